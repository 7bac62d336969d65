#include "server/batching/batch_queue.h"

#include <algorithm>
#include <iterator>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace sluice {

BatchQueue::BatchQueue(Options options)
    : options_(std::move(options)),
      admission_(Admission::Options{options_.max_requests, options_.max_bytes, options_.server_budget,
                                    /*shares=*/1}) {}

std::string BatchQueue::GroupKey(const InferRequest& request) {
  absl::InlinedVector<const TensorView*, 4> inputs;
  for (const TensorView& input : request.inputs) inputs.push_back(&input);
  std::sort(inputs.begin(), inputs.end(),
            [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  std::string key;
  for (const TensorView* input : inputs) {
    absl::StrAppend(&key, input->name, "[");
    for (size_t i = 1; i < input->shape.size(); ++i) absl::StrAppend(&key, input->shape[i], ",");
    absl::StrAppend(&key, "]");
  }
  return key;
}

void BatchQueue::EraseGroup(Groups::iterator group) {
  Groups::node_type node = groups_.extract(group);
  if (!spare_group_) spare_group_ = std::move(node);
}

Status BatchQueue::Add(PendingRequest& pending) {
  const InferRequest& request = *pending.request;
  const std::string key = options_.one_request_per_batch ? std::string() : GroupKey(request);
  auto group = groups_.find(key);
  if (group == groups_.end() && static_cast<int>(groups_.size()) >= options_.max_groups) {
    return absl::UnavailableError(absl::StrCat(
        "model '", request.model_name, "' already has ", groups_.size(),
        " different input shapes waiting (sluice.max_shape_groups); retry later or send fewer "
        "distinct shapes"));
  }
  SLUICE_RETURN_IF_ERROR(admission_.Admit(0, pending.bytes, request.model_name, [&](size_t waiting) {
    return absl::UnavailableError(absl::StrCat(
        "model '", request.model_name, "' has ", waiting,
        " requests waiting (its max_queue_size); retry later, or raise the limit or add instances"));
  }));
  if (group == groups_.end()) {
    if (spare_group_) {
      spare_group_.key() = key;
      group = groups_.insert(std::move(spare_group_)).position;
    } else {
      group = groups_.try_emplace(key).first;
    }
  }
  group->second.queue.push_back(std::move(pending));
  return absl::OkStatus();
}

void BatchQueue::Forget(const PendingRequest& pending) { admission_.Release(0, pending.bytes); }

std::vector<PendingRequest> BatchQueue::TakeExpired(TimePoint now) {
  std::vector<PendingRequest> expired;
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = it->second;
    for (auto entry = group.queue.begin(); entry != group.queue.end();) {
      if (entry->request->deadline <= now || entry->request->IsCancelled()) {
        Forget(*entry);
        expired.push_back(std::move(*entry));
        entry = group.queue.erase(entry);
      } else {
        ++entry;
      }
    }
    if (group.queue.empty()) {
      EraseGroup(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

size_t BatchQueue::ReadyPrefix(const Group& group, TimePoint now) const {
  // The longest prefix that fits max_batch_size, and the longest whose rows are a preferred size.
  int64_t rows = 0;
  size_t fitting = 0;
  size_t preferred = 0;
  if (options_.one_request_per_batch) return 1;
  const int64_t largest = ladder_.empty() ? options_.max_batch_size : ladder_.back();
  for (const PendingRequest& pending : group.queue) {
    if (rows + pending.request->batch_size > largest) break;
    rows += pending.request->batch_size;
    ++fitting;
    if (std::binary_search(options_.preferred_batch_sizes.begin(),
                           options_.preferred_batch_sizes.end(), static_cast<int>(rows))) {
      preferred = fitting;
    }
  }
  // A request larger than the ladder's largest size (at most max_batch_size) runs alone.
  if (fitting == 0) return 1;
  const bool full = fitting < group.queue.size() || rows == largest;
  const bool waited = now - group.queue.front().enqueued >= options_.max_queue_delay;
  if (!full && !waited) return preferred;
  if (ladder_.empty()) return fitting;
  // The largest ladder size the rows reach, and the longest prefix within it.
  const auto reached = std::upper_bound(ladder_.begin(), ladder_.end(), rows);
  const int64_t cap = reached == ladder_.begin() ? rows : *std::prev(reached);
  int64_t kept_rows = 0;
  size_t kept = 0;
  for (const PendingRequest& pending : group.queue) {
    if (kept == fitting || kept_rows + pending.request->batch_size > cap) break;
    kept_rows += pending.request->batch_size;
    ++kept;
  }
  return std::max<size_t>(kept, 1);
}

int64_t BatchQueue::PaddedRows(int64_t rows) const {
  if (!options_.pad_to_preferred) return rows;
  for (int size : options_.preferred_batch_sizes) {
    if (size >= rows) return size;
  }
  return options_.max_batch_size;
}

std::optional<FormedBatch> BatchQueue::TakeReadyBatch(TimePoint now) {
  Group* chosen = nullptr;
  size_t take = 0;
  Groups::iterator chosen_it;
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    const size_t prefix = ReadyPrefix(it->second, now);
    if (prefix == 0) continue;
    if (chosen == nullptr || it->second.queue.front().enqueued < chosen->queue.front().enqueued) {
      chosen = &it->second;
      chosen_it = it;
      take = prefix;
    }
  }
  if (chosen == nullptr) return std::nullopt;
  FormedBatch batch;
  batch.requests.reserve(take);
  for (size_t i = 0; i < take; ++i) {
    PendingRequest& front = chosen->queue.front();
    batch.rows += front.request->batch_size;
    Forget(front);
    batch.requests.push_back(std::move(front));
    chosen->queue.pop_front();
  }
  if (chosen->queue.empty()) EraseGroup(chosen_it);
  batch.padded_rows = PaddedRows(batch.rows);
  return batch;
}

TimePoint BatchQueue::NextBatchTime() const {
  TimePoint next = kNoDeadline;
  for (const auto& [key, group] : groups_) {
    next = std::min(next, group.queue.front().enqueued + options_.max_queue_delay);
  }
  return next;
}

TimePoint BatchQueue::NextDeadline() const {
  TimePoint next = kNoDeadline;
  for (const auto& [key, group] : groups_) {
    for (const PendingRequest& pending : group.queue) next = std::min(next, pending.request->deadline);
  }
  return next;
}

std::vector<PendingRequest> BatchQueue::TakeAll() {
  std::vector<PendingRequest> all;
  for (auto& [key, group] : groups_) {
    for (PendingRequest& pending : group.queue) {
      Forget(pending);
      all.push_back(std::move(pending));
    }
  }
  groups_.clear();
  return all;
}

}  // namespace sluice
