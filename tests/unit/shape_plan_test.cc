// Shape plans (the shapes a model can be handed) and the cuDNN benchmark decision.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/shape_plan.h"
#include "tests/unit/batching_fixtures.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using testing::FixedSpec;
using testing::PaddedSpec;

TEST(ShapePlanTest, BatchSizesTheSchedulersCanForm) {
  EXPECT_THAT(SchedulableBatchSizes(FixedSpec(0)), ElementsAre(0));
  EXPECT_THAT(SchedulableBatchSizes(FixedSpec(4)), ElementsAre(1, 2, 3, 4));
  ModelSpec padded = FixedSpec(16);
  padded.dynamic_batching.enabled = true;
  padded.dynamic_batching.pad_to_preferred = true;
  padded.dynamic_batching.preferred_batch_sizes = {4, 8};
  EXPECT_THAT(SchedulableBatchSizes(padded), ElementsAre(4, 8, 16));
  padded.dynamic_batching.pad_to_preferred = false;  // batches of any size up to the max
  EXPECT_EQ(SchedulableBatchSizes(padded).size(), 16u);
  // A huge max_batch_size is never materialised: the list stops one past the limit.
  EXPECT_EQ(SchedulableBatchSizes(FixedSpec(1 << 30), 10).size(), 11u);
  EXPECT_THAT(SchedulableBatchSizes(FixedSpec(4), 10), ElementsAre(1, 2, 3, 4));
}

TEST(ShapePlanTest, FixedDimsMakeAFiniteSet) {
  ShapePlan plan = ComputeShapePlan(FixedSpec(3));
  ASSERT_TRUE(plan.finite);
  ASSERT_EQ(plan.shapes.size(), 3u);
  EXPECT_EQ(plan.shapes[1].batch_size, 2);
  EXPECT_EQ(plan.shapes[1].input_shapes[0], (Shape{2, 3, 4}));
  EXPECT_EQ(plan.shapes[1].label, "batch=2 x[2,3,4]");

  ShapePlan unbatched = ComputeShapePlan(FixedSpec(0));
  ASSERT_TRUE(unbatched.finite);
  ASSERT_EQ(unbatched.shapes.size(), 1u);
  EXPECT_EQ(unbatched.shapes[0].input_shapes[0], (Shape{3, 4}));
}

TEST(ShapePlanTest, AVariableDimWithoutBucketIsOpenEnded) {
  ModelSpec spec = FixedSpec(4);
  spec.inputs[0].dims = {3, -1};
  ShapePlan plan = ComputeShapePlan(spec);
  EXPECT_FALSE(plan.finite);
  EXPECT_TRUE(plan.shapes.empty());
  EXPECT_THAT(plan.why_not,
              HasSubstr("input 'x' dimension 1 is variable (-1) and has no padding bucket"));
}

TEST(ShapePlanTest, BucketsMakeTheCrossProduct) {
  ModelSpec spec = PaddedSpec();
  spec.dynamic_batching.enabled = true;
  spec.dynamic_batching.pad_to_preferred = true;
  spec.dynamic_batching.preferred_batch_sizes = {2};
  ShapePlan plan = ComputeShapePlan(spec);
  ASSERT_TRUE(plan.finite) << plan.why_not;
  std::vector<std::string> labels;
  for (const auto& entry : plan.shapes) labels.push_back(entry.label);
  EXPECT_THAT(labels, ElementsAre("batch=2 x[2,4,2]", "batch=2 x[2,8,2]", "batch=4 x[4,4,2]",
                                  "batch=4 x[4,8,2]"));
  // Two axes: every combination.
  ModelSpec image = FixedSpec(1);
  image.inputs[0].dims = {3, -1, -1};
  image.padding.axes = {{"h", {224, 320}}, {"w", {224, 320, 640}}};
  image.padding.dims = {{"x", true, 1, 0}, {"x", true, 2, 1}};
  EXPECT_EQ(ComputeShapePlan(image).shapes.size(), 6u);
}

TEST(ShapePlanTest, AHugeSetIsNotWarmedUp) {
  ModelSpec spec = FixedSpec(1 << 30);  // counted, never built
  ShapePlan plan = ComputeShapePlan(spec);
  EXPECT_FALSE(plan.finite);
  EXPECT_THAT(plan.why_not, HasSubstr("more than 4096 shapes"));
  ModelSpec buckets = FixedSpec(64);
  buckets.inputs[0].dims = {-1, -1};
  buckets.padding.axes = {{"a", std::vector<int64_t>(40, 1)}, {"b", std::vector<int64_t>(40, 1)}};
  buckets.padding.dims = {{"x", true, 0, 0}, {"x", true, 1, 1}};
  EXPECT_FALSE(ComputeShapePlan(buckets).finite);  // 64 x 40 x 40
}

TEST(CudnnBenchmarkDecisionTest, PerModelRule) {
  ModelSpec fixed = FixedSpec(2);
  ModelSpec open = FixedSpec(2);
  open.inputs[0].dims = {-1, 4};
  const ShapePlan fixed_plan = ComputeShapePlan(fixed);
  const ShapePlan open_plan = ComputeShapePlan(open);
  auto decide = [](CudnnBenchmarkMode mode, const ModelSpec& spec, const ShapePlan& plan) {
    return DecideCudnnBenchmark(mode, spec, plan);
  };
  EXPECT_TRUE(decide(CudnnBenchmarkMode::kAuto, fixed, fixed_plan).benchmark);
  EXPECT_THAT(decide(CudnnBenchmarkMode::kAuto, fixed, fixed_plan).reason,
              HasSubstr("fixed shapes (2 in the set)"));
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kAuto, open, open_plan).benchmark);
  EXPECT_THAT(decide(CudnnBenchmarkMode::kAuto, open, open_plan).reason,
              HasSubstr("variable shapes"));
  EXPECT_TRUE(decide(CudnnBenchmarkMode::kOn, open, open_plan).benchmark);
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kOff, fixed, fixed_plan).benchmark);
  // Only the rule's "on" may be overruled by timing it; the operator's choices stand.
  EXPECT_TRUE(decide(CudnnBenchmarkMode::kAuto, fixed, fixed_plan).measurable);
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kAuto, open, open_plan).measurable);
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kOn, fixed, fixed_plan).measurable);
  ModelSpec package = fixed;
  package.format = ModelFormat::kAotInductor;
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kAuto, package, fixed_plan).measurable);
  fixed.cudnn_benchmark_override = CudnnBenchmarkMode::kOff;  // the model's parameter wins
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kOn, fixed, fixed_plan).benchmark);
  EXPECT_THAT(decide(CudnnBenchmarkMode::kOn, fixed, fixed_plan).reason,
              HasSubstr("sluice.cudnn_benchmark=off"));
}

}  // namespace
}  // namespace sluice
