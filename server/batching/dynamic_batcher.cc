#include "server/batching/dynamic_batcher.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "server/os/threads.h"

namespace sluice {

StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options) {
  if (instances.empty()) return absl::InvalidArgumentError("a batcher needs at least one instance");
  if (options.clock == nullptr) return absl::InvalidArgumentError("a batcher needs a clock");
  if (options.queue.max_batch_size < 1)
    return absl::InvalidArgumentError("max_batch_size must be >= 1");
  if (options.queue.latency_target > Duration::zero()) {
    // Learned per instance: warm-up seeds it (WarmUp), every batch run corrects it (the pool).
    options.queue.costs = std::make_shared<BatchCostModel>(instances.size(), kBatchCostSmoothing,
                                                           options.queue.latency_target);
    options.queue.instances = static_cast<int>(instances.size());
    if (options.stats)
      options.stats->ShowLatencyTarget(options.queue.latency_target, options.queue.costs);
  }
  std::unique_ptr<DynamicBatcher> batcher(new DynamicBatcher(options));
  if (spec.dynamic_batching.preserve_ordering) batcher->order_ = std::make_unique<ResponseOrder>();
  InstancePool::Options pool_options;
  pool_options.clock = options.clock;
  pool_options.stats = std::move(options.stats);
  pool_options.on_fatal = std::move(options.on_fatal);
  pool_options.on_idle = [raw = batcher.get()](size_t, bool) { raw->Wake(); };
  pool_options.batches = !options.queue.one_request_per_batch;
  pool_options.warm_up_one_at_a_time = options.warm_up_one_at_a_time;
  pool_options.costs = options.queue.costs;
  pool_options.stage_ahead = options.stage_ahead;
  // A batch started: a full batch already waiting may now be staged behind it.
  if (options.stage_ahead) pool_options.on_slot = [raw = batcher.get()] { raw->Wake(); };
  SLUICE_ASSIGN_OR_RETURN(
      batcher->pool_,
      InstancePool::Create(std::move(spec), std::move(instances), std::move(pool_options)));
  batcher->batcher_ = std::thread([raw = batcher.get()] { raw->BatcherLoop(); });
  return batcher;
}

DynamicBatcher::DynamicBatcher(Options options)
    : options_(std::move(options)), queue_(options_.queue) {}

DynamicBatcher::~DynamicBatcher() { Stop(); }

bool DynamicBatcher::RunsLikeTheFrontEnds(const BatchFormer::Options& queue) {
  return queue.max_queue_delay == Duration::zero() && queue.latency_target == Duration::zero() &&
         !queue.delays;
}

void DynamicBatcher::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                             InferCompletion done) {
  PendingRequest pending;
  pending.enqueued = options_.clock->Now();
  pending.bytes = request->InputBytes();
  pending.request = std::move(request);
  pending.sink = sink;
  pending.done = std::move(done);
  ModelStats* stats = pool_->stats();
  const bool may_run_here =
      pending.request->caller_may_run && caller_runs_.load(std::memory_order_relaxed);
  const TimePoint enqueued = pending.enqueued;
  Status admitted;
  EarlyRefusal refused = EarlyRefusal::kNone;
  bool wake = false;
  size_t claimed = 0;  // with `here`: the instance this thread runs the request on
  std::optional<FormedBatch> here;
  {
    MutexLock lock(&mutex_);
    const bool nothing_queued = queue_.size() == 0;
    admitted = stopping_ ? absl::UnavailableError(absl::StrCat(
                               "model '", pending.request->model_name, "' is shutting down"))
                         : queue_.Add(pending, &refused,
                                      options_.queue.instances - static_cast<int>(pool_->idle()));
    // Under the lock: the request cannot be answered (and stop being pending) before this.
    if (admitted.ok() && stats) stats->RecordAdmitted();
    // The batcher would hand this request over at once: run it here instead. Through the queue,
    // so that it forms the batch the batcher would form (padding, ladder, delay).
    if (admitted.ok() && may_run_here && nothing_queued && pool_->idle() > 0) {
      if (std::optional<size_t> instance = pool_->TryClaim()) {
        claimed = *instance;
        here = queue_.TakeReadyBatch(enqueued);
        if (here) TakePlaces(*here);
        // Without a batch it waits for company (max_queue_delay): the batcher's job.
        if (!here) pool_->Unclaim(claimed);
      }
    }
    // The batcher needs this request now only if an instance could take a batch, or if its
    // deadline comes before the batcher's planned wake-up. Otherwise the pool's idle
    // notification (or that wake-up) comes first: while every instance is busy, requests
    // gather without waking anyone. A batcher that is not waiting looks at the queue before it
    // waits again.
    // With stage ahead, also when this arrival completed a batch of the largest size that an
    // instance could stage now.
    wake = admitted.ok() && !here &&
           (pool_->idle() > 0 || queue_.NextDeadline() < batcher_wakes_at_ ||
            (pool_->ahead_slots() > 0 && queue_.HasFullBatch(enqueued)));
    if (wake) ++arrival_signals_;
  }
  if (!admitted.ok()) {
    if (stats) {
      stats->RecordEarlyRefusal(refused, /*queued=*/false);
      stats->RecordRejected(admitted, pending.request->protocol);
      stats->RecordPriorityRefused(pending.request->priority_level, admitted);
    }
    pending.done(std::move(admitted));
    return;
  }
  if (here) {
    pool_->RunClaimed(claimed, *std::move(here));
    return;
  }
  if (wake) batcher_cv_.Signal();
}

void DynamicBatcher::TakePlaces(FormedBatch& batch) {
  if (order_ == nullptr) return;
  for (PendingRequest& pending : batch.requests)
    pending.done = order_->InLine(std::move(pending.done));
}

void DynamicBatcher::Poke() {
  {
    MutexLock lock(&mutex_);
    queue_.NoteCancelled();
  }
  batcher_cv_.Signal();
}

void DynamicBatcher::Wake() {
  { MutexLock lock(&mutex_); }
  batcher_cv_.Signal();
}

Status DynamicBatcher::AdmitWaiter(const InferRequest& request) {
  MutexLock lock(&mutex_);
  if (stopping_)
    return absl::UnavailableError(
        absl::StrCat("model '", request.model_name, "' is shutting down"));
  return queue_.AdmitOutside(request);
}

void DynamicBatcher::ReleaseWaiter(int priority_level, size_t bytes) {
  MutexLock lock(&mutex_);
  queue_.ReleaseOutside(priority_level, bytes);
}

bool DynamicBatcher::Reschedule(const std::atomic<bool>* tag, int priority_level,
                                TimePoint deadline, TimePoint delay_after) {
  MutexLock lock(&mutex_);
  return queue_.Reschedule(tag, priority_level, deadline, delay_after);
}

void DynamicBatcher::BatcherLoop() {
  NameThisThread("sluice-batcher");
  if (RunsLikeTheFrontEnds(options_.queue)) {
    RunThisThreadAsFrontEnd();
  } else {
    RunThisThreadAsModelWork();
  }
  MutexLock lock(&mutex_);
  while (!stopping_) {
    const TimePoint now = options_.clock->Now();
    std::vector<PendingRequest> expired = queue_.TakeExpired(now);
    const bool idle = pool_->idle() > 0;
    std::vector<RefusedRequest> hopeless = queue_.TakeRefused(now, idle && expired.empty());
    if (!expired.empty() || !hopeless.empty()) {
      lock.Unlock();
      for (PendingRequest& pending : expired)
        pool_->Drop(pending, QueuedExpiryStatus(*pending.request));
      for (RefusedRequest& refused : hopeless) {
        if (ModelStats* stats = pool_->stats())
          stats->RecordEarlyRefusal(refused.reason, /*queued=*/true);
        pool_->Drop(refused.pending, refused.status);
      }
      lock.Lock();
      continue;
    }
    if (idle) {
      queue_.DelayOverdue(now);
      if (std::optional<FormedBatch> batch = queue_.TakeReadyBatch(now)) {
        TakePlaces(*batch);
        // Under the lock, so that Stop cannot slip between taking the batch and handing it over.
        pool_->Run(*std::move(batch));
        continue;
      }
    } else if (pool_->ahead_slots() > 0) {
      // Every instance busy: only a batch no arrival could make larger is formed now.
      queue_.DelayOverdue(now);
      if (std::optional<FormedBatch> batch = queue_.TakeFullBatch(now)) {
        TakePlaces(*batch);
        pool_->StageAhead(*std::move(batch));
        continue;
      }
    }
    // With every instance busy only a deadline can need us before the pool's idle notification;
    // with one idle, also the next group's delay.
    TimePoint wakeup = queue_.NextDeadline();
    if (idle) wakeup = std::min(wakeup, queue_.NextBatchTime());
    // (At least 50 us: a deadline the queue reports as due but did not act on must not spin.)
    if (wakeup != kNoDeadline) wakeup = std::max(wakeup, now + std::chrono::microseconds(50));
    batcher_wakes_at_ = wakeup;
    options_.clock->WaitUntil(&batcher_cv_, &mutex_, wakeup);
    batcher_wakes_at_ = TimePoint::min();
    ++waits_ended_;
  }
}

DynamicBatcher::BatcherWaits DynamicBatcher::Waits() const {
  MutexLock lock(&mutex_);
  return {waits_ended_, batcher_wakes_at_ != TimePoint::min(), arrival_signals_};
}

StatusOr<WarmupReport> DynamicBatcher::WarmUp(std::vector<WarmupRequest> requests,
                                              const std::atomic<bool>* abandon) {
  const std::shared_ptr<BatchCostModel>& costs = options_.queue.costs;
  if (costs == nullptr) return pool_->WarmUp(std::move(requests), abandon);
  // Each request's shape group and rows, to seed the cost model with what warm-up timed.
  std::vector<std::pair<std::string, int64_t>> shapes;
  for (const WarmupRequest& warmup : requests) {
    shapes.emplace_back(options_.queue.one_request_per_batch
                            ? std::string()
                            : BatchQueue::GroupKey(*warmup.request),
                        warmup.request->batch_size);
  }
  StatusOr<WarmupReport> report = pool_->WarmUp(std::move(requests), abandon);
  if (!report.ok() || shapes.empty()) return report;
  // One pass per (instance, request), instance-major, requests in the order given.
  for (size_t i = 0; i < report->passes.size(); ++i) {
    const WarmupPass& pass = report->passes[i];
    const auto& [group, rows] = shapes[i % shapes.size()];
    const Duration cost = pass.median_timed > Duration::zero() ? pass.median_timed : pass.last_run;
    if (cost > Duration::zero()) costs->Seed(static_cast<size_t>(pass.instance), group, rows, cost);
  }
  return report;
}

void DynamicBatcher::SetBatchSizeLadder(std::vector<int> sizes) {
  MutexLock lock(&mutex_);
  queue_.SetBatchSizeLadder(std::move(sizes));
}

void DynamicBatcher::Stop() {
  std::vector<PendingRequest> abandoned;
  {
    MutexLock lock(&mutex_);
    if (stopped_ || pool_ == nullptr) return;  // no pool: Create failed, nothing ever started
    stopped_ = true;
    stopping_ = true;
    abandoned = queue_.TakeAll();
  }
  batcher_cv_.SignalAll();
  for (PendingRequest& pending : abandoned) pool_->Drop(pending, ShutdownStatus());
  if (batcher_.joinable()) batcher_.join();
  // The workers finish the batches already handed over, then exit.
  pool_->Stop();
}

}  // namespace sluice
