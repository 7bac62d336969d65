// What a batch costs to execute, learned per (shape group, rows, instance), for batching to a
// latency target (sluice.latency_target_us). Warm-up's timings seed it; every batch that runs
// corrects it. The batcher asks it how long a batch of a given size would take, to decide how
// large a batch to form, whether waiting for more requests still lets the oldest one meet the
// target, and which requests cannot meet theirs at all.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/core/clock.h"
#include "server/core/mutex.h"

namespace sluice {

// Weight of a new measurement in the smoothed cost (an exponentially weighted moving average):
// about the last ten batches of a size count.
inline constexpr double kBatchCostSmoothing = 0.2;

// Planning within a latency target (BatchCostModel::PlanShare): the share of answered requests
// allowed to take longer than the target inside the server, how far one late answer lowers the
// share of the target the batcher plans with, and how low that share may go.
inline constexpr double kLateAnswerShare = 0.01;
inline constexpr double kPlanShareStep = 0.01;
inline constexpr double kMinPlanShare = 0.25;

// Thread-safe: the workers record, the batcher predicts.
class BatchCostModel {
 public:
  // `target`: the model's latency target, for PlanShare (zero: none, the share stays 1).
  explicit BatchCostModel(size_t instances, double smoothing = kBatchCostSmoothing,
                          Duration target = Duration::zero());

  // The share of the latency target the batcher plans with, in [kMinPlanShare, 1]; 1 to start
  // with. Every answered request moves it (ObserveAnswer): down by kPlanShareStep when the
  // request took longer than the target inside the server (from its arrival in the queue to its
  // answer), up by kPlanShareStep x kLateAnswerShare / (1 - kLateAnswerShare) when it did not,
  // so that it settles where about kLateAnswerShare of the answers are late: a stochastic
  // approximation of the share at which the 99th percentile meets the target. Whatever makes the
  // plan miss (costs that vary from batch to batch about their average, a CPU shared with the
  // transport, work the batcher does not see) shows up as late answers and is corrected here.
  // Never below the time the costliest shape group's lone row takes twice over (one batch ahead
  // of it, then its own), on its fastest instance: a plan shorter than that would refuse every
  // request, and with nothing answered nothing would raise it again.
  double PlanShare() const {
    return std::max(plan_share_.load(std::memory_order_relaxed),
                    floor_share_.load(std::memory_order_relaxed));
  }
  // A request answered OK `in_server` after its arrival in the queue (no-op without a target).
  void ObserveAnswer(Duration in_server);

  // The answers ObserveAnswer counted, and how many of them took longer than the target inside
  // the server: the batcher aims at about kLateAnswerShare late. A client that sees a larger share
  // late lost the difference outside the server's clock (the transport; on a CPU shared with the
  // forward pass, the wait to be read while a batch runs).
  struct AnswerCounts {
    uint64_t answered = 0;
    uint64_t late = 0;
  };
  AnswerCounts Answers() const {
    return {answered_.load(std::memory_order_relaxed),
            answered_late_.load(std::memory_order_relaxed)};
  }

  // A warm-up timing of `rows` rows of `group` on instance `instance`: replaces what is known
  // (warm-up runs before traffic, and its timed runs are steadier than any one batch).
  void Seed(size_t instance, const std::string& group, int64_t rows, Duration cost)
      ABSL_LOCKS_EXCLUDED(mutex_);

  // A batch that ran: its execution time (assembly, forward, delivery) folds into the smoothed
  // cost of that size on that instance. Returns what the model predicted for exactly this batch
  // before (nullopt when it had nothing for the group), for the prediction-error metric.
  std::optional<Duration> Observe(size_t instance, const std::string& group, int64_t rows,
                                  Duration measured) ABSL_LOCKS_EXCLUDED(mutex_);

  // Which instance's cost a prediction uses: the slowest (a batch may land on any idle instance,
  // and the target must hold on each) or the fastest (a lower bound: refuse only what no
  // instance could do in time).
  enum class Pick { kSlowest, kFastest };

  // How long `rows` rows of `group` take. A size never measured on an instance is interpolated
  // between the nearest measured sizes, or scaled per row from the nearest one (a larger batch
  // is assumed to cost in proportion to its rows beyond the largest measured, and a smaller one
  // as much as the smallest measured: both err towards too long). nullopt when no instance has
  // run this group yet: the batcher then decides as without a target.
  std::optional<Duration> Predict(const std::string& group, int64_t rows, Pick pick) const
      ABSL_LOCKS_EXCLUDED(mutex_);

  // Every known cost, for statistics and logs.
  struct Entry {
    std::string group;
    int64_t rows = 0;
    size_t instance = 0;
    Duration cost{0};
    uint64_t observations = 0;  // batches folded in since the seed (0: warm-up's figure)
  };
  std::vector<Entry> Snapshot() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Cost {
    double us = 0;
    uint64_t observations = 0;
  };
  using Sizes = std::map<int64_t, Cost>;  // by rows
  static std::optional<double> Interpolate(const Sizes& sizes, int64_t rows);
  std::optional<Duration> PredictLocked(const std::string& group, int64_t rows, Pick pick) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const size_t instances_;
  const double smoothing_;
  // Recomputes floor_share_ from the lone-row costs (see PlanShare).
  void UpdateFloorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Duration target_;
  std::atomic<double> plan_share_{1.0};
  std::atomic<double> floor_share_{0.0};
  std::atomic<uint64_t> answered_{0}, answered_late_{0};
  mutable Mutex mutex_;
  // group -> per instance -> rows -> cost
  std::map<std::string, std::vector<Sizes>, std::less<>> costs_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
