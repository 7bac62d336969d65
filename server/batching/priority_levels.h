// Where a request waits in a dynamic batcher's queue: Triton's priority levels and queue policies.
// Within a shape group requests wait in order of rank, then arrival: rank is the priority level
// (1 first), and within a level the requests whose DELAY timeout has passed go after those whose
// has not. A batch takes the group's first requests in that order, so it mixes levels only where
// the higher ones leave room; among groups ready at once, the one whose first request ranks
// highest goes first. Each level has its own request cap (one admission share per level); the
// byte caps hold for the whole queue. A group's delay (max_queue_delay) runs from its oldest
// request, whatever its level. Without levels or DELAY every request has the same rank: arrival
// order. Holds under every BatchPolicy. Stateless past its options; not thread-safe only in that
// the queue it changes is not.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "server/batching/batch_queue.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/status.h"

namespace sluice {

class PriorityLevels {
 public:
  struct Options {
    // Each level's request cap, index level - 1 (InferRequest::priority_level); empty: the model
    // has no levels, and the queue's max_requests caps it.
    std::vector<size_t> level_max_requests;
    // Some queue policy delays timed-out requests (DELAY) instead of failing them.
    bool delays = false;
  };
  explicit PriorityLevels(Options options) : options_(std::move(options)) {}

  // Whether ranks can differ: the front of a group is then not necessarily its oldest request.
  bool Ranked() const { return !options_.level_max_requests.empty() || options_.delays; }
  // The queue's per-share request caps (one share per level).
  const std::vector<size_t>& share_max_requests() const { return options_.level_max_requests; }

  // Sets where `pending` waits: its rank and its admission share.
  void Place(PendingRequest& pending) const;
  // The queue's BatchQueue::Options::rank_changes_at: a request's DELAY timeout until it is
  // delayed; null without DELAY.
  std::function<TimePoint(const PendingRequest&)> RankChanges() const;
  // The admission share of a request at `level`.
  static int ShareOf(int level) { return level > 0 ? level - 1 : 0; }
  // Why a request of `request`'s level is refused when `waiting` requests wait there already.
  static Status QueueFull(const InferRequest& request, size_t waiting);

  // Marks the requests whose DELAY timeout (InferRequest::delay_after) is at or before `now` as
  // delayed and moves them behind the requests of their level that are not (call it before a
  // batch forms; the order only matters then, so nothing needs waking for it). Looks at no
  // request when none is due.
  void DelayOverdue(BatchQueue& queue, TimePoint now) const;

  // The request still queued whose `cancelled` flag is `tag` moves up to `priority_level` when
  // that is higher than its own (a smaller number, above 0), waits until `deadline` when that is
  // later than its own, and is delayed (timeout_action DELAY) only from `delay_after` when that is
  // later than its own. It keeps its group and its admission share; a new level or a later DELAY
  // timeout puts it behind the requests of its new rank already waiting. False when no queued
  // request has that flag.
  bool Reschedule(BatchQueue& queue, const std::atomic<bool>* tag, int priority_level,
                  TimePoint deadline, TimePoint delay_after) const;

 private:
  static int16_t Rank(int level, bool delayed) {
    return static_cast<int16_t>(2 * level + (delayed ? 1 : 0));
  }
  static bool Delayed(const PendingRequest& pending) { return (pending.rank & 1) != 0; }

  const Options options_;
};

}  // namespace sluice
