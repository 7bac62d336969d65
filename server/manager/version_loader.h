// Loads one version of a repository model into something that serves: decides the devices of
// its instances, loads them through the BackendFactory, decides cuDNN benchmark mode, composes
// the scheduler (the dynamic batcher, wrapped in padding when the model pads) and warms every
// shape up. Holds no table and takes no locks: ModelControl calls it from its one thread and
// hands the result to ModelManager::Swap.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/batch_queue.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/device.h"
#include "server/core/liveness.h"
#include "server/core/repository_model.h"
#include "server/manager/cudnn_measurement.h"
#include "server/manager/model_events.h"
#include "server/manager/model_handle.h"
#include "server/manager/residency.h"
#include "server/manager/response_cache.h"

namespace sluice {

// One version loaded (or not).
struct LoadedVersion {
  int64_t version = 0;
  Status status;                        // why it did not load
  std::shared_ptr<ModelHandle> handle;  // when it loaded (and warmed up)
  ModelTuning tuning;
  Duration load_time{0};  // load and warm-up
  // Memory the version took while it loaded and warmed up, at its peak, per device ("cpu": the
  // process's resident set; "cuda:N": the device allocator's bytes); devices it did not grow are
  // absent. Measured with one load at a time; requests served meanwhile count too.
  DeviceBytes memory;
};

// Not thread-safe: one caller at a time (the control thread). The factory is thread-safe and
// outlives the loader.
class VersionLoader {
 public:
  struct Options {
    DevicePolicy device_policy = DevicePolicy::kAuto;  // --device
    size_t max_queue_size = 1024;       // per model version, unless its config sets max_queue_size
    const TimeSource* clock = nullptr;  // null: the steady clock
    std::shared_ptr<ByteBudget>
        queued_bytes_budget;              // server-wide cap (--max-queued-bytes); may be null
    LivenessMonitor* liveness = nullptr;  // told about fatal device errors; may be null
    CudnnBenchmarkMode cudnn_benchmark = CudnnBenchmarkMode::kAuto;  // --cudnn-benchmark
    // Under the auto rule, how long timing benchmark mode off against on may take per version
    // before no further shape is added (server/manager/cudnn_measurement.h); the two probe loads
    // come on top.
    Duration cudnn_measure_budget = std::chrono::seconds(10);
    bool warmup = true;  // --warmup: false skips every model's warm-up (cold-start measurements)
    ModelObserver* observer = nullptr;  // where each version's statistics also go; may be null
    // The server's response cache (--cache-config); null: none, and a model that enables
    // response_cache loads without one (a warning says so).
    std::shared_ptr<ResponseCache> response_cache;
    // The CPUs the split divides (DetectCpuBudget: cores, affinity mask, cgroup quota) and which
    // limit applied, for the log. 0: the machine's cores.
    int cpus = 0;
    std::string cpu_limit;
    // --model-cpus given: forward passes run only on the models' workers (the receiving-thread
    // path, sluice.run_on_receiving_thread, would run them on gRPC's thread, on the front ends'
    // CPUs), so that path stays off.
    bool model_cpus_split = false;
    // Where an ensemble's steps find their models (the server's ModelManager); null: ensembles
    // do not load.
    const ModelLookup* lookup = nullptr;
  };

  VersionLoader(BackendFactory* factory, Options options);

  // The CPU thread split: without INTRA_OP_THREAD_COUNT, each CPU instance of `models` (every
  // loadable version counted) gets Options::cpus / instances threads, at least 1. More OpenMP
  // threads than cores make libgomp stop spinning and every parallel region pays a futex wake-up
  // (measured: a 784-512-512-10 MLP forward 74 us -> 250 us on 2 cores). Logged; returns it.
  int SplitCpuThreads(const std::vector<std::shared_ptr<const RepositoryModel>>& models);

  // Loads, composes and warms up `version` of `model` (which must be loadable and select that
  // version). `abandon` set (a shutdown) abandons the warm-up. On failure the instances loaded so
  // far are released and `status` says why, in the words of the step that failed.
  LoadedVersion Load(const std::shared_ptr<const RepositoryModel>& model, int64_t version,
                     const std::atomic<bool>* abandon) const;

  // Gives memory that unloaded versions cached back: LibTorch's CUDA cache to the driver, glibc's
  // free lists to the kernel. Without it RSS keeps the high-water mark of every load.
  void ReleaseCachedMemory() const;

  // The devices `spec`'s instances go on under the device policy ("cpu", "cuda:N"), each once, in
  // first-use order; a group whose device cannot be decided is left out (its load will fail).
  std::vector<Device> DevicesOf(const ModelSpec& spec) const;

  // Whether --device cuda can be met (a GPU is usable): FAILED_PRECONDITION, in DecideDevice's
  // words, when it cannot.
  Status CheckDevicePolicy() const;

  const Options& options() const { return options_; }

 private:
  // The version's scheduler, warmed up; `*queue`: the queue it keeps requests in, for single
  // flight (null for a stateful model's).
  StatusOr<std::unique_ptr<Scheduler>> Compose(const RepositoryModel& model, int64_t version,
                                               std::shared_ptr<ModelStats> stats,
                                               std::string* device, ModelTuning* tuning,
                                               QueueSharing** queue,
                                               const std::atomic<bool>* abandon) const;
  // The devices one instance group goes on under the device policy; `fell_back` set when a GPU
  // group falls back to the CPU. INVALID_ARGUMENT for a GPU the process does not see.
  StatusOr<std::vector<Device>> GroupDevices(const InstanceGroupSpec& group, bool* fell_back) const;
  StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadInstances(
      const ModelSpec& spec, const std::filesystem::path& file, std::string* device) const;
  // The auto rule's "on" for a TorchScript model with fixed shapes on a GPU, checked by
  // measurement: `off` (the first serving instance, loaded with benchmark mode off) against a
  // probe instance with the mode on, loaded on `device` and released afterwards, over the shape
  // plan's warm-up requests. The timings and the time spent go into `tuning`.
  StatusOr<CudnnBenchmarkDecision> MeasureCudnn(const ModelSpec& spec,
                                                const std::filesystem::path& file,
                                                const Device& device, ModelBackend* off,
                                                const std::vector<WarmupRequest>& warmup,
                                                ModelTuning* tuning,
                                                const std::atomic<bool>* abandon) const;

  BackendFactory* const factory_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  std::atomic<int> default_intra_op_threads_{1};  // SplitCpuThreads (control thread); read by Load
};

// The lines a ready version logs about its tuning: the cuDNN decision, the convolution rewrite's
// fallback, the warm-up (each pass at debug level).
void LogTuning(const ModelTuning& tuning);

}  // namespace sluice
