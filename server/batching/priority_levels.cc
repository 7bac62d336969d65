#include "server/batching/priority_levels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {

void PriorityLevels::Place(PendingRequest& pending) const {
  const InferRequest& request = *pending.request;
  pending.share = static_cast<int16_t>(ShareOf(request.priority_level));
  pending.rank = Rank(request.priority_level, /*delayed=*/false);
}

std::function<TimePoint(const PendingRequest&)> PriorityLevels::RankChanges() const {
  if (!options_.delays) return nullptr;
  return [](const PendingRequest& pending) {
    return Delayed(pending) ? kNoDeadline : pending.request->delay_after;
  };
}

Status PriorityLevels::QueueFull(const InferRequest& request, size_t waiting) {
  if (request.priority_level > 0) {
    return absl::UnavailableError(absl::StrCat(
        "model '", request.model_name, "' has ", waiting, " requests waiting at priority level ",
        request.priority_level,
        " (that level's max_queue_size); retry later, or raise the limit or add instances"));
  }
  return absl::UnavailableError(absl::StrCat(
      "model '", request.model_name, "' has ", waiting,
      " requests waiting (its max_queue_size); retry later, or raise the limit or add instances"));
}

void PriorityLevels::DelayOverdue(BatchQueue& queue, TimePoint now) const {
  if (!options_.delays) return;
  // In the order they stood: among the delayed of one level, arrival order holds too.
  queue.Rerank(now, [](PendingRequest& pending) {
    pending.rank = Rank(pending.request->priority_level, /*delayed=*/true);
  });
}

bool PriorityLevels::Reschedule(BatchQueue& queue, const std::atomic<bool>* tag, int priority_level,
                                TimePoint deadline, TimePoint delay_after) const {
  return queue.ChangeOne(
      [tag](const PendingRequest& pending) { return pending.request->cancelled.get() == tag; },
      [&](PendingRequest& pending) {
        InferRequest& request = *pending.request;
        request.deadline = std::max(request.deadline, deadline);
        const bool higher = priority_level > 0 && request.priority_level > 0 &&
                            priority_level < request.priority_level;
        // A later DELAY timeout (a waiter's that has not passed) undoes the demotion;
        // DelayOverdue demotes it again once that one passes.
        const bool undelay = delay_after > request.delay_after;
        if (undelay) request.delay_after = delay_after;
        const bool delayed = Delayed(pending);
        if (!higher && !(undelay && delayed)) return false;  // it keeps its place
        if (higher) request.priority_level = priority_level;
        pending.rank = Rank(request.priority_level, delayed && !undelay);
        return true;
      });
}

}  // namespace sluice
