// Shape plans, the cuDNN benchmark decision, padding buckets and warm-up, with fake backends.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_sizes.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/shape_padding.h"
#include "server/batching/shape_plan.h"
#include "server/batching/warmup.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

ModelSpec FixedSpec(int max_batch_size) {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = max_batch_size;
  spec.inputs = {{"x", DataType::kFp32, {3, 4}}};
  spec.outputs = {{"y", DataType::kFp32, {2}}};
  return spec;
}

// A sequence model: "x" [-1 (seq), 2], "mask" [-1 (seq)]; output "y" follows "x".
ModelSpec PaddedSpec() {
  ModelSpec spec;
  spec.name = "seq";
  spec.max_batch_size = 4;
  spec.inputs = {{"x", DataType::kInt32, {-1, 2}}, {"lengths", DataType::kInt64, {1}}};
  spec.inputs[1].filled_by_server = true;
  spec.outputs = {{"y", DataType::kInt32, {-1, 2}}};
  spec.padding.axes = {{"seq", {4, 8}}};
  spec.padding.dims = {{"x", true, 0, 0}, {"y", false, 0, 0}};
  spec.padding.pad_value = -1;
  spec.padding.lengths_input = "lengths";
  return spec;
}

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
  EXPECT_THAT(plan.why_not, HasSubstr("input 'x' dimension 1 is variable (-1) and has no padding bucket"));
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
  EXPECT_THAT(decide(CudnnBenchmarkMode::kAuto, fixed, fixed_plan).reason, HasSubstr("fixed shapes (2 in the set)"));
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kAuto, open, open_plan).benchmark);
  EXPECT_THAT(decide(CudnnBenchmarkMode::kAuto, open, open_plan).reason, HasSubstr("variable shapes"));
  EXPECT_TRUE(decide(CudnnBenchmarkMode::kOn, open, open_plan).benchmark);
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kOff, fixed, fixed_plan).benchmark);
  fixed.cudnn_benchmark_override = CudnnBenchmarkMode::kOff;  // the model's parameter wins
  EXPECT_FALSE(decide(CudnnBenchmarkMode::kOn, fixed, fixed_plan).benchmark);
  EXPECT_THAT(decide(CudnnBenchmarkMode::kOn, fixed, fixed_plan).reason, HasSubstr("sluice.cudnn_benchmark=off"));
}

// A request for PaddedSpec: `rows` rows of `length` positions, values 1, 2, 3, ...
struct SeqCall {
  std::vector<int32_t> data;
  std::unique_ptr<InferRequest> request;
};
SeqCall SeqRequest(int64_t rows, int64_t length) {
  SeqCall call;
  for (int64_t i = 0; i < rows * length * 2; ++i) call.data.push_back(static_cast<int32_t>(i + 1));
  call.request = std::make_unique<InferRequest>();
  call.request->model_name = "seq";
  call.request->batch_size = rows;
  call.request->inputs.push_back({"x", DataType::kInt32, {rows, length, 2},
                                  reinterpret_cast<const char*>(call.data.data()), call.data.size() * 4});
  return call;
}

std::vector<int32_t> Ints(const char* data, size_t bytes) {
  std::vector<int32_t> values(bytes / 4);
  std::memcpy(values.data(), data, bytes);
  return values;
}

TEST(ShapePaddingTest, PadsToTheNextBucketAndFillsLengths) {
  const ModelSpec spec = PaddedSpec();
  SeqCall call = SeqRequest(2, 3);
  auto padded = PadRequest(spec, call.request.get());
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_THAT(padded->lengths, ElementsAre(3));
  EXPECT_THAT(padded->buckets, ElementsAre(4));
  ASSERT_EQ(call.request->inputs.size(), 2u);
  const TensorView& x = call.request->inputs[0];
  EXPECT_EQ(x.shape, (Shape{2, 4, 2}));
  // Row 0 keeps 1..6 then one padded position of -1s; row 1 keeps 7..12.
  EXPECT_THAT(Ints(x.data, x.byte_size), ElementsAre(1, 2, 3, 4, 5, 6, -1, -1, 7, 8, 9, 10, 11, 12, -1, -1));
  const TensorView& lengths = call.request->inputs[1];
  EXPECT_EQ(lengths.name, "lengths");
  EXPECT_EQ(lengths.shape, (Shape{2, 1}));
  std::vector<int64_t> values(2);
  std::memcpy(values.data(), lengths.data, 16);
  EXPECT_THAT(values, ElementsAre(3, 3));
}

TEST(ShapePaddingTest, AboveTheLargestBucketIsRejected) {
  SeqCall call = SeqRequest(1, 9);
  auto padded = PadRequest(PaddedSpec(), call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(padded.status().message(),
              HasSubstr("input 'x' dimension 1 is 9, above the largest bucket (8) of padded axis 'seq'"));
}

TEST(ShapePaddingTest, AnEmptyPaddedAxisIsRejected) {
  SeqCall call = SeqRequest(1, 0);
  auto padded = PadRequest(PaddedSpec(), call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(padded.status().message(), HasSubstr("is 0; padded axis 'seq' needs at least one position"));
}

TEST(ShapePaddingTest, InputsMustAgreeOnAnAxis) {
  ModelSpec spec = PaddedSpec();
  spec.inputs.push_back({"mask", DataType::kInt32, {-1}});
  spec.padding.dims.push_back({"mask", true, 0, 0});
  SeqCall call = SeqRequest(1, 3);
  std::vector<int32_t> mask(5, 1);
  call.request->inputs.push_back({"mask", DataType::kInt32, {1, 5}, reinterpret_cast<const char*>(mask.data()), 20});
  auto padded = PadRequest(spec, call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(padded.status().message(), HasSubstr("inputs disagree on padded axis 'seq'"));
}

// Writes `bytes` as output `name` through `sink`, as a backend does.
Status Write(OutputSink& sink, const std::string& name, const Shape& shape, const std::string& bytes) {
  SLUICE_ASSIGN_OR_RETURN(char* memory, sink.Allocate({name, DataType::kInt32, shape, bytes.size(), MemoryType::kCpu}));
  std::memcpy(memory, bytes.data(), bytes.size());
  return absl::OkStatus();
}

TEST(ShapePaddingTest, UnpaddingSinkCutsOutputsBackAndChecksTheyFollowTheAxis) {
  ModelSpec spec = PaddedSpec();
  spec.outputs.push_back({"n", DataType::kInt32, {1}});  // follows no padded axis
  auto shared = std::make_shared<const ModelSpec>(spec);
  const PaddedLengths padded{{3}, {4}};
  std::vector<int32_t> y = {1, 2, 3, 4, 5, 6, 0, 0};
  const std::string n(4, '\x07');

  TensorSink caller;
  UnpaddingSink sink(shared, padded, &caller);
  ASSERT_TRUE(Write(sink, "y", {1, 4, 2}, std::string(reinterpret_cast<char*>(y.data()), 32)).ok());
  ASSERT_TRUE(Write(sink, "n", {1, 1}, n).ok());
  EXPECT_TRUE(caller.outputs().empty());  // "y" waits to be cut, and "n" behind it keeps the order
  ASSERT_TRUE(sink.Finish().ok());
  ASSERT_EQ(caller.outputs().size(), 2u);
  EXPECT_EQ(caller.outputs()[0].shape, (Shape{1, 3, 2}));
  EXPECT_THAT(Ints(caller.outputs()[0].data.data(), caller.outputs()[0].data.size()), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(caller.outputs()[1].name, "n");
  EXPECT_EQ(caller.outputs()[1].data, n);

  TensorSink direct_caller;
  UnpaddingSink direct(shared, padded, &direct_caller);
  ASSERT_TRUE(Write(direct, "n", {1, 1}, n).ok());
  EXPECT_EQ(direct_caller.outputs().size(), 1u);  // nothing to cut: straight to the caller, one copy

  TensorSink wrong_caller;
  UnpaddingSink wrong(shared, padded, &wrong_caller);
  ASSERT_TRUE(Write(wrong, "y", {1, 5, 2}, std::string(40, '\0')).ok());
  Status status = wrong.Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("follows padded axis 'seq' (padded to 4)"));
}

// Without dynamic_batching: one request per forward pass, on the steady clock.
std::unique_ptr<DynamicBatcher> OneAtATime(const ModelSpec& spec, std::unique_ptr<ModelBackend> backend) {
  static SteadyTimeSource clock;
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::move(backend));
  DynamicBatcher::Options options;
  options.queue.one_request_per_batch = true;
  options.queue.max_batch_size = std::max(1, spec.max_batch_size);
  options.clock = &clock;
  return *DynamicBatcher::Create(spec, std::move(instances), options);
}

// Echoes input "x" as output "y", like fakes.h's EchoBackend, and records the thread of each call.
class ThreadRecordingEcho final : public ModelBackend {
 public:
  Status Execute(const InferRequest& request, absl::Span<const OutputTarget> targets) override {
    const TensorView& x = request.inputs.at(0);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.insert(std::this_thread::get_id());
      shapes_.push_back(x.shape);
    }
    return testing::Deliver({{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}}, targets);
  }
  std::set<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }
  std::vector<Shape> shapes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return shapes_;
  }

 private:
  std::mutex mutex_;
  std::set<std::thread::id> threads_;
  std::vector<Shape> shapes_;
};

TEST(ShapePaddingTest, PaddingSchedulerServesTrueLengths) {
  const ModelSpec spec = PaddedSpec();
  PaddingScheduler scheduler(spec, OneAtATime(spec, std::make_unique<ThreadRecordingEcho>()), nullptr);
  SeqCall call = SeqRequest(2, 5);  // padded to 8, cut back to 5
  TensorSink sink;
  std::promise<Status> answer;
  scheduler.Enqueue(std::move(call.request), &sink, [&](Status status) { answer.set_value(status); });
  const Status status = answer.get_future().get();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(sink.outputs().size(), 1u);
  EXPECT_EQ(sink.outputs()[0].shape, (Shape{2, 5, 2}));
  EXPECT_EQ(Ints(sink.outputs()[0].data.data(), sink.outputs()[0].data.size()), call.data);

  SeqCall too_long = SeqRequest(1, 20);
  TensorSink unused;
  std::promise<Status> rejected;
  scheduler.Enqueue(std::move(too_long.request), &unused, [&](Status status) { rejected.set_value(status); });
  EXPECT_EQ(rejected.get_future().get().code(), absl::StatusCode::kInvalidArgument);
  scheduler.Stop();
}

TEST(WarmupTest, EveryShapeRunsOnEveryInstanceOnItsOwnWorkerThread) {
  ModelSpec spec = FixedSpec(4);
  spec.inputs[0].dims = {3};
  spec.dynamic_batching.enabled = true;
  spec.dynamic_batching.pad_to_preferred = true;
  spec.dynamic_batching.preferred_batch_sizes = {2};
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
    EXPECT_THAT(echo->shapes(), ElementsAre(Shape{2, 3}, Shape{2, 3}, Shape{2, 3}, Shape{4, 3}, Shape{4, 3},
                                            Shape{4, 3}));
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
  auto scheduler = OneAtATime(spec, std::make_unique<testing::FakeBackend>(
                                        [](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
                                          if (request.batch_size == 2) return absl::InternalError("shape mismatch in layer 3");
                                          return std::vector<Tensor>{};
                                        }));
  auto report = scheduler->WarmUp(*std::move(warmup), nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(report.status().message(),
              HasSubstr("warm-up batch=2 x[2,3,4] on instance 0 failed: shape mismatch in layer 3"));
}

TEST(WarmupTest, ModelWarmupSamplesAndWarmupSwitch) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() / "sluice_warmup_test";
  std::filesystem::create_directories(directory / "warmup");
  std::vector<float> values(2 * 3 * 4, 0.5f);
  std::ofstream(directory / "warmup" / "x.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
  ModelSpec spec = FixedSpec(2);
  spec.warmup = false;  // only the samples
  WarmupSampleSpec file_sample{"file", 2, 4, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kFile, "x.bin"}}};
  WarmupSampleSpec random_sample{"random", 1, 1, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kRandom, ""}}};
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

TEST(AutoBatchSizesTest, AppliesOnlyWithoutPreferredSizesToAFiniteWarmedSet) {
  ModelSpec spec = FixedSpec(8);
  spec.dynamic_batching.enabled = true;
  EXPECT_EQ(AutoBatchSizesOffReason(spec, ComputeShapePlan(spec), true), "");
  EXPECT_EQ(AutoBatchSizesOffReason(spec, ComputeShapePlan(spec), false), "warm-up is off");
  ModelSpec other = spec;
  other.dynamic_batching.preferred_batch_sizes = {4};
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "preferred_batch_size is set");
  other = spec;
  other.dynamic_batching.auto_batch_sizes = false;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "sluice.auto_batch_sizes is false");
  other = spec;
  other.dynamic_batching.enabled = false;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "no dynamic_batching");
  other = spec;
  other.max_batch_size = 1;
  EXPECT_EQ(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), "max_batch_size is 1");
  other = spec;
  other.inputs[0].dims = {-1, 4};
  EXPECT_THAT(AutoBatchSizesOffReason(other, ComputeShapePlan(other), true), HasSubstr("open-ended"));

  // Where it applies, every shape-plan request gets timed runs and its batch size; samples none.
  spec.warmup_samples = {{"zeros", 1, 2, {{"x", DataType::kFp32, {3, 4}, WarmupInputSpec::Source::kZero, ""}}}};
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

TEST(AutoBatchSizesTest, TimedRunsGiveTheirMedian) {
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

TEST(AutoBatchSizesTest, TimedRunsComeAfterEveryWarmUpRunInRoundsAcrossTheRequests) {
  // a: 1 run + 2 timed; b: 2 runs + 2 timed; s (a model_warmup sample): 1 run, none timed.
  std::vector<WarmupRequest> requests;
  for (const auto& [label, runs, timed] : std::vector<std::tuple<std::string, int, int>>{
           {"a", 1, 2}, {"b", 2, 2}, {"s", 1, 0}}) {
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
  EXPECT_THAT(passes.status().message(), HasSubstr("warm-up b on instance 3 failed: out of memory"));
}

TEST(AutoBatchSizesTest, TimedRunsGoOnWithinTheirBudgetUpToTheirCap) {
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
  const std::vector<std::pair<int, Duration>> times = {
      {1, 1000us}, {2, 1500us}, {3, 2000us}, {4, 2500us}, {5, 5000us}, {6, 5000us}, {7, 5000us}, {8, 2600us}};
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
