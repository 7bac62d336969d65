// The requests a dynamic batcher holds, kept in shape groups: what waits, in which order, what it
// counts against the caps, and how soon the earliest of them is due. It decides nothing: a
// BatchPolicy says when a group becomes a batch and what is refused, the ranks its callers give
// requests say where each one waits (RequestOrder). Without threads; not thread-safe (the batcher
// calls it under its lock).
//
// Nothing here walks every waiting request to answer "when": the deadlines, the times a rank is
// due to change and (when asked for) each group's arrivals are kept in order as requests come and
// go, so the earliest of each is read at once.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "server/batching/admission.h"
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
  // Where it waits in its group (lower first; arrival order among equals) and the admission share
  // it counts in. Set by whoever queues it (the batcher's order); the queue only keeps them.
  // Narrow, so that an entry stays small: a larger one costs every queue more deque blocks.
  int16_t rank = 0;
  int16_t share = 0;
};

// A request taken out of the queue unrun, with the answer it gets.
struct RefusedRequest {
  PendingRequest pending;
  Status status;
  EarlyRefusal reason = EarlyRefusal::kNone;
};

// Requests that run together in one forward pass.
struct FormedBatch {
  std::vector<PendingRequest> requests;  // in queue order (rank, then arrival)
  int64_t rows = 0;                      // rows the callers sent
  int64_t padded_rows = 0;               // rows the model sees (>= rows)
};

class BatchQueue {
 public:
  struct Options {
    size_t max_requests = 1024;     // waiting requests per share, unless share_max_requests
    size_t max_bytes = 256u << 20;  // waiting input bytes, all shares together
    std::shared_ptr<ByteBudget> server_budget;  // shared by every model; may be null
    int max_groups = 16;                        // distinct shape groups waiting at once
    // Each share's request cap (index: PendingRequest::share); empty: one share of max_requests.
    std::vector<size_t> share_max_requests;
    // Keep each group's arrivals in order, so that its oldest request is known when ranks put it
    // behind younger ones (Oldest). Without it the front of a group is taken as its oldest.
    bool index_arrivals = false;
    // When a waiting request's rank is next due to change (Rerank); kNoDeadline: never. Null: no
    // rank ever changes with time. Its answer for a request may change only inside Rerank's and
    // ChangeOne's `change`.
    std::function<TimePoint(const PendingRequest&)> rank_changes_at;
  };

  struct Group {
    std::deque<PendingRequest> queue;   // by rank, then arrival
    int64_t rows = 0;                   // rows waiting in `queue`
    TimePoint last_arrival{};           // its latest request's arrival
    std::multiset<TimePoint> arrivals;  // Options::index_arrivals only
  };
  using Groups = std::map<std::string, Group>;

  explicit BatchQueue(Options options);

  // Counts `pending` against the caps (its share, its bytes) and puts it into the group `key`,
  // after every request of its rank or better; or returns why not (UNAVAILABLE: too many groups
  // wait, or a cap is reached, in `count_refusal`'s words for the request cap). On refusal
  // `pending` is untouched.
  Status Add(PendingRequest& pending, const std::string& key,
             Admission::CountRefusal count_refusal);
  // Whether a request for group `key` could wait as far as the group count goes (Add's first
  // check), or why not.
  Status CheckGroups(const InferRequest& request, const std::string& key) const;

  const Groups& groups() const { return groups_; }
  // When the oldest request of `group` arrived.
  TimePoint Oldest(const Group& group) const;
  // The earliest deadline of a waiting request; kNoDeadline when none has one.
  TimePoint EarliestDeadline() const {
    return deadlines_.empty() ? kNoDeadline : *deadlines_.begin();
  }

  // Takes the first `count` requests of the group `key` (which holds at least that many) out as a
  // batch; `padded_rows` is left to the caller.
  FormedBatch TakeFront(const std::string& key, size_t count);
  // Takes the first request of the group `key` out.
  PendingRequest PopFront(const std::string& key);

  // Takes out every waiting request for which `take(group key, const pending&)` returns true,
  // keeping the caps, the group rows and the indexes right; returns them in the order `take` saw
  // them.
  template <typename Take>
  std::vector<PendingRequest> TakeWhere(Take take);

  // The requests whose deadline is at or before `now`, and, when `look_for_cancelled`, the
  // cancelled ones (that takes a look at every request; the deadlines alone do not).
  std::vector<PendingRequest> TakeExpired(TimePoint now, bool look_for_cancelled);

  // Calls `change(pending)` for every request whose Options::rank_changes_at is at or before
  // `now` (it sets a new rank, and so a new rank_changes_at) and moves each behind the requests of
  // its new rank that were there before it, in the order they stood. Looks at no request when none
  // is due.
  template <typename Change>
  void Rerank(TimePoint now, Change change);

  // Calls `change(pending)` for the first waiting request for which `match(pending)` holds. Its
  // deadline and rank_changes_at may change, its share may not; when its rank changed `change`
  // returns true and the request moves behind those of its new rank already waiting, else it
  // keeps its place. False when none matches.
  template <typename Match, typename Change>
  bool ChangeOne(Match match, Change change);

  // Counts a request waiting outside the queue (in `share`, of `bytes`) as if it were queued, or
  // returns why not; ReleaseOutside gives it back.
  Status AdmitOutside(int share, size_t bytes, absl::string_view model,
                      Admission::CountRefusal count_refusal) {
    return admission_.Admit(share, bytes, model, count_refusal);
  }
  void ReleaseOutside(int share, size_t bytes) { admission_.Release(share, bytes); }

  // Everything still waiting (for shutdown).
  std::vector<PendingRequest> TakeAll();

  size_t size() const { return admission_.total_requests(); }  // every share's
  size_t bytes() const { return admission_.total_bytes(); }
  size_t group_count() const { return groups_.size(); }

  // The key of a request's group: its inputs' names and non-batch dimensions.
  static std::string GroupKey(const InferRequest& request);

 private:
  TimePoint RankChangesAt(const PendingRequest& pending) const {
    return options_.rank_changes_at ? options_.rank_changes_at(pending) : kNoDeadline;
  }
  // Puts `pending` into `group` after every request of its rank or better, and indexes it.
  void Insert(Group& group, PendingRequest pending);
  // Forgets `pending`'s entries in the indexes and the caps (it leaves the queue).
  void Unindex(Group& group, const PendingRequest& pending);
  // Moves `group`'s first request out and unindexes it (the group may be left empty).
  PendingRequest TakeOne(Group& group);
  void IndexTimes(Group& group, const PendingRequest& pending);
  void UnindexTimes(Group& group, const PendingRequest& pending);
  // Removes an emptied group, keeping its map node (key, deque and their memory) for the next
  // new group: a steady stream of one shape then allocates nothing per request for its group.
  void EraseGroup(Groups::iterator group);

  const Options options_;
  Groups groups_;
  Groups::node_type spare_group_;  // EraseGroup's kept node; empty when none
  // The finite deadlines and rank_changes_at of the waiting requests.
  std::multiset<TimePoint> deadlines_;
  std::multiset<TimePoint> rank_changes_;
  Admission admission_;
};

template <typename Take>
std::vector<PendingRequest> BatchQueue::TakeWhere(Take take) {
  std::vector<PendingRequest> taken;
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = it->second;
    for (auto entry = group.queue.begin(); entry != group.queue.end();) {
      if (!take(it->first, static_cast<const PendingRequest&>(*entry))) {
        ++entry;
        continue;
      }
      Unindex(group, *entry);
      taken.push_back(std::move(*entry));
      entry = group.queue.erase(entry);
    }
    if (group.queue.empty()) {
      EraseGroup(it++);
    } else {
      ++it;
    }
  }
  return taken;
}

template <typename Change>
void BatchQueue::Rerank(TimePoint now, Change change) {
  if (rank_changes_.empty() || *rank_changes_.begin() > now) return;
  for (auto& [key, group] : groups_) {
    std::vector<PendingRequest> due;
    for (auto entry = group.queue.begin(); entry != group.queue.end();) {
      if (RankChangesAt(*entry) > now) {
        ++entry;
        continue;
      }
      UnindexTimes(group, *entry);
      due.push_back(std::move(*entry));
      entry = group.queue.erase(entry);
    }
    for (PendingRequest& pending : due) {
      change(pending);
      Insert(group, std::move(pending));
    }
  }
}

template <typename Match, typename Change>
bool BatchQueue::ChangeOne(Match match, Change change) {
  for (auto& [key, group] : groups_) {
    for (auto it = group.queue.begin(); it != group.queue.end(); ++it) {
      if (!match(*it)) continue;
      UnindexTimes(group, *it);
      if (!change(*it)) {
        IndexTimes(group, *it);
        return true;
      }
      PendingRequest pending = std::move(*it);
      group.queue.erase(it);
      Insert(group, std::move(pending));
      return true;
    }
  }
  return false;
}

}  // namespace sluice
