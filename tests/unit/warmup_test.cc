// Warm-up: the requests built from a shape plan and samples, and their runs on each instance.
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <tuple>
#include <utility>
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
using testing::OneAtATime;
using testing::PaddedSpec;
using testing::ThreadRecordingEcho;

TEST(WarmupTest, EveryShapeRunsOnEveryInstanceOnItsOwnWorkerThread) {
  ModelSpec spec = FixedSpec(4);
  spec.inputs[0].dims = {3};
  spec.dynamic_batching.enabled = true;
  spec.dynamic_batching.pad_to_preferred = true;
  spec.dynamic_batching.preferred_batch_sizes = {2};
  spec.dynamic_batching.auto_batch_sizes = false;  // only the warm-up runs, none timed
  const ShapePlan plan = ComputeShapePlan(spec);
  ASSERT_EQ(plan.shapes.size(), 2u);  // batch 2 and 4
  auto warmup = BuildWarmupRequests(spec, plan, "/nonexistent");
  ASSERT_TRUE(warmup.ok()) << warmup.status();

  std::vector<ThreadRecordingEcho*> echoes;
  std::vector<std::unique_ptr<ModelBackend>> instances;
  for (int i = 0; i < 3; ++i) {
    auto echo = std::make_unique<ThreadRecordingEcho>();
    echoes.push_back(echo.get());
    instances.push_back(std::move(echo));
  }
  SteadyTimeSource clock;
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 4;
  options.queue.preferred_batch_sizes = {2};
  options.queue.pad_to_preferred = true;
  options.clock = &clock;
  auto batcher = DynamicBatcher::Create(spec, std::move(instances), options);
  ASSERT_TRUE(batcher.ok());
  auto report = (*batcher)->WarmUp(*std::move(warmup), nullptr);
  ASSERT_TRUE(report.ok()) << report.status();

  // Every (instance, shape) pair, each run spec.warmup_runs times, each instance on one thread.
  std::set<std::pair<int, std::string>> pairs;
  for (const WarmupPass& pass : report->passes) pairs.insert({pass.instance, pass.label});
  EXPECT_EQ(pairs.size(), 3u * plan.shapes.size());
  std::set<std::thread::id> all_threads;
  for (ThreadRecordingEcho* echo : echoes) {
    EXPECT_THAT(echo->shapes(), ElementsAre(Shape{2, 3}, Shape{2, 3}, Shape{2, 3}, Shape{4, 3},
                                            Shape{4, 3}, Shape{4, 3}));
    ASSERT_EQ(echo->threads().size(), 1u);
    all_threads.insert(*echo->threads().begin());
  }
  EXPECT_EQ(all_threads.size(), 3u);
  EXPECT_EQ(all_threads.count(std::this_thread::get_id()), 0u);
  // Warm-up went through batch assembly: each instance's staging buffer exists before traffic.
  EXPECT_EQ((*batcher)->StagingAllocations(), 3u);
  (*batcher)->Stop();
}

TEST(WarmupTest, AFailingShapeFailsWarmUpWithItsLabel) {
  ModelSpec spec = FixedSpec(2);
  auto warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
  ASSERT_TRUE(warmup.ok());
  auto scheduler =
      OneAtATime(spec, std::make_unique<testing::FakeBackend>(
                           [](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
                             if (request.batch_size == 2)
                               return absl::InternalError("shape mismatch in layer 3");
                             return std::vector<Tensor>{};
                           }));
  auto report = scheduler->WarmUp(*std::move(warmup), nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(
      report.status().message(),
      HasSubstr("warm-up batch=2 x[2,3,4] on instance 0 failed: shape mismatch in layer 3"));
}

TEST(WarmupTest, ModelWarmupSamplesAndWarmupSwitch) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / "sluice_warmup_test";
  std::filesystem::create_directories(directory / "warmup");
  std::vector<float> values(2 * 3 * 4, 0.5f);
  std::ofstream(directory / "warmup" / "x.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()),
             static_cast<std::streamsize>(values.size() * 4));
  ModelSpec spec = FixedSpec(2);
  spec.warmup = false;  // only the samples
  WarmupSampleSpec file_sample{
      "file", 2, 4, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kFile, "x.bin"}}};
  WarmupSampleSpec random_sample{
      "random", 1, 1, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kRandom, ""}}};
  spec.warmup_samples = {file_sample, random_sample};
  auto warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), directory);
  ASSERT_TRUE(warmup.ok()) << warmup.status();
  ASSERT_EQ(warmup->size(), 2u);
  EXPECT_EQ((*warmup)[0].label, "model_warmup 'file'");
  EXPECT_EQ((*warmup)[0].runs, 4);
  EXPECT_EQ((*warmup)[0].request->batch_size, 2);
  EXPECT_EQ(std::memcmp((*warmup)[0].request->inputs[0].data, values.data(), values.size() * 4), 0);
  std::vector<float> random(12);
  std::memcpy(random.data(), (*warmup)[1].request->inputs[0].data, 48);
  for (float v : random) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 1.0f);
  }

  spec.warmup_samples[0].batch_size = 1;  // the file now has the wrong size
  EXPECT_THAT(BuildWarmupRequests(spec, ComputeShapePlan(spec), directory).status().message(),
              HasSubstr("has 96 bytes, shape [1,3,4] of FP32 needs 48"));
  spec.warmup_samples[0].inputs[0].file = "missing.bin";
  EXPECT_THAT(BuildWarmupRequests(spec, ComputeShapePlan(spec), directory).status().message(),
              HasSubstr("cannot read"));
  spec.warmup_samples = {random_sample};
  spec.warmup_samples[0].inputs[0].dims = {3, 5};
  EXPECT_THAT(BuildWarmupRequests(spec, ComputeShapePlan(spec), directory).status().message(),
              HasSubstr("model_warmup 'random': input 'x'"));
  std::filesystem::remove_all(directory);
}

TEST(WarmupTest, WithCudaGraphsEveryShapeIsCapturedAndReplayedOnceBeforeReady) {
  // CudaGraphPlan captures a shape's third pass: warm-up runs at least that many, plus one replay.
  for (const auto& [asked, runs] : std::vector<std::pair<int, int>>{{3, 4}, {1, 4}, {5, 6}}) {
    ModelSpec spec = FixedSpec(2);
    spec.warmup_runs = asked;
    spec.cuda_graphs = true;
    auto warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
    ASSERT_TRUE(warmup.ok()) << warmup.status();
    ASSERT_FALSE(warmup->empty());
    for (const WarmupRequest& request : *warmup)
      EXPECT_EQ(request.runs, runs) << "sluice.warmup_runs " << asked;
    spec.cuda_graphs = false;
    warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
    ASSERT_TRUE(warmup.ok()) << warmup.status();
    for (const WarmupRequest& request : *warmup) EXPECT_EQ(request.runs, asked);
  }
}

TEST(WarmupTest, TimedRunsGiveTheirMedian) {
  WarmupRequest warmup;
  warmup.label = "batch=2";
  warmup.request = std::make_unique<InferRequest>();
  warmup.runs = 2;
  warmup.timed_runs = 3;
  warmup.batch_size = 2;
  std::vector<WarmupRequest> requests;
  requests.push_back(std::move(warmup));
  // Run times handed out in order on a fake clock: 2 warm-up runs, then 3 timed ones (median 5 ms).
  const std::vector<Duration> took = {50ms, 20ms, 9ms, 2ms, 5ms};
  size_t call = 0;
  FakeTimeSource clock;
  auto passes = RunWarmupOnInstance(0, requests, nullptr, clock, [&](const InferRequest&) {
    clock.Advance(took[call++]);
    return absl::OkStatus();
  });
  ASSERT_TRUE(passes.ok()) << passes.status();
  EXPECT_EQ(call, 5u);
  ASSERT_EQ(passes->size(), 1u);
  const WarmupPass& pass = (*passes)[0];
  EXPECT_EQ(pass.batch_size, 2);
  EXPECT_EQ(pass.first_run, 50ms);
  EXPECT_EQ(pass.last_run, 20ms);
  EXPECT_EQ(pass.median_timed, 5ms);
}

TEST(WarmupTest, TimedRunsComeAfterEveryWarmUpRunInRoundsAcrossTheRequests) {
  // a: 1 run + 2 timed; b: 2 runs + 2 timed; s (a model_warmup sample): 1 run, none timed.
  std::vector<WarmupRequest> requests;
  for (const auto& [label, runs, timed] :
       std::vector<std::tuple<std::string, int, int>>{{"a", 1, 2}, {"b", 2, 2}, {"s", 1, 0}}) {
    WarmupRequest warmup;
    warmup.label = label;
    warmup.request = std::make_unique<InferRequest>();
    warmup.request->id = label;
    warmup.runs = runs;
    warmup.timed_runs = timed;
    requests.push_back(std::move(warmup));
  }
  std::string order;
  FakeTimeSource clock;
  auto passes = RunWarmupOnInstance(3, requests, nullptr, clock, [&](const InferRequest& request) {
    order += request.id;
    clock.Advance(request.id == "a" ? 1ms : 2ms);
    return absl::OkStatus();
  });
  ASSERT_TRUE(passes.ok()) << passes.status();
  EXPECT_EQ(order, "abbsabab");
  ASSERT_EQ(passes->size(), 3u);
  EXPECT_EQ((*passes)[0].median_timed, 1ms);
  EXPECT_EQ((*passes)[1].median_timed, 2ms);
  EXPECT_EQ((*passes)[2].median_timed, Duration::zero());
  EXPECT_EQ((*passes)[2].instance, 3);

  // A failing timed run ends the warm-up with its request and instance named.
  order.clear();
  passes = RunWarmupOnInstance(3, requests, nullptr, clock, [&](const InferRequest& request) {
    order += request.id;
    if (order == "abbsab") return absl::InternalError("out of memory");
    return absl::OkStatus();
  });
  EXPECT_EQ(passes.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(passes.status().message(),
              HasSubstr("warm-up b on instance 3 failed: out of memory"));
}

TEST(WarmupTest, TimedRunsGoOnWithinTheirBudgetUpToTheirCap) {
  // Timed runs of `each` on a fake clock, at least 3, more while under 10 ms together, at most 6:
  // how many ran.
  auto timed_runs = [](Duration each) {
    WarmupRequest warmup;
    warmup.label = "batch=1";
    warmup.request = std::make_unique<InferRequest>();
    warmup.runs = 1;
    warmup.timed_runs = 3;
    warmup.timed_budget = 10ms;
    warmup.max_timed_runs = 6;
    warmup.batch_size = 1;
    std::vector<WarmupRequest> requests;
    requests.push_back(std::move(warmup));
    size_t call = 0;
    FakeTimeSource clock;
    auto passes = RunWarmupOnInstance(0, requests, nullptr, clock, [&](const InferRequest&) {
      clock.Advance(each);
      ++call;
      return absl::OkStatus();
    });
    EXPECT_TRUE(passes.ok()) << passes.status();
    return static_cast<int>(call) - 1;  // less the warm-up run
  };
  EXPECT_EQ(timed_runs(4ms), 3);   // 12 ms after the minimum: no more
  EXPECT_EQ(timed_runs(2ms), 5);   // 10 ms reached at the fifth
  EXPECT_EQ(timed_runs(1ms), 6);   // the cap before the budget
  EXPECT_EQ(timed_runs(20ms), 3);  // a slow model pays only the minimum

  // What BuildWarmupRequests hands out: the constants of batch_sizes.h.
  ModelSpec spec = FixedSpec(2);
  spec.dynamic_batching.enabled = true;
  auto warmup = BuildWarmupRequests(spec, ComputeShapePlan(spec), "/nonexistent");
  ASSERT_TRUE(warmup.ok()) << warmup.status();
  ASSERT_FALSE(warmup->empty());
  EXPECT_EQ((*warmup)[0].timed_runs, kBatchSizeTimedRuns);
  EXPECT_EQ((*warmup)[0].timed_budget, kBatchSizeTimedBudget);
  EXPECT_EQ((*warmup)[0].max_timed_runs, kBatchSizeMaxTimedRuns);
}

}  // namespace
}  // namespace sluice
