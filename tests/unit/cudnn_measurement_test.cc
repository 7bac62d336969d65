// cuDNN benchmark mode by measurement (server/manager/cudnn_measurement.h), with injected forward
// times: the decision's 5 % rule, the runs per shape and mode, the median, the clock fallback,
// the budget, abandoning and a failing run.
#include "server/manager/cudnn_measurement.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

CudnnShapeTiming Shape(int64_t rows, Duration off, Duration on) {
  return {"batch=" + std::to_string(rows), rows, off, on};
}

TEST(CudnnDecisionTest, OnOnlyWhenTheShapesTogetherRunAtLeastFivePercentFaster) {
  CudnnMeasurement faster;
  faster.planned = 4;
  // Slower at batch 8, faster at 64: the sum decides (a batch of each shape).
  faster.shapes = {Shape(8, 1000us, 1200us), Shape(64, 6000us, 5000us)};
  CudnnBenchmarkDecision decision = DecideFromMeasurement(faster);
  EXPECT_TRUE(decision.benchmark);  // 7000 -> 6200: 1.13x
  EXPECT_THAT(decision.reason, HasSubstr("measured: on 1.13x as fast as off over 2 of 4 shapes"));

  CudnnMeasurement marginal;
  marginal.planned = 1;
  marginal.shapes = {Shape(1, 1000us, 960us)};  // 4 % faster: not enough
  decision = DecideFromMeasurement(marginal);
  EXPECT_FALSE(decision.benchmark);
  EXPECT_THAT(decision.reason, HasSubstr("1.04x"));
  EXPECT_THAT(decision.reason, HasSubstr("not 5 % faster, so off"));

  CudnnMeasurement exactly;
  exactly.planned = 1;
  exactly.shapes = {Shape(1, 1000us, 950us)};
  EXPECT_TRUE(DecideFromMeasurement(exactly).benchmark);

  CudnnMeasurement slower;  // the H200's FP16 ResNet-50 at batches 8 and 32
  slower.planned = 2;
  slower.shapes = {Shape(8, 2700us, 3800us), Shape(32, 4000us, 4040us)};
  EXPECT_FALSE(DecideFromMeasurement(slower).benchmark);

  EXPECT_FALSE(DecideFromMeasurement(CudnnMeasurement{}).benchmark);
  EXPECT_THAT(DecideFromMeasurement(CudnnMeasurement{}).reason, HasSubstr("no shape to time"));
}

// Two fake instances whose forward takes per_row_off_ a row (mode off) or per_row_on_ (on), each
// run advancing the fake clock by that much.
class CudnnMeasurementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    off_.forward_time = [this](const InferRequest& request) {
      return Jitter(per_row_off_ * request.batch_size, &off_runs_);
    };
    on_.forward_time = [this](const InferRequest& request) {
      return Jitter(per_row_on_ * request.batch_size, &on_runs_);
    };
    for (int64_t rows : {1, 2, 4}) {
      std::vector<WarmupRequest> one = testing::ZeroWarmup(rows, 2);
      requests_.push_back(std::move(one[0]));
    }
    // A model_warmup sample (batch_size 0) is not timed.
    std::vector<WarmupRequest> sample = testing::ZeroWarmup(3, 2);
    sample[0].batch_size = 0;
    sample[0].label = "sample";
    requests_.push_back(std::move(sample[0]));
    for (size_t i = 0; i + 1 < requests_.size(); ++i) {
      requests_[i].batch_size = requests_[i].request->batch_size;
    }
  }

  // Every tenth run of an instance takes ten times as long: the median ignores it.
  Duration Jitter(Duration time, int* runs) {
    clock_.Advance(time);
    return (++*runs % 10 == 0) ? time * 10 : time;
  }

  testing::FakeBackend off_, on_;
  Duration per_row_off_ = 100us, per_row_on_ = 80us;
  int off_runs_ = 0, on_runs_ = 0;
  std::vector<WarmupRequest> requests_;
  FakeTimeSource clock_;
};

TEST_F(CudnnMeasurementTest, EveryShapeRunsOnBothInstancesAndItsMedianCounts) {
  StatusOr<CudnnMeasurement> measured =
      MeasureCudnnBenchmark(&off_, &on_, requests_, clock_, 10s, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_TRUE(measured->device_timed);
  EXPECT_EQ(measured->planned, 3u);
  ASSERT_EQ(measured->shapes.size(), 3u);
  const int runs = 3 * (kCudnnUntimedRuns + kCudnnTimedRuns);
  EXPECT_EQ(off_.executed(), runs);
  EXPECT_EQ(on_.executed(), runs);
  EXPECT_EQ(measured->shapes[2].label, "batch=4");
  EXPECT_EQ(measured->shapes[2].batch_size, 4);
  EXPECT_EQ(measured->shapes[2].off, 400us);
  EXPECT_EQ(measured->shapes[2].on, 320us);
  EXPECT_TRUE(DecideFromMeasurement(*measured).benchmark);
}

TEST_F(CudnnMeasurementTest, WithoutDevicePhasesTheClockAroundExecuteCounts) {
  off_.forward_time = nullptr;  // reports no phases
  off_.phases.reset();
  testing::FakeBackend slow([this](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
    clock_.Advance(50us * request.batch_size);
    return std::vector<Tensor>{{"y", DataType::kInt64, {1}, request.id}};
  });
  StatusOr<CudnnMeasurement> measured =
      MeasureCudnnBenchmark(&slow, &on_, requests_, clock_, 10s, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_FALSE(measured->device_timed);
  EXPECT_EQ(measured->shapes[1].off, 100us);  // batch 2 at 50 us a row
}

TEST_F(CudnnMeasurementTest, TheBudgetStopsAddingShapesButOneIsAlwaysMeasured) {
  StatusOr<CudnnMeasurement> measured =
      MeasureCudnnBenchmark(&off_, &on_, requests_, clock_, 1us, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  ASSERT_EQ(measured->shapes.size(), 1u);
  EXPECT_EQ(measured->planned, 3u);
  EXPECT_THAT(DecideFromMeasurement(*measured).reason, HasSubstr("over 1 of 3 shapes"));

  // Batch 1 takes 4.1 ms (23 rounds of 100 + 80 us): under 5 ms, so batch 2 is measured too;
  // after it (12.4 ms) batch 4 is not.
  measured = MeasureCudnnBenchmark(&off_, &on_, requests_, clock_, 5ms, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->shapes.size(), 2u);
}

TEST_F(CudnnMeasurementTest, AbandonedOrFailingRunsEndItWithTheShapeAndModeNamed) {
  std::atomic<bool> abandon{true};
  StatusOr<CudnnMeasurement> measured =
      MeasureCudnnBenchmark(&off_, &on_, requests_, clock_, 10s, &abandon);
  EXPECT_EQ(measured.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(off_.executed(), 0);

  testing::FakeBackend failing([](const InferRequest&) -> StatusOr<std::vector<Tensor>> {
    return absl::ResourceExhaustedError("CUDA out of memory");
  });
  measured = MeasureCudnnBenchmark(&off_, &failing, requests_, clock_, 10s, nullptr);
  EXPECT_EQ(measured.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(measured.status().message(),
              HasSubstr("timing batch=1 with cuDNN benchmark mode on: CUDA out of memory"));
}

}  // namespace
}  // namespace sluice
