#include "server/manager/model_manager.h"

#include <algorithm>
#include <set>
#include <thread>

#include "server/core/logging.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/shape_padding.h"
#include "server/batching/unbatched_scheduler.h"
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

ModelManager::ModelManager(std::vector<RepositoryModel> models, BackendFactory* factory,
                           Options options)
    : factory_(factory), options_(std::move(options)), clock_(options_.clock ? options_.clock : &steady_) {
  for (RepositoryModel& model : models) {
    Entry entry;
    for (const auto& [version, path] : model.versions) {
      VersionSlot slot;
      slot.version = version;
      entry.versions.push_back(std::move(slot));
    }
    entry.model = std::move(model);
    entries_.push_back(std::move(entry));
  }
}

ModelManager::~ModelManager() { Stop(); }

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
  if (!batching.enabled) {
    UnbatchedScheduler::Options scheduler_options;
    scheduler_options.max_queue_size = options_.max_queue_size;
    scheduler_options.clock = clock_;
    scheduler_options.stats = std::move(stats);
    scheduler_options.on_fatal = std::move(on_fatal);
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<UnbatchedScheduler> scheduler,
                            UnbatchedScheduler::Create(std::move(instances), std::move(scheduler_options)));
    return std::unique_ptr<Scheduler>(std::move(scheduler));
  }
  DynamicBatcher::Options batcher_options;
  batcher_options.queue.max_batch_size = spec.max_batch_size;
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
  for (const Entry& entry : entries_) {
    if (!entry.model.status.ok()) continue;
    for (const InstanceGroupSpec& group : entry.model.spec.instance_groups) {
      auto decision = DecideDevice(options_.device_policy, group.kind, factory_->CudaUsable());
      if (decision.ok() && !decision->use_cuda) {
        instances += group.count * static_cast<int>(entry.versions.size());
      }
    }
  }
  return instances;
}

Status ModelManager::LoadAll() {
  if (options_.device_policy == DevicePolicy::kCuda && !factory_->CudaUsable()) {
    SLUICE_RETURN_IF_ERROR(DecideDevice(options_.device_policy, InstanceKind::kGpu, false).status());
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int cpu_instances = CountCpuInstances();
  default_intra_op_threads_ = std::max(1, cores / std::max(1, cpu_instances));
  spdlog::info("event=cpu_threads cores={} cpu_instances={} default_intra_op_threads={}", cores,
               cpu_instances, default_intra_op_threads_);
  if (options_.observer != nullptr) {
    for (const Entry& entry : entries_) {
      for (const VersionSlot& slot : entry.versions) {
        options_.observer->OnState(entry.model.name, slot.version, ModelState::kLoading);
      }
    }
  }
  for (Entry& entry : entries_) {
    const RepositoryModel& model = entry.model;
    if (!model.status.ok()) {
      spdlog::error("event=model_unavailable model={} reason=\"{}\"", model.name,
                    model.status.message());
      continue;
    }
    for (size_t i = 0; i < entry.versions.size(); ++i) {
      const int64_t version = entry.versions[i].version;
      if (stopping_) {
        std::lock_guard<std::mutex> lock(mutex_);
        entry.versions[i].state = ModelState::kUnavailable;
        entry.versions[i].reason = "the server is shutting down";
        if (options_.observer != nullptr) options_.observer->OnState(model.name, version, ModelState::kUnavailable);
        continue;
      }
      const auto started = std::chrono::steady_clock::now();
      std::string device;
      auto stats = std::make_shared<ModelStats>(
          options_.observer != nullptr ? options_.observer->SinkFor(model.name, version) : nullptr);
      ModelTuning tuning;
      tuning.name = model.name;
      tuning.version = version;
      StatusOr<std::shared_ptr<Scheduler>> scheduler =
          LoadVersion(model, model.versions.at(version), stats, &device, &tuning);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - started).count();
      std::unique_lock<std::mutex> lock(mutex_);
      VersionSlot& slot = entry.versions[i];
      if (scheduler.ok() && stopping_) {
        // Stop ran while this version loaded and could not see its scheduler: stop it here.
        lock.unlock();
        (*scheduler)->Stop();
        lock.lock();
        scheduler = absl::UnavailableError("the server is shutting down");
      }
      if (scheduler.ok()) {
        slot.state = ModelState::kReady;
        slot.scheduler = *std::move(scheduler);
        slot.stats = std::move(stats);
        slot.device = device;
        LogTuning(tuning);
        if (options_.observer != nullptr) {
          options_.observer->OnReady(tuning, std::chrono::steady_clock::now() - started);
          options_.observer->OnState(model.name, version, ModelState::kReady);
        }
        slot.tuning = std::move(tuning);
        spdlog::info("event=model_ready model={} version={} device={} batching={} load_ms={}",
                     model.name, version, device,
                     model.spec.dynamic_batching.enabled ? "dynamic" : "none", ms);
      } else {
        slot.state = ModelState::kUnavailable;
        slot.reason = std::string(scheduler.status().message());
        if (options_.observer != nullptr) options_.observer->OnState(model.name, version, ModelState::kUnavailable);
        spdlog::error("event=model_unavailable model={} version={} reason=\"{}\"", model.name,
                      version, slot.reason);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  loaded_ = true;
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
  for (const Entry& entry : entries_) {
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state == ModelState::kReady) tunings.push_back(slot.tuning);
    }
  }
  return tunings;
}

const ModelManager::Entry* ModelManager::FindEntry(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.model.name == name) return &entry;
  }
  return nullptr;
}

StatusOr<const RepositoryModel*> ModelManager::FindModel(const std::string& name) const {
  const Entry* entry = FindEntry(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  }
  return &entry->model;
}

StatusOr<ServableModel> ModelManager::Find(const std::string& name, const std::string& version) const {
  const Entry* entry = FindEntry(name);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!entry->model.status.ok()) {
    return absl::UnavailableError(absl::StrCat("model '", name, "' is not ready: ",
                                               entry->model.status.message()));
  }
  const VersionSlot* chosen = nullptr;
  if (version.empty()) {
    for (const VersionSlot& slot : entry->versions) {
      if (slot.state == ModelState::kReady) chosen = &slot;  // ascending: the last is the newest
    }
    if (chosen == nullptr) {
      const VersionSlot& newest = entry->versions.back();
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
    for (const VersionSlot& slot : entry->versions) {
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
  return ServableModel{&entry->model, chosen->version, chosen->device, chosen->scheduler, chosen->stats};
}

std::vector<int64_t> ModelManager::ReadyVersions(const std::string& name) const {
  std::vector<int64_t> versions;
  const Entry* entry = FindEntry(name);
  if (entry == nullptr) return versions;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const VersionSlot& slot : entry->versions) {
    if (slot.state == ModelState::kReady) versions.push_back(slot.version);
  }
  return versions;
}

std::vector<ModelIndexEntry> ModelManager::Index() const {
  std::vector<ModelIndexEntry> index;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (!entry.model.status.ok()) {
      index.push_back({entry.model.name, "", ModelState::kUnavailable,
                       std::string(entry.model.status.message())});
      continue;
    }
    for (const VersionSlot& slot : entry.versions) {
      index.push_back({entry.model.name, std::to_string(slot.version), slot.state, slot.reason});
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
  for (const Entry& entry : entries_) {
    if (!name.empty() && entry.model.name != name) continue;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady || (wanted != 0 && slot.version != wanted)) continue;
      result.push_back({entry.model.name, slot.version, slot.stats->Snapshot()});
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
  for (const Entry& entry : entries_) {
    if (!entry.model.status.ok()) return false;
    for (const VersionSlot& slot : entry.versions) {
      if (slot.state != ModelState::kReady) return false;
    }
  }
  return true;
}

void ModelManager::Stop() {
  std::vector<std::shared_ptr<Scheduler>> schedulers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (const Entry& entry : entries_) {
      for (const VersionSlot& slot : entry.versions) {
        if (slot.scheduler) schedulers.push_back(slot.scheduler);
      }
    }
  }
  for (const auto& scheduler : schedulers) scheduler->Stop();
}

}  // namespace sluice
