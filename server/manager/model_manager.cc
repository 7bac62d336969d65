#include "server/manager/model_manager.h"

#include <malloc.h>

#include <algorithm>
#include <set>
#include <thread>

#include "server/core/logging.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/shape_padding.h"
#include "server/batching/warmup.h"

namespace sluice {

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading: return "LOADING";
    case ModelState::kReady: return "READY";
    case ModelState::kUnavailable: return "UNAVAILABLE";
  }
  return "UNAVAILABLE";
}

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

ModelManager::ModelManager(std::vector<RepositoryModel> models, BackendFactory* factory,
                           Options options)
    : factory_(factory), options_(std::move(options)), clock_(options_.clock ? options_.clock : &steady_) {
  const bool explicit_mode = options_.control_mode == ModelControlMode::kExplicit;
  const std::set<std::string> startup(options_.startup_models.begin(), options_.startup_models.end());
  for (RepositoryModel& model : models) {
    Entry entry;
    entry.wanted = !explicit_mode || startup.count("*") > 0 || startup.count(model.name) > 0;
    if (entry.wanted) {
      entry.versions = LoadingSlots(model);
    } else {
      entry.reason = "not loaded (--model-control-mode explicit: load it with RepositoryModelLoad)";
    }
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

StatusOr<std::shared_ptr<Scheduler>> ModelManager::LoadVersion(const RepositoryModel& model,
                                                               const std::filesystem::path& file,
                                                               std::shared_ptr<ModelStats> stats,
                                                               std::string* device_description,
                                                               ModelTuning* tuning) {
  // Without INTRA_OP_THREAD_COUNT, the CPU instances of all models share the cores: more
  // OpenMP threads than cores makes libgomp stop spinning and every parallel region pays a
  // futex wake-up (measured: a 784-512-512-10 MLP forward 74 us -> 250 us on 2 cores).
  ModelSpec spec = model.spec;
  if (spec.intra_op_threads == 0) spec.intra_op_threads = default_intra_op_threads_;
  const ShapePlan plan = ComputeShapePlan(spec);
  const CudnnBenchmarkDecision decision = DecideCudnnBenchmark(options_.cudnn_benchmark, spec, plan);
  spec.cudnn_benchmark = decision.benchmark;
  tuning->cudnn_benchmark = decision.benchmark;
  tuning->cudnn_reason = decision.reason;
  tuning->shapes_finite = plan.finite;
  tuning->shape_count = plan.shapes.size();
  // Built before the instances load, so that a bad model_warmup sample fails fast. --warmup
  // false skips the model_warmup samples too.
  std::vector<WarmupRequest> warmup;
  if (options_.warmup) {
    SLUICE_ASSIGN_OR_RETURN(warmup, BuildWarmupRequests(spec, plan, model.directory));
  }
  std::vector<std::unique_ptr<ModelBackend>> instances;
  std::vector<std::string> devices;
  for (const InstanceGroupSpec& group : spec.instance_groups) {
    SLUICE_ASSIGN_OR_RETURN(
        const DeviceDecision device_decision,
        DecideDevice(options_.device_policy, group.kind, factory_->CudaUsable()));
    if (device_decision.fell_back_to_cpu) {
      spdlog::warn("event=device_fallback model={} reason=\"instance_group asks for KIND_GPU but no "
                   "CUDA GPU is usable; running on the CPU (--device cuda makes this an error)\"",
                   model.name);
    }
    std::vector<Device> targets;
    if (!device_decision.use_cuda) {
      targets.push_back(Device{});
    } else if (group.gpus.empty()) {
      for (int gpu = 0; gpu < factory_->CudaDeviceCount(); ++gpu) targets.push_back(Device{true, gpu});
    } else {
      for (int gpu : group.gpus) {
        if (gpu >= factory_->CudaDeviceCount()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "instance_group asks for GPU ", gpu, " but ", factory_->CudaDeviceCount(),
              " GPU(s) are visible"));
        }
        targets.push_back(Device{true, gpu});
      }
    }
    for (const Device& device : targets) {
      for (int i = 0; i < group.count; ++i) {
        SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ModelBackend> instance,
                                factory_->Load(spec, file, device));
        instances.push_back(std::move(instance));
        devices.push_back(device.ToString());
      }
    }
  }
  tuning->convolutions = instances.front()->Tuning();
  std::set<std::string> distinct(devices.begin(), devices.end());
  *device_description = absl::StrCat(absl::StrJoin(distinct, ","), " x", devices.size());
  std::function<void(const Status&)> on_fatal;
  if (options_.liveness != nullptr) {
    on_fatal = [liveness = options_.liveness, name = model.name](const Status& status) {
      spdlog::critical("event=fatal_device_error model={} reason=\"{}\" action=\"server is no longer "
                       "live; restart it\"", name, status.message());
      liveness->ReportFatal(status);
    };
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                          MakeScheduler(spec, std::move(instances), stats, std::move(on_fatal)));
  if (spec.padding.enabled()) {
    scheduler = std::make_unique<PaddingScheduler>(spec, std::move(scheduler), std::move(stats));
  }
  if (!warmup.empty()) {
    const auto started = std::chrono::steady_clock::now();
    StatusOr<WarmupReport> report = scheduler->WarmUp(std::move(warmup), &stopping_);
    tuning->warmup_time = std::chrono::steady_clock::now() - started;
    if (!report.ok()) {
      scheduler->Stop();
      return report.status();
    }
    tuning->warmup = std::move(report->passes);
  }
  return std::shared_ptr<Scheduler>(std::move(scheduler));
}

StatusOr<std::unique_ptr<Scheduler>> ModelManager::MakeScheduler(
    const ModelSpec& spec, std::vector<std::unique_ptr<ModelBackend>> instances,
    std::shared_ptr<ModelStats> stats, std::function<void(const Status&)> on_fatal) const {
  const DynamicBatchingSpec& batching = spec.dynamic_batching;
  // Without dynamic_batching each request runs alone, with the batch size it sent (as Triton
  // does), through the same queue: the same caps, expiry timer and messages.
  DynamicBatcher::Options batcher_options;
  batcher_options.queue.one_request_per_batch = !batching.enabled;
  batcher_options.queue.max_batch_size = std::max(1, spec.max_batch_size);
  batcher_options.queue.preferred_batch_sizes = batching.preferred_batch_sizes;
  batcher_options.queue.max_queue_delay = std::chrono::microseconds(batching.max_queue_delay_us);
  batcher_options.queue.max_requests =
      batching.max_queue_size > 0 ? batching.max_queue_size : options_.max_queue_size;
  batcher_options.queue.max_bytes = batching.max_queued_bytes;
  batcher_options.queue.max_groups = batching.max_shape_groups;
  batcher_options.queue.pad_to_preferred = batching.pad_to_preferred;
  batcher_options.queue.server_budget = options_.queued_bytes_budget;
  batcher_options.clock = clock_;
  batcher_options.stats = std::move(stats);
  batcher_options.on_fatal = std::move(on_fatal);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<DynamicBatcher> batcher,
                          DynamicBatcher::Create(spec, std::move(instances), std::move(batcher_options)));
  return std::unique_ptr<Scheduler>(std::move(batcher));
}

int ModelManager::CountCpuInstances() const {
  int instances = 0;
  for (const auto& [name, entry] : entries_) {
    if (!entry.wanted || !entry.model->status.ok()) continue;
    for (const InstanceGroupSpec& group : entry.model->spec.instance_groups) {
      auto decision = DecideDevice(options_.device_policy, group.kind, factory_->CudaUsable());
      if (decision.ok() && !decision->use_cuda) {
        instances += group.count * static_cast<int>(entry.model->versions.size());
      }
    }
  }
  return instances;
}

Status ModelManager::LoadAll() {
  std::lock_guard<std::mutex> control(control_mutex_);
  if (options_.device_policy == DevicePolicy::kCuda && !factory_->CudaUsable()) {
    SLUICE_RETURN_IF_ERROR(DecideDevice(options_.device_policy, InstanceKind::kGpu, false).status());
  }
  std::vector<std::shared_ptr<const RepositoryModel>> wanted;
  int cpu_instances = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cpu_instances = CountCpuInstances();
    for (const auto& [name, entry] : entries_) {
      if (entry.wanted) wanted.push_back(entry.model);
    }
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  default_intra_op_threads_ = std::max(1, cores / std::max(1, cpu_instances));
  spdlog::info("event=cpu_threads cores={} cpu_instances={} default_intra_op_threads={}", cores,
               cpu_instances, default_intra_op_threads_.load());
  if (options_.observer != nullptr) {
    for (const auto& model : wanted) {
      for (const auto& [version, path] : model->versions) {
        options_.observer->OnState(model->name, version, ModelState::kLoading);
      }
    }
  }
  // Install logs each model's failures; at start-up they leave the model UNAVAILABLE and the
  // others load.
  for (const auto& model : wanted) Install(model).IgnoreError();
  std::lock_guard<std::mutex> lock(mutex_);
  loaded_ = true;
  return absl::OkStatus();
}

ModelManager::LoadedVersion ModelManager::LoadOneVersion(const std::shared_ptr<const RepositoryModel>& shared,
                                                         int64_t version) {
  const RepositoryModel& model = *shared;
  LoadedVersion loaded;
  loaded.version = version;
  if (stopping_) {
    loaded.status = absl::UnavailableError("the server is shutting down");
    return loaded;
  }
  const auto started = std::chrono::steady_clock::now();
  auto stats = std::make_shared<ModelStats>(
      options_.observer != nullptr ? options_.observer->SinkFor(model.name, version) : nullptr);
  loaded.tuning.name = model.name;
  loaded.tuning.version = version;
  std::string device;
  StatusOr<std::shared_ptr<Scheduler>> scheduler =
      LoadVersion(model, model.versions.at(version), stats, &device, &loaded.tuning);
  loaded.load_time = std::chrono::steady_clock::now() - started;
  if (scheduler.ok()) {
    loaded.handle = std::make_shared<ModelHandle>(shared, version, std::move(device), *std::move(scheduler),
                                                  std::move(stats), clock_);
  } else {
    loaded.status = scheduler.status();
  }
  return loaded;
}

Status ModelManager::Install(std::shared_ptr<const RepositoryModel> model) {
  const std::string name = model->name;
  bool serving = false;  // an old version serves (and keeps serving if this fails)
  std::vector<int64_t> serving_versions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = entries_[name];
    entry.tried_fingerprint = model->fingerprint;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) serving_versions.push_back(slot.version);
    }
    serving = !serving_versions.empty();
    if (!serving) {
      // Nothing to keep: the index shows the new versions loading (or the model's error) now.
      entry.model = model;
      entry.wanted = true;
      entry.reason = model->status.ok() ? "" : std::string(model->status.message());
      entry.versions = LoadingSlots(*model);
    }
  }
  const std::string kept =
      serving ? absl::StrCat("; version(s) ", absl::StrJoin(serving_versions, ","), " keep serving") : "";
  if (!model->status.ok()) {
    spdlog::error("event=model_unavailable model={} reason=\"{}{}\"", name, model->status.message(), kept);
    return Status(model->status.code(), absl::StrCat("model '", name, "' cannot load: ",
                                                     model->status.message(), kept));
  }
  if (!serving && options_.observer != nullptr) {
    for (const auto& [version, path] : model->versions) {
      options_.observer->OnState(name, version, ModelState::kLoading);
    }
  }
  std::vector<LoadedVersion> loaded;
  for (const auto& [version, path] : model->versions) loaded.push_back(LoadOneVersion(model, version));

  const LoadedVersion* failed = nullptr;
  for (const LoadedVersion& each : loaded) {
    if (!each.status.ok() && failed == nullptr) failed = &each;
  }
  if (serving && failed != nullptr) {
    const Status status(failed->status.code(),
                        absl::StrCat("model '", name, "' was not reloaded: version ", failed->version,
                                     ": ", failed->status.message(), kept));
    spdlog::error("event=model_reload_failed model={} reason=\"{}\"", name, status.message());
    for (LoadedVersion& each : loaded) {
      if (each.handle) each.handle->Stop();
    }
    return status;
  }

  std::vector<VersionSlot> old;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping = stopping_;
    Entry& entry = entries_[name];
    old = std::move(entry.versions);
    entry.versions.clear();
    entry.model = model;
    entry.wanted = true;
    entry.reason.clear();
    for (LoadedVersion& each : loaded) {
      if (each.handle && stopping) {
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
      } else {
        slot.state = ModelState::kUnavailable;
        slot.reason = std::string(each.status.message());
      }
      entry.versions.push_back(std::move(slot));
    }
  }
  for (const LoadedVersion& each : loaded) {
    if (each.handle) {
      LogTuning(each.tuning);
      if (options_.observer != nullptr) {
        options_.observer->OnReady(each.tuning, each.load_time);
        options_.observer->OnState(name, each.version, ModelState::kReady);
      }
      spdlog::info("event=model_ready model={} version={} device={} batching={} load_ms={}{}", name,
                   each.version, each.handle->device(), model->spec.dynamic_batching.enabled ? "dynamic" : "none",
                   std::chrono::duration_cast<std::chrono::milliseconds>(each.load_time).count(),
                   serving ? " reloaded=true" : "");
    } else {
      if (options_.observer != nullptr) options_.observer->OnState(name, each.version, ModelState::kUnavailable);
      spdlog::error("event=model_unavailable model={} version={} reason=\"{}\"", name, each.version,
                    each.status.message());
    }
  }
  if (options_.observer != nullptr) {
    for (const VersionSlot& slot : old) {
      if (!model->versions.count(slot.version)) {
        options_.observer->OnState(name, slot.version, ModelState::kUnavailable);
      }
    }
  }
  Retire(name, std::move(old));
  if (failed != nullptr) {
    return Status(failed->status.code(), absl::StrCat("model '", name, "' version ", failed->version,
                                                      " cannot load: ", failed->status.message()));
  }
  return absl::OkStatus();
}

void ModelManager::Retire(const std::string& name, std::vector<VersionSlot> old) {
  bool released = false;
  for (VersionSlot& slot : old) {
    if (!slot.handle) continue;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      retiring_.push_back(slot.handle);
      stopping = stopping_;  // else Stop will see it in retiring_ and end the wait
    }
    // Nothing hands this version out any more, and every request given it holds a reference
    // (ModelHandle::Acquire) until it is answered: once none is left, nothing is queued or
    // running on it.
    const auto started = std::chrono::steady_clock::now();
    if (!stopping) slot.handle->WaitIdle();
    slot.handle->Stop();
    slot.handle.reset();  // normally the last reference: the instances are destroyed here
    released = true;
    spdlog::info("event=model_version_retired model={} version={} drain_ms={}", name, slot.version,
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count());
  }
  if (!released) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    retiring_.erase(std::remove_if(retiring_.begin(), retiring_.end(),
                                   [](const std::weak_ptr<ModelHandle>& weak) { return weak.expired(); }),
                    retiring_.end());
  }
  // The instances' memory goes back to where it came from: LibTorch's CUDA cache to the driver,
  // glibc's free lists to the kernel. Without this, RSS keeps the high-water mark of every load.
  factory_->ReleaseCachedMemory();
  malloc_trim(0);
}

void ModelManager::SetChangeListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  change_listener_ = std::move(listener);
}

void ModelManager::NotifyChange() {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    listener = change_listener_;
  }
  if (listener) listener();
}

Status ModelManager::LoadModel(const std::string& name) {
  if (options_.source == nullptr) {
    return absl::FailedPreconditionError("model control has no model repository to read from");
  }
  Status status;
  {
    std::lock_guard<std::mutex> control(control_mutex_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    StatusOr<RepositoryModel> read = options_.source->Read(name);
    if (!read.ok()) return read.status();
    spdlog::info("event=model_load model={}", name);
    status = Install(std::make_shared<const RepositoryModel>(*std::move(read)));
  }
  NotifyChange();
  return status;
}

Status ModelManager::UnloadModel(const std::string& name) {
  Status status;
  {
    std::lock_guard<std::mutex> control(control_mutex_);
    status = Unload(name, /*forget=*/false);
  }
  NotifyChange();
  return status;
}

Status ModelManager::Unload(const std::string& name, bool forget) {
  std::vector<VersionSlot> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
    Entry& entry = it->second;
    old = std::move(entry.versions);
    entry.versions.clear();
    entry.wanted = false;
    entry.reason = "unloaded";
    for (const VersionSlot& slot : old) {
      VersionSlot unloaded;
      unloaded.version = slot.version;
      unloaded.state = ModelState::kUnavailable;
      unloaded.reason = "unloaded";
      entry.versions.push_back(std::move(unloaded));
    }
    if (forget) entries_.erase(it);
  }
  const bool any = std::any_of(old.begin(), old.end(), [](const VersionSlot& slot) { return slot.handle != nullptr; });
  if (options_.observer != nullptr) {
    for (const VersionSlot& slot : old) options_.observer->OnState(name, slot.version, ModelState::kUnavailable);
  }
  if (any) spdlog::info("event=model_unload model={}{}", name, forget ? " reason=\"removed from the repository\"" : "");
  Retire(name, std::move(old));
  return absl::OkStatus();
}

Status ModelManager::PollRepository() {
  if (options_.source == nullptr) {
    return absl::FailedPreconditionError("model control has no model repository to read from");
  }
  std::unique_lock<std::mutex> control(control_mutex_);
  if (stopping_) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(std::vector<RepositoryModel> models, options_.source->Scan());
  std::set<std::string> present;
  std::vector<std::shared_ptr<const RepositoryModel>> changed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (RepositoryModel& model : models) {
      present.insert(model.name);
      auto it = entries_.find(model.name);
      if (it != entries_.end() && it->second.tried_fingerprint == model.fingerprint) continue;
      changed.push_back(std::make_shared<const RepositoryModel>(std::move(model)));
    }
  }
  for (const auto& model : changed) {
    if (stopping_) break;
    spdlog::info("event=model_changed model={} action=load", model->name);
    Install(model).IgnoreError();  // logged by Install
  }
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, entry] : entries_) {
      if (!present.count(name)) gone.push_back(name);
    }
  }
  for (const std::string& name : gone) Unload(name, /*forget=*/true).IgnoreError();
  if (!changed.empty() || !gone.empty()) {
    control.unlock();
    NotifyChange();
  }
  return absl::OkStatus();
}

void ModelManager::LogTuning(const ModelTuning& tuning) {
  const ConvolutionTuning& convolutions = tuning.convolutions;
  spdlog::info("event=cudnn_benchmark model={} version={} benchmark={} reason=\"{}\" convolutions={} "
               "rewritten={}", tuning.name, tuning.version, tuning.cudnn_benchmark ? "on" : "off",
               tuning.cudnn_reason, convolutions.convolutions, convolutions.rewritten);
  if (!convolutions.fallback.empty()) {
    spdlog::warn("event=cudnn_benchmark_fallback model={} version={} reason=\"{}\"", tuning.name,
                 tuning.version, convolutions.fallback);
  }
  for (const WarmupPass& pass : tuning.warmup) {
    spdlog::debug("event=warmup_pass model={} version={} instance={} shape=\"{}\" first_ms={:.3f} "
                  "last_ms={:.3f}", tuning.name, tuning.version, pass.instance, pass.label,
                  std::chrono::duration<double, std::milli>(pass.first_run).count(),
                  std::chrono::duration<double, std::milli>(pass.last_run).count());
  }
  std::set<int> instances;
  for (const WarmupPass& pass : tuning.warmup) instances.insert(pass.instance);
  spdlog::info("event=warmup model={} version={} shapes={} instances={} pairs={} warmup_ms={}",
               tuning.name, tuning.version, tuning.shapes_finite ? std::to_string(tuning.shape_count) : "variable",
               instances.size(), tuning.warmup.size(),
               std::chrono::duration_cast<std::chrono::milliseconds>(tuning.warmup_time).count());
}

std::vector<ModelTuning> ModelManager::Tunings() const {
  std::vector<ModelTuning> tunings;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, entry] : entries_) {
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) tunings.push_back(slot.tuning);
    }
  }
  return tunings;
}

StatusOr<std::shared_ptr<const RepositoryModel>> ModelManager::FindModel(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  return it->second.model;
}

StatusOr<std::shared_ptr<ModelHandle>> ModelManager::Find(const std::string& name, const std::string& version) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  const Entry& entry = it->second;
  if (entry.versions.empty()) {
    const std::string why = !entry.reason.empty() ? entry.reason : std::string(entry.model->status.message());
    return absl::UnavailableError(absl::StrCat("model '", name, "' is not ready: ", why));
  }
  const VersionSlot* chosen = nullptr;
  if (version.empty()) {
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) chosen = &slot;  // ascending: the last is the newest
    }
    if (chosen == nullptr) {
      const VersionSlot& newest = entry.versions.back();
      return absl::UnavailableError(absl::StrCat(
          "model '", name, "' has no ready version",
          newest.reason.empty() ? " yet (still loading)" : absl::StrCat(": ", newest.reason)));
    }
  } else {
    int64_t wanted = 0;
    if (!absl::SimpleAtoi(version, &wanted)) {
      return absl::NotFoundError(absl::StrCat("model '", name, "' has no version '", version,
                                              "' (versions are positive integers)"));
    }
    for (const VersionSlot& slot : entry.versions) {
      if (slot.version == wanted) chosen = &slot;
    }
    if (chosen == nullptr) {
      return absl::NotFoundError(absl::StrCat("model '", name, "' has no version ", wanted,
                                              " loaded (see its version_policy)"));
    }
    if (chosen->state != ModelState::kReady) {
      return absl::UnavailableError(absl::StrCat(
          "model '", name, "' version ", wanted, " is not ready",
          chosen->reason.empty() ? " (still loading)" : absl::StrCat(": ", chosen->reason)));
    }
  }
  return chosen->handle->Acquire();
}

std::vector<int64_t> ModelManager::ReadyVersions(const std::string& name) const {
  std::vector<int64_t> versions;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return versions;
  for (const VersionSlot& slot : it->second.versions) {
    if (slot.state == ModelState::kReady) versions.push_back(slot.version);
  }
  return versions;
}

std::vector<ModelIndexEntry> ModelManager::Index() const {
  std::vector<ModelIndexEntry> index;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, entry] : entries_) {
    if (entry.versions.empty()) {
      const std::string why = !entry.reason.empty() ? entry.reason : std::string(entry.model->status.message());
      index.push_back({name, "", ModelState::kUnavailable, why});
      continue;
    }
    for (const VersionSlot& slot : entry.versions) {
      index.push_back({name, std::to_string(slot.version), slot.state, slot.reason});
    }
  }
  return index;
}

StatusOr<std::vector<VersionStatistics>> ModelManager::Statistics(const std::string& name,
                                                                  const std::string& version) const {
  if (!name.empty()) SLUICE_RETURN_IF_ERROR(FindModel(name).status());
  int64_t wanted = 0;
  if (!version.empty() && !absl::SimpleAtoi(version, &wanted)) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' has no version '", version, "'"));
  }
  std::vector<VersionStatistics> result;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [model_name, entry] : entries_) {
    if (!name.empty() && model_name != name) continue;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady || (wanted != 0 && slot.version != wanted)) continue;
      result.push_back({model_name, slot.version, slot.handle->Statistics()});
    }
  }
  if (!name.empty() && wanted != 0 && result.empty()) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' has no ready version ", wanted));
  }
  return result;
}

bool ModelManager::AllReady() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loaded_) return false;
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
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
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

RepositoryPoller::RepositoryPoller(ModelManager* manager, Duration interval)
    : manager_(manager), interval_(interval) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
      lock.unlock();
      if (Status status = manager_->PollRepository(); !status.ok()) {
        spdlog::error("event=repository_poll_failed reason=\"{}\"", status.message());
      }
      lock.lock();
    }
  });
}

RepositoryPoller::~RepositoryPoller() { Stop(); }

void RepositoryPoller::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace sluice
