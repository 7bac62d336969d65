// The scheduler of a model version whose answers are cached (config.pbtxt response_cache): a
// decorator over the version's own scheduler. A request whose answer is cached is answered at
// once, through its sink (nothing queued, nothing run); one that misses waits for the run of an
// identical request already queued or running, or runs (SingleFlight), and a run's answer is kept
// when it succeeds. Warm-up, the batch-size ladder and caller runs are the inner scheduler's.
// The version's answers live in a namespace of their own in the cache, dropped by Stop.
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/manager/response_cache.h"
#include "server/manager/single_flight.h"

namespace sluice {

class CachingScheduler final : public Scheduler {
 public:
  struct Options {
    std::string model;                      // named in answers
    std::vector<std::string> output_names;  // the model's outputs in config order (cache keys)
    const TimeSource* clock = nullptr;      // required; outlives this
    std::shared_ptr<ModelStats> stats;      // required
    std::shared_ptr<ResponseCache> cache;   // required
    // The queue `inner` keeps its requests in (single flight counts its waiters there); required,
    // owned by `inner`.
    QueueSharing* queue = nullptr;
  };
  CachingScheduler(Options options, std::unique_ptr<Scheduler> inner);
  ~CachingScheduler() override;  // Stop()

  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override;
  // Answers cancelled requests queued in `inner` and cancelled waiters of single flight.
  void Poke() override;
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                const std::atomic<bool>* abandon) override {
    return inner_->WarmUp(std::move(requests), abandon);
  }
  void SetCallerRuns(bool allowed) override { inner_->SetCallerRuns(allowed); }
  void SetBatchSizeLadder(std::vector<int> sizes) override {
    inner_->SetBatchSizeLadder(std::move(sizes));
  }
  // Stops `inner` (which answers every flight's run, and so every waiter), then single flight,
  // and drops the version's cached answers. Idempotent.
  void Stop() override;

 private:
  const Options options_;
  const std::unique_ptr<Scheduler> inner_;
  // This version's namespace in the cache, and the inner scheduler's AnswersGeneration it holds
  // answers for: a new generation closes it (dropping its answers) and opens another.
  std::atomic<uint64_t> space_;
  std::atomic<uint64_t> generation_;
  Mutex regenerate_;  // one thread replaces the namespace
  std::unique_ptr<SingleFlight> flights_;
  std::atomic<bool> stopped_{false};
};

}  // namespace sluice
