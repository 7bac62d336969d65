#include "server/batching/batch_sizes.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice {

std::string AutoBatchSizesOffReason(const ModelSpec& spec, const ShapePlan& plan, bool warmup) {
  const DynamicBatchingSpec& batching = spec.dynamic_batching;
  if (spec.sequence_batching.enabled)
    return "sequence_batching: an execution has one row per active sequence";
  if (!batching.enabled) return "no dynamic_batching";
  if (spec.max_batch_size <= 1) return "max_batch_size is 1";
  if (!batching.auto_batch_sizes) return "sluice.auto_batch_sizes is false";
  if (!batching.preferred_batch_sizes.empty() && !batching.pad_to_preferred)
    return "preferred_batch_size is set";
  if (!warmup || !spec.warmup) return "warm-up is off";
  if (!plan.finite) return absl::StrCat("the shape set is open-ended (", plan.why_not, ")");
  return "";
}

std::string BatchSizeChoice::SizesText() const { return absl::StrJoin(sizes, ","); }

std::string BatchSizeChoice::RatesText() const {
  return absl::StrJoin(rates, ",", [](std::string* out, const BatchSizeRate& rate) {
    absl::StrAppend(out, rate.batch_size, ":", std::llround(rate.rows_per_second));
  });
}

namespace {

// The keep rule over rates offered in ascending size: the first is kept, a later one when it is
// at least kBatchSizeKeepRatio x the best rate offered before it.
class KeepRule {
 public:
  bool Keep(double rate) {
    const bool kept = first_ || rate >= kBatchSizeKeepRatio * best_;
    first_ = false;
    best_ = std::max(best_, rate);
    return kept;
  }

 private:
  bool first_ = true;
  double best_ = 0;
};

}  // namespace

BatchSizeChoice ChooseBatchSizes(const std::vector<WarmupPass>& passes) {
  struct Sum {
    double seconds = 0;
    int64_t rows = 0;
  };
  std::map<int64_t, std::map<int, Sum>> per_size;  // batch size -> instance -> sums
  for (const WarmupPass& pass : passes) {
    if (pass.batch_size < 1 || pass.median_timed <= Duration::zero()) continue;
    Sum& sum = per_size[pass.batch_size][pass.instance];
    sum.seconds += std::chrono::duration<double>(pass.median_timed).count();
    sum.rows += pass.batch_size;
  }
  BatchSizeChoice choice;
  if (per_size.empty()) {
    choice.off_reason = "warm-up timed no batch size";
    return choice;
  }
  choice.measured = true;
  KeepRule rule;
  for (const auto& [size, instances] : per_size) {
    std::vector<double> rates;
    for (const auto& [instance, sum] : instances)
      rates.push_back(static_cast<double>(sum.rows) / sum.seconds);
    std::sort(rates.begin(), rates.end());
    const size_t n = rates.size();
    BatchSizeRate rate;
    rate.batch_size = static_cast<int>(size);
    rate.rows_per_second = n % 2 == 1 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
    rate.kept = rule.Keep(rate.rows_per_second);
    if (rate.kept) choice.sizes.push_back(rate.batch_size);
    choice.rates.push_back(rate);
  }
  return choice;
}

BatchSizeChoice ChoosePaddedBatchSizes(const std::vector<WarmupPass>& passes,
                                       const std::vector<int64_t>& padded_sizes) {
  BatchSizeChoice measured = ChooseBatchSizes(passes);
  if (!measured.measured) return measured;
  BatchSizeChoice choice;
  choice.measured = true;
  std::map<int64_t, double> rate_of;  // padded size -> rows/s of full batches of it
  for (const BatchSizeRate& rate : measured.rates) rate_of[rate.batch_size] = rate.rows_per_second;
  KeepRule rule;
  std::set<int64_t> kept_padded;
  const int64_t largest = padded_sizes.empty() ? 0 : padded_sizes.back();
  for (int64_t rows = 1; rows <= largest; ++rows) {
    const auto padded = std::lower_bound(padded_sizes.begin(), padded_sizes.end(), rows);
    const auto timed = rate_of.find(*padded);
    if (timed == rate_of.end()) continue;  // a size warm-up did not time: never formed
    // `rows` real rows run as a batch of *padded rows, which takes *padded / its rate.
    const double rate = static_cast<double>(rows) * timed->second / static_cast<double>(*padded);
    if (rule.Keep(rate)) {
      choice.sizes.push_back(static_cast<int>(rows));
      kept_padded.insert(*padded);
    }
  }
  for (BatchSizeRate rate : measured.rates) {
    rate.kept = kept_padded.count(rate.batch_size) > 0;
    choice.rates.push_back(rate);
  }
  return choice;
}

}  // namespace sluice
