// Triton's sequence batcher for stateful models (config sequence_batching), direct and oldest
// strategies.
//
// Every sequence (a correlation id, Triton's sequence_id parameter) is bound to one slot of one
// instance from its sequence_start request to its sequence_end request, so that a model can keep
// the sequence's state per slot (or per CONTROL_SEQUENCE_CORRID), or the server keeps it (implicit
// state: each request's StateRow names the slot; the runtime's store holds the state on the
// instance's device). Direct: an instance has max_batch_size slots and each execution carries at
// most one request per slot, in that slot's row: the batch has as many rows as the highest slot
// that has a request, plus one; slots below it without a request get a filler row (zeros, READY
// off). Oldest: an instance has max_candidate_sequences slots and each execution packs the oldest
// requests of up to max_batch_size of them into rows (see SequenceSlots::FormBatch). The server
// fills the control inputs of every row (START, END, READY, CORRID, with the values the config
// gives). A sequence's requests run one at a time, in arrival order. A sequence that sends nothing
// for max_sequence_idle_microseconds is ended and its slot freed; a new sequence finds a free slot
// or waits for one (in arrival order), within the queue cap.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/batching/instance_pool.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/batching/sequence_slots.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"

namespace sluice {

// Appends `spec`'s control inputs to `request` (rows: its batch size; shape [rows, 1], or [1]
// for a model without a batch dimension): the values of `control` with READY on, or, when
// `control` is null (a filler row, warm-up), every flag off and a zero/empty correlation id.
void AppendSequenceControls(const ModelSpec& spec, const SequenceControl* control,
                            InferRequest* request);

// The decisions live in SequenceSlots (thread-free, with each sequence's phase); this class adds
// the lock, the batcher thread and the instance pool. Thread-safe. Every request is answered
// exactly once: with its outputs, or INVALID_ARGUMENT (no
// or a wrong sequence_id, a batch of more than one row, a request for a sequence that is not
// active, a second sequence_start on an active one, a request after the sequence's
// sequence_end), UNAVAILABLE (the queue is full, the sequence was ended by EndSequences, or the
// batcher stopped), DEADLINE_EXCEEDED / CANCELLED (expired while queued), or the model's error.
class SequenceBatcher final : public SequenceScheduler {
 public:
  struct Options {
    const TimeSource* clock = nullptr;            // required; outlives the batcher
    std::shared_ptr<ModelStats> stats;            // may be null
    std::function<void(const Status&)> on_fatal;  // a fatal (sticky device) error; may be null
    bool warm_up_one_at_a_time = false;           // see InstancePool::Options
    // Requests and input bytes waiting in sequences that wait for a slot, and, apart, in sequences
    // bound to one (see Admission); the server budget is shared by every model, may be null.
    size_t max_requests = 1024;
    size_t max_bytes = 256u << 20;
    std::shared_ptr<ByteBudget> server_budget;
  };

  // INVALID_ARGUMENT without instances, a clock, or sequence_batching in `spec`.
  static StatusOr<std::unique_ptr<SequenceBatcher>> Create(
      ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  ~SequenceBatcher() override;

  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override ABSL_LOCKS_EXCLUDED(mutex_);
  void Poke() override ABSL_LOCKS_EXCLUDED(mutex_);
  // A sequence's requests run on its slot's instance, in the slot's order: never on the caller's
  // thread. Ignored.
  void SetCallerRuns(bool) override {}
  // Each warm-up request runs with its control inputs off (READY false): the model sees the
  // shapes without any sequence's state changing.
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                const std::atomic<bool>* abandon) override;
  void SetBatchSizeLadder(std::vector<int>) override {}  // a batch is the slots that have a request
  void Stop() override ABSL_LOCKS_EXCLUDED(mutex_);

  bool HasSequence(const CorrelationId& id) const override ABSL_LOCKS_EXCLUDED(mutex_);
  size_t ActiveSequences() const override ABSL_LOCKS_EXCLUDED(mutex_);
  bool WaitSequencesEnded(TimePoint deadline) override ABSL_LOCKS_EXCLUDED(mutex_);
  void EndSequences(const Status& why) override ABSL_LOCKS_EXCLUDED(mutex_);

  // Slots per instance (SequenceBatchingSpec::SlotsPerInstance).
  int slots_per_instance() const { return slots_per_instance_; }

 private:
  SequenceBatcher(ModelSpec spec, Options options, size_t instances);
  void BatcherLoop() ABSL_LOCKS_EXCLUDED(mutex_);
  void InstanceIdle(size_t instance) ABSL_LOCKS_EXCLUDED(mutex_);
  // Admission: the checks that need no lock. OK or why the request is refused.
  Status CheckRequest(const InferRequest& request) const;
  Status CheckRows(const InferRequest& request) const;  // one row per request
  // The completion a taken request runs under: reports the answer to the slots (which may drop a
  // sequence whose start failed, answering its queued requests), then answers the caller.
  InferCompletion Completion(std::shared_ptr<Sequence> sequence, bool start, InferCompletion done)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // A row that keeps an empty slot below a busy one (zeros, READY off), shaped like `like`.
  PendingRequest Filler(const InferRequest& like) const;

  const ModelSpec spec_;
  const Options options_;
  const int slots_per_instance_;
  std::unique_ptr<InstancePool> pool_;  // set by Create before the batcher thread starts

  mutable Mutex mutex_;
  CondVar batcher_cv_;  // a request arrived, an instance went idle, or stop
  CondVar ended_cv_;    // the last sequence ended
  SequenceSlots slots_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> busy_
      ABSL_GUARDED_BY(mutex_);  // by instance: an execution was handed over, not ended
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread batcher_;
};

}  // namespace sluice
