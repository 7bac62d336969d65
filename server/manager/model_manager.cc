#include "server/manager/model_manager.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#include "server/manager/model_errors.h"

namespace sluice {
namespace {

// A version as a client writes it: decimal digits only (no sign, no spaces), a positive number
// that fits. absl::SimpleAtoi alone would take " 1", "+1" and "1 " for version 1.
bool ParseVersionNumber(const std::string& text, int64_t* version) {
  if (text.empty() || text.size() > 18) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(text, version) && *version > 0;
}

}  // namespace

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnavailable:
      return "UNAVAILABLE";
  }
  return "UNAVAILABLE";
}

ModelManager::ModelManager(std::vector<RepositoryModel> models, Options options)
    : options_(options), clock_(options_.clock != nullptr ? options_.clock : &steady_) {
  MutexLock lock(&mutex_);
  for (RepositoryModel& model : models) {
    Entry entry;
    entry.reason = "not loaded yet";
    const std::string name = model.name;
    entry.model = std::make_shared<const RepositoryModel>(std::move(model));
    entries_.emplace(name, std::move(entry));
  }
}

ModelManager::~ModelManager() { Stop(); }

std::vector<ModelManager::VersionSlot> ModelManager::LoadingSlots(const RepositoryModel& model) {
  std::vector<VersionSlot> slots;
  if (!model.status.ok()) return slots;
  for (const auto& [version, path] : model.versions) {
    VersionSlot slot;
    slot.version = version;
    slots.push_back(std::move(slot));
  }
  return slots;
}

void ModelManager::Observe(const std::string& name, int64_t version, ModelState state) const {
  if (options_.observer == nullptr) return;
  options_.observer->OnState(name, version, state);
  if (state == ModelState::kUnavailable) options_.observer->OnVersionMemory(name, version, {});
}

std::vector<int64_t> ModelManager::BeginLoad(const std::shared_ptr<const RepositoryModel>& model,
                                             bool wanted) {
  std::vector<int64_t> serving;
  {
    MutexLock lock(&mutex_);
    Entry& entry = entries_[model->name];
    entry.tried_fingerprint = model->fingerprint;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) serving.push_back(slot.version);
    }
    if (serving.empty()) {
      // Nothing to keep: the index shows the new versions loading (or the model's error) now.
      entry.model = model;
      entry.wanted = wanted;
      entry.reason = model->status.ok() ? "" : std::string(model->status.message());
      entry.versions = LoadingSlots(*model);
    }
  }
  if (serving.empty() && model->status.ok()) {
    for (const auto& [version, path] : model->versions)
      Observe(model->name, version, ModelState::kLoading);
  }
  return serving;
}

void ModelManager::RetireLocked(std::vector<VersionSlot>* slots, RetiredVersions* retired) {
  retired->stopped = stopped_;
  retiring_.erase(
      std::remove_if(retiring_.begin(), retiring_.end(),
                     [](const std::weak_ptr<ModelHandle>& weak) { return weak.expired(); }),
      retiring_.end());
  for (VersionSlot& slot : *slots) {
    if (!slot.handle) continue;
    retiring_.push_back(slot.handle);  // so that Stop can end their drain
    retired->handles.push_back(std::move(slot.handle));
  }
}

RetiredVersions ModelManager::Swap(const std::shared_ptr<const RepositoryModel>& model,
                                   std::vector<LoadedVersion>* loaded, bool wanted) {
  const std::string& name = model->name;
  RetiredVersions retired;
  std::vector<VersionSlot> old;
  {
    MutexLock lock(&mutex_);
    Entry& entry = entries_[name];
    old = std::move(entry.versions);
    entry.versions.clear();
    entry.model = model;
    entry.wanted = wanted;
    entry.reason.clear();
    entry.ready_since = clock_->Now();
    for (LoadedVersion& each : *loaded) {
      if (each.handle && stopped_) {
        // Stop ran while this version loaded and could not see it.
        each.handle->Stop();
        each.handle.reset();
        each.status = absl::UnavailableError("the server is shutting down");
      }
      VersionSlot slot;
      slot.version = each.version;
      if (each.handle) {
        slot.state = ModelState::kReady;
        slot.handle = each.handle;
        slot.tuning = each.tuning;
        slot.memory = each.memory;
      } else {
        slot.state = ModelState::kUnavailable;
        slot.reason = std::string(each.status.message());
      }
      entry.versions.push_back(std::move(slot));
    }
    entry.changed_at = ++generation_;  // with the change, under the table lock
    RetireLocked(&old, &retired);
  }
  for (const LoadedVersion& each : *loaded) {
    if (each.handle && options_.observer != nullptr) {
      options_.observer->OnReady(each.tuning, each.load_time);
      options_.observer->OnVersionMemory(name, each.version, each.memory);
    }
    Observe(name, each.version, each.handle ? ModelState::kReady : ModelState::kUnavailable);
  }
  for (const VersionSlot& slot : old) {
    if (!model->versions.count(slot.version)) Observe(name, slot.version, ModelState::kUnavailable);
  }
  return retired;
}

namespace {

bool Busy(const ModelHandle& handle) {
  return handle.in_flight() > 0 || handle.active_sequences() > 0;
}

}  // namespace

StatusOr<RetiredVersions> ModelManager::Remove(const std::string& name, const std::string& reason,
                                               bool forget) {
  return Take(name, reason, forget, /*only_if_idle=*/false);
}

StatusOr<RetiredVersions> ModelManager::RemoveIfIdle(const std::string& name,
                                                     const std::string& reason) {
  return Take(name, reason, /*forget=*/false, /*only_if_idle=*/true);
}

StatusOr<RetiredVersions> ModelManager::Take(const std::string& name, const std::string& reason,
                                             bool forget, bool only_if_idle) {
  RetiredVersions retired;
  std::vector<VersionSlot> old;
  {
    MutexLock lock(&mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return UnknownModelError(name);
    Entry& entry = it->second;
    if (only_if_idle) {
      for (const VersionSlot& slot : entry.versions) {
        if (slot.handle && Busy(*slot.handle)) {
          return absl::FailedPreconditionError(
              absl::StrCat("model '", name, "' has requests in flight or active sequences"));
        }
      }
    }
    old = std::move(entry.versions);
    entry.versions.clear();
    entry.wanted = false;  // readiness does not wait for a model taken out of service
    entry.reason = reason;
    for (const VersionSlot& slot : old) {
      VersionSlot removed;
      removed.version = slot.version;
      removed.state = ModelState::kUnavailable;
      removed.reason = reason;
      entry.versions.push_back(std::move(removed));
    }
    entry.changed_at = ++generation_;  // with the change, under the table lock
    if (forget) entries_.erase(it);
    RetireLocked(&old, &retired);
  }
  for (const VersionSlot& slot : old) Observe(name, slot.version, ModelState::kUnavailable);
  return retired;
}

void ModelManager::Know(const std::shared_ptr<const RepositoryModel>& model,
                        const std::string& reason) {
  MutexLock lock(&mutex_);
  Entry& entry = entries_[model->name];
  entry.tried_fingerprint = model->fingerprint;
  for (const VersionSlot& slot : entry.versions) {
    if (slot.state == ModelState::kReady) return;
  }
  entry.model = model;
  entry.versions.clear();
  entry.wanted = false;
  entry.reason = model->status.ok() ? reason : std::string(model->status.message());
}

std::vector<ResidentModel> ModelManager::Resident() const {
  std::vector<ResidentModel> resident;
  MutexLock lock(&mutex_);
  for (const auto& [name, entry] : entries_) {
    ResidentModel model;
    bool ready = false;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady || !slot.handle) continue;
      ready = true;
      AddDeviceBytes(&model.memory, slot.memory);
      model.busy = model.busy || Busy(*slot.handle);
      model.last_used = std::max(model.last_used, slot.handle->last_used());
    }
    if (!ready) continue;
    model.name = name;
    model.last_used = std::max(model.last_used, entry.ready_since);
    model.ready_since = entry.ready_since;
    resident.push_back(std::move(model));
  }
  return resident;
}

DeviceBytes ModelManager::MemoryOf(const std::string& name) const {
  DeviceBytes memory;
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return memory;
  for (const VersionSlot& slot : it->second.versions) {
    if (slot.state == ModelState::kReady) AddDeviceBytes(&memory, slot.memory);
  }
  return memory;
}

void ModelManager::NotServed(const std::string& name, const std::string& reason) {
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.versions.empty()) return;
  it->second.wanted = false;
  it->second.reason = reason;
}

void ModelManager::SetStarted() {
  MutexLock lock(&mutex_);
  started_ = true;
}

std::vector<std::shared_ptr<const RepositoryModel>> ModelManager::Models() const {
  std::vector<std::shared_ptr<const RepositoryModel>> models;
  MutexLock lock(&mutex_);
  for (const auto& [name, entry] : entries_) models.push_back(entry.model);
  return models;
}

std::optional<std::string> ModelManager::TriedFingerprint(const std::string& name) const {
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.tried_fingerprint;
}

std::vector<ModelTuning> ModelManager::Tunings() const {
  std::vector<ModelTuning> tunings;
  MutexLock lock(&mutex_);
  for (const auto& [name, entry] : entries_) {
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) tunings.push_back(slot.tuning);
    }
  }
  return tunings;
}

StatusOr<std::shared_ptr<const RepositoryModel>> ModelManager::FindModel(
    const std::string& name) const {
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownModelError(name);
  return it->second.model;
}

StatusOr<InFlightModel> ModelManager::FindSequence(const std::string& name,
                                                   const CorrelationId& id) const {
  MutexLock lock(&mutex_);
  if (auto it = entries_.find(name); it != entries_.end()) {
    for (const VersionSlot& slot : it->second.versions) {
      if (slot.handle && slot.handle->HasSequence(id)) return slot.handle->Acquire();
    }
  }
  for (const std::weak_ptr<ModelHandle>& retiring : retiring_) {
    std::shared_ptr<ModelHandle> handle = retiring.lock();
    if (handle && handle->spec().name == name && handle->HasSequence(id)) return handle->Acquire();
  }
  return absl::NotFoundError(
      absl::StrCat("no version of model '", name, "' holds sequence ", id.ToString()));
}

StatusOr<InFlightModel> ModelManager::Find(const std::string& name,
                                           const std::string& version) const {
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownModelError(name);
  const Entry& entry = it->second;
  if (entry.versions.empty()) {
    const std::string why =
        !entry.reason.empty() ? entry.reason : std::string(entry.model->status.message());
    return NoReadyVersionError(name, why);
  }
  const VersionSlot* chosen = nullptr;
  if (version.empty()) {
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) chosen = &slot;  // ascending: the last is the newest
    }
    if (chosen == nullptr) {
      const VersionSlot& newest = entry.versions.back();
      return NoReadyVersionError(name, newest.reason.empty() ? "still loading" : newest.reason);
    }
  } else {
    int64_t wanted = 0;
    if (!ParseVersionNumber(version, &wanted)) {
      return UnknownVersionError(name, version, "versions are positive integers");
    }
    for (const VersionSlot& slot : entry.versions) {
      if (slot.version == wanted) chosen = &slot;
    }
    if (chosen == nullptr) {
      return UnknownVersionError(name, version, "not loaded: see the model's version_policy");
    }
    if (chosen->state != ModelState::kReady) {
      return VersionNotReadyError(name, wanted,
                                  chosen->reason.empty() ? "still loading" : chosen->reason);
    }
  }
  return chosen->handle->Acquire();
}

std::vector<int64_t> ModelManager::ReadyVersions(const std::string& name) const {
  std::vector<int64_t> versions;
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return versions;
  for (const VersionSlot& slot : it->second.versions) {
    if (slot.state == ModelState::kReady) versions.push_back(slot.version);
  }
  return versions;
}

uint64_t ModelManager::Generation(const std::string& name) const {
  MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.changed_at;
}

std::vector<ModelIndexEntry> ModelManager::Index() const {
  std::vector<ModelIndexEntry> index;
  MutexLock lock(&mutex_);
  for (const auto& [name, entry] : entries_) {
    if (entry.versions.empty()) {
      const std::string why =
          !entry.reason.empty() ? entry.reason : std::string(entry.model->status.message());
      index.push_back({name, "", ModelState::kUnavailable, why, {}});
      continue;
    }
    for (const VersionSlot& slot : entry.versions) {
      index.push_back({name, std::to_string(slot.version), slot.state, slot.reason, slot.memory});
    }
  }
  return index;
}

StatusOr<std::vector<VersionStatistics>> ModelManager::Statistics(
    const std::string& name, const std::string& version) const {
  if (!name.empty()) SLUICE_RETURN_IF_ERROR(FindModel(name).status());
  int64_t wanted = 0;
  if (!version.empty() && !ParseVersionNumber(version, &wanted)) {
    return UnknownVersionError(name, version, "versions are positive integers");
  }
  std::vector<VersionStatistics> result;
  MutexLock lock(&mutex_);
  for (const auto& [model_name, entry] : entries_) {
    if (!name.empty() && model_name != name) continue;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady || (wanted != 0 && slot.version != wanted)) continue;
      result.push_back({model_name, slot.version, slot.handle->Statistics(), slot.memory});
    }
  }
  if (!name.empty() && wanted != 0 && result.empty()) {
    return UnknownVersionError(name, version, "not loaded, or not ready");
  }
  return result;
}

bool ModelManager::AllReady() const {
  MutexLock lock(&mutex_);
  if (!started_) return false;
  for (const auto& [name, entry] : entries_) {
    if (!entry.wanted) continue;
    if (!entry.model->status.ok() || entry.versions.empty()) return false;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady) return false;
    }
  }
  return true;
}

void ModelManager::Stop() {
  std::vector<std::shared_ptr<ModelHandle>> handles;
  {
    MutexLock lock(&mutex_);
    stopped_ = true;
    for (const auto& [name, entry] : entries_) {
      for (const VersionSlot& slot : entry.versions) {
        if (slot.handle) handles.push_back(slot.handle);
      }
    }
    for (const std::weak_ptr<ModelHandle>& weak : retiring_) {
      if (auto handle = weak.lock()) handles.push_back(std::move(handle));
    }
  }
  for (const auto& handle : handles) handle->Stop();
}

}  // namespace sluice
