// What the manager's parts report about model versions: their states, how each was tuned, and
// the observer interface the metrics implement (server/metrics; the manager knows nothing about
// how it is exported).
#pragma once

#include <cstdint>
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

// What the server did to make one version fast from its first request: the cuDNN benchmark
// decision and the warm-up.
struct ModelTuning {
  std::string name;
  int64_t version = 0;
  bool cudnn_benchmark = false;
  std::string cudnn_reason;        // why (DecideCudnnBenchmark)
  ConvolutionTuning convolutions;  // of the first instance (every instance loads the same graph)
  bool shapes_finite = false;
  size_t shape_count = 0;          // shapes in the plan (0 when not finite)
  std::vector<WarmupPass> warmup;  // every (instance, shape) pair warmed, and the samples
  Duration warmup_time{0};         // wall time of the warm-up
  std::vector<std::string> warnings;  // the runtime's (ModelBackend::Warnings)
  BatchSizeChoice batch_sizes;        // sluice.auto_batch_sizes: measured, or why not
  CallerRunsChoice caller_runs;       // sluice.run_on_receiving_thread: on, or why not
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
};

}  // namespace sluice
