// What the manager's parts report about model versions: their states, how each was tuned, and
// the observer interface the metrics implement (server/metrics; the manager knows nothing about
// how it is exported).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/batch_sizes.h"
#include "server/batching/caller_runs.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/backend.h"
#include "server/core/clock.h"

namespace sluice {

enum class ModelState { kLoading, kReady, kUnavailable };
const char* ModelStateName(ModelState state);  // "LOADING", "READY", "UNAVAILABLE"

// One shape's median forward time with cuDNN benchmark mode off and on
// (server/manager/cudnn_measurement.h).
struct CudnnShapeTiming {
  std::string label;  // the warm-up request's label ("batch=8 image[8,3,224,224]")
  int64_t batch_size = 0;
  Duration off{0};
  Duration on{0};
  // off / on: above 1 the mode helps; 0 when `on` is zero.
  double speedup() const {
    return on.count() > 0 ? static_cast<double>(off.count()) / static_cast<double>(on.count()) : 0;
  }
};

// What the server did to make one version fast from its first request: the cuDNN benchmark
// decision and the warm-up.
struct ModelTuning {
  std::string name;
  int64_t version = 0;
  bool cudnn_benchmark = false;
  std::string cudnn_reason;  // why (DecideCudnnBenchmark, DecideFromMeasurement)
  // Under the auto rule on a GPU: each shape's median forward with the mode off and on, and the
  // time the measurement added to the load (zero when nothing was measured).
  std::vector<CudnnShapeTiming> cudnn_timings;
  Duration cudnn_measure_time{0};
  bool cudnn_device_timed = false;  // the timings are CUDA events' (false: the host clock's)
  ConvolutionTuning convolutions;   // of the first instance (every instance loads the same graph)
  bool shapes_finite = false;
  size_t shape_count = 0;             // shapes in the plan (0 when not finite)
  std::vector<WarmupPass> warmup;     // every (instance, shape) pair warmed, and the samples
  Duration warmup_time{0};            // wall time of the warm-up
  std::vector<std::string> warnings;  // the runtime's (ModelBackend::Warnings)
  BatchSizeChoice batch_sizes;        // sluice.auto_batch_sizes: measured, or why not
  CallerRunsChoice caller_runs;       // sluice.run_on_receiving_thread: on, or why not
  bool stage_ahead = false;           // sluice.stage_ahead (DynamicBatcher::Options)
  std::string stage_ahead_reason;     // why on or off
};

// Told about model versions as they load, become ready and go away. Implementations are
// thread-safe.
class ModelObserver {
 public:
  virtual ~ModelObserver() = default;
  // Where the request statistics of a version about to load also go (null: nowhere).
  virtual std::shared_ptr<StatsSink> SinkFor(const std::string& model, int64_t version) = 0;
  virtual void OnState(const std::string& model, int64_t version, ModelState state) = 0;
  // A version became ready: its tuning, and how long it took to load (warm-up included).
  virtual void OnReady(const ModelTuning& tuning, Duration load_time) = 0;

  // Loading on demand and the memory budget (--model-load-on-demand). Defaults: nothing.
  // A load of `model` ended: `trigger` is "startup", "explicit", "poll" or "on_demand".
  virtual void OnModelLoad(const std::string& /*model*/, const char* /*trigger*/, bool /*ok*/) {}
  // `model` was unloaded to make room for another; `young`: it had been ready for less than the
  // minimum residency (no older idle model could make the room).
  virtual void OnEviction(const std::string& /*model*/, bool /*young*/) {}
  // A request that waited for `model` to load was answered `waited` after it arrived.
  virtual void OnColdStart(const std::string& /*model*/, Duration /*waited*/) {}
  // A version's memory as measured at load (bytes per device); an empty map when it goes.
  virtual void OnVersionMemory(const std::string& /*model*/, int64_t /*version*/,
                               const std::map<std::string, uint64_t>& /*memory*/) {}
  // The models' memory on each budgeted device against its budget, after every change.
  virtual void OnBudget(const std::map<std::string, uint64_t>& /*budget*/,
                        const std::map<std::string, uint64_t>& /*resident*/) {}
};

}  // namespace sluice
