// cuDNN benchmark mode by measurement. Benchmark mode does not always pay: FP16 ResNet-50 on an
// H200 ran 0.71-0.99x as fast with it at batches 8 and 32. So under the auto rule a TorchScript
// model with a finite shape set on a GPU is timed with benchmark mode off and on before it
// reports ready, and keeps "on" only where that is at least kCudnnMinGain faster.
//
// The decision is per model version, not per shape: the convolution rewrite gives a loaded graph
// one set of cuDNN flags (server/runtime/convolution_rewrite.h), so one graph cannot run some
// shapes with the mode and others without. The per-shape ratios are kept for the log and the
// metrics, so an operator can see where the mode helped and where it hurt.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/scheduler.h"
#include "server/batching/shape_plan.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/status.h"
#include "server/manager/model_events.h"

namespace sluice {

// Runs of each shape before the timed ones: with benchmark mode on, the first run of a shape is
// cuDNN's search of algorithms, and the next settle the allocator.
inline constexpr int kCudnnUntimedRuns = 3;
// Timed runs of each shape in each mode; their median is the shape's time.
inline constexpr int kCudnnTimedRuns = 20;
// "On" must be at least this much faster (sum of the shapes' medians) to be kept.
inline constexpr double kCudnnMinGain = 0.05;

struct CudnnMeasurement {
  std::vector<CudnnShapeTiming> shapes;  // plan order; the shapes measured within the budget
  size_t planned = 0;                    // shapes in the plan
  // Forward times came from the backend's device phases (CUDA events); false: from the clock
  // around each Execute (a backend that reports no phases).
  bool device_timed = false;
};

// On when the measured shapes' medians add up to at least kCudnnMinGain less with the mode on (a
// batch of each shape), else off; off when nothing was measured. The reason states the gain and
// how many shapes were measured ("measured: on 1.23x faster over 4 of 4 shapes").
CudnnBenchmarkDecision DecideFromMeasurement(const CudnnMeasurement& measurement);

// Times `requests` (the shape plan's warm-up requests; model_warmup samples are skipped) on two
// instances: `off` (benchmark mode off) and `on`. For each shape in turn: kCudnnUntimedRuns on
// each instance, then kCudnnTimedRuns on each, alternating, so that a clock change (a GPU
// leaving its idle clocks) affects both modes alike. A run's time is the forward phase the
// backend reports (LastPhases: CUDA events on the instance's stream), else the clock's time
// around Execute. Shapes are added while the time spent on `clock` is under `budget`, at least
// one. CANCELLED once `*abandon` (may be null) is set; a failed run's status names the shape.
StatusOr<CudnnMeasurement> MeasureCudnnBenchmark(ModelBackend* off, ModelBackend* on,
                                                 const std::vector<WarmupRequest>& requests,
                                                 const TimeSource& clock, Duration budget,
                                                 const std::atomic<bool>* abandon);

}  // namespace sluice
