// Warm-up before a model reports ready: the requests to run (every shape of the model's shape
// plan, then Triton's model_warmup samples) and the plumbing InstancePool uses to run them on
// each instance's worker thread.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/batching/scheduler.h"
#include "server/batching/shape_plan.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"

namespace sluice {

// One zero-filled request per shape of `plan` (when the plan is finite and spec.warmup is on;
// BYTES inputs hold empty strings),
// each run spec.warmup_runs times and, where sluice.auto_batch_sizes applies
// (AutoBatchSizesOffReason), timed runs after those (kBatchSizeTimedRuns at least, more within
// kBatchSizeTimedBudget, see batch_sizes.h); then each model_warmup
// sample (zero, random or file data; files are read from <model_directory>/warmup/; for BYTES:
// empty strings, random digits, or a file of serialized elements), run
// `count` times. INVALID_ARGUMENT for a sample that does not fit the model's inputs or whose
// file is missing or of the wrong size.
StatusOr<std::vector<WarmupRequest>> BuildWarmupRequests(
    const ModelSpec& spec, const ShapePlan& plan, const std::filesystem::path& model_directory);

// A request viewing the same input bytes as `request` (not owning them).
InferRequest ViewOf(const InferRequest& request);

// The median of `runs` (the upper one of an even count), which must not be empty: the time a
// shape takes, from repeated timed runs.
Duration MedianOf(std::vector<Duration> runs);

// Runs `requests` on one instance through `run` (the scheduler's execution path): each request's
// `runs` in order, then the timed runs in rounds across the requests (WarmupRequest), timed on
// `clock` (the scheduler's; the median of each request's timed runs goes to
// WarmupPass::median_timed); CANCELLED before the next run once `*abandon` (may be null) is true.
// The first failing run's status ends it, naming the request and the instance.
StatusOr<std::vector<WarmupPass>> RunWarmupOnInstance(
    int instance, const std::vector<WarmupRequest>& requests, const std::atomic<bool>* abandon,
    const TimeSource& clock, const std::function<Status(const InferRequest&)>& run);

// Collects the per-instance results of one warm-up. Thread-safe.
class WarmupCollector {
 public:
  explicit WarmupCollector(int instances) : remaining_(instances) {}
  // Takes everything out of `passes` under the lock: nothing of it is shared with the reporting
  // thread afterwards (absl::Status shares its message between copies, and the reporter's
  // temporary may die after Wait has returned).
  void Report(StatusOr<std::vector<WarmupPass>>&& passes) ABSL_LOCKS_EXCLUDED(mutex_);
  // Blocks until every instance reported; the passes in instance order, or the first failure.
  StatusOr<WarmupReport> Wait() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  Mutex mutex_;
  CondVar done_;  // remaining_ reached 0
  int remaining_ ABSL_GUARDED_BY(mutex_);
  Status failure_ ABSL_GUARDED_BY(mutex_);
  std::vector<WarmupPass> passes_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
