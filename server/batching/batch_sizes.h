// Batch sizes chosen by measurement (sluice.auto_batch_sizes). Warm-up runs every batch size a
// model can be handed on every instance; timing a few extra runs there tells which sizes serve
// more rows per second than every smaller size. On a CPU a larger batch is not always faster per
// row (oneDNN picks other kernels by size, caches overflow), so a batcher that always takes what
// is waiting can make a busy server slower than an idle one; on a GPU the rule mostly keeps every
// size. An explicit preferred_batch_size wins: the rule applies only without one, or with padding
// to the preferred sizes, where it decides how many real rows are worth padding up
// (ChoosePaddedBatchSizes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "server/batching/scheduler.h"
#include "server/batching/shape_plan.h"
#include "server/core/model_spec.h"

namespace sluice {

// Timed runs per (instance, shape) after the warm-up runs; their median counts. At least
// kBatchSizeTimedRuns; more while they have taken less than kBatchSizeTimedBudget together, up to
// kBatchSizeMaxTimedRuns; in rounds across the sizes (RunWarmupOnInstance). A model that runs
// in microseconds gets a median of a hundred or more runs, and a busy spell of the host slows
// every size alike (3 runs of each size in turn once made batch 3 of a 5 us model look slower
// than batch 2 on a loaded CI machine); a model that runs in 10 ms or more pays only the 3 runs.
inline constexpr int kBatchSizeTimedRuns = 3;
inline constexpr Duration kBatchSizeTimedBudget = std::chrono::milliseconds(20);
inline constexpr int kBatchSizeMaxTimedRuns = 200;
// A size is kept when it serves at least this share of the best rows/s of the smaller sizes:
// timings on a busy host vary by a few percent, and a size within that of the best is no loss.
inline constexpr double kBatchSizeKeepRatio = 0.9;

// Empty when the rule applies to `spec` and `plan`; else why not, in words (for the log).
std::string AutoBatchSizesOffReason(const ModelSpec& spec, const ShapePlan& plan, bool warmup);

struct BatchSizeRate {
  int batch_size = 0;
  double rows_per_second = 0;  // the median over instances
  bool kept = false;
};

struct BatchSizeChoice {
  bool measured = false;   // sizes come from warm-up timings
  std::string off_reason;  // when not measured
  std::vector<int> sizes;  // ascending, 1 first; the batcher's ladder (empty: not measured)
  std::vector<BatchSizeRate> rates;  // every size timed, ascending

  // "1,2,4,8" (the kept sizes), and "1:25000,2:41000,..." (every rate, rounded to rows/s).
  std::string SizesText() const;
  std::string RatesText() const;
};

// From the passes of a warm-up built with timed runs (BuildWarmupRequests): per instance and
// batch size, rows/s = rows of every shape of that size / the sum of their median timed runs;
// per size the median over instances. Size 1 is always kept; a larger size is kept when its rate
// is at least kBatchSizeKeepRatio x the best rate of the smaller sizes. Not measured (empty
// sizes) when no pass has timed runs.
BatchSizeChoice ChooseBatchSizes(const std::vector<WarmupPass>& passes);

// With padding to preferred sizes (sluice.pad_batch_to_preferred), warm-up times the padded sizes
// `padded_sizes` (ascending: the preferred sizes and max_batch_size), and the choice is how many
// real rows to take: `r` rows run as a batch of the smallest padded size P(r) >= r, at
// r x rate(P(r)) / P(r) real rows/s. Row counts are kept by ChooseBatchSizes' rule over those
// rates, and the batcher cuts a batch to the largest kept count the waiting rows reach: it pads
// up where padding pays and leaves the rest for the next batch where a smaller size serves more
// real rows per second (33 rows padded to 64 against 32 rows unpadded). `rates`: the padded
// sizes', `kept` where some kept count pads to them.
BatchSizeChoice ChoosePaddedBatchSizes(const std::vector<WarmupPass>& passes,
                                       const std::vector<int64_t>& padded_sizes);

}  // namespace sluice
