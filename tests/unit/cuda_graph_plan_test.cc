// Which passes of a GPU instance capture and replay CUDA graphs (server/core/cuda_graph_plan.h).
#include "server/core/cuda_graph_plan.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

using Action = CudaGraphPlan::Action;

TEST(CudaGraphPlanTest, AShapeRunsEagerlyThenCapturesOnceThenReplays) {
  CudaGraphPlan plan(/*max_graphs=*/4, /*eager_runs=*/2);
  EXPECT_EQ(plan.Next("fp32[8,3]"), Action::kEager);    // the profiling executor's run
  EXPECT_EQ(plan.Next("fp32[8,3]"), Action::kEager);    // its optimised plan, cuDNN's search done
  EXPECT_EQ(plan.Next("fp32[8,3]"), Action::kCapture);  // warm-up's third run captures
  plan.Captured("fp32[8,3]", 1500);
  EXPECT_EQ(plan.Next("fp32[8,3]"), Action::kReplay);
  plan.Replayed();
  EXPECT_EQ(plan.Next("fp32[8,3]"), Action::kReplay);
  plan.Replayed();
  EXPECT_EQ(plan.graphs(), 1);
  EXPECT_EQ(plan.replays(), 2);
  EXPECT_EQ(plan.eager_passes(), 3);  // the capture pass answers from its eager run
  EXPECT_EQ(plan.capture_us(), 1500);
  // Another shape counts from zero.
  EXPECT_EQ(plan.Next("fp32[1,3]"), Action::kEager);
}

TEST(CudaGraphPlanTest, AFailedCaptureLeavesThatShapeEagerAndTheOthersCapture) {
  CudaGraphPlan plan(4, 1);
  EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
  plan.CaptureFailed("a");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.failed_shapes(), 1);
  EXPECT_EQ(plan.graphs(), 0);
  EXPECT_EQ(plan.Next("b"), Action::kEager);
  EXPECT_EQ(plan.Next("b"), Action::kCapture);
  plan.Captured("b", 10);
  EXPECT_EQ(plan.Next("b"), Action::kReplay);
}

TEST(CudaGraphPlanTest, TheCapIsPerInstanceAndShapesBeyondItRunEagerly) {
  CudaGraphPlan plan(/*max_graphs=*/2, /*eager_runs=*/1);
  for (const std::string key : {"a", "b"}) {
    EXPECT_EQ(plan.Next(key), Action::kEager);
    EXPECT_EQ(plan.Next(key), Action::kCapture);
    plan.Captured(key, 1);
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(plan.Next("c"), Action::kEager);
  EXPECT_EQ(plan.graphs(), 2);
  EXPECT_EQ(plan.Next("a"), Action::kReplay);
}

TEST(CudaGraphPlanTest, ADifferingReplayTurnsGraphsOffForGood) {
  CudaGraphPlan plan(4, 1);
  EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
  plan.Captured("a", 1);
  plan.TurnOff("the replay of a differs from the eager pass by 0.5 (eager passes: 0)");
  EXPECT_TRUE(plan.off());
  EXPECT_EQ(plan.graphs(), 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(plan.Next("a"), Action::kEager);
    EXPECT_EQ(plan.Next("b"), Action::kEager);
  }
  EXPECT_NE(plan.off_reason().find("differs"), std::string::npos);
}

TEST(CudaGraphPlanTest, ReportsForAShapeNotBeingCapturedChangeNothing) {
  CudaGraphPlan plan(4, 1);
  plan.Captured("never-seen", 5);
  plan.CaptureFailed("never-seen");
  EXPECT_EQ(plan.graphs(), 0);
  EXPECT_EQ(plan.failed_shapes(), 0);
  EXPECT_EQ(plan.Next("a"), Action::kEager);
  plan.Captured("a", 5);  // still counting: not a capture
  EXPECT_EQ(plan.graphs(), 0);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
}

TEST(CudaGraphPlanTest, OpenEndedShapesDoNotGrowTheCountsForEver) {
  CudaGraphPlan plan(/*max_graphs=*/1, /*eager_runs=*/1);
  // Four shapes per allowed graph are counted; every later new shape runs eagerly untracked.
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(plan.Next("len" + std::to_string(i)), Action::kEager);
  EXPECT_EQ(plan.Next("len0"), Action::kCapture);  // a tracked one still reaches its capture
  EXPECT_EQ(plan.Next("len999"), Action::kEager);
  EXPECT_EQ(plan.Next("len999"), Action::kEager);
}

TEST(CudaGraphPlanTest, ACapturePassWhoseEagerRunFailedCapturesOnTheNextPass) {
  CudaGraphPlan plan(4, 1);
  EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
  plan.Retry("a");  // its eager forward failed (out of memory, say): nothing was captured
  EXPECT_EQ(plan.failed_shapes(), 0);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
  plan.Captured("a", 1);
  EXPECT_EQ(plan.Next("a"), Action::kReplay);
  plan.Retry("a");  // only a shape being captured goes back
  EXPECT_EQ(plan.Next("a"), Action::kReplay);
}

TEST(CudaGraphPlanTest, ShapesPastTheCapKeepTheirCountBounded) {
  CudaGraphPlan plan(/*max_graphs=*/1, /*eager_runs=*/1);
  EXPECT_EQ(plan.Next("b"), Action::kEager);  // b counts first...
  EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.Next("a"), Action::kCapture);
  plan.Captured("a", 1);  // ...but a takes the only graph
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(plan.Next("b"), Action::kEager);
  plan.TurnOff("");
  EXPECT_EQ(plan.off_reason(), "turned off");
}

TEST(CudaGraphPlanTest, NoGraphsAllowedMeansEveryPassIsEager) {
  CudaGraphPlan plan(/*max_graphs=*/0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(plan.Next("a"), Action::kEager);
  EXPECT_EQ(plan.eager_passes(), 5);
}

}  // namespace
}  // namespace sluice
