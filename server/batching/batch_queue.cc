#include "server/batching/batch_queue.h"

#include <algorithm>
#include <functional>
#include <iterator>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

int64_t Micros(Duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration).count();
}

Admission::Options AdmissionOptions(const BatchQueue::Options& options) {
  Admission::Options out;
  out.max_requests = options.max_requests;
  out.max_bytes = options.max_bytes;
  out.server_budget = options.server_budget;
  // One share per priority level, each with its own request cap; the bytes are the queue's.
  out.shares = std::max<int>(1, static_cast<int>(options.level_max_requests.size()));
  out.share_max_requests = options.level_max_requests;
  out.bytes_across_shares = true;
  return out;
}

}  // namespace

BatchQueue::BatchQueue(Options options)
    : options_(std::move(options)), admission_(AdmissionOptions(options_)) {}

void BatchQueue::Insert(Group& group, PendingRequest pending) {
  const int rank = Rank(pending);
  if (group.queue.empty() || Rank(group.queue.back()) <= rank) {
    group.queue.push_back(std::move(pending));
    return;
  }
  const auto after =
      std::upper_bound(group.queue.begin(), group.queue.end(), rank,
                       [](int value, const PendingRequest& entry) { return value < Rank(entry); });
  group.queue.insert(after, std::move(pending));
}

TimePoint BatchQueue::Oldest(const Group& group) const {
  if (!Ranked()) return group.queue.front().enqueued;
  TimePoint oldest = group.queue.front().enqueued;
  for (const PendingRequest& pending : group.queue) oldest = std::min(oldest, pending.enqueued);
  return oldest;
}

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
  group->second.rows = 0;
  Groups::node_type node = groups_.extract(group);
  if (!spare_group_) spare_group_ = std::move(node);
}

Status BatchQueue::Add(PendingRequest& pending, EarlyRefusal* refused, int busy) {
  const InferRequest& request = *pending.request;
  const std::string key = options_.one_request_per_batch ? std::string() : GroupKey(request);
  auto group = groups_.find(key);
  if (group == groups_.end() && static_cast<int>(groups_.size()) >= options_.max_groups) {
    return absl::UnavailableError(absl::StrCat(
        "model '", request.model_name, "' already has ", groups_.size(),
        " different input shapes waiting (sluice.max_shape_groups); retry later or send fewer "
        "distinct shapes"));
  }
  if (Targeted()) SLUICE_RETURN_IF_ERROR(CheckInTime(pending, key, refused, busy));
  pending.share = std::max(request.priority_level - 1, 0);
  SLUICE_RETURN_IF_ERROR(
      admission_.Admit(ShareOf(pending), pending.bytes, request.model_name,
                       [&](size_t waiting) { return QueueFull(request, waiting); }));
  if (group == groups_.end()) {
    if (spare_group_) {
      spare_group_.key() = key;
      group = groups_.insert(std::move(spare_group_)).position;
    } else {
      group = groups_.try_emplace(key).first;
    }
  }
  Group& joined = group->second;
  if (Targeted()) {
    // Callers read the clock before they take the batcher's lock, so arrivals can reach here a
    // little out of order: such a gap counts as 0, and the last arrival never moves back.
    if (last_arrival_ != TimePoint{}) {
      // The first sample starts an average (< 0: none yet); each later one moves it by the
      // smoothing.
      const auto smooth = [](double& average, double sample) {
        average = average < 0 ? sample
                              : (1 - kBatchCostSmoothing) * average + kBatchCostSmoothing * sample;
      };
      const double arrival_gap =
          static_cast<double>(std::max<int64_t>(Micros(pending.enqueued - last_arrival_), 0));
      smooth(gap_us_per_row_,
             arrival_gap / static_cast<double>(std::max<int64_t>(request.batch_size, 1)));
      smooth(gap_us_per_arrival_, arrival_gap);
    }
    last_arrival_ = std::max(last_arrival_, pending.enqueued);
    joined.last_arrival = std::max(joined.last_arrival, pending.enqueued);
  }
  joined.rows += request.batch_size;
  Insert(joined, std::move(pending));
  return absl::OkStatus();
}

Status BatchQueue::CheckInTime(const PendingRequest& pending, const std::string& key,
                               EarlyRefusal* refused, int busy) const {
  const InferRequest& request = *pending.request;
  using Pick = BatchCostModel::Pick;
  const std::optional<Duration> own =
      options_.costs->Predict(key, PaddedRows(request.batch_size), Pick::kFastest);
  if (!own) return absl::OkStatus();  // nothing known of this shape yet: no refusal on a guess
  // The work ahead: every waiting group's rows at the per-row cost of the largest batch the
  // target lets it form, and what the batches already handed out are predicted to have left.
  double ahead_us = 0;
  for (const auto& [group_key, group] : groups_) {
    if (group.rows == 0) continue;
    const int64_t size = options_.one_request_per_batch ? group.queue.front().request->batch_size
                                                        : UsefulBatchSize(group_key);
    const std::optional<Duration> full =
        options_.costs->Predict(group_key, PaddedRows(size), Pick::kFastest);
    if (full)
      ahead_us += static_cast<double>(Micros(*full)) * static_cast<double>(group.rows) /
                  static_cast<double>(size);
  }
  // The batches still running: the `busy` predicted to end last (the others ended early).
  absl::InlinedVector<TimePoint, 4> running;
  for (TimePoint end : running_until_) {
    if (end > pending.enqueued) running.push_back(end);
  }
  if (busy >= 0 && running.size() > static_cast<size_t>(busy)) {
    std::sort(running.begin(), running.end(), std::greater<TimePoint>());
    running.resize(static_cast<size_t>(busy));
  }
  for (TimePoint end : running) ahead_us += static_cast<double>(Micros(end - pending.enqueued));
  const auto ahead =
      std::chrono::microseconds(static_cast<int64_t>(ahead_us / std::max(options_.instances, 1)));
  // Nothing ahead: it runs as early as it ever could. Refusing it on its predicted cost alone
  // could refuse everything for good (no batch would run to correct an estimate that is too high,
  // as warm-up's can be on a host busy loading other models).
  if (ahead == Duration::zero()) return absl::OkStatus();
  const TimePoint finish = pending.enqueued + ahead + *own;
  const bool by_deadline = request.deadline < TargetDeadline(pending);
  if (finish <= AnswerBy(pending)) return absl::OkStatus();
  if (refused != nullptr) *refused = by_deadline ? EarlyRefusal::kDeadline : EarlyRefusal::kTarget;
  const std::string work = absl::StrCat(
      "about ", Micros(ahead), " us of work is queued ahead of it and its own batch takes about ",
      Micros(*own), " us");
  if (by_deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("model '", request.model_name,
                     "' cannot answer this request before its deadline or queue timeout: ", work,
                     "; it was refused without running"));
  }
  return absl::UnavailableError(absl::StrCat(
      "model '", request.model_name, "' cannot answer this request within its latency target of ",
      Micros(options_.latency_target), " us (sluice.latency_target_us): ", work,
      "; it was refused without running: retry later, or add instances"));
}

int64_t BatchQueue::UsefulBatchSize(const std::string& key) const {
  // Costs grow with rows: the largest size whose predicted cost is within the planned target.
  int64_t low = 1, high = ladder_.empty() ? options_.max_batch_size : ladder_.back();
  while (low < high) {
    const int64_t middle = (low + high + 1) / 2;
    const std::optional<Duration> cost =
        options_.costs->Predict(key, PaddedRows(middle), BatchCostModel::Pick::kFastest);
    if (cost && *cost <= PlannedTarget()) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

template <typename Take>
void BatchQueue::TakeWhere(Take take) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = it->second;
    for (auto entry = group.queue.begin(); entry != group.queue.end();) {
      const int64_t rows = entry->request->batch_size;
      const size_t bytes = entry->bytes;
      const int share = ShareOf(*entry);
      if (!take(it->first, *entry)) {
        ++entry;
        continue;
      }
      admission_.Release(share, bytes);
      group.rows -= rows;
      entry = group.queue.erase(entry);
    }
    if (group.queue.empty()) {
      EraseGroup(it++);
    } else {
      ++it;
    }
  }
}

std::vector<RefusedRequest> BatchQueue::TakeHopeless(TimePoint now) {
  std::vector<RefusedRequest> refused;
  if (!Targeted()) return refused;
  TakeWhere([&](const std::string& key, PendingRequest& pending) {
    const InferRequest& request = *pending.request;
    const std::optional<Duration> own = options_.costs->Predict(key, PaddedRows(request.batch_size),
                                                                BatchCostModel::Pick::kFastest);
    // Without an estimate only a target already past is certain; an estimate longer than the
    // target itself is not trusted alone either (see CheckInTime): it runs and corrects it.
    const bool trusted = own.has_value() && *own <= options_.latency_target;
    const TimePoint done = now + (trusted ? *own : Duration::zero());
    const bool late_for_target = done > TargetDeadline(pending);
    const bool late_for_deadline = trusted && done > request.deadline;
    if (!late_for_target && !late_for_deadline) return false;
    RefusedRequest out;
    const bool by_deadline = late_for_deadline && request.deadline < TargetDeadline(pending);
    out.reason = by_deadline ? EarlyRefusal::kDeadline : EarlyRefusal::kTarget;
    out.status =
        by_deadline
            ? absl::DeadlineExceededError(absl::StrCat(
                  "model '", request.model_name,
                  "' could no longer answer this request before its deadline or queue timeout (its "
                  "batch "
                  "takes about ",
                  Micros(own.value_or(Duration::zero())), " us); it was refused without running"))
            : absl::UnavailableError(absl::StrCat(
                  "model '", request.model_name,
                  "' could no longer answer this request within its latency "
                  "target of ",
                  Micros(options_.latency_target),
                  " us (sluice.latency_target_us) after it waited ", Micros(now - pending.enqueued),
                  " us; it was refused without running: retry later, or add instances"));
    out.pending = std::move(pending);
    refused.push_back(std::move(out));
    return true;
  });
  return refused;
}

std::optional<int64_t> BatchQueue::InTimeRows(const std::string& key, const Group& group,
                                              TimePoint now, int64_t* fitting_rows) const {
  const int64_t largest = ladder_.empty() ? options_.max_batch_size : ladder_.back();
  const TimePoint answer_by = AnswerBy(group.queue.front());
  int64_t rows = 0, in_time = 0;
  bool late = false;  // costs grow with rows: once a prefix is late, every longer one is
  for (const PendingRequest& pending : group.queue) {
    if (rows + pending.request->batch_size > largest) break;
    rows += pending.request->batch_size;
    if (late) continue;
    const std::optional<Duration> cost =
        options_.costs->Predict(key, PaddedRows(rows), BatchCostModel::Pick::kSlowest);
    if (!cost) return std::nullopt;
    late = now + *cost > answer_by;
    if (!late) in_time = rows;
  }
  *fitting_rows = rows;
  return in_time;
}

int64_t BatchQueue::KeepingUpRows(const std::string& key, int64_t limit) const {
  const double instances = static_cast<double>(std::max(options_.instances, 1));
  for (int64_t rows = 1; rows < limit; ++rows) {
    const std::optional<Duration> cost =
        options_.costs->Predict(key, PaddedRows(rows), BatchCostModel::Pick::kSlowest);
    if (cost && static_cast<double>(Micros(*cost)) / static_cast<double>(rows) / instances <=
                    gap_us_per_row_) {
      return rows;
    }
  }
  return limit;
}

std::vector<RefusedRequest> BatchQueue::TakeOverloaded(TimePoint now) {
  std::vector<RefusedRequest> refused;
  if (!Targeted() || options_.one_request_per_batch || gap_us_per_row_ < 0) return refused;
  // Arrivals have stopped (a closed loop whose callers all wait): nothing arrives faster than
  // batches serve, whatever the smoothed rate of the last burst says, and shedding would refuse
  // requests that no later arrival needs the room of.
  if (now >= SilentFrom(last_arrival_)) return refused;
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = it->second;
    // A lone row predicted beyond the whole target is not trusted (see CheckInTime): no shedding on
    // it.
    const std::optional<Duration> lone =
        options_.costs->Predict(it->first, PaddedRows(1), BatchCostModel::Pick::kFastest);
    if (!lone || *lone > options_.latency_target) {
      ++it;
      continue;
    }
    // The batch worth forming: the smallest that keeps up with arrivals, within the largest the
    // target allows a request that has just arrived.
    const int64_t goal = KeepingUpRows(it->first, UsefulBatchSize(it->first));
    while (group.queue.size() > 1) {
      int64_t fitting_rows = 0;
      const std::optional<int64_t> in_time = InTimeRows(it->first, group, now, &fitting_rows);
      // Shed the oldest only while its batch would be cut below what keeps up and below what waits.
      if (!in_time || *in_time >= std::min(goal, fitting_rows)) break;
      PendingRequest& oldest = group.queue.front();
      const InferRequest& request = *oldest.request;
      RefusedRequest out;
      const bool by_deadline = request.deadline < TargetDeadline(oldest);
      out.reason = by_deadline ? EarlyRefusal::kDeadline : EarlyRefusal::kTarget;
      const std::string why = absl::StrCat(
          "model '", request.model_name,
          "' is overloaded: requests arrive faster than batches small enough to answer "
          "this one ",
          by_deadline
              ? std::string("before its deadline or queue timeout")
              : absl::StrCat("within its latency target of ", Micros(options_.latency_target),
                             " us (sluice.latency_target_us)"),
          " can serve them (it waited ", Micros(now - oldest.enqueued),
          " us); it was refused without running so that the requests behind it are answered in "
          "time");
      out.status =
          by_deadline
              ? absl::DeadlineExceededError(why)
              : absl::UnavailableError(absl::StrCat(why, ": retry later, or add instances"));
      out.pending = PopFront(group);
      refused.push_back(std::move(out));
    }
    ++it;  // a group keeps at least one request here
  }
  return refused;
}

Status BatchQueue::QueueFull(const InferRequest& request, size_t waiting) {
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

Status BatchQueue::AdmitOutside(const InferRequest& request) {
  return admission_.Admit(std::max(request.priority_level - 1, 0), request.InputBytes(),
                          request.model_name,
                          [&](size_t waiting) { return QueueFull(request, waiting); });
}

void BatchQueue::ReleaseOutside(int priority_level, size_t bytes) {
  admission_.Release(std::max(priority_level - 1, 0), bytes);
}

bool BatchQueue::Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                            TimePoint delay_after) {
  for (auto& [key, group] : groups_) {
    for (auto it = group.queue.begin(); it != group.queue.end(); ++it) {
      InferRequest& request = *it->request;
      if (request.cancelled.get() != tag) continue;
      request.deadline = std::max(request.deadline, deadline);
      const bool higher = priority_level > 0 && request.priority_level > 0 &&
                          priority_level < request.priority_level;
      // A later DELAY timeout (a waiter's that has not passed) undoes the demotion; DelayOverdue
      // demotes it again once that one passes.
      const bool undelay = delay_after > request.delay_after;
      if (undelay) request.delay_after = delay_after;
      if (!higher && !(undelay && it->delayed)) return true;
      PendingRequest pending = std::move(*it);
      group.queue.erase(it);
      if (higher) request.priority_level = priority_level;
      if (undelay) pending.delayed = false;
      Insert(group, std::move(pending));
      return true;
    }
  }
  return false;
}

void BatchQueue::Forget(const PendingRequest& pending) {
  admission_.Release(ShareOf(pending), pending.bytes);
}

PendingRequest BatchQueue::PopFront(Group& group) {
  PendingRequest front = std::move(group.queue.front());
  group.queue.pop_front();
  group.rows -= front.request->batch_size;
  Forget(front);
  return front;
}

std::vector<PendingRequest> BatchQueue::TakeExpired(TimePoint now) {
  std::vector<PendingRequest> expired;
  TakeWhere([&](const std::string&, PendingRequest& pending) {
    if (pending.request->deadline > now && !pending.request->IsCancelled()) return false;
    expired.push_back(std::move(pending));
    return true;
  });
  return expired;
}

void BatchQueue::DelayOverdue(TimePoint now) {
  if (!options_.delays) return;
  for (auto& [key, group] : groups_) {
    absl::InlinedVector<PendingRequest, 4> overdue;
    for (auto entry = group.queue.begin(); entry != group.queue.end();) {
      if (entry->delayed || entry->request->delay_after > now) {
        ++entry;
        continue;
      }
      entry->delayed = true;
      overdue.push_back(std::move(*entry));
      entry = group.queue.erase(entry);
    }
    // In the order they stood: among the delayed of one level, arrival order holds too.
    for (PendingRequest& pending : overdue) Insert(group, std::move(pending));
  }
}

size_t BatchQueue::ReadyPrefix(const std::string& key, const Group& group, TimePoint now) const {
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
  bool full = fitting < group.queue.size() || rows == largest;
  bool waited = now - Oldest(group) >= options_.max_queue_delay;
  if (Targeted()) {
    bool wait = false;
    if (std::optional<size_t> limit = TargetLimit(key, group, now, fitting, rows, &wait)) {
      if (*limit < fitting) {  // cut so that the oldest answers in time: ready now
        for (size_t i = *limit; i < fitting; ++i) rows -= group.queue[i].request->batch_size;
        fitting = *limit;
        full = true;
        preferred = std::min(preferred, fitting);
      }
      // The target decides the wait; a positive max_queue_delay bounds it.
      const bool bounded = options_.max_queue_delay > Duration::zero() && waited;
      waited = bounded || !wait;
    }
  }
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

std::optional<size_t> BatchQueue::TargetLimit(const std::string& key, const Group& group,
                                              TimePoint now, size_t fitting, int64_t rows,
                                              bool* wait) const {
  using Pick = BatchCostModel::Pick;
  const TimePoint answer_by = AnswerBy(group.queue.front());
  std::optional<Duration> cost = options_.costs->Predict(key, PaddedRows(rows), Pick::kSlowest);
  if (!cost) return std::nullopt;  // nothing known of this shape yet
  size_t take = fitting;
  int64_t take_rows = rows;
  while (take > 1 && now + *cost > answer_by) {
    take_rows -= group.queue[take - 1].request->batch_size;
    --take;
    cost = options_.costs->Predict(key, PaddedRows(take_rows), Pick::kSlowest);
    if (!cost) return std::nullopt;
  }
  *wait = false;
  if (take < fitting || gap_us_per_row_ < 0) return take;
  // Waiting pays when batches this small, on every instance, serve fewer rows per second than
  // arrive; it is allowed while one more arrival and the larger batch still answer the oldest in
  // time.
  const double serve_us_per_row = static_cast<double>(Micros(*cost)) /
                                  static_cast<double>(take_rows) /
                                  static_cast<double>(std::max(options_.instances, 1));
  if (serve_us_per_row <= gap_us_per_row_) return take;
  const std::optional<TimePoint> stop = StopWaitingAt(key, group);
  *wait = stop.has_value() && now < *stop;
  return take;
}

std::optional<TimePoint> BatchQueue::StopWaitingAt(const std::string& key,
                                                   const Group& group) const {
  if (gap_us_per_row_ < 0) return std::nullopt;
  const std::optional<Duration> larger =
      options_.costs->Predict(key, PaddedRows(group.rows + 1), BatchCostModel::Pick::kSlowest);
  if (!larger) return std::nullopt;
  TimePoint stop = AnswerBy(group.queue.front()) - *larger -
                   std::chrono::microseconds(static_cast<int64_t>(gap_us_per_row_));
  // The silence bound: once nothing has arrived for the group for kSilenceGaps smoothed gaps
  // between arrivals, the smoothed rate (which only changes at an arrival) no longer says
  // anything about it: its arrivals have slowed or stopped, as they do when every caller of a
  // closed loop already waits here (perf_analyzer at a concurrency below max_batch_size), and
  // waiting on would hold the group until its oldest request's target had nearly passed. The
  // silence is the group's own (another shape arriving steadily does not extend it); the gap is
  // the model's, which only shortens the bound for a shape that arrives less often.
  return std::min(stop, SilentFrom(group.last_arrival));
}

TimePoint BatchQueue::SilentFrom(TimePoint last) const {
  if (gap_us_per_arrival_ < 0) return kNoDeadline;
  return last + std::chrono::microseconds(static_cast<int64_t>(kSilenceGaps * gap_us_per_arrival_));
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
    const size_t prefix = ReadyPrefix(it->first, it->second, now);
    if (prefix == 0) continue;
    const PendingRequest& first = it->second.queue.front();
    if (chosen == nullptr || Rank(first) < Rank(chosen->queue.front()) ||
        (Rank(first) == Rank(chosen->queue.front()) &&
         first.enqueued < chosen->queue.front().enqueued)) {
      chosen = &it->second;
      chosen_it = it;
      take = prefix;
    }
  }
  if (chosen == nullptr) return std::nullopt;
  FormedBatch batch;
  batch.requests.reserve(take);
  for (size_t i = 0; i < take; ++i) {
    batch.rows += chosen->queue.front().request->batch_size;
    batch.requests.push_back(PopFront(*chosen));
  }
  batch.padded_rows = PaddedRows(batch.rows);
  if (Targeted()) {
    // When it is predicted to end, for the work ahead of later arrivals; at most one per instance.
    running_until_.erase(std::remove_if(running_until_.begin(), running_until_.end(),
                                        [&](TimePoint end) { return end <= now; }),
                         running_until_.end());
    if (static_cast<int>(running_until_.size()) >= std::max(options_.instances, 1)) {
      running_until_.erase(std::min_element(running_until_.begin(), running_until_.end()));
    }
    const std::optional<Duration> cost = options_.costs->Predict(
        chosen_it->first, batch.padded_rows, BatchCostModel::Pick::kSlowest);
    if (cost) running_until_.push_back(now + *cost);
  }
  if (chosen->queue.empty()) EraseGroup(chosen_it);
  return batch;
}

TimePoint BatchQueue::NextBatchTime() const {
  TimePoint next = kNoDeadline;
  for (const auto& [key, group] : groups_) {
    TimePoint ready = Oldest(group) + options_.max_queue_delay;
    std::optional<TimePoint> stop;
    if (Targeted() && !options_.one_request_per_batch && (stop = StopWaitingAt(key, group))) {
      ready = options_.max_queue_delay > Duration::zero() ? std::min(ready, *stop) : *stop;
    }
    next = std::min(next, ready);
  }
  return next;
}

TimePoint BatchQueue::NextDeadline() const {
  TimePoint next = kNoDeadline;
  for (const auto& [key, group] : groups_) {
    for (const PendingRequest& pending : group.queue) {
      next = std::min(next, AnswerBy(pending));
    }
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
