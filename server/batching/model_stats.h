// Per model version statistics with Triton's ModelStatistics meaning, and the events behind them
// for an optional sink (the Prometheus metrics). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/batching/batch_cost.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"
#include "server/core/status.h"

namespace sluice {

struct DurationStat {
  uint64_t count = 0;
  uint64_t ns = 0;
  void Add(Duration d) {
    ++count;
    ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  }
};

// One batch's cycle on its instance (InstancePool::RunBatch), for where the time goes. The host
// phases follow each other: idle, assembly, execute, scatter, complete. The device phases lie
// inside execute, as the device saw them (ModelBackend::LastPhases; absent when the backend does
// not measure them).
struct BatchPhases {
  Duration idle{0};      // the instance had nothing to run since its previous batch ended
  Duration assembly{0};  // the requests' rows copied into the instance's staging buffer
  // A batch staged ahead (InstancePool::StageAhead) was assembled by the instance's stager while
  // the batch before it ran, off the cycle: that assembly's time (`assembly` is then ~0).
  Duration assembly_ahead{0};
  bool staged_ahead = false;
  Duration execute{0};                 // the backend's Execute until it handed out the first output
  std::optional<DevicePhases> device;  // inputs to the device, forward pass, outputs back
  Duration scatter{0};   // the outputs handed to every request's sink (rows copied into answers)
  Duration complete{0};  // the requests completed (answers given to their front ends)
  // A batch with another staged behind it is completed by the instance's stager while that one
  // runs, off the cycle: that completion's time (`complete` is then ~0).
  Duration complete_behind{0};
  int64_t rows = 0;         // the callers' rows
  int64_t padded_rows = 0;  // the rows the model ran (padding included)
};

// Sums of BatchPhases over a version's batches.
struct BatchPhaseTotals {
  uint64_t batches = 0, measured_on_device = 0;  // batches, and those with device phases
  uint64_t staged_ahead = 0;                     // batches assembled while another ran
  uint64_t rows = 0, padded_rows = 0;
  Duration idle{0}, assembly{0}, execute{0}, to_device{0}, forward{0}, to_host{0}, scatter{0},
      complete{0}, assembly_ahead{0}, complete_behind{0};
  void Add(const BatchPhases& phases);
};

// Per-request totals (each request of a batch is charged the batch's compute times, as Triton
// does) and per-batch-size totals.
struct ModelStatsSnapshot {
  uint64_t inference_count = 0;    // rows answered (padding excluded)
  uint64_t execution_count = 0;    // forward passes
  uint64_t last_inference_ms = 0;  // wall-clock ms since the epoch
  DurationStat success, fail, queue, compute_input, compute_infer, compute_output;
  // Response cache models: lookups that hit (lookup and copy into the response) and that missed
  // (lookup and insertion of the answer once computed). A hit also counts in `success`.
  DurationStat cache_hit, cache_miss;
  struct Batch {
    DurationStat compute_input, compute_infer, compute_output;
  };
  std::map<uint64_t, Batch> batches;  // by batch size the model saw (padding included)
  BatchPhaseTotals phases;            // every batch's cycle (see BatchPhases)
  // Latency target models: the target (zero: none), requests refused because they could not be
  // answered in time, and the batch costs the batcher decides from.
  Duration latency_target{0};
  uint64_t refused_for_target = 0, refused_for_deadline = 0;
  std::vector<BatchCostModel::Entry> batch_costs;
  double plan_share = 1;                 // BatchCostModel::PlanShare
  BatchCostModel::AnswerCounts answers;  // BatchCostModel::Answers
  // Ensembles: bytes of tensors copied between the steps of the requests answered (CopyLedger).
  uint64_t copied_on_device_bytes = 0, copied_through_host_bytes = 0;
};

// Why a request failed, as operators group failures.
enum class FailureReason {
  kRejected,      // not admitted: a queue or memory cap, not ready, shutting down (UNAVAILABLE)
  kTimeout,       // deadline or queue timeout passed while queued (DEADLINE_EXCEEDED)
  kCancelled,     // the caller went away while it was queued (CANCELLED)
  kInvalidInput,  // the request does not fit the model (INVALID_ARGUMENT)
  kModelError,    // the model failed (INTERNAL, RESOURCE_EXHAUSTED, anything else)
};
inline constexpr FailureReason kAllFailureReasons[] = {
    FailureReason::kRejected, FailureReason::kTimeout, FailureReason::kCancelled,
    FailureReason::kInvalidInput, FailureReason::kModelError};
FailureReason FailureReasonOf(const Status& status);
const char* FailureReasonName(FailureReason reason);  // "rejected", "timeout", ...

// How a sequence of a stateful model (SequenceBatcher) stopped being active.
enum class SequenceOutcome {
  kEnded,        // its sequence_end request ran
  kIdleExpired,  // nothing came for max_sequence_idle_microseconds
  kDropped,      // its start expired (deadline, cancellation) before it ran, or failed
  kCut,          // the server ended it: its version was unloaded or replaced, or the server stopped
};
inline constexpr SequenceOutcome kAllSequenceOutcomes[] = {
    SequenceOutcome::kEnded, SequenceOutcome::kIdleExpired, SequenceOutcome::kDropped,
    SequenceOutcome::kCut};
const char* SequenceOutcomeName(
    SequenceOutcome outcome);  // "ended", "idle_expired", "dropped", "cut"

// Why a request was refused before running because it could not be answered in time (latency
// target mode, sluice.latency_target_us): its own deadline (the client's, or the queue timeout)
// or the model's target.
enum class EarlyRefusal { kNone, kDeadline, kTarget };
const char* EarlyRefusalName(EarlyRefusal reason);  // "deadline", "target"

// Receives every event ModelStats records. Implementations must be thread-safe and cheap: they
// run on the request path.
class StatsSink {
 public:
  virtual ~StatsSink() = default;
  virtual void OnAdmitted() = 0;
  // `requests` admitted requests leave the queue and start running (one forward pass).
  virtual void OnStarted(int64_t requests) = 0;
  virtual void OnExecution(int64_t batch_rows, Duration input, Duration infer, Duration output) = 0;
  // A batch ran and answered: its cycle, phase by phase.
  virtual void OnPhases(const BatchPhases& /*phases*/) {}
  virtual void OnSuccess(int64_t rows, Duration queue, Duration input, Duration infer,
                         Duration output, Duration total, Protocol protocol) = 0;
  // `was_admitted`: the request had been admitted to a queue (it stops being pending); `ran`: it
  // had started running (OnStarted), so it was no longer waiting.
  virtual void OnFailure(FailureReason reason, Duration total, bool was_admitted, bool ran,
                         Protocol protocol) = 0;
  // Stateful models only: a sequence became active (its start was admitted), or stopped.
  virtual void OnSequenceStarted() {}
  virtual void OnSequenceFinished(SequenceOutcome /*outcome*/) {}
  // Latency target models only: a request refused because it could not be answered in time, at
  // its arrival or later while queued (it is also reported through OnFailure).
  virtual void OnEarlyRefusal(EarlyRefusal /*reason*/, bool /*queued*/) {}
  // CUDA graph models only: a shape captured (at warm-up, or on its third batch in serving), or a
  // served batch that replayed one (warm-up's replays are not counted).
  virtual void OnGraphRun(ModelBackend::GraphRun /*run*/) {}
  // Latency target models only, per batch: how long its oldest request had waited when the
  // batch formed, and its execution time against what the cost model predicted (nullopt: no
  // prediction yet).
  virtual void OnBatchCost(Duration /*oldest_wait*/, std::optional<Duration> /*predicted*/,
                           Duration /*measured*/) {}
  // Response cache models only: a request answered from the cache (never admitted to a queue;
  // `took`: lookup and copy), or one that missed (`took`: lookup and insertion; its run is
  // reported as any other request's).
  virtual void OnCacheHit(Duration /*took*/, Protocol /*protocol*/) {}
  virtual void OnCacheMiss(Duration /*took*/) {}
  // Response cache models only: a request answered with the run of an identical request that was
  // queued or running when it came (single flight; never admitted to a queue), after `waited`.
  virtual void OnSharedAnswer(Duration /*waited*/, Protocol /*protocol*/) {}
  // Models with priority levels only (`level` in [1, kMaxPriorityLevels]): a request of `level`
  // started running after waiting `queued`, or left its queue without running (refused at
  // admission, expired, cancelled, or dropped at stop) for `reason`.
  virtual void OnPriorityQueued(int /*level*/, Duration /*queued*/) {}
  virtual void OnPriorityRefused(int /*level*/, FailureReason /*reason*/) {}
  // Ensembles only, per request answered: bytes of its tensors copied between its steps, on the
  // device and through the host (CopyLedger).
  virtual void OnEnsembleCopies(uint64_t /*on_device*/, uint64_t /*through_host*/) {}
};

class ModelStats {
 public:
  explicit ModelStats(std::shared_ptr<StatsSink> sink = nullptr) : sink_(std::move(sink)) {}

  // A request entered a scheduler's queue; it is pending until RecordSuccess or RecordFailure.
  void RecordAdmitted();
  // `requests` admitted requests start running in one forward pass (they stop waiting).
  void RecordStarted(int64_t requests);
  // One forward pass over `batch_rows` rows (padding included) with its phase durations.
  void RecordExecution(int64_t batch_rows, Duration input, Duration infer, Duration output)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // One admitted request answered OK: its rows, time queued, the phases of its batch, and end to
  // end; `protocol`: the front end it came through.
  void RecordSuccess(int64_t rows, Duration queue, Duration input, Duration infer, Duration output,
                     Duration total, Protocol protocol) ABSL_LOCKS_EXCLUDED(mutex_);
  // One admitted request answered with `status` (an error) after `total`; `ran`: RecordStarted
  // had counted it (the model failed), else it left the queue without running.
  void RecordFailure(Duration total, const Status& status, bool ran, Protocol protocol)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // A request answered with `status` without being admitted (invalid, or a cap reached).
  void RecordRejected(const Status& status, Protocol protocol) ABSL_LOCKS_EXCLUDED(mutex_);
  // Stateful models: a sequence became active, or stopped being active and why.
  void RecordSequenceStarted() {
    if (sink_) sink_->OnSequenceStarted();
  }
  void RecordSequenceFinished(SequenceOutcome outcome) {
    if (sink_) sink_->OnSequenceFinished(outcome);
  }
  // A batch that ran and answered: its cycle (see BatchPhases).
  void RecordPhases(const BatchPhases& phases) ABSL_LOCKS_EXCLUDED(mutex_);
  // CUDA graph models: see StatsSink::OnGraphRun.
  void RecordGraphRun(ModelBackend::GraphRun run) {
    if (sink_ && run != ModelBackend::GraphRun::kNone) sink_->OnGraphRun(run);
  }
  // Latency target models: see StatsSink::OnEarlyRefusal and OnBatchCost.
  void RecordEarlyRefusal(EarlyRefusal reason, bool queued) ABSL_LOCKS_EXCLUDED(mutex_);
  void RecordBatchCost(Duration oldest_wait, std::optional<Duration> predicted, Duration measured) {
    if (sink_) sink_->OnBatchCost(oldest_wait, predicted, measured);
  }

  // Response cache models: a request answered from the cache after `took` (a success that did
  // not run: no inference, execution or compute time), or a lookup that missed and the insertion
  // that followed, `took` together.
  void RecordCacheHit(Duration took, Protocol protocol) ABSL_LOCKS_EXCLUDED(mutex_);
  void RecordCacheMiss(Duration took) ABSL_LOCKS_EXCLUDED(mutex_);
  // Response cache models: a request answered OK with an identical request's run after waiting
  // `waited` for it (single flight): a success, its wait counted as queue time, neither a cache
  // hit nor a miss (its lookup missed; the run's own request counts the miss).
  void RecordSharedAnswer(Duration waited, Protocol protocol) ABSL_LOCKS_EXCLUDED(mutex_);

  // Models with priority levels: see StatsSink::OnPriorityQueued and OnPriorityRefused. Level 0
  // (no levels) records nothing.
  void RecordPriorityQueued(int level, Duration queued) {
    if (sink_ && level > 0) sink_->OnPriorityQueued(level, queued);
  }
  void RecordPriorityRefused(int level, const Status& status) {
    if (sink_ && level > 0) sink_->OnPriorityRefused(level, FailureReasonOf(status));
  }

  // Ensembles: see StatsSink::OnEnsembleCopies.
  void RecordEnsembleCopies(uint64_t on_device, uint64_t through_host) ABSL_LOCKS_EXCLUDED(mutex_);

  // Latency target models: snapshots carry `target` and `costs`' live figures from now on.
  void ShowLatencyTarget(Duration target, std::shared_ptr<const BatchCostModel> costs)
      ABSL_LOCKS_EXCLUDED(mutex_);

  ModelStatsSnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  // A success that ran nothing (a cache hit, a shared answer): in success and queue, no compute.
  void RecordAnsweredWithoutRunning(Duration total, Duration queued, bool cache_hit)
      ABSL_LOCKS_EXCLUDED(mutex_);

  const std::shared_ptr<StatsSink> sink_;  // may be null
  mutable Mutex mutex_;
  ModelStatsSnapshot stats_ ABSL_GUARDED_BY(mutex_);
  std::shared_ptr<const BatchCostModel> costs_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
