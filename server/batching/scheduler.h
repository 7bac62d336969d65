// The scheduler interface: how validated requests reach model instances.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"

#include "server/core/infer_request.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"

namespace sluice {

// Called exactly once per enqueued request: OK when the request's sink holds every output it
// asked for, else why it failed (the sink may then hold part of the outputs; discard them). It
// may run on a scheduler worker thread (normal case) or on the enqueuing thread (immediate
// rejection), so it must not block on model work and must be cheap. It must own (capture by
// value or by move: it is move-only) everything it uses: the scheduler destroys the request right
// after calling it, and the completion with it.
using InferCompletion = absl::AnyInvocable<void(Status)>;

// The answer for a request that left a queue without running because its caller cancelled it
// (CANCELLED) or its deadline passed (DEADLINE_EXCEEDED). Every scheduler uses it.
inline Status QueuedExpiryStatus(const InferRequest& request) {
  if (request.IsCancelled()) return absl::CancelledError("the request was cancelled while queued");
  return absl::DeadlineExceededError(
      "the request's deadline or queue timeout passed while it was queued; it did not run");
}

// The answer for requests still queued when a scheduler stops.
inline Status ShutdownStatus() {
  return absl::UnavailableError("the server is shutting down; the request did not run");
}

// One request the warm-up runs (see Scheduler::WarmUp).
struct WarmupRequest {
  std::string label;                      // "batch=4 image[4,3,32,32]", for logs and errors
  std::unique_ptr<InferRequest> request;  // owns its bytes (owned_buffers)
  int runs = 1;                           // times it runs on each instance
  // Runs after every request's `runs`, each timed, in rounds across the requests; their median
  // is WarmupPass::median_timed (0: none). At least `timed_runs`; then more while the timed runs
  // have taken less than `timed_budget` together, up to `max_timed_runs` in all.
  int timed_runs = 0;
  Duration timed_budget{0};
  int max_timed_runs = 0;
  int64_t batch_size = 0;  // rows, for a shape-plan request; 0 for a model_warmup sample
};

// One (instance, request) pair the warm-up ran.
struct WarmupPass {
  int instance = 0;  // index of the instance, in load order
  std::string label;
  Duration first_run{0};     // what the first client request of this shape would have paid
  Duration last_run{0};      // the last warm-up run, close to the steady state
  int64_t batch_size = 0;    // WarmupRequest::batch_size
  Duration median_timed{0};  // median of the timed runs; 0 when there were none
};

struct WarmupReport {
  std::vector<WarmupPass> passes;  // instance-major, requests in the order given
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Takes ownership of `request` and answers it through `done`; the outputs go to `sink`.
  // Lifetimes: the caller keeps `sink`, and the bytes `request`'s inputs view, alive and
  // untouched until `done` has run; the scheduler owns `request` (and destroys it after `done`)
  // and `done`. Thread-safe; never blocks on model execution. UNAVAILABLE when the queue is full
  // or the scheduler has stopped.
  virtual void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                       InferCompletion done) = 0;

  // A request queued here may have been cancelled (its `cancelled` flag was set): answer it now
  // rather than when it would have run. Cheap.
  virtual void Poke() = 0;

  // Runs every request `runs` times on every instance, each on that instance's own worker thread
  // (LibTorch keeps cuDNN's benchmark cache per thread) and through the path a request of that
  // shape takes when served, discarding the outputs; returns when all ran. Call it before the
  // scheduler takes traffic. The first failure is returned, prefixed with the request's label;
  // CANCELLED as soon as `*abandon` (may be null) turns true (the server is shutting down).
  virtual StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                        const std::atomic<bool>* abandon) = 0;

  // From now on a request whose caller_may_run is set may run on the thread that enqueues it,
  // when it finds nothing queued before it and an instance idle (it would run at once anyway):
  // Enqueue then returns after the forward pass and the answer. Call it after warm-up, for a
  // model whose lone request is cheap (see ChooseCallerRuns). A scheduler that cannot says so
  // where it ignores it.
  virtual void SetCallerRuns(bool allowed) = 0;

  // The batch sizes to form from now on (ascending; see BatchPolicy::SetBatchSizeLadder). Call it
  // before the scheduler takes traffic. A scheduler that forms no batches ignores it.
  virtual void SetBatchSizeLadder(std::vector<int> sizes) = 0;

  // Stops accepting work, answers every queued request with UNAVAILABLE, waits for the requests
  // in flight to finish and joins the workers. Idempotent.
  virtual void Stop() = 0;

  // What the answers depend on besides the request, for a response cache in front of this
  // scheduler: answers given under one value may be reused only under the same value. Constant
  // (0) for a model's own scheduler; an ensemble's changes when a model its steps run changes.
  virtual uint64_t AnswersGeneration() const { return 0; }
};

// What single flight (manager/single_flight.h) needs of the queue its shared runs wait in: a
// request that waits outside the queue for the answer of an identical one counts against the
// queue's caps as if it were queued at its own priority level, and the queued run can be moved up.
// DynamicBatcher is one; a decorator that keeps its inner scheduler's queue hands out the inner's.
class QueueSharing {
 public:
  virtual ~QueueSharing() = default;
  // Counts `request` (its level and input bytes) or returns why not (UNAVAILABLE, in
  // Scheduler::Enqueue's words).
  virtual Status AdmitWaiter(const InferRequest& request) = 0;
  // Gives back what AdmitWaiter counted.
  virtual void ReleaseWaiter(int priority_level, size_t bytes) = 0;
  // The request still queued whose `cancelled` flag is `tag` moves up to `priority_level` when
  // that is higher than its own (a smaller number, above 0), waits until `deadline` when that is
  // later than its own, and is delayed (timeout_action DELAY) only from `delay_after` when that is
  // later than its own. Its count in the caps stays where it was admitted. False when no queued
  // request has that flag (it runs, or was answered).
  virtual bool Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                          TimePoint delay_after) = 0;
};

// A scheduler of a stateful model (SequenceBatcher): what the manager needs of its sequences to
// route requests and to drain a retired version.
class SequenceScheduler : public Scheduler {
 public:
  // Whether the sequence `id` is active here (started, not ended, not expired).
  virtual bool HasSequence(const CorrelationId& id) const = 0;
  virtual size_t ActiveSequences() const = 0;
  // Blocks until no sequence is active or `deadline` (on the scheduler's clock) passed; true
  // when none is.
  virtual bool WaitSequencesEnded(TimePoint deadline) = 0;
  // Ends every active sequence now: its queued requests are answered `why` and later requests
  // for it are refused as for any sequence that is not active.
  virtual void EndSequences(const Status& why) = 0;
};

}  // namespace sluice
