// Batch sizes chosen by measurement (sluice.auto_batch_sizes): when the rule applies and what it
// keeps.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_sizes.h"
#include "server/batching/shape_plan.h"
#include "server/batching/warmup.h"
#include "tests/unit/batching_fixtures.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using testing::FixedSpec;
using testing::PaddedSpec;

TEST(AutoBatchSizesTest, AppliesOnlyWithoutPreferredSizesToAFiniteWarmedSet) {
  ModelSpec spec = FixedSpec(8);
  spec.dynamic_batching.enabled = true;
  EXPECT_EQ(AutoBatchSizesOffReason(spec, ComputeShapePlan(spec), true), "");
  EXPECT_EQ(AutoBatchSizesOffReason(spec, ComputeShapePlan(spec), false), "warm-up is off");
  ModelSpec other = spec;
  other.dynamic_batching.preferred_batch_sizes = {4};
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true),
            "preferred_batch_size is set");
  other.dynamic_batching.pad_to_preferred = true;  // then it decides what padding pays
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "");
  other = spec;
  other.dynamic_batching.auto_batch_sizes = false;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true),
            "sluice.auto_batch_sizes is false");
  other = spec;
  other.dynamic_batching.enabled = false;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "no dynamic_batching");
  other = spec;
  other.max_batch_size = 1;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "max_batch_size is 1");
  other = spec;
  other.inputs[0].dims = {-1, 4};
  EXPECT_THAT(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true),
              HasSubstr("open-ended"));

  // Where it applies, every shape-plan request gets timed runs and its batch size; samples none.
  spec.warmup_samples = {
      {"zeros", 1, 2, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kZero, ""}}}};
  auto warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
  ASSERT_TRUE(warmup.ok()) << warmup.status();
  ASSERT_EQ(warmup->size(), 9u);
  EXPECT_EQ((*warmup)[0].timed_runs, kBatchSizeTimedRuns);
  EXPECT_EQ((*warmup)[7].batch_size, 8);
  EXPECT_EQ((*warmup)[8].timed_runs, 0);
  EXPECT_EQ((*warmup)[8].batch_size, 0);
  spec.dynamic_batching.preferred_batch_sizes = {4};
  warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
  ASSERT_TRUE(warmup.ok());
  EXPECT_EQ((*warmup)[0].timed_runs, 0);
}

WarmupPass Timed(int instance, int64_t batch_size, Duration median, std::string label = "") {
  WarmupPass pass;
  pass.instance = instance;
  pass.batch_size = batch_size;
  pass.median_timed = median;
  pass.label = std::move(label);
  return pass;
}

TEST(AutoBatchSizesTest, KeepsASizeOnlyWhereItServesAtLeastNearlyTheBestRateBelow) {
  // Rows/s like a CPU conv net: rising to 4, a cliff from 5 to 7, back up at 8.
  const std::vector<std::pair<int, Duration>> times = {{1, 1000us}, {2, 1500us}, {3, 2000us},
                                                       {4, 2500us}, {5, 5000us}, {6, 5000us},
                                                       {7, 5000us}, {8, 2600us}};
  std::vector<WarmupPass> passes;
  for (const auto& [size, median] : times) passes.push_back(Timed(0, size, median));
  passes.push_back(WarmupPass{});  // a model_warmup sample: no batch size, no timing
  const BatchSizeChoice choice = ChooseBatchSizes(passes);
  ASSERT_TRUE(choice.measured);
  // 5-7: at most 1400 rows/s < 0.9 x 1600 (the best below); 8: 3077, kept.
  EXPECT_THAT(choice.sizes, ElementsAre(1, 2, 3, 4, 8));
  ASSERT_EQ(choice.rates.size(), 8u);
  EXPECT_DOUBLE_EQ(choice.rates[0].rows_per_second, 1000.0);
  EXPECT_FALSE(choice.rates[4].kept);
  EXPECT_EQ(choice.SizesText(), "1,2,3,4,8");
  EXPECT_EQ(choice.RatesText(), "1:1000,2:1333,3:1500,4:1600,5:1000,6:1200,7:1400,8:3077");

  // Within 10 % of the best below is kept (timing noise); further below is not.
  passes = {Timed(0, 1, 1000us), Timed(0, 2, 2100us), Timed(0, 3, 3400us)};
  EXPECT_THAT(ChooseBatchSizes(passes).sizes, ElementsAre(1, 2));
}

// Padded sizes {1, 8, 32, 64} timed like the H200's ResNet-50 FP16: launch-bound up to 8 (2.6 ms),
// then 1.0 ms + 94 us a row.
TEST(AutoBatchSizesTest, WithPaddingARowCountIsKeptWherePaddingItUpPays) {
  const std::vector<WarmupPass> passes = {Timed(0, 1, 2600us), Timed(0, 8, 2600us),
                                          Timed(0, 32, 4008us), Timed(0, 64, 7016us)};
  const BatchSizeChoice choice = ChoosePaddedBatchSizes(passes, {1, 8, 32, 64});
  ASSERT_TRUE(choice.measured);
  std::vector<int> expected;
  // 1-8 rows pad to 8 (up to 3,077 rows/s); 9-11 padded to 32 serve under 0.9 x that (11 / 4.008
  // ms = 2,745 < 2,769), 12-32 more; 33-50 padded to 64 under 0.9 x 32 rows at 32 (50 / 7.016 ms
  // = 7,127 < 7,186), 51-64 enough. With 40 rows waiting the batcher takes 32.
  for (int rows = 1; rows <= 64; ++rows) {
    if (rows <= 8 || (rows >= 12 && rows <= 32) || rows >= 51) expected.push_back(rows);
  }
  EXPECT_EQ(choice.sizes, expected);
  ASSERT_EQ(choice.rates.size(), 4u);
  EXPECT_TRUE(choice.rates[3].kept);  // 51-64 pad to 64
  EXPECT_EQ(choice.RatesText(), "1:385,8:3077,32:7984,64:9122");

  // A size warm-up did not time is never formed; nothing timed: not measured.
  const BatchSizeChoice partial =
      ChoosePaddedBatchSizes({Timed(0, 1, 1ms), Timed(0, 8, 2ms)}, {1, 8, 32});
  EXPECT_EQ(partial.sizes.back(), 8);
  EXPECT_FALSE(ChoosePaddedBatchSizes({WarmupPass{}}, {1, 8}).measured);
}

TEST(AutoBatchSizesTest, ShapesOfASizeAddUpAndInstancesTakeTheMedian) {
  std::vector<WarmupPass> passes;
  // Two bucket shapes per size; three instances, one of them slow at size 2.
  for (int instance = 0; instance < 3; ++instance) {
    passes.push_back(Timed(instance, 1, 1ms, "short"));
    passes.push_back(Timed(instance, 1, 3ms, "long"));
    passes.push_back(Timed(instance, 2, instance == 2 ? 40ms : 2ms, "short"));
    passes.push_back(Timed(instance, 2, instance == 2 ? 40ms : 4ms, "long"));
  }
  const BatchSizeChoice choice = ChooseBatchSizes(passes);
  ASSERT_EQ(choice.rates.size(), 2u);
  EXPECT_DOUBLE_EQ(choice.rates[0].rows_per_second, 2 / 0.004);  // 2 rows in 4 ms
  EXPECT_DOUBLE_EQ(choice.rates[1].rows_per_second, 4 / 0.006);  // the median instance
  EXPECT_THAT(choice.sizes, ElementsAre(1, 2));

  const BatchSizeChoice none = ChooseBatchSizes({Timed(0, 1, Duration::zero())});
  EXPECT_FALSE(none.measured);
  EXPECT_TRUE(none.sizes.empty());
  EXPECT_EQ(none.off_reason, "warm-up timed no batch size");
}

}  // namespace
}  // namespace sluice
