#include "server/batching/batch_queue.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

Admission::Options AdmissionOptions(const BatchQueue::Options& options) {
  Admission::Options out;
  out.max_requests = options.max_requests;
  out.max_bytes = options.max_bytes;
  out.server_budget = options.server_budget;
  out.shares = std::max<int>(1, static_cast<int>(options.share_max_requests.size()));
  out.share_max_requests = options.share_max_requests;
  out.bytes_across_shares = true;
  return out;
}

}  // namespace

BatchQueue::BatchQueue(Options options)
    : options_(std::move(options)), admission_(AdmissionOptions(options_)) {}

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

Status BatchQueue::Add(PendingRequest& pending, const std::string& key,
                       Admission::CountRefusal count_refusal) {
  const InferRequest& request = *pending.request;
  auto group = groups_.find(key);
  if (group == groups_.end()) SLUICE_RETURN_IF_ERROR(CheckGroups(request, key));
  SLUICE_RETURN_IF_ERROR(
      admission_.Admit(pending.share, pending.bytes, request.model_name, count_refusal));
  if (group == groups_.end()) {
    if (spare_group_) {
      spare_group_.key() = key;
      group = groups_.insert(std::move(spare_group_)).position;
    } else {
      group = groups_.try_emplace(key).first;
    }
  }
  Group& joined = group->second;
  joined.rows += request.batch_size;
  joined.last_arrival = std::max(joined.last_arrival, pending.enqueued);
  Insert(joined, std::move(pending));
  return absl::OkStatus();
}

Status BatchQueue::CheckGroups(const InferRequest& request, const std::string& key) const {
  if (static_cast<int>(groups_.size()) < options_.max_groups || groups_.count(key) > 0)
    return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "model '", request.model_name, "' already has ", groups_.size(),
      " different input shapes waiting (sluice.max_shape_groups); retry later or send fewer "
      "distinct shapes"));
}

void BatchQueue::IndexTimes(Group& group, const PendingRequest& pending) {
  if (pending.request->deadline != kNoDeadline) deadlines_.insert(pending.request->deadline);
  if (const TimePoint at = RankChangesAt(pending); at != kNoDeadline) rank_changes_.insert(at);
  if (options_.index_arrivals) group.arrivals.insert(pending.enqueued);
}

void BatchQueue::UnindexTimes(Group& group, const PendingRequest& pending) {
  if (pending.request->deadline != kNoDeadline)
    deadlines_.erase(deadlines_.find(pending.request->deadline));
  if (const TimePoint at = RankChangesAt(pending); at != kNoDeadline)
    rank_changes_.erase(rank_changes_.find(at));
  if (options_.index_arrivals) group.arrivals.erase(group.arrivals.find(pending.enqueued));
}

void BatchQueue::Insert(Group& group, PendingRequest pending) {
  IndexTimes(group, pending);
  const int rank = pending.rank;
  if (group.queue.empty() || group.queue.back().rank <= rank) {
    group.queue.push_back(std::move(pending));
    return;
  }
  const auto after =
      std::upper_bound(group.queue.begin(), group.queue.end(), rank,
                       [](int value, const PendingRequest& entry) { return value < entry.rank; });
  group.queue.insert(after, std::move(pending));
}

void BatchQueue::Unindex(Group& group, const PendingRequest& pending) {
  UnindexTimes(group, pending);
  admission_.Release(pending.share, pending.bytes);
  group.rows -= pending.request->batch_size;
}

TimePoint BatchQueue::Oldest(const Group& group) const {
  if (options_.index_arrivals) return *group.arrivals.begin();
  return group.queue.front().enqueued;
}

void BatchQueue::EraseGroup(Groups::iterator group) {
  group->second.rows = 0;
  Groups::node_type node = groups_.extract(group);
  if (!spare_group_) spare_group_ = std::move(node);
}

PendingRequest BatchQueue::TakeOne(Group& group) {
  PendingRequest front = std::move(group.queue.front());
  group.queue.pop_front();
  Unindex(group, front);
  return front;
}

PendingRequest BatchQueue::PopFront(const std::string& key) {
  const auto it = groups_.find(key);
  PendingRequest front = TakeOne(it->second);
  if (it->second.queue.empty()) EraseGroup(it);
  return front;
}

FormedBatch BatchQueue::TakeFront(const std::string& key, size_t count) {
  const auto it = groups_.find(key);
  Group& group = it->second;
  FormedBatch batch;
  batch.requests.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    PendingRequest front = TakeOne(group);
    batch.rows += front.request->batch_size;
    batch.requests.push_back(std::move(front));
  }
  if (group.queue.empty()) EraseGroup(it);
  return batch;
}

std::vector<PendingRequest> BatchQueue::TakeExpired(TimePoint now, bool look_for_cancelled) {
  if (!look_for_cancelled && EarliestDeadline() > now) return {};
  return TakeWhere([&](const std::string&, const PendingRequest& pending) {
    return pending.request->deadline <= now || pending.request->IsCancelled();
  });
}

std::vector<PendingRequest> BatchQueue::TakeAll() {
  std::vector<PendingRequest> all;
  for (auto& [key, group] : groups_) {
    for (PendingRequest& pending : group.queue) {
      admission_.Release(pending.share, pending.bytes);
      all.push_back(std::move(pending));
    }
  }
  groups_.clear();
  deadlines_.clear();
  rank_changes_.clear();
  return all;
}

}  // namespace sluice
