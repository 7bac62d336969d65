#include "server/batching/batch_former.h"

#include "server/batching/latency_target_policy.h"

namespace sluice {
namespace {

BatchQueue::Options QueueOptions(const BatchFormer::Options& options,
                                 const PriorityLevels& levels) {
  BatchQueue::Options out;
  out.max_requests = options.max_requests;
  out.max_bytes = options.max_bytes;
  out.server_budget = options.server_budget;
  out.max_groups = options.max_groups;
  out.share_max_requests = levels.share_max_requests();
  out.index_arrivals = levels.Ranked();
  out.rank_changes_at = levels.RankChanges();
  return out;
}

}  // namespace

std::unique_ptr<BatchPolicy> BatchFormer::MakePolicy(const Options& options) {
  std::unique_ptr<BatchPolicy> base;
  if (options.one_request_per_batch) {
    base = std::make_unique<OneRequestPerBatchPolicy>(options.max_queue_delay);
  } else {
    DynamicBatchingPolicy::Options batching;
    batching.max_batch_size = options.max_batch_size;
    batching.preferred_batch_sizes = options.preferred_batch_sizes;
    batching.max_queue_delay = options.max_queue_delay;
    batching.pad_to_preferred = options.pad_to_preferred;
    base = std::make_unique<DynamicBatchingPolicy>(std::move(batching));
  }
  if (options.latency_target > Duration::zero() && options.costs != nullptr) {
    LatencyTargetPolicy::Options target;
    target.target = options.latency_target;
    target.costs = options.costs;
    target.instances = options.instances;
    return std::make_unique<LatencyTargetPolicy>(std::move(target), std::move(base));
  }
  return base;
}

BatchFormer::BatchFormer(Options options)
    : levels_(PriorityLevels::Options{options.level_max_requests, options.delays}),
      policy_(MakePolicy(options)),
      queue_(QueueOptions(options, levels_)) {}

Status BatchFormer::Add(PendingRequest& pending, EarlyRefusal* refused, int busy) {
  const InferRequest& request = *pending.request;
  const std::string key = policy_->KeyOf(request);
  SLUICE_RETURN_IF_ERROR(queue_.CheckGroups(request, key));
  SLUICE_RETURN_IF_ERROR(policy_->CheckArrival(queue_, pending, key, busy, refused));
  levels_.Place(pending);
  const TimePoint enqueued = pending.enqueued;
  const int64_t rows = request.batch_size;
  SLUICE_RETURN_IF_ERROR(queue_.Add(pending, key, [&](size_t waiting) {
    return PriorityLevels::QueueFull(*pending.request, waiting);
  }));
  policy_->Arrived(enqueued, rows);
  return absl::OkStatus();
}

Status BatchFormer::AdmitOutside(const InferRequest& request) {
  return queue_.AdmitOutside(
      PriorityLevels::ShareOf(request.priority_level), request.InputBytes(), request.model_name,
      [&](size_t waiting) { return PriorityLevels::QueueFull(request, waiting); });
}

std::vector<PendingRequest> BatchFormer::TakeExpired(TimePoint now) {
  const bool look = cancelled_;
  cancelled_ = false;
  return queue_.TakeExpired(now, look);
}

const std::string* BatchFormer::Choose(TimePoint now, bool full, size_t* take) const {
  const std::string* chosen = nullptr;
  const PendingRequest* chosen_front = nullptr;
  for (const auto& [key, group] : queue_.groups()) {
    const size_t prefix = full ? policy_->FullPrefix(queue_, key, group, now)
                               : policy_->ReadyPrefix(queue_, key, group, now);
    if (prefix == 0) continue;
    const PendingRequest& first = group.queue.front();
    if (chosen == nullptr || first.rank < chosen_front->rank ||
        (first.rank == chosen_front->rank && first.enqueued < chosen_front->enqueued)) {
      chosen = &key;
      chosen_front = &first;
      *take = prefix;
    }
  }
  return chosen;
}

std::optional<FormedBatch> BatchFormer::Take(const std::string& chosen, size_t take,
                                             TimePoint now) {
  const std::string key = chosen;  // the group may go with its last request
  FormedBatch batch = queue_.TakeFront(key, take);
  batch.padded_rows = policy_->PaddedRows(batch.rows);
  policy_->Formed(key, batch.padded_rows, now);
  return batch;
}

std::optional<FormedBatch> BatchFormer::TakeReadyBatch(TimePoint now) {
  size_t take = 0;
  const std::string* chosen = Choose(now, /*full=*/false, &take);
  if (chosen == nullptr) return std::nullopt;
  return Take(*chosen, take, now);
}

std::optional<FormedBatch> BatchFormer::TakeFullBatch(TimePoint now) {
  size_t take = 0;
  const std::string* chosen = Choose(now, /*full=*/true, &take);
  if (chosen == nullptr) return std::nullopt;
  return Take(*chosen, take, now);
}

bool BatchFormer::HasFullBatch(TimePoint now) const {
  size_t take = 0;
  return Choose(now, /*full=*/true, &take) != nullptr;
}

TimePoint BatchFormer::NextBatchTime() const {
  TimePoint next = kNoDeadline;
  for (const auto& [key, group] : queue_.groups())
    next = std::min(next, policy_->ReadyAt(queue_, key, group));
  return next;
}

}  // namespace sluice
