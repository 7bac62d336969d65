#include "server/batching/unbatched_scheduler.h"

#include "absl/strings/str_cat.h"
#include "server/batching/warmup.h"

namespace sluice {

StatusOr<std::unique_ptr<UnbatchedScheduler>> UnbatchedScheduler::Create(
    std::vector<std::unique_ptr<ModelBackend>> instances, Options options) {
  if (instances.empty()) return absl::InvalidArgumentError("a scheduler needs at least one instance");
  if (options.max_queue_size == 0) return absl::InvalidArgumentError("max_queue_size must be > 0");
  return std::unique_ptr<UnbatchedScheduler>(
      new UnbatchedScheduler(std::move(instances), std::move(options)));
}

UnbatchedScheduler::UnbatchedScheduler(std::vector<std::unique_ptr<ModelBackend>> instances,
                                       Options options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &steady_),
      instances_(std::move(instances)),
      tasks_(instances_.size()) {
  workers_.reserve(instances_.size());
  for (size_t i = 0; i < instances_.size(); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

StatusOr<WarmupReport> UnbatchedScheduler::WarmUp(std::vector<WarmupRequest> requests, const std::atomic<bool>* abandon) {
  auto shared = std::make_shared<const std::vector<WarmupRequest>>(std::move(requests));
  WarmupCollector collector(static_cast<int>(instances_.size()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return absl::UnavailableError("the scheduler has stopped");
    for (size_t i = 0; i < instances_.size(); ++i) {
      tasks_[i].push_back([this, instance = instances_[i].get(), i, shared, abandon, &collector] {
        // Unbatched requests run on their own bytes, so warm-up does too.
        collector.Report(RunWarmupOnInstance(static_cast<int>(i), *shared, abandon,
                                             [this, instance](const InferRequest& request) {
                                               Status status = instance->Execute(request).status();
                                               if (IsFatal(status) && options_.on_fatal) options_.on_fatal(status);
                                               return status;
                                             }));
      });
    }
  }
  work_ready_.notify_all();
  return collector.Wait();
}

UnbatchedScheduler::~UnbatchedScheduler() { Stop(); }

void UnbatchedScheduler::Enqueue(std::unique_ptr<InferRequest> request, InferCompletion done) {
  Status rejection;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      rejection = absl::UnavailableError(
          absl::StrCat("model '", request->model_name, "' is shutting down"));
    } else if (queue_.size() >= options_.max_queue_size) {
      rejection = absl::UnavailableError(absl::StrCat(
          "model '", request->model_name, "' has ", queue_.size(),
          " requests waiting (the queue limit); retry later or add instances"));
    } else {
      queue_.push_back(Work{std::move(request), std::move(done), clock_->Now()});
      if (options_.stats) options_.stats->RecordAdmitted();  // under the lock, before any answer
    }
  }
  if (!rejection.ok()) {
    if (options_.stats) options_.stats->RecordRejected(rejection);
    done(std::move(rejection));
    return;
  }
  work_ready_.notify_one();
}

void UnbatchedScheduler::Stop() {
  std::deque<Work> abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    abandoned.swap(queue_);
  }
  work_ready_.notify_all();
  for (Work& work : abandoned) {
    if (options_.stats) options_.stats->RecordFailure(clock_->Now() - work.enqueued, ShutdownStatus(), false);
    work.done(ShutdownStatus());
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.clear();
}

void UnbatchedScheduler::WorkerLoop(size_t index) {
  ModelBackend* instance = instances_[index].get();
  std::deque<std::function<void()>>& tasks = tasks_[index];
  for (;;) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty() || !tasks.empty(); });
      if (!tasks.empty()) {
        std::function<void()> task = std::move(tasks.front());
        tasks.pop_front();
        lock.unlock();
        task();
        continue;
      }
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    const TimePoint started = clock_->Now();
    // A request whose caller is gone, or whose deadline passed while it waited, never runs.
    if (work.request->IsCancelled() || work.request->deadline <= started) {
      const Status expired = QueuedExpiryStatus(*work.request);
      if (options_.stats) options_.stats->RecordFailure(started - work.enqueued, expired, /*ran=*/false);
      work.done(expired);
      continue;
    }
    if (options_.stats) options_.stats->RecordStarted(1);
    StatusOr<InferResponse> result = instance->Execute(*work.request);
    const TimePoint finished = clock_->Now();
    if (options_.stats) {
      if (result.ok()) {
        options_.stats->RecordExecution(work.request->batch_size, Duration::zero(), finished - started,
                                        Duration::zero());
        options_.stats->RecordSuccess(work.request->batch_size, started - work.enqueued,
                                      Duration::zero(), finished - started, Duration::zero(),
                                      finished - work.enqueued);
      } else {
        options_.stats->RecordFailure(finished - work.enqueued, result.status(), /*ran=*/true);
      }
    }
    if (!result.ok() && IsFatal(result.status()) && options_.on_fatal) options_.on_fatal(result.status());
    work.done(std::move(result));
  }
}

}  // namespace sluice
