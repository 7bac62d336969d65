// The decisions of the dynamic batcher, without threads: which requests wait together, when a
// group of them becomes a batch, what is admitted, what has expired. DynamicBatcher drives it
// under its lock; tests drive it with a fake clock.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/batching/admission.h"
#include "server/batching/batch_cost.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/status.h"

namespace sluice {

// A request waiting in a queue, with what it costs there.
struct PendingRequest {
  std::unique_ptr<InferRequest> request;
  OutputSink* sink = nullptr;  // the caller's; alive until `done` has run
  InferCompletion done;
  TimePoint enqueued;
  size_t bytes = 0;
  // A row the scheduler added, not a caller's request (an empty sequence slot below a busy one):
  // it runs and is answered like the others but counts in no statistics.
  bool filler = false;
  // Its queue timeout passed under a timeout_action DELAY policy (InferRequest::delay_after): it
  // now waits behind every request of its level and the higher ones that has not timed out.
  bool delayed = false;
  // BatchQueue: the admission share it counts in (its priority level when admitted, less one).
  int share = 0;
};

// A request taken out of the queue unrun, with the answer it gets.
struct RefusedRequest {
  PendingRequest pending;
  Status status;
  EarlyRefusal reason = EarlyRefusal::kNone;
};

// Requests that run together in one forward pass.
struct FormedBatch {
  std::vector<PendingRequest> requests;  // in queue order (priority level, then arrival)
  int64_t rows = 0;                      // rows the callers sent
  int64_t padded_rows = 0;               // rows the model sees (>= rows)
};

class BatchQueue {
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
    // sluice.latency_target_us; 0: none. With a target (and `costs`), see "Latency target" below.
    Duration latency_target{0};
    std::shared_ptr<BatchCostModel> costs;  // required with latency_target; shared with the pool
    int instances = 1;  // instances the queue feeds (work ahead is spread over them)
    // Priority levels (see "Priorities" below): each level's request cap, index level - 1
    // (InferRequest::priority_level); empty: the model has none, and max_requests caps the queue.
    std::vector<size_t> level_max_requests;
    // Some queue policy delays timed-out requests (DELAY) instead of failing them: DelayOverdue
    // has work to do.
    bool delays = false;
  };

  explicit BatchQueue(Options options);

  // Admits `pending` or returns why not (UNAVAILABLE: a cap is reached, see Admission, or too many
  // shapes wait; the caller answers the request). Requests whose non-batch shapes differ wait in
  // different groups. With a latency target, also refuses a request that cannot be answered in
  // time (see below); `*refused` (may be null) then says why. `busy`: how many instances are
  // running a batch now, when the caller knows (-1: it does not; see "Refusal at arrival").
  Status Add(PendingRequest& pending, EarlyRefusal* refused = nullptr, int busy = -1);

  // Latency target (Options::latency_target > 0). Each request must be answered within the
  // target of its arrival, and within its own deadline. Costs come from `costs` (BatchCostModel:
  // warm-up timings, corrected by every batch run); a shape group it knows nothing of yet is
  // batched as without a target, and its requests are not refused on a guess.
  //  - Size: a batch takes the longest prefix (within max_batch_size and the ladder) whose
  //    predicted time on the slowest instance still answers its oldest request in time.
  //  - Waiting: a group that could still grow waits only while (a) a batch of its present rows,
  //    on every instance, would serve fewer rows per second than arrive for the model (so waiting
  //    pays), (b) one more arrival (at that smoothed rate) plus the larger batch still answers
  //    the oldest in time, and (c) something has arrived for the group within the last four
  //    smoothed gaps between arrivals (a longer silence says arrivals slowed or stopped:
  //    StopWaitingAt); a positive max_queue_delay bounds the wait, and a preferred size cuts as
  //    without a target.
  //  - Refusal at arrival: refused when even the fastest instance could not answer it in time
  //    after the work ahead: every group's rows at the per-row cost of the largest batch the target
  //    allows, and what the batches handed out last are predicted to have left, spread over the
  //    instances (of the batches handed out, only the `busy` ones predicted to end last count:
  //    a batch that ended early on an instance now idle counts no more; without `busy`, every
  //    batch counts until its predicted end):
  //    DEADLINE_EXCEEDED when its own deadline is the one it would miss, else UNAVAILABLE. With
  //    nothing ahead a request is always admitted: refusing it on its own predicted cost could
  //    refuse everything for good, with no batch left to correct an estimate that is too high.
  //  - Refusal while queued: TakeHopeless; under overload, TakeOverloaded (not while arrivals
  //    have stopped: SilentFrom).

  // Removes and returns, with their answers, the requests that can no longer be answered in time
  // even in a batch of their own started now (their target passed, or now + their own predicted
  // cost is past it or past their deadline; a predicted cost longer than the whole target is not
  // trusted alone). Empty without a latency target.
  std::vector<RefusedRequest> TakeHopeless(TimePoint now);

  // Latency target, with an instance free at `now` (call it just before TakeReadyBatch): when a
  // batch cut so that a group's oldest request answers in time would serve rows more slowly than
  // they arrive (the model is overloaded: the queue would only grow, and every request behind
  // would wait longer), refuses that oldest request instead, and repeats while that lets the batch
  // grow, up to the smallest size that keeps up with arrivals (or the largest the target allows).
  // Trades the few oldest requests for batches that answer the many behind them in time. Empty
  // without a target, before the arrival rate is known, while nothing has arrived for the model
  // for a silence that says arrivals stopped (SilentFrom), or when the cost model knows nothing
  // of the group.
  std::vector<RefusedRequest> TakeOverloaded(TimePoint now);

  // Removes and returns the requests that are cancelled or whose deadline is at or before `now`.
  std::vector<PendingRequest> TakeExpired(TimePoint now);

  // Priorities (Triton's priority_levels and queue policies). Within a shape group requests wait
  // in order of rank, then arrival: rank is the priority level (1 first), and within a level the
  // requests whose DELAY timeout has passed go after those whose has not. A batch takes the
  // group's first requests in that order, so it mixes levels only where the higher ones leave
  // room; among groups ready at once, the one whose first request ranks highest goes first. Each
  // level has its own request cap (Options::level_max_requests); the byte caps hold for the
  // whole queue. A group's delay (max_queue_delay) runs from its oldest request, whatever its
  // level. Without levels or DELAY every request has the same rank: arrival order, as before.
  //
  // Marks the requests whose DELAY timeout (InferRequest::delay_after) is at or before `now` as
  // delayed and moves them behind the requests of their level that are not (call it before
  // TakeReadyBatch; the order only matters when a batch forms, so nothing needs waking for it).
  void DelayOverdue(TimePoint now);

  // The next batch, if a group is ready at `now`: it can fill max_batch_size, or a prefix of it
  // sums to a preferred batch size, or its oldest request has waited max_queue_delay. Among
  // ready groups the one whose first request ranks highest (see "Priorities"), then the one
  // with the oldest first request, goes first. Groups never block each other.
  std::optional<FormedBatch> TakeReadyBatch(TimePoint now);

  // When a group next becomes ready by its delay, assuming nothing arrives; kNoDeadline when
  // the queue is empty. (A time in the past: a group is ready now.)
  TimePoint NextBatchTime() const;

  // The earliest deadline of a waiting request (its target deadline included); kNoDeadline when
  // none has one.
  TimePoint NextDeadline() const;

  // Limits the batches formed from now on to the rows in `sizes` (ascending, each in
  // [1, max_batch_size]; empty: every size up to max_batch_size): a group whose waiting rows
  // reach sizes.back() is full, and a batch takes the longest prefix of requests whose rows stay
  // within the largest size in `sizes` that the waiting rows reach (at least one request, so a
  // request larger than sizes.back() still runs, alone). Ignored with one_request_per_batch.
  void SetBatchSizeLadder(std::vector<int> sizes) { ladder_ = std::move(sizes); }

  // A request that waits outside the queue for an identical one's answer (Scheduler::AdmitWaiter)
  // counts against the caps of its level, as if queued; ReleaseOutside gives that back.
  Status AdmitOutside(const InferRequest& request);
  void ReleaseOutside(int priority_level, size_t bytes);
  // See Scheduler::Reschedule. The request keeps its group and its admission share; a new level
  // or a later DELAY timeout puts it behind the requests of its new rank already waiting.
  bool Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                  TimePoint delay_after);

  // Everything still waiting (for shutdown).
  std::vector<PendingRequest> TakeAll();

  size_t size() const { return admission_.total_requests(); }  // every level's
  size_t bytes() const { return admission_.total_bytes(); }
  size_t groups() const { return groups_.size(); }

  // The key of a request's group: its inputs' names and non-batch dimensions.
  static std::string GroupKey(const InferRequest& request);

 private:
  struct Group {
    std::deque<PendingRequest> queue;  // by Rank, then arrival
    int64_t rows = 0;                  // rows waiting in `queue`
    TimePoint last_arrival{};          // latency target only: its latest request's arrival
  };

  // Where a request waits relative to others (lower first): its priority level, and behind those
  // of its level whose DELAY timeout has not passed once its own has.
  static int Rank(const PendingRequest& pending) {
    return 2 * pending.request->priority_level + (pending.delayed ? 1 : 0);
  }
  // Whether ranks can differ (priority levels or DELAY): the front of a group is then not
  // necessarily its oldest request.
  bool Ranked() const { return !options_.level_max_requests.empty() || options_.delays; }
  // The admission share a request counts in: the level it was admitted at (Add sets it; a
  // Reschedule does not move it).
  static int ShareOf(const PendingRequest& pending) { return pending.share; }
  // Why a request of `request`'s level is refused when `waiting` requests wait there already.
  static Status QueueFull(const InferRequest& request, size_t waiting);
  // Puts `pending` into `group` after every request of its rank or better.
  static void Insert(Group& group, PendingRequest pending);
  // When the oldest request of `group` arrived.
  TimePoint Oldest(const Group& group) const;

  bool Targeted() const {
    return options_.latency_target > Duration::zero() && options_.costs != nullptr;
  }
  // When `pending` must be answered by for the target (kNoDeadline without one). Not stored in
  // PendingRequest: a larger entry would cost every model's queues more deque blocks.
  TimePoint TargetDeadline(const PendingRequest& pending) const {
    return Targeted() ? pending.enqueued + PlannedTarget() : kNoDeadline;
  }
  // The part of the target the batcher plans with (BatchCostModel::PlanShare): the whole target
  // until answers come late inside the server.
  Duration PlannedTarget() const {
    return std::chrono::duration_cast<Duration>(options_.latency_target *
                                                options_.costs->PlanShare());
  }
  // The earlier of `pending`'s own deadline and its target deadline.
  TimePoint AnswerBy(const PendingRequest& pending) const {
    return std::min(pending.request->deadline, TargetDeadline(pending));
  }
  // Removes every waiting request for which `take(group key, pending)` returns true (it may move
  // the request out first), keeping the admission counts, group rows and groups right.
  template <typename Take>
  void TakeWhere(Take take);
  // How many requests from the front of `group` form a batch now, or 0 when it should wait.
  size_t ReadyPrefix(const std::string& key, const Group& group, TimePoint now) const;
  // With a latency target: at most how many requests from the front of `group` (which has
  // `fitting` requests of `rows` rows within the largest size) may run now so that the oldest
  // is answered in time, and whether the group should still wait for more (`*wait`).
  // nullopt when the cost model knows nothing of the group yet (decide as without a target).
  std::optional<size_t> TargetLimit(const std::string& key, const Group& group, TimePoint now,
                                    size_t fitting, int64_t rows, bool* wait) const;
  // Latency target: the moment a group waiting for more requests stops waiting: when one more
  // arrival (at the smoothed arrival rate) plus the larger batch would answer its oldest request
  // late, or, if earlier, when nothing has arrived for the group for kSilenceGaps smoothed gaps
  // between arrivals (its arrivals have slowed or stopped: a closed loop whose callers all
  // wait); nullopt before the arrival rate or the group's cost is known.
  std::optional<TimePoint> StopWaitingAt(const std::string& key, const Group& group) const;
  // Latency target: when a silence since `last` (an arrival) becomes long enough to say that
  // arrivals have slowed or stopped: kSilenceGaps smoothed gaps between arrivals after it (at a
  // steady Poisson rate, a silence that long comes before about 3.5 % of arrivals);
  // kNoDeadline before the gap is known.
  TimePoint SilentFrom(TimePoint last) const;
  // Latency target: the rows of the longest prefix of `group` (within the largest batch size)
  // whose batch started at `now` answers the oldest request in time on the slowest instance
  // (`*fitting_rows`: the rows of the prefix within the largest size); nullopt when the cost
  // model knows nothing of the group.
  std::optional<int64_t> InTimeRows(const std::string& key, const Group& group, TimePoint now,
                                    int64_t* fitting_rows) const;
  // Latency target: the smallest batch of group `key`, up to `limit` rows, that serves rows at
  // least as fast as they arrive (on every instance), or `limit` when none does.
  int64_t KeepingUpRows(const std::string& key, int64_t limit) const;
  // The largest batch of group `key` whose predicted cost (fastest instance) is within the target
  // (at least 1): the batch size the work ahead is counted at.
  int64_t UsefulBatchSize(const std::string& key) const;
  // Why `pending` (in group `key`, not yet added) cannot be answered in time, or OK.
  Status CheckInTime(const PendingRequest& pending, const std::string& key, EarlyRefusal* refused,
                     int busy) const;
  void Forget(const PendingRequest& pending);
  // Takes `group`'s oldest request out of the queue (its rows and admitted bytes with it).
  PendingRequest PopFront(Group& group);
  int64_t PaddedRows(int64_t rows) const;

  using Groups = std::map<std::string, Group>;
  // Removes an emptied group, keeping its map node (key, deque and their memory) for the next
  // new group: a steady stream of one shape then allocates nothing per request for its group.
  void EraseGroup(Groups::iterator group);

  const Options options_;
  std::vector<int> ladder_;  // SetBatchSizeLadder's sizes; empty: no limit below max_batch_size
  Groups groups_;
  Groups::node_type spare_group_;  // EraseGroup's kept node; empty when none
  // Latency target only: the smoothed time between arrivals per row, over every shape (us; < 0:
  // fewer than two arrivals yet), and the last arrival.
  double gap_us_per_row_ = -1;
  TimePoint last_arrival_;
  // Latency target only: the smoothed time between arrivals (us; < 0: fewer than two yet), what
  // a silence is measured in (StopWaitingAt): a request of many rows is still one arrival.
  double gap_us_per_arrival_ = -1;
  static constexpr double kSilenceGaps = 4;
  // Latency target only: when the batches handed out last are predicted to end (at most one per
  // instance; entries in the past are dropped).
  std::vector<TimePoint> running_until_;
  Admission admission_;
};

}  // namespace sluice
