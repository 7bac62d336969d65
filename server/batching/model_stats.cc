#include "server/batching/model_stats.h"

namespace sluice {

FailureReason FailureReasonOf(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return FailureReason::kRejected;
    case absl::StatusCode::kDeadlineExceeded:
      return FailureReason::kTimeout;
    case absl::StatusCode::kCancelled:
      return FailureReason::kCancelled;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return FailureReason::kInvalidInput;
    default:
      return FailureReason::kModelError;
  }
}

const char* FailureReasonName(FailureReason reason) {
  switch (reason) {
    case FailureReason::kRejected:
      return "rejected";
    case FailureReason::kTimeout:
      return "timeout";
    case FailureReason::kCancelled:
      return "cancelled";
    case FailureReason::kInvalidInput:
      return "invalid_input";
    case FailureReason::kModelError:
      return "model_error";
  }
  return "model_error";
}

const char* SequenceOutcomeName(SequenceOutcome outcome) {
  switch (outcome) {
    case SequenceOutcome::kEnded:
      return "ended";
    case SequenceOutcome::kIdleExpired:
      return "idle_expired";
    case SequenceOutcome::kDropped:
      return "dropped";
    case SequenceOutcome::kCut:
      return "cut";
  }
  return "cut";
}

namespace {

// last_inference_ms's clock: wall-clock milliseconds since the epoch.
uint64_t WallClockMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

void ModelStats::RecordAdmitted() {
  if (sink_) sink_->OnAdmitted();
}

void ModelStats::RecordStarted(int64_t requests) {
  if (sink_) sink_->OnStarted(requests);
}

void ModelStats::RecordExecution(int64_t batch_rows, Duration input, Duration infer,
                                 Duration output) {
  if (sink_) sink_->OnExecution(batch_rows, input, infer, output);
  MutexLock lock(&mutex_);
  ++stats_.execution_count;
  ModelStatsSnapshot::Batch& batch = stats_.batches[static_cast<uint64_t>(batch_rows)];
  batch.compute_input.Add(input);
  batch.compute_infer.Add(infer);
  batch.compute_output.Add(output);
}

void BatchPhaseTotals::Add(const BatchPhases& phases) {
  ++batches;
  rows += static_cast<uint64_t>(phases.rows);
  padded_rows += static_cast<uint64_t>(phases.padded_rows);
  idle += phases.idle;
  assembly += phases.assembly;
  assembly_ahead += phases.assembly_ahead;
  complete_behind += phases.complete_behind;
  if (phases.staged_ahead) ++staged_ahead;
  execute += phases.execute;
  scatter += phases.scatter;
  complete += phases.complete;
  if (phases.device) {
    ++measured_on_device;
    to_device += phases.device->to_device;
    forward += phases.device->forward;
    to_host += phases.device->to_host;
  }
}

void ModelStats::RecordPhases(const BatchPhases& phases) {
  if (sink_) sink_->OnPhases(phases);
  MutexLock lock(&mutex_);
  stats_.phases.Add(phases);
}

void ModelStats::RecordSuccess(int64_t rows, Duration queue, Duration input, Duration infer,
                               Duration output, Duration total, Protocol protocol) {
  if (sink_) sink_->OnSuccess(rows, queue, input, infer, output, total, protocol);
  const uint64_t now_ms = WallClockMs();
  MutexLock lock(&mutex_);
  stats_.inference_count += static_cast<uint64_t>(rows);
  stats_.last_inference_ms = now_ms;
  stats_.success.Add(total);
  stats_.queue.Add(queue);
  stats_.compute_input.Add(input);
  stats_.compute_infer.Add(infer);
  stats_.compute_output.Add(output);
}

void ModelStats::RecordAnsweredWithoutRunning(Duration total, Duration queued, bool cache_hit) {
  const uint64_t now_ms = WallClockMs();
  MutexLock lock(&mutex_);
  stats_.last_inference_ms = now_ms;
  stats_.success.Add(total);
  stats_.queue.Add(queued);
  if (cache_hit) stats_.cache_hit.Add(total);
}

void ModelStats::RecordEnsembleCopies(uint64_t on_device, uint64_t through_host) {
  {
    MutexLock lock(&mutex_);
    stats_.copied_on_device_bytes += on_device;
    stats_.copied_through_host_bytes += through_host;
  }
  if (sink_) sink_->OnEnsembleCopies(on_device, through_host);
}

void ModelStats::RecordCacheHit(Duration took, Protocol protocol) {
  if (sink_) sink_->OnCacheHit(took, protocol);
  // As Triton: a hit counts in queue, with no time queued.
  RecordAnsweredWithoutRunning(took, Duration::zero(), /*cache_hit=*/true);
}

void ModelStats::RecordSharedAnswer(Duration waited, Protocol protocol) {
  if (sink_) sink_->OnSharedAnswer(waited, protocol);
  RecordAnsweredWithoutRunning(waited, waited, /*cache_hit=*/false);
}

void ModelStats::RecordCacheMiss(Duration took) {
  if (sink_) sink_->OnCacheMiss(took);
  MutexLock lock(&mutex_);
  stats_.cache_miss.Add(took);
}

void ModelStats::RecordFailure(Duration total, const Status& status, bool ran, Protocol protocol) {
  if (sink_) sink_->OnFailure(FailureReasonOf(status), total, /*was_admitted=*/true, ran, protocol);
  MutexLock lock(&mutex_);
  stats_.fail.Add(total);
}

void ModelStats::RecordRejected(const Status& status, Protocol protocol) {
  if (sink_) {
    sink_->OnFailure(FailureReasonOf(status), Duration::zero(), /*was_admitted=*/false,
                     /*ran=*/false, protocol);
  }
  MutexLock lock(&mutex_);
  stats_.fail.Add(Duration::zero());
}

const char* EarlyRefusalName(EarlyRefusal reason) {
  switch (reason) {
    case EarlyRefusal::kDeadline:
      return "deadline";
    case EarlyRefusal::kTarget:
      return "target";
    case EarlyRefusal::kNone:
      break;
  }
  return "none";
}

void ModelStats::RecordEarlyRefusal(EarlyRefusal reason, bool queued) {
  if (reason == EarlyRefusal::kNone) return;
  if (sink_) sink_->OnEarlyRefusal(reason, queued);
  MutexLock lock(&mutex_);
  ++(reason == EarlyRefusal::kTarget ? stats_.refused_for_target : stats_.refused_for_deadline);
}

void ModelStats::ShowLatencyTarget(Duration target, std::shared_ptr<const BatchCostModel> costs) {
  MutexLock lock(&mutex_);
  stats_.latency_target = target;
  costs_ = std::move(costs);
}

ModelStatsSnapshot ModelStats::Snapshot() const {
  ModelStatsSnapshot snapshot;
  std::shared_ptr<const BatchCostModel> costs;
  {
    MutexLock lock(&mutex_);
    snapshot = stats_;
    costs = costs_;
  }
  if (costs) {  // outside our lock: the two never nest
    snapshot.batch_costs = costs->Snapshot();
    snapshot.plan_share = costs->PlanShare();
    snapshot.answers = costs->Answers();
  }
  return snapshot;
}

}  // namespace sluice
