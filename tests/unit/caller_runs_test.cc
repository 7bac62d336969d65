// When a model's requests may run on the thread that received them
// (sluice.run_on_receiving_thread).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/caller_runs.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

ModelSpec Asking(int64_t bound_us = kRunOnReceivingThreadMaxUs) {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.dynamic_batching.run_on_receiving_thread = true;
  spec.dynamic_batching.run_on_receiving_thread_max_us = bound_us;
  return spec;
}

WarmupPass Pass(int64_t batch_size, Duration median_timed, Duration last_run = 0us) {
  WarmupPass pass;
  pass.batch_size = batch_size;
  pass.median_timed = median_timed;
  pass.last_run = last_run;
  return pass;
}

TEST(CallerRunsTest, OffUnlessTheConfigAsks) {
  ModelSpec spec = Asking();
  spec.dynamic_batching.run_on_receiving_thread = false;
  const CallerRunsChoice choice = ChooseCallerRuns(spec, {Pass(1, 10us)});
  EXPECT_FALSE(choice.asked);
  EXPECT_FALSE(choice.on);
}

TEST(CallerRunsTest, OnWhenTheSlowestLoneRequestIsWithinTheBound) {
  // Two instances and two lone shapes (batch 0: a model without a batch dimension, or a
  // model_warmup sample); the batch-4 pass is not a lone request and does not count.
  const CallerRunsChoice choice = ChooseCallerRuns(
      Asking(500), {Pass(1, 120us), Pass(0, 0us, 480us), Pass(4, 900us), Pass(1, 130us)});
  EXPECT_TRUE(choice.asked);
  EXPECT_TRUE(choice.on) << choice.reason;
  EXPECT_EQ(choice.measured, Duration(480us));  // a pass without timed runs counts its last run
  EXPECT_THAT(choice.reason, HasSubstr("480 us"));
}

TEST(CallerRunsTest, OffAboveTheBoundWithoutAMeasurementAndForSequences) {
  CallerRunsChoice slow = ChooseCallerRuns(Asking(500), {Pass(1, 120us), Pass(1, 501us)});
  EXPECT_FALSE(slow.on);
  EXPECT_THAT(slow.reason, HasSubstr("501 us"));
  EXPECT_THAT(slow.reason, HasSubstr("sluice.run_on_receiving_thread_max_us"));
  // A median that is within the bound wins over a slow first warm-up run (last_run ignored).
  EXPECT_TRUE(ChooseCallerRuns(Asking(500), {Pass(1, 300us, 5000us)}).on);

  CallerRunsChoice unmeasured = ChooseCallerRuns(Asking(), {Pass(8, 50us)});
  EXPECT_FALSE(unmeasured.on);
  EXPECT_THAT(unmeasured.reason, HasSubstr("measured no lone request"));

  ModelSpec sequence = Asking();
  sequence.sequence_batching.enabled = true;
  CallerRunsChoice stateful = ChooseCallerRuns(sequence, {Pass(1, 10us)});
  EXPECT_FALSE(stateful.on);
  EXPECT_THAT(stateful.reason, HasSubstr("sequence"));
}

}  // namespace
}  // namespace sluice
