#include "server/batching/batch_cost.h"

#include <algorithm>
#include <iterator>

namespace sluice {
namespace {

double Micros(Duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}
Duration FromMicros(double us) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::micro>(us));
}

}  // namespace

BatchCostModel::BatchCostModel(size_t instances, double smoothing, Duration target)
    : instances_(std::max<size_t>(instances, 1)), smoothing_(smoothing), target_(target) {}

void BatchCostModel::ObserveAnswer(Duration in_server) {
  if (target_ <= Duration::zero()) return;
  answered_.fetch_add(1, std::memory_order_relaxed);
  if (in_server > target_) answered_late_.fetch_add(1, std::memory_order_relaxed);
  const double step = in_server > target_
                          ? -kPlanShareStep
                          : kPlanShareStep * kLateAnswerShare / (1 - kLateAnswerShare);
  double share = plan_share_.load(std::memory_order_relaxed);
  // Workers of several instances answer at once: a lost update would lose a step.
  while (!plan_share_.compare_exchange_weak(share, std::clamp(share + step, kMinPlanShare, 1.0),
                                            std::memory_order_relaxed)) {
  }
}

void BatchCostModel::Seed(size_t instance, const std::string& group, int64_t rows, Duration cost) {
  if (instance >= instances_ || rows < 1) return;
  MutexLock lock(&mutex_);
  auto [it, added] = costs_.try_emplace(group);
  if (added) it->second.resize(instances_);
  it->second[instance][rows] = Cost{Micros(cost), 0};
  UpdateFloorLocked();
}

void BatchCostModel::UpdateFloorLocked() {
  if (target_ <= Duration::zero()) return;
  double costliest_lone_us = 0;
  for (const auto& [group, instances] : costs_) {
    double fastest = -1;
    for (const Sizes& sizes : instances) {
      if (sizes.empty()) continue;
      const double lone = sizes.begin()->second.us;  // the smallest size measured: as a lone row
      fastest = fastest < 0 ? lone : std::min(fastest, lone);
    }
    costliest_lone_us = std::max(costliest_lone_us, fastest);
  }
  floor_share_.store(std::min(1.0, 2 * costliest_lone_us / Micros(target_)),
                     std::memory_order_relaxed);
}

std::optional<Duration> BatchCostModel::Observe(size_t instance, const std::string& group,
                                                int64_t rows, Duration measured) {
  if (instance >= instances_ || rows < 1) return std::nullopt;
  MutexLock lock(&mutex_);
  auto it = costs_.find(group);
  std::optional<Duration> predicted;
  if (it == costs_.end()) {
    it = costs_.try_emplace(group).first;
    it->second.resize(instances_);
  } else if (std::optional<double> us = Interpolate(it->second[instance], rows)) {
    predicted = FromMicros(*us);
  } else {
    predicted = PredictLocked(group, rows, Pick::kSlowest);
  }
  auto [cost, first] = it->second[instance].try_emplace(rows);
  // The first batch of a size on an instance is its estimate; later ones are smoothed in.
  cost->second.us =
      first ? Micros(measured) : (1 - smoothing_) * cost->second.us + smoothing_ * Micros(measured);
  ++cost->second.observations;
  UpdateFloorLocked();
  return predicted;
}

std::optional<double> BatchCostModel::Interpolate(const Sizes& sizes, int64_t rows) {
  if (sizes.empty()) return std::nullopt;
  auto upper = sizes.lower_bound(rows);
  if (upper != sizes.end() && upper->first == rows) return upper->second.us;
  if (upper == sizes.begin()) return upper->second.us;  // below the smallest: as much as it
  auto lower = std::prev(upper);
  if (upper == sizes.end()) {  // beyond the largest: per row, as the largest
    return lower->second.us * static_cast<double>(rows) / static_cast<double>(lower->first);
  }
  const double share =
      static_cast<double>(rows - lower->first) / static_cast<double>(upper->first - lower->first);
  return lower->second.us + share * (upper->second.us - lower->second.us);
}

std::optional<Duration> BatchCostModel::PredictLocked(const std::string& group, int64_t rows,
                                                      Pick pick) const {
  auto it = costs_.find(group);
  if (it == costs_.end()) return std::nullopt;
  std::optional<double> chosen;
  for (const Sizes& sizes : it->second) {
    std::optional<double> us = Interpolate(sizes, rows);
    if (!us) continue;  // this instance has not run the group yet
    if (!chosen || (pick == Pick::kSlowest ? *us > *chosen : *us < *chosen)) chosen = us;
  }
  if (!chosen) return std::nullopt;
  return FromMicros(*chosen);
}

std::optional<Duration> BatchCostModel::Predict(const std::string& group, int64_t rows,
                                                Pick pick) const {
  MutexLock lock(&mutex_);
  return PredictLocked(group, rows, pick);
}

std::vector<BatchCostModel::Entry> BatchCostModel::Snapshot() const {
  MutexLock lock(&mutex_);
  std::vector<Entry> entries;
  for (const auto& [group, instances] : costs_) {
    for (size_t instance = 0; instance < instances.size(); ++instance) {
      for (const auto& [rows, cost] : instances[instance]) {
        entries.push_back({group, rows, instance, FromMicros(cost.us), cost.observations});
      }
    }
  }
  return entries;
}

}  // namespace sluice
