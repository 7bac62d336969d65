// The batch cost model of latency-target batching: seeds, interpolation, smoothing, and which
// instance a prediction follows.
#include <gtest/gtest.h>

#include "server/batching/batch_cost.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using Pick = BatchCostModel::Pick;

TEST(BatchCostModelTest, AGroupNoInstanceHasRunHasNoPrediction) {
  BatchCostModel costs(2);
  EXPECT_FALSE(costs.Predict("x[2,]", 1, Pick::kSlowest).has_value());
  costs.Seed(0, "x[2,]", 4, 400us);
  EXPECT_FALSE(costs.Predict("x[3,]", 4, Pick::kSlowest).has_value());
  EXPECT_EQ(costs.Predict("x[2,]", 4, Pick::kSlowest), 400us);
}

TEST(BatchCostModelTest, SizesNeverMeasuredAreInterpolatedOrScaledTowardsTooLong) {
  BatchCostModel costs(1);
  costs.Seed(0, "g", 2, 200us);
  costs.Seed(0, "g", 6, 400us);
  EXPECT_EQ(costs.Predict("g", 4, Pick::kSlowest), 300us);   // halfway
  EXPECT_EQ(costs.Predict("g", 1, Pick::kSlowest), 200us);   // below the smallest: as much as it
  EXPECT_EQ(costs.Predict("g", 12, Pick::kSlowest), 800us);  // beyond the largest: per row
}

TEST(BatchCostModelTest, BatchesThatRunAreSmoothedInAndReportWhatWasPredicted) {
  BatchCostModel costs(1, /*smoothing=*/0.5);
  costs.Seed(0, "g", 4, 100us);
  EXPECT_EQ(costs.Observe(0, "g", 4, 300us), 100us);
  EXPECT_EQ(costs.Predict("g", 4, Pick::kSlowest), 200us);
  // A size seen for the first time starts at its measurement; the prediction it had came from
  // the neighbours.
  EXPECT_EQ(costs.Observe(0, "g", 8, 1000us), 400us);  // 200 us for 4 rows, scaled to 8
  EXPECT_EQ(costs.Predict("g", 8, Pick::kSlowest), 1000us);
  // A group never seen: no prediction, and its first batch is its estimate.
  EXPECT_FALSE(costs.Observe(0, "other", 1, 50us).has_value());
  EXPECT_EQ(costs.Predict("other", 1, Pick::kSlowest), 50us);
}

TEST(BatchCostModelTest, AWrongSeedIsCorrectedByTheBatchesThatRun) {
  BatchCostModel costs(1);
  costs.Seed(0, "g", 4, 100us);  // warm-up measured a quiet host; traffic runs 4x slower
  for (int i = 0; i < 20; ++i) costs.Observe(0, "g", 4, 400us);
  const Duration predicted = *costs.Predict("g", 4, Pick::kSlowest);
  EXPECT_GT(predicted, 390us);
  EXPECT_LE(predicted, 400us);
  const auto entries = costs.Snapshot();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].observations, 20u);
}

TEST(BatchCostModelTest, PredictionsFollowTheSlowestOrTheFastestInstance) {
  BatchCostModel costs(3);
  costs.Seed(0, "g", 4, 300us);
  costs.Seed(1, "g", 4, 100us);  // instance 2 has not run the group: it does not count
  EXPECT_EQ(costs.Predict("g", 4, Pick::kSlowest), 300us);
  EXPECT_EQ(costs.Predict("g", 4, Pick::kFastest), 100us);
  // An instance out of range, or no rows, is ignored rather than trusted.
  costs.Seed(7, "g", 4, 1s);
  costs.Observe(0, "g", 0, 1s);
  EXPECT_EQ(costs.Predict("g", 4, Pick::kSlowest), 300us);
}

TEST(BatchCostModelTest, ThePlanShareFallsWithLateAnswersAndSettlesWhereAboutOnePercentAreLate) {
  BatchCostModel costs(1, kBatchCostSmoothing, 1000us);
  EXPECT_EQ(costs.PlanShare(), 1.0);
  costs.ObserveAnswer(900us);  // in time: already at the top
  EXPECT_EQ(costs.PlanShare(), 1.0);
  costs.ObserveAnswer(1001us);
  EXPECT_DOUBLE_EQ(costs.PlanShare(), 1.0 - kPlanShareStep);
  // A late answer in every hundred holds it where it is.
  for (int i = 0; i < 99; ++i) costs.ObserveAnswer(500us);
  costs.ObserveAnswer(2000us);
  EXPECT_NEAR(costs.PlanShare(), 1.0 - kPlanShareStep, 1e-9);
  // Answers late in the server, one in ten, drive it down to its floor; then in time, back up.
  for (int i = 0; i < 10000; ++i) costs.ObserveAnswer(i % 10 == 0 ? 3000us : 500us);
  EXPECT_NEAR(costs.PlanShare(), kMinPlanShare, 0.01);
  for (int i = 0; i < 100000; ++i) costs.ObserveAnswer(500us);
  EXPECT_EQ(costs.PlanShare(), 1.0);
  // Every answer counted, the late ones (longer than the target, not equal to it) apart.
  EXPECT_EQ(costs.Answers().answered, 2u + 100u + 10000u + 100000u);
  EXPECT_EQ(costs.Answers().late, 1u + 1u + 1000u);
  costs.ObserveAnswer(1000us);
  EXPECT_EQ(costs.Answers().late, 1002u);
}

TEST(BatchCostModelTest, ThePlanShareNeverFallsBelowTwiceTheCostliestLoneRow) {
  BatchCostModel costs(2, kBatchCostSmoothing, 1000us);
  for (int i = 0; i < 1000; ++i) costs.ObserveAnswer(2000us);
  EXPECT_EQ(costs.PlanShare(), kMinPlanShare);
  costs.Seed(0, "cheap", 1, 50us);
  costs.Seed(0, "dear", 2, 300us);           // its smallest size measured stands for a lone row
  costs.Seed(1, "dear", 1, 200us);           // the fastest instance counts
  EXPECT_DOUBLE_EQ(costs.PlanShare(), 0.4);  // 2 x 200 us of 1000
  costs.Observe(1, "dear", 1, 700us);        // smoothed: 200 x 0.8 + 700 x 0.2 = 300 us
  EXPECT_DOUBLE_EQ(costs.PlanShare(), 0.6);
}

TEST(BatchCostModelTest, WithoutATargetThePlanShareStaysWhole) {
  BatchCostModel costs(1);
  costs.ObserveAnswer(1s);
  EXPECT_EQ(costs.Answers().answered, 0u);  // nothing to count against
  EXPECT_EQ(costs.PlanShare(), 1.0);
}

}  // namespace
}  // namespace sluice
