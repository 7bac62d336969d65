#include "server/batching/batch_policy.h"

#include <algorithm>
#include <iterator>

namespace sluice {

DynamicBatchingPolicy::Prefix DynamicBatchingPolicy::Measure(const BatchQueue& queue,
                                                             const BatchQueue::Group& group,
                                                             TimePoint now) const {
  // The longest prefix that fits the largest size, and the longest whose rows are a preferred size.
  Prefix prefix;
  const int64_t largest = Largest();
  for (const PendingRequest& pending : group.queue) {
    if (prefix.rows + pending.request->batch_size > largest) break;
    prefix.rows += pending.request->batch_size;
    ++prefix.fitting;
    if (std::binary_search(options_.preferred_batch_sizes.begin(),
                           options_.preferred_batch_sizes.end(), static_cast<int>(prefix.rows))) {
      prefix.preferred = prefix.fitting;
    }
  }
  prefix.full = prefix.fitting < group.queue.size() || prefix.rows == largest;
  prefix.waited = now - queue.Oldest(group) >= options_.max_queue_delay;
  return prefix;
}

size_t DynamicBatchingPolicy::Decide(const BatchQueue::Group& group, const Prefix& prefix) const {
  if (!prefix.full && !prefix.waited) return prefix.preferred;
  if (ladder_.empty()) return prefix.fitting;
  // The largest ladder size the rows reach, and the longest prefix within it.
  const auto reached = std::upper_bound(ladder_.begin(), ladder_.end(), prefix.rows);
  const int64_t cap = reached == ladder_.begin() ? prefix.rows : *std::prev(reached);
  int64_t kept_rows = 0;
  size_t kept = 0;
  for (const PendingRequest& pending : group.queue) {
    if (kept == prefix.fitting || kept_rows + pending.request->batch_size > cap) break;
    kept_rows += pending.request->batch_size;
    ++kept;
  }
  return std::max<size_t>(kept, 1);
}

size_t DynamicBatchingPolicy::ReadyPrefix(const BatchQueue& queue, const std::string&,
                                          const BatchQueue::Group& group, TimePoint now) const {
  const Prefix prefix = Measure(queue, group, now);
  // A request larger than the ladder's largest size (at most max_batch_size) runs alone.
  if (prefix.fitting == 0) return 1;
  return Decide(group, prefix);
}

size_t DynamicBatchingPolicy::FullPrefix(const BatchQueue& queue, const std::string&,
                                         const BatchQueue::Group& group, TimePoint now) const {
  // Fewer rows than the largest size: every request fits, and an arrival could add to them.
  if (group.rows < Largest()) return 0;
  const Prefix prefix = Measure(queue, group, now);
  if (prefix.fitting == 0) return 1;  // a request too large for any batch runs alone
  return prefix.full ? Decide(group, prefix) : 0;
}

int64_t DynamicBatchingPolicy::PaddedRows(int64_t rows) const {
  if (!options_.pad_to_preferred) return rows;
  for (int size : options_.preferred_batch_sizes) {
    if (size >= rows) return size;
  }
  return options_.max_batch_size;
}

}  // namespace sluice
