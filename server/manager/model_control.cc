#include "server/manager/model_control.h"

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/logging.h"
#include "server/core/thread_name.h"

namespace sluice {

const char* ModelControlModeName(ModelControlMode mode) {
  switch (mode) {
    case ModelControlMode::kNone: return "none";
    case ModelControlMode::kPoll: return "poll";
    case ModelControlMode::kExplicit: return "explicit";
  }
  return "none";
}

StatusOr<ModelControlMode> ParseModelControlMode(std::string_view text) {
  for (ModelControlMode mode : {ModelControlMode::kNone, ModelControlMode::kPoll, ModelControlMode::kExplicit}) {
    if (text == ModelControlModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model control mode '", std::string(text), "' (none, poll or explicit)"));
}

ModelControl::ModelControl(ModelManager* manager, VersionLoader* loader, Options options)
    : manager_(manager), loader_(loader), options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &steady_) {}

ModelControl::~ModelControl() { Stop(); }

void ModelControl::Start(std::function<void(const Status&)> loaded) {
  {
    // The index shows every start-up model LOADING (and, in explicit mode, the others not
    // loaded) from the moment the server answers, not only once the control thread gets to them.
    MutexLock control(&control_mutex_);
    MarkStartupModels();
  }
  Task load_all{[this] {
                  Status status = LoadAll();
                  if (status.ok() && options_.mode == ModelControlMode::kPoll) {
                    MutexLock lock(&mutex_);
                    if (!thread_stopping_ && !stopping_) {
                      spdlog::info("event=repository_polling interval_s={}",
                                   std::chrono::duration_cast<std::chrono::seconds>(options_.poll_interval).count());
                      polling_ = true;
                      next_poll_ = clock_->Now() + options_.poll_interval;
                    }
                  }
                  return status;
                },
                std::move(loaded)};
  // First in the queue: a RepositoryModelLoad that came in before Start waits for the start-up
  // models.
  if (!Enqueue(std::move(load_all), /*first=*/true)) return;
  MutexLock lock(&thread_mutex_);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void ModelControl::Submit(std::function<Status()> task, std::function<void(const Status&)> done) {
  Enqueue({std::move(task), std::move(done)}, /*first=*/false);
}

bool ModelControl::Enqueue(Task task, bool first) {
  {
    MutexLock lock(&mutex_);
    if (!thread_stopping_) {
      if (first) {
        tasks_.push_front(std::move(task));
      } else {
        tasks_.push_back(std::move(task));
      }
      wake_.Signal();
      return true;
    }
  }
  if (task.done) task.done(absl::UnavailableError("the server is shutting down"));
  return false;
}

void ModelControl::Loop() {
  NameThisThread("sluice-control");
  MutexLock lock(&mutex_);
  while (true) {
    if (!tasks_.empty()) {
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.Unlock();
      const Status status = task.run();
      if (task.done) task.done(status);
      lock.Lock();
      continue;
    }
    if (thread_stopping_) return;
    if (polling_ && clock_->Now() >= next_poll_) {
      lock.Unlock();
      if (Status status = PollRepository(); !status.ok()) {
        spdlog::error("event=repository_poll_failed reason=\"{}\"", status.message());
      }
      lock.Lock();
      next_poll_ = clock_->Now() + options_.poll_interval;
      continue;
    }
    clock_->WaitUntil(&wake_, &mutex_, polling_ ? next_poll_ : kNoDeadline);
  }
}

std::vector<std::shared_ptr<const RepositoryModel>> ModelControl::MarkStartupModels() {
  const bool explicit_mode = options_.mode == ModelControlMode::kExplicit;
  const std::set<std::string> startup(options_.startup_models.begin(), options_.startup_models.end());
  std::vector<std::shared_ptr<const RepositoryModel>> wanted;
  for (const auto& model : manager_->Models()) {
    if (!explicit_mode || startup.count("*") > 0 || startup.count(model->name) > 0) {
      wanted.push_back(model);
    } else {
      manager_->NotServed(model->name, "not loaded (--model-control-mode explicit: load it with RepositoryModelLoad)");
    }
  }
  // Every model shows LOADING before the first one loads.
  for (const auto& model : wanted) manager_->BeginLoad(model);
  return wanted;
}

Status ModelControl::LoadAll() {
  MutexLock control(&control_mutex_);
  SLUICE_RETURN_IF_ERROR(loader_->CheckDevicePolicy());
  const std::vector<std::shared_ptr<const RepositoryModel>> wanted = MarkStartupModels();
  loader_->SplitCpuThreads(wanted);
  // Install logs each model's failures; at start-up they leave the model UNAVAILABLE and the
  // others load.
  for (const auto& model : wanted) Install(model).IgnoreError();
  manager_->SetStarted();
  return absl::OkStatus();
}

Status ModelControl::Install(const std::shared_ptr<const RepositoryModel>& model) {
  const std::string& name = model->name;
  const std::vector<int64_t> serving_versions = manager_->BeginLoad(model);
  const bool serving = !serving_versions.empty();  // and keeps serving if this fails
  const std::string kept =
      serving ? absl::StrCat("; version(s) ", absl::StrJoin(serving_versions, ","), " keep serving") : "";
  if (!model->status.ok()) {
    spdlog::error("event=model_unavailable model={} reason=\"{}{}\"", name, model->status.message(), kept);
    return Status(model->status.code(),
                  absl::StrCat("model '", name, "' cannot load: ", model->status.message(), kept));
  }
  std::vector<LoadedVersion> loaded;
  for (const auto& [version, path] : model->versions) loaded.push_back(loader_->Load(model, version, &stopping_));

  const LoadedVersion* failed = nullptr;
  for (const LoadedVersion& each : loaded) {
    if (!each.status.ok() && failed == nullptr) failed = &each;
  }
  if (serving && failed != nullptr) {
    const Status status(failed->status.code(),
                        absl::StrCat("model '", name, "' was not reloaded: version ", failed->version, ": ",
                                     failed->status.message(), kept));
    spdlog::error("event=model_reload_failed model={} reason=\"{}\"", name, status.message());
    for (LoadedVersion& each : loaded) {
      if (each.handle) each.handle->Stop();
    }
    return status;
  }

  RetiredVersions retired = manager_->Swap(model, &loaded);
  for (const LoadedVersion& each : loaded) {
    if (each.handle) {
      LogTuning(each.tuning);
      spdlog::info("event=model_ready model={} version={} device={} batching={} load_ms={}{}", name, each.version,
                   each.handle->device(), model->spec.sequence_batching.enabled  ? "sequence"
                   : model->spec.dynamic_batching.enabled ? "dynamic"
                                                          : "none",
                   std::chrono::duration_cast<std::chrono::milliseconds>(each.load_time).count(),
                   serving ? " reloaded=true" : "");
    } else {
      spdlog::error("event=model_unavailable model={} version={} reason=\"{}\"", name, each.version,
                    each.status.message());
    }
  }
  Retire(name, std::move(retired));
  for (const LoadedVersion& each : loaded) {
    if (!each.status.ok()) {
      return Status(each.status.code(), absl::StrCat("model '", name, "' version ", each.version,
                                                     " cannot load: ", each.status.message()));
    }
  }
  return absl::OkStatus();
}

void ModelControl::Retire(const std::string& name, RetiredVersions retired) {
  if (retired.handles.empty()) return;
  for (std::shared_ptr<ModelHandle>& handle : retired.handles) {
    // Nothing hands this version out any more, and every request given it holds a reference
    // (ModelHandle::Acquire) until it is answered: once none is left, nothing is queued or
    // running on it.
    const auto started = std::chrono::steady_clock::now();
    const int64_t version = handle->version();
    if (!retired.stopped) {
      handle->DrainSequences(options_.sequence_drain);
      handle->WaitIdle();
    }
    handle->Stop();
    handle.reset();  // normally the last reference: the instances are destroyed here
    spdlog::info("event=model_version_retired model={} version={} drain_ms={}", name, version,
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count());
  }
  loader_->ReleaseCachedMemory();
}

Status ModelControl::LoadModel(const std::string& name, const ModelOverride& override) {
  auto failed = [&name](const Status& status) {
    return Status(status.code(), absl::StrCat("failed to load '", name, "': ", status.message()));
  };
  if (options_.source == nullptr) {
    return failed(absl::FailedPreconditionError("model control has no model repository to read from"));
  }
  Status status;
  {
    MutexLock control(&control_mutex_);
    if (stopping_) return failed(absl::UnavailableError("the server is shutting down"));
    StatusOr<RepositoryModel> read = options_.source->Read(name, override);
    if (!read.ok()) return failed(read.status());
    spdlog::info("event=model_load model={}{}{}", name, override.config_json ? " config_override=true" : "",
                 override.files.empty() ? "" : absl::StrCat(" files=", override.files.size()));
    const bool served_before = !manager_->ReadyVersions(name).empty();
    auto model = std::make_shared<const RepositoryModel>(*std::move(read));
    status = Install(model);
    // The files of a load stay while it serves: this one if it serves now (in full, or partly
    // where nothing served before), else the one before it if that serves on.
    if (status.ok() || (!served_before && !manager_->ReadyVersions(name).empty())) {
      serving_directory_[name] = model->directory;
    } else if (!served_before) {
      serving_directory_.erase(name);
    }
    auto serving = serving_directory_.find(name);
    options_.source->Retain(name, serving == serving_directory_.end() ? std::filesystem::path() : serving->second);
  }
  NotifyChange();
  return status.ok() ? status : failed(status);
}

Status ModelControl::UnloadModel(const std::string& name) {
  Status status;
  {
    MutexLock control(&control_mutex_);
    status = Unload(name, /*forget=*/false);
  }
  NotifyChange();
  return status;
}

Status ModelControl::Unload(const std::string& name, bool forget) {
  SLUICE_ASSIGN_OR_RETURN(RetiredVersions retired, manager_->Remove(name, "unloaded", forget));
  if (!retired.handles.empty()) {
    spdlog::info("event=model_unload model={}{}", name, forget ? " reason=\"removed from the repository\"" : "");
  }
  Retire(name, std::move(retired));
  serving_directory_.erase(name);
  if (options_.source != nullptr) options_.source->Retain(name, {});  // files sent with its loads go
  return absl::OkStatus();
}

Status ModelControl::PollRepository() {
  if (options_.source == nullptr) {
    return absl::FailedPreconditionError("model control has no model repository to read from");
  }
  bool changed_any = false;
  {
    MutexLock control(&control_mutex_);
    if (stopping_) return absl::OkStatus();
    SLUICE_ASSIGN_OR_RETURN(std::vector<RepositoryModel> models, options_.source->Scan());
    std::set<std::string> present;
    std::vector<std::shared_ptr<const RepositoryModel>> changed;
    for (RepositoryModel& model : models) {
      present.insert(model.name);
      if (manager_->TriedFingerprint(model.name) == model.fingerprint) continue;
      changed.push_back(std::make_shared<const RepositoryModel>(std::move(model)));
    }
    for (const auto& model : changed) {
      if (stopping_) break;
      spdlog::info("event=model_changed model={} action=load", model->name);
      Install(model).IgnoreError();  // logged by Install
    }
    std::vector<std::string> gone;
    for (const auto& model : manager_->Models()) {
      if (!present.count(model->name)) gone.push_back(model->name);
    }
    for (const std::string& name : gone) Unload(name, /*forget=*/true).IgnoreError();
    changed_any = !changed.empty() || !gone.empty();
  }
  if (changed_any) NotifyChange();
  return absl::OkStatus();
}

void ModelControl::SetChangeListener(std::function<void()> listener) {
  MutexLock lock(&mutex_);
  change_listener_ = std::move(listener);
}

void ModelControl::NotifyChange() {
  std::function<void()> listener;
  {
    MutexLock lock(&mutex_);
    listener = change_listener_;
  }
  if (listener) listener();
}

void ModelControl::BeginStop() {
  stopping_ = true;
  MutexLock lock(&mutex_);
  polling_ = false;
  wake_.SignalAll();
}

void ModelControl::Stop() {
  BeginStop();
  manager_->Stop();
  std::deque<Task> unanswered;
  {
    MutexLock lock(&mutex_);
    thread_stopping_ = true;
    wake_.SignalAll();
  }
  {
    MutexLock lock(&thread_mutex_);
    if (thread_.joinable()) {
      thread_.join();
    } else {
      MutexLock queue(&mutex_);
      unanswered.swap(tasks_);  // never started: nothing will run them
    }
  }
  for (Task& task : unanswered) {
    if (task.done) task.done(absl::UnavailableError("the server is shutting down"));
  }
}

}  // namespace sluice
