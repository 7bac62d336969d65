#include "server/batching/dynamic_batcher.h"

#include "absl/strings/str_cat.h"
#include "server/batching/warmup.h"

namespace sluice {

StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options) {
  if (instances.empty()) return absl::InvalidArgumentError("a batcher needs at least one instance");
  if (options.clock == nullptr) return absl::InvalidArgumentError("a batcher needs a clock");
  if (options.queue.max_batch_size < 1) return absl::InvalidArgumentError("max_batch_size must be >= 1");
  return std::unique_ptr<DynamicBatcher>(
      new DynamicBatcher(std::move(spec), std::move(instances), std::move(options)));
}

DynamicBatcher::DynamicBatcher(ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances,
                               Options options)
    : spec_(std::move(spec)), options_(std::move(options)), queue_(options_.queue) {
  for (auto& backend : instances) instances_.push_back(std::make_unique<Instance>(std::move(backend)));
  idle_workers_ = static_cast<int>(instances_.size());
  for (auto& instance : instances_) {
    workers_.emplace_back([this, raw = instance.get()] { WorkerLoop(raw); });
  }
  batcher_ = std::thread([this] { BatcherLoop(); });
}

DynamicBatcher::~DynamicBatcher() { Stop(); }

void DynamicBatcher::Enqueue(std::unique_ptr<InferRequest> request, InferCompletion done) {
  PendingRequest pending;
  pending.enqueued = options_.clock->Now();
  pending.bytes = request->InputBytes();
  pending.request = std::move(request);
  pending.done = std::move(done);
  Status admitted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    admitted = stopping_ ? absl::UnavailableError(absl::StrCat(
                               "model '", pending.request->model_name, "' is shutting down"))
                         : queue_.Add(pending);
    // Under the lock: the request cannot be answered (and stop being pending) before this.
    if (admitted.ok() && options_.stats) options_.stats->RecordAdmitted();
  }
  if (!admitted.ok()) {
    if (options_.stats) options_.stats->RecordRejected(admitted);
    pending.done(std::move(admitted));
    return;
  }
  batcher_cv_.notify_one();
}

void DynamicBatcher::Poke() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  batcher_cv_.notify_one();
}

void DynamicBatcher::FailOne(PendingRequest& pending, const Status& status, TimePoint now, bool ran) {
  if (options_.stats) options_.stats->RecordFailure(now - pending.enqueued, status, ran);
  pending.done(status);
}

void DynamicBatcher::Fail(std::vector<PendingRequest> requests, const Status& status, bool ran) {
  const TimePoint now = options_.clock->Now();
  for (PendingRequest& pending : requests) FailOne(pending, status, now, ran);
}

void DynamicBatcher::BatcherLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const TimePoint now = options_.clock->Now();
    std::vector<PendingRequest> expired = queue_.TakeExpired(now);
    if (!expired.empty()) {
      lock.unlock();
      for (PendingRequest& pending : expired) {
        FailOne(pending, QueuedExpiryStatus(*pending.request), now, /*ran=*/false);
      }
      lock.lock();
      continue;
    }
    if (idle_workers_ > 0) {
      if (std::optional<FormedBatch> batch = queue_.TakeReadyBatch(now)) {
        --idle_workers_;
        ready_.push_back(*std::move(batch));
        worker_cv_.notify_one();
        continue;
      }
    }
    // With every instance busy only a deadline can need us before a worker's notification; with
    // one idle, also the next group's delay.
    TimePoint wakeup = queue_.NextDeadline();
    if (idle_workers_ > 0) wakeup = std::min(wakeup, queue_.NextBatchTime());
    if (wakeup == kNoDeadline) {
      batcher_cv_.wait(lock);
    } else {
      // The clock may be a fake one: wait for the real time it says is left, or a Poke.
      batcher_cv_.wait_for(lock, std::max(wakeup - now, Duration(std::chrono::microseconds(50))));
    }
  }
}

StatusOr<WarmupReport> DynamicBatcher::WarmUp(std::vector<WarmupRequest> requests, const std::atomic<bool>* abandon) {
  auto shared = std::make_shared<const std::vector<WarmupRequest>>(std::move(requests));
  WarmupCollector collector(static_cast<int>(instances_.size()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return absl::UnavailableError("the scheduler has stopped");
    for (size_t i = 0; i < instances_.size(); ++i) {
      Instance* instance = instances_[i].get();
      instance->tasks.push_back([this, instance, i, shared, abandon, &collector] {
        collector.Report(RunWarmupOnInstance(
            static_cast<int>(i), *shared, abandon, [&](const InferRequest& request) -> Status {
              FormedBatch batch;
              batch.requests.emplace_back();
              batch.requests.back().request = std::make_unique<InferRequest>(ViewOf(request));
              batch.rows = batch.padded_rows = request.batch_size;
              TimePoint assembled_at;
              Status status = ExecuteBatch(instance, batch, /*assemble=*/true, &assembled_at).status();
              if (IsFatal(status) && options_.on_fatal) options_.on_fatal(status);
              return status;
            }));
      });
    }
  }
  worker_cv_.notify_all();
  return collector.Wait();
}

StatusOr<InferResponse> DynamicBatcher::ExecuteBatch(Instance* instance, const FormedBatch& batch,
                                                     bool assemble, TimePoint* assembled_at) {
  InferRequest assembled;
  if (assemble) assembled = AssembleBatch(spec_, batch, &instance->staging);
  *assembled_at = options_.clock->Now();
  return instance->backend->Execute(assemble ? assembled : *batch.requests[0].request);
}

void DynamicBatcher::WorkerLoop(Instance* instance) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    worker_cv_.wait(lock, [&] { return stopping_ || !ready_.empty() || !instance->tasks.empty(); });
    if (!instance->tasks.empty()) {
      std::function<void()> task = std::move(instance->tasks.front());
      instance->tasks.pop_front();
      --idle_workers_;
      lock.unlock();
      task();
      lock.lock();
      ++idle_workers_;
      batcher_cv_.notify_one();
      continue;
    }
    if (ready_.empty()) return;  // stopping, and no batch left to run
    FormedBatch batch = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    RunBatch(instance, std::move(batch));
    lock.lock();
    ++idle_workers_;
    batcher_cv_.notify_one();
  }
}

void DynamicBatcher::RunBatch(Instance* instance, FormedBatch batch) {
  const TimePoint started = options_.clock->Now();
  // A lone request that needs no padding runs on its own bytes: nothing to copy or split.
  const bool alone = batch.requests.size() == 1 && batch.padded_rows == batch.rows;
  if (options_.stats) options_.stats->RecordStarted(static_cast<int64_t>(batch.requests.size()));
  TimePoint assembled_at;
  StatusOr<InferResponse> outputs = ExecuteBatch(instance, batch, !alone, &assembled_at);
  const TimePoint executed_at = options_.clock->Now();
  if (!outputs.ok()) {
    if (IsFatal(outputs.status()) && options_.on_fatal) options_.on_fatal(outputs.status());
    Fail(std::move(batch.requests), outputs.status(), /*ran=*/true);
    return;
  }
  StatusOr<std::vector<InferResponse>> responses =
      alone ? StatusOr<std::vector<InferResponse>>(std::vector<InferResponse>{*std::move(outputs)})
            : SplitBatch(batch, *std::move(outputs));
  const TimePoint split_at = options_.clock->Now();
  if (!responses.ok()) {
    Fail(std::move(batch.requests), responses.status(), /*ran=*/true);
    return;
  }
  if (options_.stats) {
    options_.stats->RecordExecution(batch.padded_rows, assembled_at - started, executed_at - assembled_at,
                                    split_at - executed_at);
  }
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    PendingRequest& pending = batch.requests[i];
    if (options_.stats) {
      options_.stats->RecordSuccess(pending.request->batch_size, started - pending.enqueued,
                                    assembled_at - started, executed_at - assembled_at,
                                    split_at - executed_at, options_.clock->Now() - pending.enqueued);
    }
    pending.done(std::move((*responses)[i]));
  }
}

void DynamicBatcher::Stop() {
  std::vector<PendingRequest> abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    abandoned = queue_.TakeAll();
  }
  batcher_cv_.notify_all();
  worker_cv_.notify_all();
  Fail(std::move(abandoned), ShutdownStatus(), /*ran=*/false);
  if (batcher_.joinable()) batcher_.join();
  // Workers finish the batches already formed, then exit.
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

size_t DynamicBatcher::StagingAllocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& instance : instances_) total += instance->staging.allocations();
  return total;
}

}  // namespace sluice
