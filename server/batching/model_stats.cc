#include "server/batching/model_stats.h"

namespace sluice {

void ModelStats::RecordExecution(int64_t batch_rows, Duration input, Duration infer, Duration output) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.execution_count;
  ModelStatsSnapshot::Batch& batch = stats_.batches[static_cast<uint64_t>(batch_rows)];
  batch.compute_input.Add(input);
  batch.compute_infer.Add(infer);
  batch.compute_output.Add(output);
}

void ModelStats::RecordSuccess(int64_t rows, Duration queue, Duration input, Duration infer,
                               Duration output, Duration total) {
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.inference_count += static_cast<uint64_t>(rows);
  stats_.last_inference_ms = static_cast<uint64_t>(now_ms);
  stats_.success.Add(total);
  stats_.queue.Add(queue);
  stats_.compute_input.Add(input);
  stats_.compute_infer.Add(infer);
  stats_.compute_output.Add(output);
}

void ModelStats::RecordFailure(Duration total) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.fail.Add(total);
}

ModelStatsSnapshot ModelStats::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace sluice
