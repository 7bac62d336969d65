#include "server/manager/version_loader.h"

#include "server/manager/caching_scheduler.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "server/batching/batch_sizes.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/sequence_batcher.h"
#include "server/batching/shape_padding.h"
#include "server/batching/shape_plan.h"
#include "server/batching/warmup.h"
#include "server/core/logging.h"
#include "server/manager/cudnn_measurement.h"
#include "server/manager/ensemble_scheduler.h"

namespace sluice {

VersionLoader::VersionLoader(BackendFactory* factory, Options options)
    : factory_(factory),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &steady_) {}

Status VersionLoader::CheckDevicePolicy() const {
  if (options_.device_policy != DevicePolicy::kCuda || factory_->CudaUsable())
    return absl::OkStatus();
  return DecideDevice(options_.device_policy, InstanceKind::kGpu, false).status();
}

int VersionLoader::SplitCpuThreads(
    const std::vector<std::shared_ptr<const RepositoryModel>>& models) {
  int cpu_instances = 0;
  for (const auto& model : models) {
    if (!model->status.ok()) continue;
    for (const InstanceGroupSpec& group : model->spec.instance_groups) {
      auto decision = DecideDevice(options_.device_policy, group.kind, factory_->CudaUsable());
      if (decision.ok() && !decision->use_cuda) {
        cpu_instances += group.count * static_cast<int>(model->versions.size());
      }
    }
  }
  const int cpus = options_.cpus > 0
                       ? options_.cpus
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cpus / std::max(1, cpu_instances));
  default_intra_op_threads_ = threads;
  spdlog::info(
      "event=cpu_threads cpus={} limit=\"{}\" cpu_instances={} default_intra_op_threads={}", cpus,
      options_.cpu_limit.empty() ? "cores" : options_.cpu_limit, cpu_instances, threads);
  return threads;
}

LoadedVersion VersionLoader::Load(const std::shared_ptr<const RepositoryModel>& model,
                                  int64_t version, const std::atomic<bool>* abandon) const {
  LoadedVersion loaded;
  loaded.version = version;
  loaded.tuning.name = model->name;
  loaded.tuning.version = version;
  if (abandon != nullptr && *abandon) {
    loaded.status = absl::UnavailableError("the server is shutting down");
    return loaded;
  }
  const auto started = std::chrono::steady_clock::now();
  auto stats = std::make_shared<ModelStats>(
      options_.observer != nullptr ? options_.observer->SinkFor(model->name, version) : nullptr);
  std::string device;
  // The host and every GPU an instance goes on, measured from here to the end of the warm-up.
  std::vector<Device> devices{Device{}};
  for (const Device& each : DevicesOf(model->spec)) {
    if (each.cuda) devices.push_back(each);
  }
  std::vector<uint64_t> before;
  std::vector<bool> peak_reset;
  for (const Device& each : devices) {
    peak_reset.push_back(factory_->ResetPeakMemory(each));
    before.push_back(factory_->ReadMemory(each).current);
  }
  QueueSharing* queue = nullptr;
  StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Compose(*model, version, stats, &device, &loaded.tuning, &queue, abandon);
  loaded.load_time = std::chrono::steady_clock::now() - started;
  for (size_t i = 0; i < devices.size(); ++i) {
    const MemoryReading after = factory_->ReadMemory(devices[i]);
    // Without a fresh peak (clear_refs refused), the peak is the process's lifetime one: the
    // growth to now is the honest figure.
    const uint64_t peak = peak_reset[i] ? after.peak : after.current;
    if (scheduler.ok() && peak > before[i]) loaded.memory[devices[i].ToString()] = peak - before[i];
  }
  if (scheduler.ok()) {
    std::unique_ptr<Scheduler> serving = *std::move(scheduler);
    const bool cached = model->spec.response_cache && options_.response_cache != nullptr;
    if (model->spec.response_cache && !cached) {
      spdlog::warn(
          "event=response_cache_off model={} version={} reason=\"config.pbtxt enables "
          "response_cache but "
          "the server has no cache (start it with --cache-config local,size=BYTES); requests run "
          "uncached\"",
          model->name, version);
    } else if (cached) {
      CachingScheduler::Options caching;
      caching.model = model->name;
      for (const TensorSpec& output : model->spec.outputs)
        caching.output_names.push_back(output.name);
      caching.clock = clock_;
      caching.stats = stats;
      caching.cache = options_.response_cache;
      caching.queue = queue;  // the parser refuses a cache on a stateful model: never null here
      serving = std::make_unique<CachingScheduler>(std::move(caching), std::move(serving));
    }
    loaded.handle = std::make_shared<ModelHandle>(
        model, version, std::move(device), std::shared_ptr<Scheduler>(std::move(serving)),
        std::move(stats), clock_, loaded.tuning.batch_sizes, cached);
  } else {
    loaded.status = scheduler.status();
  }
  return loaded;
}

StatusOr<std::vector<Device>> VersionLoader::GroupDevices(const InstanceGroupSpec& group,
                                                          bool* fell_back) const {
  SLUICE_ASSIGN_OR_RETURN(const DeviceDecision decision,
                          DecideDevice(options_.device_policy, group.kind, factory_->CudaUsable()));
  *fell_back = decision.fell_back_to_cpu;
  std::vector<Device> targets;
  if (!decision.use_cuda) {
    targets.push_back(Device{});
  } else if (group.gpus.empty()) {
    for (int gpu = 0; gpu < factory_->CudaDeviceCount(); ++gpu)
      targets.push_back(Device{true, gpu});
  } else {
    for (int gpu : group.gpus) {
      if (gpu >= factory_->CudaDeviceCount()) {
        return absl::InvalidArgumentError(absl::StrCat("instance_group asks for GPU ", gpu, " but ",
                                                       factory_->CudaDeviceCount(),
                                                       " GPU(s) are visible"));
      }
      targets.push_back(Device{true, gpu});
    }
  }
  return targets;
}

std::vector<Device> VersionLoader::DevicesOf(const ModelSpec& spec) const {
  std::vector<Device> devices;
  for (const InstanceGroupSpec& group : spec.instance_groups) {
    bool fell_back = false;
    StatusOr<std::vector<Device>> targets = GroupDevices(group, &fell_back);
    if (!targets.ok()) continue;
    for (const Device& device : *targets) {
      if (std::find(devices.begin(), devices.end(), device) == devices.end())
        devices.push_back(device);
    }
  }
  return devices;
}

StatusOr<std::vector<std::unique_ptr<ModelBackend>>> VersionLoader::LoadInstances(
    const ModelSpec& spec, const std::filesystem::path& file, std::string* device) const {
  std::vector<std::unique_ptr<ModelBackend>> instances;
  std::vector<std::string> devices;
  std::vector<std::pair<Device, int>> per_device;  // instance count per device, first use first
  for (const InstanceGroupSpec& group : spec.instance_groups) {
    bool fell_back = false;
    SLUICE_ASSIGN_OR_RETURN(const std::vector<Device> targets, GroupDevices(group, &fell_back));
    if (fell_back) {
      spdlog::warn(
          "event=device_fallback model={} reason=\"instance_group asks for KIND_GPU but no "
          "CUDA GPU is usable; running on the CPU (--device cuda makes this an error)\"",
          spec.name);
    }
    for (const Device& target : targets) {
      auto same =
          std::find_if(per_device.begin(), per_device.end(),
                       [&](const std::pair<Device, int>& each) { return each.first == target; });
      if (same == per_device.end()) {
        per_device.emplace_back(target, group.count);
      } else {
        same->second += group.count;
      }
    }
  }
  // One call per device: a runtime may share what its instances on one device can share.
  for (const auto& [target, count] : per_device) {
    if (count < 1) continue;
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ModelBackend>> loaded,
                            factory_->LoadInstances(spec, file, target, count));
    for (std::unique_ptr<ModelBackend>& instance : loaded) {
      instances.push_back(std::move(instance));
      devices.push_back(target.ToString());
    }
  }
  const std::set<std::string> distinct(devices.begin(), devices.end());
  *device = absl::StrCat(absl::StrJoin(distinct, ","), " x", devices.size());
  return instances;
}

StatusOr<CudnnBenchmarkDecision> VersionLoader::MeasureCudnn(
    const ModelSpec& spec, const std::filesystem::path& file, const Device& device,
    ModelBackend* off, const std::vector<WarmupRequest>& warmup, ModelTuning* tuning,
    const std::atomic<bool>* abandon) const {
  const auto started = std::chrono::steady_clock::now();
  ModelSpec variant = spec;
  variant.cudnn_benchmark = true;
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ModelBackend>> probe,
                          factory_->LoadInstances(variant, file, device, 1));
  if (probe.empty()) return absl::InternalError("the runtime loaded no probe instance");
  StatusOr<CudnnMeasurement> measurement = MeasureCudnnBenchmark(
      off, probe.front().get(), warmup, *clock_, options_.cudnn_measure_budget, abandon);
  probe.clear();
  if (!measurement.ok()) return measurement.status();
  tuning->cudnn_timings = measurement->shapes;
  tuning->cudnn_device_timed = measurement->device_timed;
  tuning->cudnn_measure_time = std::chrono::steady_clock::now() - started;
  return DecideFromMeasurement(*measurement);
}

StatusOr<std::unique_ptr<Scheduler>> VersionLoader::Compose(
    const RepositoryModel& model, int64_t version, std::shared_ptr<ModelStats> stats,
    std::string* device, ModelTuning* tuning, QueueSharing** queue,
    const std::atomic<bool>* abandon) const {
  *queue = nullptr;
  if (model.spec.is_ensemble()) {
    // No instance of its own: its steps run on their models' (checked against them here).
    if (options_.lookup == nullptr) {
      return absl::FailedPreconditionError("this server loads no ensembles (no model table)");
    }
    *device = "ensemble";
    EnsembleScheduler::Options ensemble;
    ensemble.lookup = options_.lookup;
    ensemble.clock = clock_;
    ensemble.stats = std::move(stats);
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<EnsembleScheduler> scheduler,
                            EnsembleScheduler::Create(model.spec, std::move(ensemble)));
    *queue = scheduler.get();  // the response cache's single flight shares it
    return std::unique_ptr<Scheduler>(std::move(scheduler));
  }
  ModelSpec spec = model.spec;
  if (spec.intra_op_threads == 0) spec.intra_op_threads = default_intra_op_threads_;
  const ShapePlan plan = ComputeShapePlan(spec);
  CudnnBenchmarkDecision decision = DecideCudnnBenchmark(options_.cudnn_benchmark, spec, plan);
  tuning->shapes_finite = plan.finite;
  tuning->shape_count = plan.shapes.size();
  // Built before the instances load, so that a bad model_warmup sample fails fast. --warmup
  // false skips the model_warmup samples too.
  std::vector<WarmupRequest> warmup;
  if (options_.warmup) {
    SLUICE_ASSIGN_OR_RETURN(warmup, BuildWarmupRequests(spec, plan, model.directory));
  }
  // The auto rule's "on" for fixed shapes is measured where it matters: TorchScript (whose graph
  // carries the flag) on a GPU, with the warm-up's shapes to time. The instances load with the
  // mode off; the first one is measured against a probe with it on.
  std::vector<Device> devices;
  if (decision.measurable && !warmup.empty()) devices = DevicesOf(spec);
  const bool measure = !devices.empty() && devices.front().cuda;
  spec.cudnn_benchmark = decision.benchmark && !measure;
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ModelBackend>> instances,
                          LoadInstances(spec, model.versions.at(version), device));
  if (instances.empty()) return absl::InvalidArgumentError("instance_group places no instance");
  // Without a convolution the mode changes nothing: the rule's answer stands, unmeasured.
  if (measure && instances.front()->Tuning().rewritten > 0) {
    SLUICE_ASSIGN_OR_RETURN(decision,
                            MeasureCudnn(spec, model.versions.at(version), devices.front(),
                                         instances.front().get(), warmup, tuning, abandon));
    if (decision.benchmark) {
      instances.clear();
      factory_->ReleaseCachedMemory();
      spec.cudnn_benchmark = true;
      SLUICE_ASSIGN_OR_RETURN(instances, LoadInstances(spec, model.versions.at(version), device));
      if (instances.empty()) return absl::InternalError("the reload placed no instance");
    }
  }
  spec.cudnn_benchmark = decision.benchmark;
  tuning->cudnn_benchmark = decision.benchmark;
  tuning->cudnn_reason = decision.reason;
  tuning->convolutions = instances.front()->Tuning();
  tuning->warnings = instances.front()->Warnings();

  // Without dynamic_batching each request runs alone, with the batch size it sent (as Triton
  // does), through the same queue: the same caps, expiry timer and messages.
  const DynamicBatchingSpec& batching = spec.dynamic_batching;
  DynamicBatcher::Options batcher;
  batcher.queue.one_request_per_batch = !batching.enabled;
  batcher.queue.max_batch_size = std::max(1, spec.max_batch_size);
  batcher.queue.preferred_batch_sizes = batching.preferred_batch_sizes;
  batcher.queue.max_queue_delay = std::chrono::microseconds(batching.max_queue_delay_us);
  auto cap = [&](const QueuePolicySpec& policy) {
    return policy.max_queue_size > 0 ? policy.max_queue_size : options_.max_queue_size;
  };
  batcher.queue.max_requests = cap(batching.default_policy);
  for (const QueuePolicySpec& level : batching.level_policies)
    batcher.queue.level_max_requests.push_back(cap(level));
  batcher.queue.delays = batching.AnyDelay();
  batcher.queue.max_bytes = batching.max_queued_bytes;
  batcher.queue.max_groups = batching.max_shape_groups;
  batcher.queue.pad_to_preferred = batching.pad_to_preferred;
  batcher.queue.server_budget = options_.queued_bytes_budget;
  batcher.queue.latency_target = std::chrono::microseconds(batching.latency_target_us);
  batcher.clock = clock_;
  batcher.stats = stats;
  // cudnnFind on several instances of one GPU at once would time each against the others.
  batcher.warm_up_one_at_a_time = decision.benchmark && absl::StrContains(*device, "cuda");
  // A GPU instance's worker waits for the device through its forward pass: the host's assembly of
  // the next batch can go on meanwhile. A CPU instance's forward has the CPUs busy already. With
  // several instances one assembles while another computes, and staging ahead as well pulls rows
  // into full batches tied to one instance that the others' batches then lack.
  if (!batching.enabled) {
    tuning->stage_ahead_reason = "no dynamic batching";
  } else if (batching.stage_ahead) {
    batcher.stage_ahead = *batching.stage_ahead;
    tuning->stage_ahead_reason = "set for this model (sluice.stage_ahead)";
  } else if (instances.size() > 1) {
    tuning->stage_ahead_reason = "several instances";
  } else if (!absl::StrContains(*device, "cuda")) {
    tuning->stage_ahead_reason = "a CPU instance";
  } else {
    batcher.stage_ahead = true;
    tuning->stage_ahead_reason = "one GPU instance";
  }
  tuning->stage_ahead = batcher.stage_ahead;
  if (options_.liveness != nullptr) {
    batcher.on_fatal = [liveness = options_.liveness, name = model.name](const Status& status) {
      spdlog::critical(
          "event=fatal_device_error model={} reason=\"{}\" action=\"server is no longer "
          "live; restart it\"",
          name, status.message());
      liveness->ReportFatal(status);
    };
  }
  std::unique_ptr<Scheduler> scheduler;
  if (spec.sequence_batching.enabled) {
    SequenceBatcher::Options sequences;
    sequences.clock = clock_;
    sequences.stats = batcher.stats;
    sequences.on_fatal = batcher.on_fatal;
    sequences.warm_up_one_at_a_time = batcher.warm_up_one_at_a_time;
    sequences.max_requests = options_.max_queue_size;
    sequences.max_bytes = batcher.queue.max_bytes;
    sequences.server_budget = batcher.queue.server_budget;
    SLUICE_ASSIGN_OR_RETURN(
        scheduler, SequenceBatcher::Create(spec, std::move(instances), std::move(sequences)));
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<DynamicBatcher> dynamic,
                            DynamicBatcher::Create(spec, std::move(instances), std::move(batcher)));
    *queue = dynamic.get();
    scheduler = std::move(dynamic);
  }
  if (spec.padding.enabled()) {
    scheduler = std::make_unique<PaddingScheduler>(spec, std::move(scheduler), std::move(stats));
  }
  if (!warmup.empty()) {
    const auto started = std::chrono::steady_clock::now();
    StatusOr<WarmupReport> report = scheduler->WarmUp(std::move(warmup), abandon);
    tuning->warmup_time = std::chrono::steady_clock::now() - started;
    if (!report.ok()) {
      scheduler->Stop();
      return report.status();
    }
    tuning->warmup = std::move(report->passes);
  }
  const std::string auto_off = AutoBatchSizesOffReason(spec, plan, options_.warmup);
  if (auto_off.empty()) {
    tuning->batch_sizes = spec.dynamic_batching.pad_to_preferred
                              ? ChoosePaddedBatchSizes(tuning->warmup, SchedulableBatchSizes(spec))
                              : ChooseBatchSizes(tuning->warmup);
    if (tuning->batch_sizes.measured) scheduler->SetBatchSizeLadder(tuning->batch_sizes.sizes);
  } else {
    tuning->batch_sizes.off_reason = auto_off;
  }
  tuning->caller_runs = ChooseCallerRuns(spec, tuning->warmup);
  if (tuning->caller_runs.on && options_.model_cpus_split) {
    tuning->caller_runs.on = false;
    tuning->caller_runs.reason = "--model-cpus keeps forward passes off the front ends' CPUs";
  }
  if (tuning->caller_runs.on) scheduler->SetCallerRuns(true);
  return scheduler;
}

void VersionLoader::ReleaseCachedMemory() const {
  factory_->ReleaseCachedMemory();
  malloc_trim(0);
}

namespace {
double Micros(Duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}
}  // namespace

void LogTuning(const ModelTuning& tuning) {
  const ConvolutionTuning& convolutions = tuning.convolutions;
  spdlog::info(
      "event=cudnn_benchmark model={} version={} benchmark={} reason=\"{}\" convolutions={} "
      "rewritten={}",
      tuning.name, tuning.version, tuning.cudnn_benchmark ? "on" : "off", tuning.cudnn_reason,
      convolutions.convolutions, convolutions.rewritten);
  for (const CudnnShapeTiming& shape : tuning.cudnn_timings) {
    spdlog::info(
        "event=cudnn_benchmark_measured model={} version={} shape=\"{}\" off_us={:.1f} "
        "on_us={:.1f} speedup={:.2f}",
        tuning.name, tuning.version, shape.label, Micros(shape.off), Micros(shape.on),
        shape.speedup());
  }
  if (!tuning.cudnn_timings.empty()) {
    spdlog::info(
        "event=cudnn_benchmark_measure_time model={} version={} ms={} timed_by={}", tuning.name,
        tuning.version,
        std::chrono::duration_cast<std::chrono::milliseconds>(tuning.cudnn_measure_time).count(),
        tuning.cudnn_device_timed ? "cuda_events" : "clock");
  }
  spdlog::info("event=stage_ahead model={} version={} stage_ahead={} reason=\"{}\"", tuning.name,
               tuning.version, tuning.stage_ahead ? "on" : "off", tuning.stage_ahead_reason);
  if (!convolutions.fallback.empty()) {
    spdlog::warn("event=cudnn_benchmark_fallback model={} version={} reason=\"{}\"", tuning.name,
                 tuning.version, convolutions.fallback);
  }
  for (const std::string& warning : tuning.warnings) {
    spdlog::warn("event=model_warning model={} version={} reason=\"{}\"", tuning.name,
                 tuning.version, warning);
  }
  for (const WarmupPass& pass : tuning.warmup) {
    spdlog::debug(
        "event=warmup_pass model={} version={} instance={} shape=\"{}\" first_ms={:.3f} "
        "last_ms={:.3f}",
        tuning.name, tuning.version, pass.instance, pass.label,
        std::chrono::duration<double, std::milli>(pass.first_run).count(),
        std::chrono::duration<double, std::milli>(pass.last_run).count());
  }
  const BatchSizeChoice& batch_sizes = tuning.batch_sizes;
  if (batch_sizes.measured) {
    spdlog::info("event=auto_batch_sizes model={} version={} sizes={} rows_per_s=\"{}\"",
                 tuning.name, tuning.version, batch_sizes.SizesText(), batch_sizes.RatesText());
  } else {
    spdlog::info("event=auto_batch_sizes model={} version={} off=\"{}\"", tuning.name,
                 tuning.version, batch_sizes.off_reason);
  }
  if (tuning.caller_runs.asked) {
    spdlog::info("event=run_on_receiving_thread model={} version={} on={} reason=\"{}\"",
                 tuning.name, tuning.version, tuning.caller_runs.on, tuning.caller_runs.reason);
  }
  std::set<int> instances;
  for (const WarmupPass& pass : tuning.warmup) instances.insert(pass.instance);
  spdlog::info("event=warmup model={} version={} shapes={} instances={} pairs={} warmup_ms={}",
               tuning.name, tuning.version,
               tuning.shapes_finite ? std::to_string(tuning.shape_count) : "variable",
               instances.size(), tuning.warmup.size(),
               std::chrono::duration_cast<std::chrono::milliseconds>(tuning.warmup_time).count());
}

}  // namespace sluice
