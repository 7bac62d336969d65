// The decisions of the dynamic batcher, without threads: the queue that keeps the waiting
// requests (BatchQueue), the order they wait in (PriorityLevels) and the policy that says when a
// group becomes a batch and what is refused (BatchPolicy, chosen from the options once, when the
// version loads). DynamicBatcher drives it under its lock; tests drive it with a fake clock.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/batching/batch_cost.h"
#include "server/batching/batch_policy.h"
#include "server/batching/batch_queue.h"
#include "server/batching/priority_levels.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/status.h"

namespace sluice {

class BatchFormer {
 public:
  struct Options {
    int max_batch_size = 1;
    std::vector<int> preferred_batch_sizes;  // ascending
    Duration max_queue_delay{0};             // 0: a batch forms as soon as an instance is free
    size_t max_requests = 1024;              // waiting requests
    size_t max_bytes = 256u << 20;  // waiting input bytes (one larger request may wait alone)
    int max_groups = 16;            // distinct shapes waiting at once
    bool pad_to_preferred = false;  // pad rows to the next preferred size / max
    std::shared_ptr<ByteBudget> server_budget;  // shared by every model; may be null
    // Every batch is one request (with its own batch size, at most max_batch_size), and requests
    // wait in one queue in arrival order whatever their shapes: a model without dynamic_batching.
    bool one_request_per_batch = false;
    // sluice.latency_target_us; 0: none. With a target (and `costs`): LatencyTargetPolicy.
    Duration latency_target{0};
    std::shared_ptr<BatchCostModel> costs;  // required with latency_target; shared with the pool
    int instances = 1;  // instances the queue feeds (work ahead is spread over them)
    // Priority levels (PriorityLevels): each level's request cap, index level - 1; empty: the
    // model has none, and max_requests caps the queue.
    std::vector<size_t> level_max_requests;
    // Some queue policy delays timed-out requests (DELAY) instead of failing them.
    bool delays = false;
  };

  // The policy `options` ask for.
  static std::unique_ptr<BatchPolicy> MakePolicy(const Options& options);

  explicit BatchFormer(Options options);

  // Admits `pending` or returns why not (UNAVAILABLE: a cap is reached, see Admission, or too many
  // shapes wait; the caller answers the request; or the policy's refusal, `*refused` (may be null)
  // then says which). Requests whose non-batch shapes differ wait in different groups. `busy`: how
  // many instances are running a batch now, when the caller knows (-1: it does not).
  Status Add(PendingRequest& pending, EarlyRefusal* refused = nullptr, int busy = -1);

  // Removes and returns the requests whose deadline is at or before `now`, and those cancelled
  // since the last call that NoteCancelled announced (a cancellation is found only once announced;
  // finding it takes a look at every waiting request).
  std::vector<PendingRequest> TakeExpired(TimePoint now);
  // A waiting request may have been cancelled (its caller went away).
  void NoteCancelled() { cancelled_ = true; }

  // The requests the policy refuses while they wait, with their answers (see
  // BatchPolicy::TakeRefused); `forming`: an instance is free and a batch is about to form.
  std::vector<RefusedRequest> TakeRefused(TimePoint now, bool forming) {
    return policy_->TakeRefused(queue_, now, forming);
  }

  // See PriorityLevels::DelayOverdue (call it before TakeReadyBatch).
  void DelayOverdue(TimePoint now) { levels_.DelayOverdue(queue_, now); }

  // The next batch, if a group is ready at `now` (BatchPolicy::ReadyPrefix). Among ready groups
  // the one whose first request ranks highest (see PriorityLevels), then the one with the oldest
  // first request, goes first. Groups never block each other.
  std::optional<FormedBatch> TakeReadyBatch(TimePoint now);

  // The next batch no arrival could make larger (BatchPolicy::FullPrefix), chosen among such
  // groups as TakeReadyBatch chooses; nullopt when none is full. For a batch staged ahead while
  // every instance is busy.
  std::optional<FormedBatch> TakeFullBatch(TimePoint now);
  // Whether TakeFullBatch would return a batch now. Cheap while no group holds the largest batch
  // size's rows (a look at each group's row count).
  bool HasFullBatch(TimePoint now) const;

  // When a group next becomes ready by waiting, assuming nothing arrives; kNoDeadline when the
  // queue is empty. (A time in the past: a group is ready now.)
  TimePoint NextBatchTime() const;

  // The earliest time a waiting request must be answered by (its deadline, or the policy's
  // answer-by time); kNoDeadline when none has one. Read from ordered indexes: cheap at any depth.
  TimePoint NextDeadline() const {
    return std::min(queue_.EarliestDeadline(), policy_->EarliestAnswerBy(queue_));
  }

  // See BatchPolicy::SetBatchSizeLadder.
  void SetBatchSizeLadder(std::vector<int> sizes) { policy_->SetBatchSizeLadder(std::move(sizes)); }

  // A request that waits outside the queue for an identical one's answer (single flight) counts
  // against the caps of its level, as if queued; ReleaseOutside gives that back.
  Status AdmitOutside(const InferRequest& request);
  void ReleaseOutside(int priority_level, size_t bytes) {
    queue_.ReleaseOutside(PriorityLevels::ShareOf(priority_level), bytes);
  }
  // See PriorityLevels::Reschedule.
  bool Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                  TimePoint delay_after) {
    return levels_.Reschedule(queue_, tag, priority_level, deadline, delay_after);
  }

  // Everything still waiting (for shutdown).
  std::vector<PendingRequest> TakeAll() { return queue_.TakeAll(); }

  size_t size() const { return queue_.size(); }  // every level's
  size_t bytes() const { return queue_.bytes(); }
  size_t groups() const { return queue_.group_count(); }

 private:
  // The group TakeReadyBatch (`full` false) or TakeFullBatch (`full` true) takes from, and how
  // many requests; nullptr when none.
  const std::string* Choose(TimePoint now, bool full, size_t* take) const;
  // Takes `take` requests from the front of group `key` as a batch.
  std::optional<FormedBatch> Take(const std::string& key, size_t take, TimePoint now);

  const PriorityLevels levels_;
  const std::unique_ptr<BatchPolicy> policy_;
  BatchQueue queue_;
  bool cancelled_ = false;  // NoteCancelled since the last TakeExpired
};

}  // namespace sluice
