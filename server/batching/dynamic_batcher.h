// Triton-style dynamic batching: requests for one model version wait in shape groups and run
// together in one forward pass on whichever instance of its InstancePool is free. A model without
// dynamic_batching uses the same batcher with one request per batch (BatchFormer's
// one_request_per_batch): the same queue caps, expiry timer and messages.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/batching/batch_former.h"
#include "server/batching/instance_pool.h"
#include "server/batching/model_stats.h"
#include "server/batching/response_order.h"
#include "server/batching/scheduler.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"

namespace sluice {

// Threads: one batcher thread forms batches, only when an instance is idle (so batches keep
// growing while every instance is busy), and hands them to the pool; with stage_ahead, also a
// batch of the largest size while every instance is busy, staged behind a running batch. It is
// woken by an arrival only when that arrival could change its plan (an instance idle, or an earlier
// deadline), by the pool when an instance goes idle, and by its own timer. With SetCallerRuns, a
// request that would run at once (nothing queued, an instance waiting, its batch ready by itself)
// runs on the enqueuing thread instead, on a claimed instance: no thread is woken for it. Every
// request is answered exactly once: with its outputs, or DEADLINE_EXCEEDED (expired while queued),
// CANCELLED (caller gone while queued), UNAVAILABLE (a cap reached, or shutting down), or the
// model's error (only the requests of the failing batch get it). With a latency target
// (BatchFormer::Options:: latency_target) the batcher learns batch costs (warm-up seeds them, the
// pool corrects them), and a request that cannot be answered in time is refused at arrival or while
// queued (UNAVAILABLE for the target, DEADLINE_EXCEEDED for its own deadline; see
// LatencyTargetPolicy). With preserve_ordering, answers leave in the order the requests were taken
// into batches (ResponseOrder); requests answered without running leave at once.
class DynamicBatcher final : public Scheduler, public QueueSharing {
 public:
  struct Options {
    BatchFormer::Options queue;
    const TimeSource* clock = nullptr;            // required; outlives the batcher
    std::shared_ptr<ModelStats> stats;            // may be null
    std::function<void(const Status&)> on_fatal;  // a fatal (sticky device) error; may be null
    bool warm_up_one_at_a_time = false;           // see InstancePool::Options
    // sluice.stage_ahead: while every instance is busy, a batch that waiting could not make
    // larger (BatchFormer::TakeFullBatch) is formed at once and staged behind a running one
    // (InstancePool::StageAhead), so that its assembly overlaps the running forward pass.
    bool stage_ahead = false;
  };

  // Whether the batcher thread of a queue with these options runs as the front ends do
  // (RunThisThreadAsFrontEnd) rather than as model work: when it forms each batch as soon as an
  // instance is free and keeps no timer the model's configuration promises (no queue delay, no
  // latency target, no queue policy that delays). Such a batcher, woken on a busy CPU by the first
  // request of a burst, then no longer preempts the gRPC thread still delivering the rest; one with
  // such a timer must act on it at once, not at the scheduler's next tick (up to 4 ms at HZ=250).
  // Requests' own timeouts may be acted on up to a tick late on a busy CPU either way.
  static bool RunsLikeTheFrontEnds(const BatchFormer::Options& queue);

  static StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  ~DynamicBatcher() override;

  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override ABSL_LOCKS_EXCLUDED(mutex_);
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                const std::atomic<bool>* abandon) override;
  void SetBatchSizeLadder(std::vector<int> sizes) override ABSL_LOCKS_EXCLUDED(mutex_);
  void SetCallerRuns(bool allowed) override {
    caller_runs_.store(allowed, std::memory_order_relaxed);
  }
  void Stop() override ABSL_LOCKS_EXCLUDED(mutex_);

  // A queued request may have been cancelled (the transport calls it after a cancellation): the
  // batcher thread looks for cancelled requests and answers them now. Moving the clock needs no
  // poke: the thread waits on it.
  void Poke() override ABSL_LOCKS_EXCLUDED(mutex_);
  Status AdmitWaiter(const InferRequest& request) override ABSL_LOCKS_EXCLUDED(mutex_);
  void ReleaseWaiter(int priority_level, size_t bytes) override ABSL_LOCKS_EXCLUDED(mutex_);
  bool Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                  TimePoint delay_after) override ABSL_LOCKS_EXCLUDED(mutex_);

  // Staging allocations so far, over all instances.
  size_t StagingAllocations() const { return pool_->StagingAllocations(); }

  // The batch costs it learns (with a latency target; else null).
  const BatchCostModel* costs() const { return options_.queue.costs.get(); }

  // The batcher thread's waits: how many it has ended (a signal, its timer, or a spurious
  // wake-up), whether it is in one now, and how many arrivals signalled it. For tests of who
  // wakes it.
  struct BatcherWaits {
    uint64_t ended = 0;
    bool waiting = false;
    uint64_t arrival_signals = 0;
  };
  BatcherWaits Waits() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  explicit DynamicBatcher(Options options);
  void BatcherLoop() ABSL_LOCKS_EXCLUDED(mutex_);
  // Makes the batcher thread look at the queue now (an instance went idle).
  void Wake() ABSL_LOCKS_EXCLUDED(mutex_);
  // preserve_ordering: gives each request of `batch` its place in line, in batch order.
  void TakePlaces(FormedBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Options options_;
  std::unique_ptr<ResponseOrder> order_;  // preserve_ordering; else null. Outlives pool_'s workers.
  std::unique_ptr<InstancePool> pool_;    // set by Create before the batcher thread starts

  mutable Mutex mutex_;
  CondVar batcher_cv_;  // queue changed, an instance went idle, or stop
  BatchFormer queue_ ABSL_GUARDED_BY(mutex_);
  // While the batcher thread waits: when it plans to look again (kNoDeadline: only when poked).
  // TimePoint::min() while it runs (it looks at the queue before it waits again).
  TimePoint batcher_wakes_at_ ABSL_GUARDED_BY(mutex_) = TimePoint::min();
  uint64_t waits_ended_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t arrival_signals_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread batcher_;
  std::atomic<bool> caller_runs_{false};  // SetCallerRuns
};

}  // namespace sluice
