// Per model version statistics with Triton's ModelStatistics meaning. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "server/core/clock.h"

namespace sluice {

struct DurationStat {
  uint64_t count = 0;
  uint64_t ns = 0;
  void Add(Duration d) {
    ++count;
    ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  }
};

// Per-request totals (each request of a batch is charged the batch's compute times, as Triton
// does) and per-batch-size totals.
struct ModelStatsSnapshot {
  uint64_t inference_count = 0;  // rows answered (padding excluded)
  uint64_t execution_count = 0;  // forward passes
  uint64_t last_inference_ms = 0;  // wall-clock ms since the epoch
  DurationStat success, fail, queue, compute_input, compute_infer, compute_output;
  struct Batch {
    DurationStat compute_input, compute_infer, compute_output;
  };
  std::map<uint64_t, Batch> batches;  // by batch size the model saw (padding included)
};

class ModelStats {
 public:
  // One forward pass over `batch_rows` rows (padding included) with its phase durations.
  void RecordExecution(int64_t batch_rows, Duration input, Duration infer, Duration output);
  // One request answered OK: its rows, time queued, the phases of its batch, and end to end.
  void RecordSuccess(int64_t rows, Duration queue, Duration input, Duration infer, Duration output,
                     Duration total);
  // One request answered with an error after `total` (rejected, expired, model failure...).
  void RecordFailure(Duration total);

  ModelStatsSnapshot Snapshot() const;

 private:
  mutable std::mutex mutex_;
  ModelStatsSnapshot stats_;
};

}  // namespace sluice
