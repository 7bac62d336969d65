#include "server/batching/latency_target_policy.h"

#include <algorithm>
#include <functional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

int64_t Micros(Duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration).count();
}

}  // namespace

LatencyTargetPolicy::LatencyTargetPolicy(Options options, std::unique_ptr<BatchPolicy> base)
    : options_(std::move(options)),
      base_(std::move(base)),
      sizes_(dynamic_cast<DynamicBatchingPolicy*>(base_.get())) {}

void LatencyTargetPolicy::Arrived(TimePoint at, int64_t rows) {
  // Callers read the clock before they take the batcher's lock, so arrivals can reach here a
  // little out of order: such a gap counts as 0, and the last arrival never moves back.
  if (last_arrival_ != TimePoint{}) {
    // The first sample starts an average (< 0: none yet); each later one moves it by the
    // smoothing.
    const auto smooth = [](double& average, double sample) {
      average =
          average < 0 ? sample : (1 - kBatchCostSmoothing) * average + kBatchCostSmoothing * sample;
    };
    const double arrival_gap =
        static_cast<double>(std::max<int64_t>(Micros(at - last_arrival_), 0));
    smooth(gap_us_per_row_, arrival_gap / static_cast<double>(std::max<int64_t>(rows, 1)));
    smooth(gap_us_per_arrival_, arrival_gap);
  }
  last_arrival_ = std::max(last_arrival_, at);
}

Status LatencyTargetPolicy::CheckArrival(const BatchQueue& queue, const PendingRequest& pending,
                                         const std::string& key, int busy,
                                         EarlyRefusal* refused) const {
  const InferRequest& request = *pending.request;
  using Pick = BatchCostModel::Pick;
  const std::optional<Duration> own =
      options_.costs->Predict(key, PaddedRows(request.batch_size), Pick::kFastest);
  if (!own) return absl::OkStatus();  // nothing known of this shape yet: no refusal on a guess
  // The work ahead: every waiting group's rows at the per-row cost of the largest batch the
  // target lets it form, and what the batches already handed out are predicted to have left.
  double ahead_us = 0;
  for (const auto& [group_key, group] : queue.groups()) {
    if (group.rows == 0) continue;
    const int64_t size =
        sizes_ == nullptr ? group.queue.front().request->batch_size : UsefulBatchSize(group_key);
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
      Micros(options_.target), " us (sluice.latency_target_us): ", work,
      "; it was refused without running: retry later, or add instances"));
}

int64_t LatencyTargetPolicy::UsefulBatchSize(const std::string& key) const {
  // Costs grow with rows: the largest size whose predicted cost is within the planned target.
  int64_t low = 1, high = Largest();
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

std::vector<RefusedRequest> LatencyTargetPolicy::TakeRefused(BatchQueue& queue, TimePoint now,
                                                             bool forming) {
  std::vector<RefusedRequest> refused = TakeHopeless(queue, now);
  // About to form a batch: under overload the oldest may make way for a batch that keeps up.
  if (forming && refused.empty()) refused = TakeOverloaded(queue, now);
  return refused;
}

std::vector<RefusedRequest> LatencyTargetPolicy::TakeHopeless(BatchQueue& queue,
                                                              TimePoint now) const {
  std::vector<RefusedRequest> refused;
  // Each refusal is written as its request is chosen; the requests come out in that order.
  std::vector<PendingRequest> taken = queue.TakeWhere([&](const std::string& key,
                                                          const PendingRequest& pending) {
    const InferRequest& request = *pending.request;
    const std::optional<Duration> own = options_.costs->Predict(key, PaddedRows(request.batch_size),
                                                                BatchCostModel::Pick::kFastest);
    // Without an estimate only a target already past is certain; an estimate longer than the
    // target itself is not trusted alone either (see CheckArrival): it runs and corrects it.
    const bool trusted = own.has_value() && *own <= options_.target;
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
                  Micros(options_.target), " us (sluice.latency_target_us) after it waited ",
                  Micros(now - pending.enqueued),
                  " us; it was refused without running: retry later, or add instances"));
    refused.push_back(std::move(out));
    return true;
  });
  for (size_t i = 0; i < taken.size(); ++i) refused[i].pending = std::move(taken[i]);
  return refused;
}

std::optional<int64_t> LatencyTargetPolicy::InTimeRows(const std::string& key,
                                                       const BatchQueue::Group& group,
                                                       TimePoint now, int64_t* fitting_rows) const {
  const int64_t largest = Largest();
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

int64_t LatencyTargetPolicy::KeepingUpRows(const std::string& key, int64_t limit) const {
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

std::vector<RefusedRequest> LatencyTargetPolicy::TakeOverloaded(BatchQueue& queue,
                                                                TimePoint now) const {
  std::vector<RefusedRequest> refused;
  if (sizes_ == nullptr || gap_us_per_row_ < 0) return refused;
  // Arrivals have stopped (a closed loop whose callers all wait): nothing arrives faster than
  // batches serve, whatever the smoothed rate of the last burst says, and shedding would refuse
  // requests that no later arrival needs the room of.
  if (now >= SilentFrom(last_arrival_)) return refused;
  // Groups keep at least one request here, so none is erased while this walks them.
  for (const auto& [key, group] : queue.groups()) {
    // A lone row predicted beyond the whole target is not trusted (see CheckArrival): no shedding
    // on it.
    const std::optional<Duration> lone =
        options_.costs->Predict(key, PaddedRows(1), BatchCostModel::Pick::kFastest);
    if (!lone || *lone > options_.target) continue;
    // The batch worth forming: the smallest that keeps up with arrivals, within the largest the
    // target allows a request that has just arrived.
    const int64_t goal = KeepingUpRows(key, UsefulBatchSize(key));
    while (group.queue.size() > 1) {
      int64_t fitting_rows = 0;
      const std::optional<int64_t> in_time = InTimeRows(key, group, now, &fitting_rows);
      // Shed the oldest only while its batch would be cut below what keeps up and below what waits.
      if (!in_time || *in_time >= std::min(goal, fitting_rows)) break;
      const PendingRequest& oldest = group.queue.front();
      const InferRequest& request = *oldest.request;
      RefusedRequest out;
      const bool by_deadline = request.deadline < TargetDeadline(oldest);
      out.reason = by_deadline ? EarlyRefusal::kDeadline : EarlyRefusal::kTarget;
      const std::string why = absl::StrCat(
          "model '", request.model_name,
          "' is overloaded: requests arrive faster than batches small enough to answer "
          "this one ",
          by_deadline ? std::string("before its deadline or queue timeout")
                      : absl::StrCat("within its latency target of ", Micros(options_.target),
                                     " us (sluice.latency_target_us)"),
          " can serve them (it waited ", Micros(now - oldest.enqueued),
          " us); it was refused without running so that the requests behind it are answered in "
          "time");
      out.status =
          by_deadline
              ? absl::DeadlineExceededError(why)
              : absl::UnavailableError(absl::StrCat(why, ": retry later, or add instances"));
      out.pending = queue.PopFront(key);
      refused.push_back(std::move(out));
    }
  }
  return refused;
}

size_t LatencyTargetPolicy::ReadyPrefix(const BatchQueue& queue, const std::string& key,
                                        const BatchQueue::Group& group, TimePoint now) const {
  if (sizes_ == nullptr) return base_->ReadyPrefix(queue, key, group, now);
  DynamicBatchingPolicy::Prefix prefix = sizes_->Measure(queue, group, now);
  // A request larger than the ladder's largest size (at most max_batch_size) runs alone.
  if (prefix.fitting == 0) return 1;
  bool wait = false;
  if (std::optional<size_t> limit =
          TargetLimit(key, group, now, prefix.fitting, prefix.rows, &wait)) {
    if (*limit < prefix.fitting) {  // cut so that the oldest answers in time: ready now
      for (size_t i = *limit; i < prefix.fitting; ++i)
        prefix.rows -= group.queue[i].request->batch_size;
      prefix.fitting = *limit;
      prefix.full = true;
      prefix.preferred = std::min(prefix.preferred, prefix.fitting);
    }
    // The target decides the wait; a positive max_queue_delay bounds it.
    const bool bounded = sizes_->max_queue_delay() > Duration::zero() && prefix.waited;
    prefix.waited = bounded || !wait;
  }
  return sizes_->Decide(group, prefix);
}

std::optional<size_t> LatencyTargetPolicy::TargetLimit(const std::string& key,
                                                       const BatchQueue::Group& group,
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

std::optional<TimePoint> LatencyTargetPolicy::StopWaitingAt(const std::string& key,
                                                            const BatchQueue::Group& group) const {
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

TimePoint LatencyTargetPolicy::SilentFrom(TimePoint last) const {
  if (gap_us_per_arrival_ < 0) return kNoDeadline;
  return last + std::chrono::microseconds(static_cast<int64_t>(kSilenceGaps * gap_us_per_arrival_));
}

TimePoint LatencyTargetPolicy::ReadyAt(const BatchQueue& queue, const std::string& key,
                                       const BatchQueue::Group& group) const {
  TimePoint ready = base_->ReadyAt(queue, key, group);
  if (sizes_ == nullptr) return ready;
  const std::optional<TimePoint> stop = StopWaitingAt(key, group);
  if (!stop) return ready;
  return sizes_->max_queue_delay() > Duration::zero() ? std::min(ready, *stop) : *stop;
}

TimePoint LatencyTargetPolicy::EarliestAnswerBy(const BatchQueue& queue) const {
  // Target deadlines follow arrivals: the earliest is the oldest request's.
  TimePoint oldest = kNoDeadline;
  for (const auto& [key, group] : queue.groups()) oldest = std::min(oldest, queue.Oldest(group));
  return oldest == kNoDeadline ? kNoDeadline : oldest + PlannedTarget();
}

void LatencyTargetPolicy::Formed(const std::string& key, int64_t padded_rows, TimePoint now) {
  // When it is predicted to end, for the work ahead of later arrivals; at most one per instance.
  running_until_.erase(std::remove_if(running_until_.begin(), running_until_.end(),
                                      [&](TimePoint end) { return end <= now; }),
                       running_until_.end());
  if (static_cast<int>(running_until_.size()) >= std::max(options_.instances, 1)) {
    running_until_.erase(std::min_element(running_until_.begin(), running_until_.end()));
  }
  const std::optional<Duration> cost =
      options_.costs->Predict(key, padded_rows, BatchCostModel::Pick::kSlowest);
  if (cost) running_until_.push_back(now + *cost);
}

}  // namespace sluice
