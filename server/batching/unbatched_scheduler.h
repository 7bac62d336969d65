// Runs each request on its own, as it comes, on whichever model instance is free: the scheduling
// of a model without dynamic_batching. A request that was cancelled, or whose deadline passed,
// while it waited is answered CANCELLED / DEADLINE_EXCEEDED when its turn comes, without running.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/backend.h"

namespace sluice {

class UnbatchedScheduler final : public Scheduler {
 public:
  struct Options {
    size_t max_queue_size = 1024;       // waiting requests beyond this are rejected with UNAVAILABLE
    const TimeSource* clock = nullptr;  // for statistics; null: the steady clock
    std::shared_ptr<ModelStats> stats;  // may be null
    std::function<void(const Status&)> on_fatal;  // a fatal (sticky device) error; may be null
  };

  // One worker thread per instance. INVALID_ARGUMENT without instances.
  static StatusOr<std::unique_ptr<UnbatchedScheduler>> Create(
      std::vector<std::unique_ptr<ModelBackend>> instances, Options options);

  ~UnbatchedScheduler() override;

  void Enqueue(std::unique_ptr<InferRequest> request, InferCompletion done) override;
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests, const std::atomic<bool>* abandon) override;
  void Stop() override;

 private:
  struct Work {
    std::unique_ptr<InferRequest> request;
    InferCompletion done;
    TimePoint enqueued;
  };

  UnbatchedScheduler(std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  void WorkerLoop(size_t index);

  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  std::vector<std::unique_ptr<ModelBackend>> instances_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<Work> queue_;  // guarded by mutex_
  // Per instance, work for that instance's worker alone (warm-up), run before the queue.
  std::vector<std::deque<std::function<void()>>> tasks_;  // guarded by mutex_
  bool stopping_ = false;   // guarded by mutex_
  std::vector<std::thread> workers_;
};

}  // namespace sluice
