#include "server/manager/cudnn_measurement.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/batching/warmup.h"
#include "server/core/output_sink.h"

namespace sluice {

namespace {

// Runs `request` once on `backend`, outputs discarded; the time it took (see
// MeasureCudnnBenchmark). `device_timed` is cleared when the backend reports no phases.
StatusOr<Duration> TimeOne(ModelBackend* backend, const WarmupRequest& request,
                           const TimeSource& clock, bool* device_timed) {
  TensorSink discarded;
  const InferRequest view = ViewOf(*request.request);
  const OutputTarget target{request.request->batch_size, &request.request->requested_outputs,
                            &discarded};
  const TimePoint started = clock.Now();
  Status status = backend->Execute(view, absl::MakeConstSpan(&target, 1));
  const Duration wall = clock.Now() - started;
  if (!status.ok()) return status;
  const std::optional<DevicePhases> phases = backend->LastPhases();
  if (phases) return phases->forward;
  *device_timed = false;
  return wall;
}

}  // namespace

CudnnBenchmarkDecision DecideFromMeasurement(const CudnnMeasurement& measurement) {
  if (measurement.shapes.empty()) return {false, "measured: no shape to time"};
  Duration off{0}, on{0};
  for (const CudnnShapeTiming& shape : measurement.shapes) {
    off += shape.off;
    on += shape.on;
  }
  const double speedup = on.count() > 0 ? static_cast<double>(off.count()) / on.count() : 1.0;
  const bool keep = on.count() > 0 && on.count() <= (1.0 - kCudnnMinGain) * off.count();
  return {keep,
          absl::StrFormat(
              "measured: on %.2fx as fast as off over %d of %d shapes (%s)", speedup,
              measurement.shapes.size(), measurement.planned,
              keep ? "kept" : absl::StrFormat("not %.0f %% faster, so off", kCudnnMinGain * 100))};
}

StatusOr<CudnnMeasurement> MeasureCudnnBenchmark(ModelBackend* off, ModelBackend* on,
                                                 const std::vector<WarmupRequest>& requests,
                                                 const TimeSource& clock, Duration budget,
                                                 const std::atomic<bool>* abandon) {
  CudnnMeasurement measurement;
  measurement.device_timed = true;
  std::vector<const WarmupRequest*> shapes;
  for (const WarmupRequest& request : requests) {
    if (request.batch_size > 0) shapes.push_back(&request);
  }
  measurement.planned = shapes.size();
  const TimePoint started = clock.Now();
  ModelBackend* const instances[2] = {off, on};
  for (const WarmupRequest* shape : shapes) {
    if (!measurement.shapes.empty() && clock.Now() - started >= budget) break;
    std::vector<Duration> times[2];
    for (int run = 0; run < kCudnnUntimedRuns + kCudnnTimedRuns; ++run) {
      for (int mode = 0; mode < 2; ++mode) {
        if (abandon != nullptr && abandon->load()) {
          return absl::CancelledError("the cuDNN benchmark measurement was abandoned");
        }
        StatusOr<Duration> time =
            TimeOne(instances[mode], *shape, clock, &measurement.device_timed);
        if (!time.ok()) {
          return Status(time.status().code(),
                        absl::StrCat("timing ", shape->label, " with cuDNN benchmark mode ",
                                     mode == 0 ? "off" : "on", ": ", time.status().message()));
        }
        if (run >= kCudnnUntimedRuns) times[mode].push_back(*time);
      }
    }
    measurement.shapes.push_back({shape->label, shape->batch_size, MedianOf(std::move(times[0])),
                                  MedianOf(std::move(times[1]))});
  }
  return measurement;
}

}  // namespace sluice
