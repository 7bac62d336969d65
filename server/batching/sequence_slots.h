// The sequence batcher's decisions, without threads: which sequence holds which slot, what is
// admitted, what expires, and which requests form an instance's next execution. SequenceBatcher
// drives it under its lock; tests drive it with a fake clock. See sequence_batcher.h for the
// behaviour clients see.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"

#include "server/batching/admission.h"
#include "server/batching/batch_queue.h"
#include "server/batching/model_stats.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// One sequence (a correlation id), from its start request until it ends, expires or is dropped.
//
//   phase            what it means                                  next
//   kWaitingForSlot  no slot yet: its start waits in `pending`      kBound (AssignSlots binds it)
//   kBound           holds a slot; its start has not run yet        kRunning (FormBatch takes its
//   start) kRunning         one of its requests runs                       kIdle (Finished), or
//   dropped (its
//                                                                   start failed)
//   kIdle            started; nothing of it runs                    kRunning (FormBatch), or ended
//   (idle
//                                                                   for
//                                                                   max_sequence_idle_microseconds)
//   kEnding          its end request runs; its slot is free already gone (Finished)
//                    (executions of one instance run in order, so a sequence bound to the slot now
//                    starts after it)
// Before kRunning a sequence whose start expires while queued (deadline, cancellation) is dropped
// with its other requests. From kEnding on, and once ended, expired or dropped, the id is no
// longer active: a request for it is refused, and a new start begins a new sequence.
struct Sequence {
  enum class Phase { kWaitingForSlot, kBound, kRunning, kIdle, kEnding };
  struct Slot {
    size_t instance = 0;
    int row = 0;
  };

  CorrelationId id;
  Phase phase = Phase::kWaitingForSlot;
  std::optional<Slot> slot;            // from kBound on
  std::deque<PendingRequest> pending;  // arrival order; the front runs next
  TimePoint last_activity;             // its last arrival, or the answer to its last request

  bool started() const {
    return phase == Phase::kRunning || phase == Phase::kIdle || phase == Phase::kEnding;
  }
  // Its sequence_end request has arrived and waits.
  bool EndQueued() const;
};

class SequenceSlots {
 public:
  struct Options {
    size_t instances = 1;
    int slots_per_instance = 1;    // SequenceBatchingSpec::SlotsPerInstance
    Admission::Options admission;  // the caps, per share: waiting for a slot / bound (the slots
                                   // set the shares)
    ModelStats* stats = nullptr;   // may be null: sequences started and how they finished
  };
  // Wraps a taken request's completion (FormBatch): the batcher's way back to Finished.
  using WrapCompletion = absl::FunctionRef<InferCompletion(std::shared_ptr<Sequence> sequence,
                                                           bool start, InferCompletion done)>;

  // `spec` outlives the slots.
  SequenceSlots(const ModelSpec* spec, Options options);

  // Admits `pending` (one row, its controls appended) into its sequence at `now`, or returns why
  // not: INVALID_ARGUMENT (a start for an active id, a request for an id that is not active, a
  // request after the queued end) or UNAVAILABLE (an admission cap); `pending` is then untouched.
  Status Add(PendingRequest& pending, TimePoint now);

  // Moves the requests that expired by `now` (deadline, cancellation) into `out` with their
  // answers, and, for a sequence whose start expired, its other requests too (the sequence is
  // dropped); ends sequences idle for max_sequence_idle_microseconds. Returns when something can
  // next expire (kNoDeadline: nothing can).
  TimePoint Expire(TimePoint now, std::vector<std::pair<PendingRequest, Status>>* out);

  // Binds sequences waiting for a slot to free slots, oldest first: on the instance with the most
  // free slots (spreading sequences), its lowest free slot (keeping executions few rows tall).
  void AssignSlots();

  // The next execution of idle instance `instance`, if one should run at `now`, at most one
  // request per sequence, rows sharing the oldest request's non-batch shapes. Direct: each
  // request in its slot's row, rows up to the highest slot with a request, fillers (`filler`)
  // below it; with max_queue_delay it waits for minimum_slot_utilization. Oldest: the oldest
  // requests of up to max_batch_size sequences, packed in age order; with max_queue_delay it waits
  // for the largest preferred batch size (else max_batch_size), and then takes that many. Else
  // nullopt, with `*wake` lowered to when it may. Taken requests run under `wrap`'s completion,
  // which must call Finished; with implicit state each carries its StateRow (its slot, its start).
  std::optional<FormedBatch> FormBatch(
      size_t instance, TimePoint now, TimePoint* wake, WrapCompletion wrap,
      absl::FunctionRef<PendingRequest(const InferRequest& like)> filler);

  // A request of `sequence` taken by FormBatch was answered with `status` at `now`. A start that
  // failed drops its sequence: its queued requests move into `*orphans` for the caller to answer.
  void Finished(const std::shared_ptr<Sequence>& sequence, bool start, const Status& status,
                TimePoint now, std::deque<PendingRequest>* orphans);

  // Ends every active sequence; returns their queued requests for the caller to answer.
  std::vector<PendingRequest> EndAll();

  bool Has(const CorrelationId& id) const { return sequences_.count(id) > 0; }
  size_t active() const { return sequences_.size(); }
  size_t queued() const { return admission_.total_requests(); }
  // The sequence active under `id`, or null (for tests and logs).
  const Sequence* Find(const CorrelationId& id) const;

 private:
  static constexpr int kWaitingShare = 0;
  static constexpr int kBoundShare = 1;
  static int ShareOf(const Sequence& sequence) {
    return sequence.slot ? kBoundShare : kWaitingShare;
  }

  Status Admit(const Sequence* sequence, size_t bytes);
  // Takes the front request of bound `sequence` into an execution (FormBatch). By value: an end
  // request frees the slot that held the caller's reference.
  PendingRequest Take(std::shared_ptr<Sequence> sequence, WrapCompletion wrap);
  // Frees the slot of `sequence` (if it has one), forgets it, and counts how it finished.
  void Forget(const std::shared_ptr<Sequence>& sequence, SequenceOutcome outcome);

  const ModelSpec* const spec_;
  const Options options_;
  std::map<CorrelationId, std::shared_ptr<Sequence>> sequences_;  // active ones
  std::deque<std::shared_ptr<Sequence>> waiting_;                 // for a slot, arrival order
  std::vector<std::vector<std::shared_ptr<Sequence>>> slots_;     // by instance, by row; null: free
  Admission admission_;
};

}  // namespace sluice
