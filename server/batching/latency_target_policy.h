// Batching to a latency target (sluice.latency_target_us) over a model's own policy (dynamic
// batching, or one request per batch). Each request must be answered within the target of its
// arrival, and within its own deadline. Costs come from a BatchCostModel (warm-up timings,
// corrected by every batch run); a shape group it knows nothing of yet is batched as the policy
// underneath batches it, and its requests are not refused on a guess.
//  - Size: a batch takes the longest prefix (within max_batch_size and the ladder) whose
//    predicted time on the slowest instance still answers its oldest request in time.
//  - Waiting: a group that could still grow waits only while (a) a batch of its present rows,
//    on every instance, would serve fewer rows per second than arrive for the model (so waiting
//    pays), (b) one more arrival (at that smoothed rate) plus the larger batch still answers
//    the oldest in time, and (c) something has arrived for the group within the last four
//    smoothed gaps between arrivals (a longer silence says arrivals slowed or stopped:
//    StopWaitingAt); a positive max_queue_delay bounds the wait, and a preferred size cuts as
//    without a target.
//  - Refusal at arrival (CheckArrival): refused when even the fastest instance could not answer it
//    in time after the work ahead: every group's rows at the per-row cost of the largest batch the
//    target allows, and what the batches handed out last are predicted to have left, spread over
//    the instances (of the batches handed out, only the `busy` ones predicted to end last count:
//    a batch that ended early on an instance now idle counts no more; without `busy`, every
//    batch counts until its predicted end): DEADLINE_EXCEEDED when its own deadline is the one it
//    would miss, else UNAVAILABLE. With nothing ahead a request is always admitted: refusing it on
//    its own predicted cost could refuse everything for good, with no batch left to correct an
//    estimate that is too high.
//  - Refusal while queued (TakeRefused): TakeHopeless; with an instance free, TakeOverloaded (not
//    while arrivals have stopped: SilentFrom).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/batching/batch_policy.h"

namespace sluice {

class LatencyTargetPolicy final : public BatchPolicy {
 public:
  struct Options {
    Duration target{0};                     // > 0
    std::shared_ptr<BatchCostModel> costs;  // required; shared with the instance pool
    int instances = 1;                      // instances the queue feeds (work ahead is spread)
  };
  // `base`: the model's own policy, DynamicBatchingPolicy (whose positive max_queue_delay bounds
  // the wait) or OneRequestPerBatchPolicy for a model without dynamic batching.
  LatencyTargetPolicy(Options options, std::unique_ptr<BatchPolicy> base);

  // Removes and returns, with their answers, the requests that can no longer be answered in time
  // even in a batch of their own started now (their target passed, or now + their own predicted
  // cost is past it or past their deadline; a predicted cost longer than the whole target is not
  // trusted alone).
  std::vector<RefusedRequest> TakeHopeless(BatchQueue& queue, TimePoint now) const;
  // With an instance free at `now`: when a batch cut so that a group's oldest request answers in
  // time would serve rows more slowly than they arrive (the model is overloaded: the queue would
  // only grow, and every request behind would wait longer), refuses that oldest request instead,
  // and repeats while that lets the batch grow, up to the smallest size that keeps up with
  // arrivals (or the largest the target allows). Empty before the arrival rate is known, while
  // nothing has arrived for the model for a silence that says arrivals stopped (SilentFrom),
  // without dynamic batching, or when the cost model knows nothing of the group.
  std::vector<RefusedRequest> TakeOverloaded(BatchQueue& queue, TimePoint now) const;

  std::string KeyOf(const InferRequest& request) const override { return base_->KeyOf(request); }
  Status CheckArrival(const BatchQueue& queue, const PendingRequest& pending,
                      const std::string& key, int busy, EarlyRefusal* refused) const override;
  void Arrived(TimePoint at, int64_t rows) override;
  size_t ReadyPrefix(const BatchQueue& queue, const std::string& key,
                     const BatchQueue::Group& group, TimePoint now) const override;
  TimePoint ReadyAt(const BatchQueue& queue, const std::string& key,
                    const BatchQueue::Group& group) const override;
  TimePoint EarliestAnswerBy(const BatchQueue& queue) const override;
  std::vector<RefusedRequest> TakeRefused(BatchQueue& queue, TimePoint now, bool forming) override;
  void Formed(const std::string& key, int64_t padded_rows, TimePoint now) override;
  int64_t PaddedRows(int64_t rows) const override { return base_->PaddedRows(rows); }
  void SetBatchSizeLadder(std::vector<int> sizes) override {
    base_->SetBatchSizeLadder(std::move(sizes));
  }

 private:
  // When `pending` must be answered by for the target.
  TimePoint TargetDeadline(const PendingRequest& pending) const {
    return pending.enqueued + PlannedTarget();
  }
  // The part of the target the batcher plans with (BatchCostModel::PlanShare): the whole target
  // until answers come late inside the server.
  Duration PlannedTarget() const {
    return std::chrono::duration_cast<Duration>(options_.target * options_.costs->PlanShare());
  }
  // The earlier of `pending`'s own deadline and its target deadline.
  TimePoint AnswerBy(const PendingRequest& pending) const {
    return std::min(pending.request->deadline, TargetDeadline(pending));
  }
  // At most how many requests from the front of `group` (which has `fitting` requests of `rows`
  // rows within the largest size) may run now so that the oldest is answered in time, and
  // whether the group should still wait for more (`*wait`). nullopt when the cost model knows
  // nothing of the group yet (decide as without a target).
  std::optional<size_t> TargetLimit(const std::string& key, const BatchQueue::Group& group,
                                    TimePoint now, size_t fitting, int64_t rows, bool* wait) const;
  // The moment a group waiting for more requests stops waiting: when one more arrival (at the
  // smoothed arrival rate) plus the larger batch would answer its oldest request late, or, if
  // earlier, when nothing has arrived for the group for kSilenceGaps smoothed gaps between
  // arrivals (its arrivals have slowed or stopped: a closed loop whose callers all wait);
  // nullopt before the arrival rate or the group's cost is known.
  std::optional<TimePoint> StopWaitingAt(const std::string& key,
                                         const BatchQueue::Group& group) const;
  // When a silence since `last` (an arrival) becomes long enough to say that arrivals have slowed
  // or stopped: kSilenceGaps smoothed gaps between arrivals after it (at a steady Poisson rate, a
  // silence that long comes before about 3.5 % of arrivals); kNoDeadline before the gap is known.
  TimePoint SilentFrom(TimePoint last) const;
  // The rows of the longest prefix of `group` (within the largest batch size) whose batch started
  // at `now` answers the oldest request in time on the slowest instance (`*fitting_rows`: the rows
  // of the prefix within the largest size); nullopt when the cost model knows nothing of the group.
  std::optional<int64_t> InTimeRows(const std::string& key, const BatchQueue::Group& group,
                                    TimePoint now, int64_t* fitting_rows) const;
  // The smallest batch of group `key`, up to `limit` rows, that serves rows at least as fast as
  // they arrive (on every instance), or `limit` when none does.
  int64_t KeepingUpRows(const std::string& key, int64_t limit) const;
  // The largest batch of group `key` whose predicted cost (fastest instance) is within the target
  // (at least 1): the batch size the work ahead is counted at.
  int64_t UsefulBatchSize(const std::string& key) const;
  int64_t Largest() const { return sizes_ != nullptr ? sizes_->Largest() : 1; }

  const Options options_;
  const std::unique_ptr<BatchPolicy> base_;  // the model's own policy
  DynamicBatchingPolicy* const sizes_;       // base_ when it batches; null for one per batch
  // The smoothed time between arrivals per row, over every shape (us; < 0: fewer than two arrivals
  // yet), and the last arrival.
  double gap_us_per_row_ = -1;
  TimePoint last_arrival_;
  // The smoothed time between arrivals (us; < 0: fewer than two yet), what a silence is measured
  // in (StopWaitingAt): a request of many rows is still one arrival.
  double gap_us_per_arrival_ = -1;
  static constexpr double kSilenceGaps = 4;
  // When the batches handed out last are predicted to end (at most one per instance; entries in
  // the past are dropped).
  std::vector<TimePoint> running_until_;
};

}  // namespace sluice
