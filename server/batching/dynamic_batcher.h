// Triton-style dynamic batching: requests for one model version wait in shape groups and run
// together in one forward pass on whichever instance is free; outputs are split back per request.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/batching/batch_assembly.h"
#include "server/batching/batch_queue.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"

namespace sluice {

// Threads: one batcher thread forms batches, only when an instance is idle (so batches keep
// growing while every instance is busy); one worker thread per instance assembles its batch in
// the instance's staging buffers, runs it and answers each request. Every request is answered
// exactly once: with its outputs, or DEADLINE_EXCEEDED (expired while queued), CANCELLED
// (caller gone while queued), UNAVAILABLE (a cap reached, or shutting down), or the model's
// error (only the requests of the failing batch get it).
class DynamicBatcher final : public Scheduler {
 public:
  struct Options {
    BatchQueue::Options queue;
    const TimeSource* clock = nullptr;           // required; outlives the batcher
    std::shared_ptr<ModelStats> stats;           // may be null
    std::function<void(const Status&)> on_fatal;  // a fatal (sticky device) error; may be null
  };

  static StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  ~DynamicBatcher() override;

  void Enqueue(std::unique_ptr<InferRequest> request, InferCompletion done) override;
  // Each warm-up request is assembled in the instance's staging buffers as a one-request batch
  // (so the buffers also reach their largest size before traffic comes).
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests, const std::atomic<bool>* abandon) override;
  void Stop() override;

  // Makes the batcher thread look at the queue now (tests call it after moving a fake clock;
  // the transport after a cancellation).
  void Poke() override;

  // Staging allocations so far, over all instances.
  size_t StagingAllocations() const;

 private:
  struct Instance {
    explicit Instance(std::unique_ptr<ModelBackend> model)
        : backend(std::move(model)), staging(backend.get()) {}
    std::unique_ptr<ModelBackend> backend;
    StagingPool staging;  // touched only by this instance's worker thread
    std::deque<std::function<void()>> tasks;  // run by this instance's worker first; guarded by mutex_
  };

  DynamicBatcher(ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  void BatcherLoop();
  void WorkerLoop(Instance* instance);
  void RunBatch(Instance* instance, FormedBatch batch);
  // Assembles `batch` in the instance's staging buffers (unless it is one request that needs no
  // padding) and runs it.
  StatusOr<InferResponse> ExecuteBatch(Instance* instance, const FormedBatch& batch, bool assemble,
                                       TimePoint* assembled_at);
  // `ran`: the requests were running (their batch failed), not waiting.
  void FailOne(PendingRequest& pending, const Status& status, TimePoint now, bool ran);
  void Fail(std::vector<PendingRequest> requests, const Status& status, bool ran);

  const ModelSpec spec_;
  const Options options_;
  std::vector<std::unique_ptr<Instance>> instances_;

  mutable std::mutex mutex_;
  std::condition_variable batcher_cv_;  // queue changed, an instance went idle, or stop
  std::condition_variable worker_cv_;   // a batch is ready, or stop
  BatchQueue queue_;                    // guarded by mutex_
  std::deque<FormedBatch> ready_;       // formed, waiting for a worker; guarded by mutex_
  int idle_workers_ = 0;                // guarded by mutex_
  bool stopping_ = false;               // guarded by mutex_
  bool stopped_ = false;                // guarded by mutex_
  std::thread batcher_;
  std::vector<std::thread> workers_;
};

}  // namespace sluice
