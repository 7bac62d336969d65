#include "server/manager/model_control.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/logging.h"
#include "server/core/message_text.h"
#include "server/os/threads.h"

namespace sluice {

namespace {

constexpr char kNotLoadedYet[] =
    "not loaded yet: loads on its first request (--model-load-on-demand)";

// The bytes of a model's files (a version's directory, or its file).
uint64_t FileBytes(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return std::filesystem::file_size(path, ec);
  uint64_t bytes = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  }
  return bytes;
}

}  // namespace

const char* ModelControlModeName(ModelControlMode mode) {
  switch (mode) {
    case ModelControlMode::kNone:
      return "none";
    case ModelControlMode::kPoll:
      return "poll";
    case ModelControlMode::kExplicit:
      return "explicit";
  }
  return "none";
}

StatusOr<ModelControlMode> ParseModelControlMode(std::string_view text) {
  for (ModelControlMode mode :
       {ModelControlMode::kNone, ModelControlMode::kPoll, ModelControlMode::kExplicit}) {
    if (text == ModelControlModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model control mode '", std::string(text),
                                                 "' (none, poll or explicit)"));
}

ModelControl::ModelControl(ModelManager* manager, VersionLoader* loader, Options options)
    : manager_(manager),
      loader_(loader),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &steady_),
      backoff_(options_.load_retry_first, options_.load_retry_longest),
      no_room_(options_.no_room_retry, options_.no_room_retry) {}

ModelControl::~ModelControl() { Stop(); }

void ModelControl::Start(std::function<void(const Status&)> loaded) {
  {
    // The index shows every start-up model LOADING (and, in explicit mode, the others not
    // loaded) from the moment the server answers, not only once the control thread gets to them.
    MutexLock control(&control_mutex_);
    MarkStartupModels();
  }
  Task load_all{
      [this] {
        Status status = LoadAll();
        if (status.ok() && options_.mode == ModelControlMode::kPoll) {
          MutexLock lock(&mutex_);
          if (!thread_stopping_ && !stopping_) {
            spdlog::info(
                "event=repository_polling interval_s={}",
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
  const bool named_only = options_.mode == ModelControlMode::kExplicit || options_.load_on_demand;
  const std::set<std::string> startup(options_.startup_models.begin(),
                                      options_.startup_models.end());
  std::vector<std::shared_ptr<const RepositoryModel>> wanted;
  for (const auto& model : manager_->Models()) {
    if (!named_only || startup.count("*") > 0 || startup.count(model->name) > 0) {
      wanted.push_back(model);
      if (named_only) pinned_.insert(model->name);
    } else if (options_.load_on_demand) {
      manager_->NotServed(model->name, kNotLoadedYet);
    } else {
      manager_->NotServed(
          model->name,
          "not loaded (--model-control-mode explicit: load it with RepositoryModelLoad)");
    }
  }
  // Every model shows LOADING before the first one loads. Ensembles load last: they are checked
  // against their steps' models as those serve.
  for (const auto& model : wanted) manager_->BeginLoad(model);
  std::stable_partition(wanted.begin(), wanted.end(),
                        [](const auto& model) { return !model->spec.is_ensemble(); });
  return wanted;
}

Status ModelControl::LoadAll() {
  MutexLock control(&control_mutex_);
  SLUICE_RETURN_IF_ERROR(loader_->CheckDevicePolicy());
  const std::vector<std::shared_ptr<const RepositoryModel>> wanted = MarkStartupModels();
  loader_->SplitCpuThreads(wanted);
  // Install logs each model's failures; at start-up they leave the model UNAVAILABLE and the
  // others load.
  for (const auto& model : wanted) {
    const Status status = Install(model);
    if (options_.observer != nullptr)
      options_.observer->OnModelLoad(model->name, "startup", status.ok());
  }
  manager_->SetStarted();
  if (Budgeted()) {
    const DeviceBytes used = ResidentBytes(manager_->Resident());
    for (const auto& [device, limit] : options_.eviction.budget) {
      auto it = used.find(device);
      if (it != used.end() && it->second > limit) {
        spdlog::warn(
            "event=memory_budget_exceeded device={} used=\"{}\" budget=\"{}\" reason=\"the "
            "--load-model "
            "models are pinned and alone take more than the budget: nothing else can load\"",
            device, DescribeBytes(it->second), DescribeBytes(limit));
      }
    }
    ReportBudget();
  }
  return absl::OkStatus();
}

Status ModelControl::Install(const std::shared_ptr<const RepositoryModel>& model, bool wanted) {
  const std::string& name = model->name;
  const std::vector<int64_t> serving_versions = manager_->BeginLoad(model, wanted);
  const bool serving = !serving_versions.empty();  // and keeps serving if this fails
  const std::string kept =
      serving ? absl::StrCat("; version(s) ", absl::StrJoin(serving_versions, ","), " keep serving")
              : "";
  if (!model->status.ok()) {
    spdlog::error("event=model_unavailable model={} reason=\"{}{}\"", name, model->status.message(),
                  kept);
    return Status(model->status.code(),
                  absl::StrCat("model '", name, "' cannot load: ", model->status.message(), kept));
  }
  std::vector<LoadedVersion> loaded;
  for (const auto& [version, path] : model->versions)
    loaded.push_back(loader_->Load(model, version, &stopping_));

  const LoadedVersion* failed = nullptr;
  for (const LoadedVersion& each : loaded) {
    if (!each.status.ok() && failed == nullptr) failed = &each;
  }
  if (serving && failed != nullptr) {
    const Status status(failed->status.code(),
                        absl::StrCat("model '", name, "' was not reloaded: version ",
                                     failed->version, ": ", failed->status.message(), kept));
    spdlog::error("event=model_reload_failed model={} reason=\"{}\"", name, status.message());
    for (LoadedVersion& each : loaded) {
      if (each.handle) each.handle->Stop();
    }
    return status;
  }

  RetiredVersions retired = manager_->Swap(model, &loaded, wanted);
  // The operator libraries the config names (each one's path and operators are in its own
  // event=operator_library_loaded line).
  std::vector<std::string> libraries = model->spec.operator_libraries;
  if (!model->spec.init_library.empty()) libraries.push_back(model->spec.init_library);
  const std::string libraries_field =
      libraries.empty()
          ? ""
          : absl::StrCat(" operator_libraries=\"", absl::StrJoin(libraries, ","), "\"");
  for (const LoadedVersion& each : loaded) {
    if (each.handle) {
      LogTuning(each.tuning);
      spdlog::info(
          "event=model_ready model={} version={} device={} batching={} load_ms={} "
          "memory=\"{}\"{}{}",
          name, each.version, each.handle->device(),
          model->spec.is_ensemble()               ? "ensemble"
          : model->spec.sequence_batching.enabled ? "sequence"
          : model->spec.dynamic_batching.enabled  ? "dynamic"
                                                  : "none",
          std::chrono::duration_cast<std::chrono::milliseconds>(each.load_time).count(),
          DescribeDeviceBytes(each.memory), libraries_field, serving ? " reloaded=true" : "");
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
                 std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - started)
                     .count());
  }
  loader_->ReleaseCachedMemory();
}

Status ModelControl::LoadModel(const std::string& name, const ModelOverride& override) {
  auto failed = [&name](const Status& status) {
    return Status(status.code(),
                  absl::StrCat("failed to load '", QuoteClientText(name), "': ", status.message()));
  };
  if (options_.source == nullptr) {
    return failed(
        absl::FailedPreconditionError("model control has no model repository to read from"));
  }
  Status status;
  {
    MutexLock control(&control_mutex_);
    if (stopping_) return failed(absl::UnavailableError("the server is shutting down"));
    StatusOr<RepositoryModel> read = options_.source->Read(name, override);
    if (!read.ok()) return failed(read.status());
    spdlog::info("event=model_load model={}{}{}", name,
                 override.config_json ? " config_override=true" : "",
                 override.files.empty() ? "" : absl::StrCat(" files=", override.files.size()));
    const bool served_before = !manager_->ReadyVersions(name).empty();
    auto model = std::make_shared<const RepositoryModel>(*std::move(read));
    status = Budgeted() && model->status.ok() ? MakeRoom(name, Expected(*model)) : absl::OkStatus();
    if (status.ok() && model->status.ok() && model->spec.is_ensemble()) {
      status = LoadComposingModels(*model, "explicit", /*wanted=*/true);
    }
    if (status.ok()) status = Install(model);
    // A reload that measures over the budget keeps serving (the old versions are gone already).
    if (status.ok() && Budgeted()) status = SettleBudget(name, /*may_unload=*/!served_before);
    group_.clear();
    group_ensemble_.clear();
    if (status.ok()) {
      MutexLock demand(&demand_mutex_);
      backoff_.RecordSuccess(name);
      unloaded_explicitly_.erase(name);
    }
    if (options_.observer != nullptr) options_.observer->OnModelLoad(name, "explicit", status.ok());
    // The files of a load stay while it serves: this one if it serves now (in full, or partly
    // where nothing served before), else the one before it if that serves on.
    if (status.ok() || (!served_before && !manager_->ReadyVersions(name).empty())) {
      serving_directory_[name] = model->directory;
    } else if (!served_before) {
      serving_directory_.erase(name);
    }
    auto serving = serving_directory_.find(name);
    options_.source->Retain(
        name, serving == serving_directory_.end() ? std::filesystem::path() : serving->second);
  }
  ReportBudget();
  NotifyChange();
  return status.ok() ? status : failed(status);
}

Status ModelControl::LoadComposingModels(const RepositoryModel& ensemble, const char* trigger,
                                         bool wanted) {
  group_ensemble_ = ensemble.name;
  group_.clear();
  for (const EnsembleStepSpec& step : ensemble.spec.ensemble.steps) group_.insert(step.model);
  std::set<std::string> done;
  for (const EnsembleStepSpec& step : ensemble.spec.ensemble.steps) {
    const std::string& name = step.model;
    if (!done.insert(name).second || !manager_->ReadyVersions(name).empty()) continue;
    if (wanted) {
      // An explicit load of the ensemble is one of its models too.
      MutexLock demand(&demand_mutex_);
      unloaded_explicitly_.erase(name);
    } else if (Status allowed = CheckLoadOnDemand(name); !allowed.ok()) {
      return Status(allowed.code(),
                    absl::StrCat("its step model '", name, "' did not load: ", allowed.message()));
    }
    spdlog::info("event=model_load model={} for_ensemble={} trigger={}", name, ensemble.name,
                 trigger);
    StatusOr<RepositoryModel> read = options_.source->Read(name, ModelOverride{});
    Status status = read.status();
    if (read.ok()) {
      auto model = std::make_shared<const RepositoryModel>(*std::move(read));
      if (Budgeted() && model->status.ok()) status = MakeRoom(name, Expected(*model));
      if (status.ok()) status = Install(model, wanted);
      if (status.ok() && Budgeted()) status = SettleBudget(name, /*may_unload=*/true);
      if (status.ok()) {
        serving_directory_[name] = model->directory;
        options_.source->Retain(name, model->directory);
      }
    }
    if (options_.observer != nullptr) options_.observer->OnModelLoad(name, trigger, status.ok());
    if (!status.ok()) {
      return Status(status.code(),
                    absl::StrCat("its step model '", name, "' did not load: ", status.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ModelControl::EnsemblesRunning(const std::string& model,
                                                        const std::string& except) const {
  std::vector<std::string> ensembles;
  for (const std::shared_ptr<const RepositoryModel>& each : manager_->Models()) {
    if (!each->spec.is_ensemble() || each->name == except) continue;
    const std::vector<EnsembleStepSpec>& steps = each->spec.ensemble.steps;
    const bool runs = std::any_of(steps.begin(), steps.end(), [&](const EnsembleStepSpec& step) {
      return step.model == model;
    });
    if (runs && !manager_->ReadyVersions(each->name).empty()) ensembles.push_back(each->name);
  }
  return ensembles;
}

Status ModelControl::UnloadModel(const std::string& name, bool unload_dependents) {
  Status status;
  {
    MutexLock control(&control_mutex_);
    // Chosen before the ensemble goes, which no longer counts as running them.
    std::vector<std::string> dependents;
    StatusOr<std::shared_ptr<const RepositoryModel>> found = manager_->FindModel(name);
    if (unload_dependents && found.ok() && (*found)->spec.is_ensemble()) {
      for (const EnsembleStepSpec& step : (*found)->spec.ensemble.steps) {
        const std::string& model = step.model;
        if (std::find(dependents.begin(), dependents.end(), model) != dependents.end()) continue;
        if (manager_->ReadyVersions(model).empty() || Pinned(model)) continue;
        if (EnsemblesRunning(model, name).empty()) dependents.push_back(model);
      }
    }
    status = Unload(name, /*forget=*/false);
    for (const std::string& model : dependents) {
      if (!status.ok()) break;
      spdlog::info("event=model_unload model={} with_ensemble={}", model, name);
      status = Unload(model, /*forget=*/false);
    }
    if (status.ok() && options_.load_on_demand) {
      MutexLock demand(&demand_mutex_);
      unloaded_explicitly_.insert(name);
      unloaded_explicitly_.insert(dependents.begin(), dependents.end());
    }
  }
  ReportBudget();
  NotifyChange();
  return status;
}

bool ModelControl::LoadsOnDemand(const std::string& name) const {
  if (!options_.load_on_demand || options_.source == nullptr) return false;
  if (!manager_->FindModel(name).ok()) return false;
  MutexLock demand(&demand_mutex_);
  return unloaded_explicitly_.count(name) == 0;
}

Status ModelControl::CheckLoadOnDemand(const std::string& name) const {
  const TimePoint now = clock_->Now();
  MutexLock demand(&demand_mutex_);
  if (unloaded_explicitly_.count(name) > 0) {
    return absl::UnavailableError(
        absl::StrCat("failed to load '", name,
                     "' on demand: it was unloaded with "
                     "RepositoryModelUnload; RepositoryModelLoad loads it again"));
  }
  SLUICE_RETURN_IF_ERROR(backoff_.Check(name, now));
  return no_room_.Check(name, now);
}

Status ModelControl::LoadOnDemand(const std::string& name) {
  // Every failure but the budget's is UNAVAILABLE for the requests that waited: whatever went
  // wrong is the model's, not the request's (the reason is in the message).
  auto failed = [&name](const Status& status) {
    const absl::StatusCode code =
        absl::IsResourceExhausted(status) ? status.code() : absl::StatusCode::kUnavailable;
    return Status(code, absl::StrCat("failed to load '", name, "' on demand: ", status.message()));
  };
  if (options_.source == nullptr || !options_.load_on_demand) {
    return failed(absl::FailedPreconditionError("the server does not load models on demand"));
  }
  Status status;
  {
    MutexLock control(&control_mutex_);
    if (stopping_) return failed(absl::UnavailableError("the server is shutting down"));
    if (!manager_->ReadyVersions(name).empty()) return absl::OkStatus();  // an earlier load made it
    SLUICE_RETURN_IF_ERROR(CheckLoadOnDemand(name));
    const auto started = clock_->Now();
    StatusOr<RepositoryModel> read = options_.source->Read(name, {});
    std::shared_ptr<const RepositoryModel> model;
    if (read.ok()) model = std::make_shared<const RepositoryModel>(*std::move(read));
    status = read.ok() ? model->status : read.status();
    bool load_failed = !status.ok();  // the model's own failure (not the budget's): back off
    if (status.ok() && Budgeted()) status = MakeRoom(name, Expected(*model));
    if (status.ok() && model->spec.is_ensemble()) {
      status = LoadComposingModels(*model, "on_demand", /*wanted=*/false);
    }
    if (status.ok()) {
      spdlog::info("event=model_load model={} trigger=on_demand", name);
      // Readiness never waits for a model loaded on demand.
      status = Install(model, /*wanted=*/false);
      load_failed = !status.ok();
      if (!status.ok() && !manager_->ReadyVersions(name).empty()) {
        // Some versions serve: keep them, as an explicit load does; the failed ones are listed
        // with their reasons and their requests answered UNAVAILABLE.
        spdlog::error("event=model_load_on_demand_partial model={} reason=\"{}\"", name,
                      status.message());
        status = absl::OkStatus();
      }
    }
    if (status.ok() && Budgeted()) status = SettleBudget(name, /*may_unload=*/true);
    group_.clear();
    group_ensemble_.clear();
    if (status.ok()) {
      {
        MutexLock demand(&demand_mutex_);
        backoff_.RecordSuccess(name);
      }
      serving_directory_[name] = model->directory;
      options_.source->Retain(name, model->directory);
      spdlog::info(
          "event=model_loaded_on_demand model={} ms={}", name,
          std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - started).count());
    } else {
      {
        MutexLock demand(&demand_mutex_);
        if (load_failed) {
          backoff_.RecordFailure(name, status, clock_->Now());
        } else {
          no_room_.RecordFailure(name, status, clock_->Now());
        }
      }
      // Not served, and readiness does not wait for it; the index shows why.
      const std::string reason = absl::StrCat("failed to load on demand: ", status.message());
      if (manager_->ReadyVersions(name).empty() && manager_->FindModel(name).ok()) {
        StatusOr<RetiredVersions> retired = manager_->Remove(name, reason, /*forget=*/false);
        if (retired.ok()) Retire(name, *std::move(retired));
      }
      spdlog::error("event=model_load_on_demand_failed model={} reason=\"{}\"", name,
                    status.message());
    }
    if (options_.observer != nullptr)
      options_.observer->OnModelLoad(name, "on_demand", status.ok());
  }
  ReportBudget();
  NotifyChange();
  return status.ok() ? status : failed(status);
}

std::vector<ResidentModel> ModelControl::Resident() const {
  std::vector<ResidentModel> resident = manager_->Resident();
  for (ResidentModel& model : resident) {
    model.pinned = Pinned(model.name);
    if (group_.count(model.name) > 0) {
      model.kept = absl::StrCat("loads with '", group_ensemble_, "'");
      continue;
    }
    // The models pinned ensembles run stay with them (an ensemble goes with a model it runs).
    for (const std::string& ensemble : EnsemblesRunning(model.name)) {
      if (!Pinned(ensemble)) continue;
      model.kept = absl::StrCat("runs in pinned ensemble '", ensemble, "'");
      break;
    }
  }
  return resident;
}

bool ModelControl::Pinned(const std::string& name) const {
  if (pinned_.count(name) > 0) return true;
  StatusOr<std::shared_ptr<const RepositoryModel>> found = manager_->FindModel(name);
  return found.ok() && (*found)->spec.pinned;
}

DeviceBytes ModelControl::Expected(const RepositoryModel& model) const {
  DeviceBytes expected;
  auto measured = measured_.find(model.name);
  if (measured != measured_.end()) {
    for (const auto& [device, limit] : options_.eviction.budget) {
      auto it = measured->second.find(device);
      if (it != measured->second.end()) expected[device] = it->second;
    }
    return expected;
  }
  // Never loaded: its files times its instances on each device its instances go on (and the host,
  // which every load reads the files into). A guess: never more than the budget, so that the
  // load is tried and SettleBudget judges what it measured.
  uint64_t files = 0;
  for (const auto& [version, path] : model.versions) files += FileBytes(path);
  int instances = 0;
  for (const InstanceGroupSpec& group : model.spec.instance_groups) instances += group.count;
  const uint64_t guess = files * static_cast<uint64_t>(std::max(1, instances));
  std::vector<std::string> devices{"cpu"};
  for (const Device& device : loader_->DevicesOf(model.spec)) devices.push_back(device.ToString());
  for (const std::string& device : devices) {
    auto limit = options_.eviction.budget.find(device);
    if (limit != options_.eviction.budget.end()) expected[device] = std::min(guess, limit->second);
  }
  return expected;
}

Status ModelControl::MakeRoom(const std::string& name, const DeviceBytes& needed) {
  const TimePoint give_up = clock_->Now() + options_.room_wait;
  const std::string reason =
      options_.load_on_demand
          ? absl::StrCat("unloaded to make room for '", name,
                         "' (least recently used; loads again on its next request)")
          : absl::StrCat("unloaded to make room for '", name,
                         "' (least recently used; RepositoryModelLoad loads it again)");
  Status last;
  while (true) {
    const std::vector<ResidentModel> resident = Resident();
    const TimePoint now = clock_->Now();
    StatusOr<std::vector<std::string>> plan =
        PlanEviction(resident, needed, options_.eviction, now, name);
    if (plan.ok()) {
      bool all_gone = true;
      for (const std::string& victim : *plan) {
        const DeviceBytes freed = manager_->MemoryOf(victim);
        StatusOr<RetiredVersions> retired = manager_->RemoveIfIdle(victim, reason);
        if (!retired.ok()) {  // a request found it since the plan: plan again
          all_gone = false;
          last = retired.status();
          continue;
        }
        const bool young =
            std::any_of(resident.begin(), resident.end(), [&](const ResidentModel& model) {
              return model.name == victim &&
                     now - model.ready_since < options_.eviction.min_residency;
            });
        spdlog::info("event=model_evicted model={} for={} freed=\"{}\" young={}", victim, name,
                     DescribeDeviceBytes(freed), young);
        Retire(victim, *std::move(retired));
        serving_directory_.erase(victim);
        options_.source->Retain(victim, {});
        if (options_.observer != nullptr) options_.observer->OnEviction(victim, young);
        // An ensemble goes with a model it runs, so that its next load (on demand, or
        // RepositoryModelLoad) loads them together again; it holds no memory of its own.
        for (const std::string& ensemble : EnsemblesRunning(victim)) {
          StatusOr<RetiredVersions> with = manager_->Remove(
              ensemble, absl::StrCat("its step model '", victim, "' was ", reason), false);
          if (!with.ok()) continue;
          spdlog::info("event=model_evicted model={} with={} for={}", ensemble, victim, name);
          Retire(ensemble, *std::move(with));
          serving_directory_.erase(ensemble);
          options_.source->Retain(ensemble, {});
        }
      }
      if (all_gone) return absl::OkStatus();
    } else {
      last = plan.status();
    }
    // Only busy models could go: they may go idle in a moment.
    if (stopping_ || clock_->Now() >= give_up) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for model '", name, "' within the memory budget: ", last.message()));
    }
    Mutex pause;
    CondVar never;
    MutexLock lock(&pause);
    clock_->WaitUntil(&never, &pause,
                      std::min(give_up, clock_->Now() + std::chrono::milliseconds(10)));
  }
}

Status ModelControl::SettleBudget(const std::string& name, bool may_unload) {
  measured_[name] = manager_->MemoryOf(name);
  const Status room = MakeRoom(name, {});
  if (room.ok()) return room;
  if (!may_unload || Pinned(name)) {
    // A reload or a pinned model stays: the budget is exceeded until others can go.
    spdlog::warn("event=memory_budget_exceeded model={} reason=\"{}\"", name, room.message());
    return absl::OkStatus();
  }
  // Even with every model that may go gone, this one does not fit: it goes instead.
  StatusOr<RetiredVersions> retired =
      manager_->Remove(name, std::string(room.message()), /*forget=*/false);
  if (retired.ok()) Retire(name, *std::move(retired));
  return absl::ResourceExhaustedError(
      absl::StrCat("model '", name, "' measured more than expected at load and ", room.message()));
}

void ModelControl::ReportBudget() const {
  if (options_.observer == nullptr || !Budgeted()) return;
  options_.observer->OnBudget(options_.eviction.budget, ResidentBytes(manager_->Resident()));
}

Status ModelControl::Unload(const std::string& name, bool forget) {
  SLUICE_ASSIGN_OR_RETURN(RetiredVersions retired, manager_->Remove(name, "unloaded", forget));
  if (!retired.handles.empty()) {
    spdlog::info("event=model_unload model={}{}", name,
                 forget ? " reason=\"removed from the repository\"" : "");
  }
  Retire(name, std::move(retired));
  serving_directory_.erase(name);
  if (options_.source != nullptr)
    options_.source->Retain(name, {});  // files sent with its loads go
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
    // Ensembles after the models their steps run.
    std::stable_partition(changed.begin(), changed.end(),
                          [](const auto& model) { return !model->spec.is_ensemble(); });
    for (const auto& model : changed) {
      if (stopping_) break;
      if (options_.load_on_demand && manager_->ReadyVersions(model->name).empty() &&
          !pinned_.count(model->name)) {
        // Not serving: the new files load on its next request.
        spdlog::info(
            "event=model_changed model={} action=none reason=\"not loaded; loads on demand\"",
            model->name);
        manager_->Know(model, kNotLoadedYet);
        MutexLock demand(&demand_mutex_);
        backoff_.RecordSuccess(model->name);  // new files: a new chance
        continue;
      }
      spdlog::info("event=model_changed model={} action=load", model->name);
      // Room for the new files beside the old ones; a reload that still measures over the budget
      // keeps serving (SettleBudget logs it).
      if (Budgeted() && model->status.ok()) MakeRoom(model->name, Expected(*model)).IgnoreError();
      const Status status = Install(model);  // logged by Install
      if (status.ok() && Budgeted()) SettleBudget(model->name, /*may_unload=*/false).IgnoreError();
      if (options_.observer != nullptr)
        options_.observer->OnModelLoad(model->name, "poll", status.ok());
    }
    std::vector<std::string> gone;
    for (const auto& model : manager_->Models()) {
      if (!present.count(model->name)) gone.push_back(model->name);
    }
    for (const std::string& name : gone) Unload(name, /*forget=*/true).IgnoreError();
    changed_any = !changed.empty() || !gone.empty();
  }
  if (changed_any) {
    ReportBudget();
    NotifyChange();
  }
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
