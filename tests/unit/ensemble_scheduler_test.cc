// The ensemble scheduler over real handles and batchers with fake backends: steps in order with
// their tensors handed on, a failing step named, a cancelled request dropping its queued step,
// and the load-time checks against the steps' models.
#include "server/manager/ensemble_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "tests/unit/fakes.h"
#include "tests/unit/handle_factory.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kPlusOne[] =
    "max_batch_size: 8\n"
    "input [ { name: \"x\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
    "output [ { name: \"y\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
    "dynamic_batching { default_queue_policy { max_queue_size: 4 } }\n";

// y = x + 1, element by element; fails when `fail` is set.
std::unique_ptr<testing::FakeBackend> PlusOne(const std::atomic<bool>* fail = nullptr) {
  return std::make_unique<testing::FakeBackend>(
      [fail](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
        if (fail != nullptr && fail->load()) return absl::InternalError("the model broke");
        const TensorView& x = request.inputs.front();
        std::string bytes(x.data, x.byte_size);
        for (size_t i = 0; i < bytes.size(); i += 4) {
          int32_t value;
          std::memcpy(&value, bytes.data() + i, 4);
          ++value;
          std::memcpy(bytes.data() + i, &value, 4);
        }
        return std::vector<Tensor>{{"y", DataType::kInt32, x.shape, std::move(bytes)}};
      });
}

ModelSpec Chain(const std::string& second_input = "x") {
  ModelSpec spec;
  spec.name = "chain";
  spec.max_batch_size = 8;
  spec.inputs = {{"in", DataType::kInt32, {-1}}};
  spec.outputs = {{"out", DataType::kInt32, {-1}}};
  spec.ensemble.steps = {{"a", -1, {{"x", "in"}}, {{"y", "mid"}}},
                         {"b", -1, {{second_input, "mid"}}, {{"y", "out"}}}};
  return spec;
}

class EnsembleSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_backend_ = PlusOne(&a_fails_).release();
    b_backend_ = PlusOne(&b_fails_).release();
    lookup_.models["a"] =
        testing::MakeHandle("a", kPlusOne, std::unique_ptr<ModelBackend>(a_backend_), &clock_, 4);
    lookup_.models["b"] =
        testing::MakeHandle("b", kPlusOne, std::unique_ptr<ModelBackend>(b_backend_), &clock_, 4);
  }
  void TearDown() override {
    for (auto& [name, handle] : lookup_.models) handle->Stop();
  }
  std::unique_ptr<EnsembleScheduler> Make(ModelSpec spec,
                                          std::shared_ptr<ModelStats> stats = nullptr) {
    EnsembleScheduler::Options options;
    options.lookup = &lookup_;
    options.clock = &clock_;
    options.stats = std::move(stats);
    auto made = EnsembleScheduler::Create(std::move(spec), options);
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *std::move(made) : nullptr;
  }
  // Submits [1, 2, 3] and returns the answer; the outputs land in `sink`.
  std::future<Status> Submit(EnsembleScheduler& ensemble, TensorSink* sink,
                             std::shared_ptr<std::atomic<bool>> cancelled = nullptr,
                             TimePoint deadline = kNoDeadline,
                             std::shared_ptr<RequestTrace> trace = nullptr) {
    auto request = std::make_unique<InferRequest>();
    request->model_name = "chain";
    request->batch_size = 1;
    request->inputs.push_back(
        {"in", DataType::kInt32, {1, 3}, reinterpret_cast<const char*>(values_), 12, {}});
    request->cancelled = std::move(cancelled);
    request->deadline = deadline;
    request->trace = std::move(trace);
    auto answer = std::make_shared<std::promise<Status>>();
    std::future<Status> future = answer->get_future();
    ensemble.Enqueue(std::move(request), sink,
                     [answer](Status status) { answer->set_value(status); });
    return future;
  }

  SteadyTimeSource clock_;
  testing::FakeLookup lookup_;
  testing::FakeBackend* a_backend_ = nullptr;
  testing::FakeBackend* b_backend_ = nullptr;
  std::atomic<bool> a_fails_{false};
  std::atomic<bool> b_fails_{false};
  const int32_t values_[3] = {1, 2, 3};
};

TEST_F(EnsembleSchedulerTest, StepsRunInOrderAndHandTheirTensorsOn) {
  auto ensemble = Make(Chain());
  TensorSink sink;
  ASSERT_TRUE(Submit(*ensemble, &sink).get().ok());
  ASSERT_EQ(sink.outputs().size(), 1u);
  const Tensor& out = sink.outputs()[0];
  EXPECT_EQ(out.name, "out");
  EXPECT_THAT(out.shape, ElementsAre(1, 3));
  std::vector<int32_t> got(3);
  std::memcpy(got.data(), out.data.data(), 12);
  EXPECT_THAT(got, ElementsAre(3, 4, 5));  // two steps of +1
  ensemble->Stop();
  TensorSink late;
  Status refused = Submit(*ensemble, &late).get();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("ensemble 'chain' is shutting down"));
}

// Step outputs a backend holds pass to the next step as they are: no copy between steps, and
// the ensemble's output copied once, into the caller's sink.
TEST_F(EnsembleSchedulerTest, HeldOutputsReachTheNextStepWithoutACopy) {
  a_backend_->hold_outputs = true;
  b_backend_->hold_outputs = true;
  auto stats = std::make_shared<ModelStats>();
  auto ensemble = Make(Chain(), stats);
  TensorSink sink;
  ASSERT_TRUE(Submit(*ensemble, &sink).get().ok());
  ASSERT_EQ(sink.outputs().size(), 1u);
  std::vector<int32_t> got(3);
  std::memcpy(got.data(), sink.outputs()[0].data.data(), 12);
  EXPECT_THAT(got, ElementsAre(3, 4, 5));
  EXPECT_EQ(b_backend_->held_inputs(), 1);  // step 2 read step 1's held output
  EXPECT_EQ(a_backend_->held_inputs(), 0);  // the caller's bytes are not held
  const ModelStatsSnapshot snapshot = stats->Snapshot();
  EXPECT_EQ(snapshot.copied_on_device_bytes, 0u);
  EXPECT_EQ(snapshot.copied_through_host_bytes, 0u);
}

// A step batched with another request's step gathers their held rows into one batch: one copy
// on the device each, counted for the request whose tensor it was.
TEST_F(EnsembleSchedulerTest, HeldRowsGatheredIntoABatchAreCountedOnTheDevice) {
  a_backend_->hold_outputs = true;
  auto stats = std::make_shared<ModelStats>();
  auto ensemble = Make(Chain(), stats);
  b_backend_->CloseGate();
  TensorSink sinks[3];
  std::vector<std::future<Status>> answers;
  answers.push_back(Submit(*ensemble, &sinks[0]));
  b_backend_->WaitStarted(1);  // the first request's step 2 runs alone, held at the gate
  for (int i = 1; i < 3; ++i) answers.push_back(Submit(*ensemble, &sinks[i]));
  ModelHandle& b = *lookup_.models["b"];
  ASSERT_TRUE(testing::Eventually([&] { return b.in_flight() == 3; }));  // two queued behind it
  b_backend_->OpenGate();
  for (auto& answer : answers) ASSERT_TRUE(answer.get().ok());
  EXPECT_EQ(b_backend_->executed(), 2);  // one alone, then the other two as one batch
  EXPECT_EQ(stats->Snapshot().copied_on_device_bytes, 2u * 12u);
  EXPECT_EQ(stats->Snapshot().copied_through_host_bytes, 0u);
  for (TensorSink& sink : sinks) {
    std::vector<int32_t> got(3);
    std::memcpy(got.data(), sink.outputs()[0].data.data(), 12);
    EXPECT_THAT(got, ElementsAre(3, 4, 5));
  }
}

// A GPU's output a later step reads but that came to the host (its model did not hand it over
// held) crossed the host between steps; one only the caller reads did not.
TEST_F(EnsembleSchedulerTest, AnOutputBroughtFromADeviceForTheNextStepCountsThroughTheHost) {
  a_backend_->output_memory = MemoryType::kCpuPinned;
  b_backend_->output_memory = MemoryType::kCpuPinned;
  auto stats = std::make_shared<ModelStats>();
  auto ensemble = Make(Chain(), stats);
  TensorSink sink;
  ASSERT_TRUE(Submit(*ensemble, &sink).get().ok());
  EXPECT_EQ(stats->Snapshot().copied_through_host_bytes, 12u);  // "mid", not "out"
  EXPECT_EQ(stats->Snapshot().copied_on_device_bytes, 0u);
}

TEST_F(EnsembleSchedulerTest, AFailingStepFailsTheRequestNamingTheStep) {
  auto ensemble = Make(Chain());
  b_fails_ = true;
  TensorSink sink;
  Status status = Submit(*ensemble, &sink).get();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("ensemble 'chain' step 2 (model 'b') failed: "));
  EXPECT_THAT(status.message(), HasSubstr("the model broke"));
  EXPECT_TRUE(sink.outputs().empty());
  b_fails_ = false;
  EXPECT_TRUE(Submit(*ensemble, &sink).get().ok());  // it serves on
}

TEST_F(EnsembleSchedulerTest, ACancelledRequestDropsItsQueuedStep) {
  auto ensemble = Make(Chain());
  a_backend_->CloseGate();
  TensorSink first_sink, second_sink;
  std::future<Status> first = Submit(*ensemble, &first_sink);  // runs step 1, held at the gate
  a_backend_->WaitStarted(1);
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  std::future<Status> second = Submit(*ensemble, &second_sink, cancelled);  // queued behind it
  cancelled->store(true);
  ensemble->Poke();
  Status dropped = second.get();  // answered while the first still runs
  EXPECT_EQ(dropped.code(), absl::StatusCode::kCancelled) << dropped;
  a_backend_->OpenGate();
  EXPECT_TRUE(first.get().ok());
  EXPECT_EQ(a_backend_->executed(), 1);
}

// max_inflight_requests 1: each step has one request in its model at a time, the others wait in
// the ensemble in order (so step 1's model runs three requests one by one instead of batching
// the two that would have queued); a waiting request whose caller goes is answered at once.
TEST_F(EnsembleSchedulerTest, MaxInflightRequestsKeepsTheOthersWaitingInTheEnsemble) {
  ModelSpec spec = Chain();
  spec.ensemble.max_inflight_requests = 1;
  auto ensemble = Make(spec);
  a_backend_->CloseGate();
  TensorSink sinks[4];
  std::vector<std::future<Status>> answers;
  answers.push_back(Submit(*ensemble, &sinks[0]));
  a_backend_->WaitStarted(1);
  answers.push_back(Submit(*ensemble, &sinks[1]));
  answers.push_back(Submit(*ensemble, &sinks[2]));
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  std::future<Status> gone = Submit(*ensemble, &sinks[3], cancelled);
  cancelled->store(true);
  ensemble->Poke();
  ASSERT_EQ(gone.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const Status dropped = gone.get();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kCancelled) << dropped;
  EXPECT_THAT(dropped.message(), HasSubstr("waited for max_inflight_requests"));
  a_backend_->OpenGate();
  for (auto& answer : answers) EXPECT_TRUE(answer.get().ok());
  EXPECT_EQ(a_backend_->executed(), 3);  // one at a time
  std::vector<int32_t> got(3);
  std::memcpy(got.data(), sinks[2].outputs().at(0).data.data(), 12);
  EXPECT_THAT(got, ElementsAre(3, 4, 5));

  // Without the limit the two behind the first batch together.
  auto unlimited = Make(Chain());
  a_backend_->CloseGate();
  const int before = a_backend_->executed();
  const int started = a_backend_->started();
  answers.clear();
  answers.push_back(Submit(*unlimited, &sinks[0]));
  a_backend_->WaitStarted(started + 1);
  answers.push_back(Submit(*unlimited, &sinks[1]));
  answers.push_back(Submit(*unlimited, &sinks[2]));
  a_backend_->OpenGate();
  for (auto& answer : answers) EXPECT_TRUE(answer.get().ok());
  EXPECT_EQ(a_backend_->executed() - before, 2);
}

// A run that fails drops its step waiting for a slot at once: its answer does not wait for the
// unrelated request that holds the slot.
TEST_F(EnsembleSchedulerTest, AFailedRunDropsItsWaitingStepAtOnce) {
  ModelSpec spec = Chain();  // two independent steps: out from a, side from b
  spec.outputs.push_back({"side", DataType::kInt32, {-1}});
  spec.ensemble.steps[1].inputs = {{"x", "in"}};
  spec.ensemble.steps[1].outputs = {{"y", "side"}};
  spec.ensemble.steps[0].outputs = {{"y", "out"}};
  spec.ensemble.max_inflight_requests = 1;
  auto ensemble = Make(spec);
  b_backend_->CloseGate();
  TensorSink first_sink, second_sink;
  std::future<Status> first = Submit(*ensemble, &first_sink);  // holds b's slot at the gate
  b_backend_->WaitStarted(1);
  // Its step on `a` runs beside: a fails only once that one has succeeded.
  while (lookup_.models["a"]->Statistics().success.count < 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  a_fails_ = true;
  std::future<Status> second = Submit(*ensemble, &second_sink);  // a fails; b's step waits
  ASSERT_EQ(second.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const Status failed = second.get();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("step 1 (model 'a') failed"));
  a_fails_ = false;
  b_backend_->OpenGate();
  EXPECT_TRUE(first.get().ok());
  EXPECT_EQ(b_backend_->executed(), 1);  // the dropped step never ran
}

// Thousands of steps waiting for one slot whose submits all fail on the handing thread (their
// model is gone): each is answered, without the stack growing with them.
TEST_F(EnsembleSchedulerTest, ManyWaitingStepsThatFailAtOnceAreHandedOnInALoop) {
  ModelSpec spec = Chain();
  spec.ensemble.max_inflight_requests = 1;
  auto ensemble = Make(spec);
  a_backend_->CloseGate();
  constexpr int kWaiting = 20000;
  std::vector<TensorSink> sinks(kWaiting + 1);
  std::vector<std::future<Status>> answers;
  answers.push_back(Submit(*ensemble, &sinks[0]));
  a_backend_->WaitStarted(1);
  for (int i = 1; i <= kWaiting; ++i) answers.push_back(Submit(*ensemble, &sinks[i]));
  std::shared_ptr<ModelHandle> a = lookup_.models["a"];
  {
    std::lock_guard<std::mutex> lock(lookup_.mutex);
    lookup_.models.erase("a");  // step 1's model is gone: each waiting submit fails at once
  }
  a_backend_->OpenGate();
  EXPECT_TRUE(answers[0].get().ok());
  for (int i = 1; i <= kWaiting; ++i) {
    const Status status = answers[i].get();
    ASSERT_EQ(status.code(), absl::StatusCode::kNotFound) << i << " " << status;
  }
  a->Stop();
}

// A traced ensemble request: each step is a span of its own under the ensemble's request span,
// with the step model's queue, compute and output spans under it; a failed step's span says why.
TEST_F(EnsembleSchedulerTest, EachStepIsTracedUnderTheEnsemblesRequestSpan) {
  auto ensemble = Make(Chain());
  testing::SpanRecorder spans;
  auto traced = [&] {
    return std::make_shared<RequestTrace>(&spans, Duration(0), std::nullopt, "ModelInfer",
                                          Clock::now());
  };
  auto trace = traced();
  TensorSink sink;
  ASSERT_TRUE(Submit(*ensemble, &sink, nullptr, kNoDeadline, trace).get().ok());
  trace->End(absl::OkStatus(), Clock::now());
  const SpanData request = spans.Named("ModelInfer");
  EXPECT_EQ(request.kind, SpanKind::kServer);
  for (const char* name : {"ensemble step 1", "ensemble step 2"}) {
    const SpanData step = spans.Named(name);
    EXPECT_EQ(step.trace_id, trace->trace_id()) << name;
    EXPECT_EQ(step.parent_span_id, trace->span_id()) << name;
    EXPECT_EQ(step.kind, SpanKind::kInternal);
    EXPECT_FALSE(step.error);
    EXPECT_GE(step.start_unix_ns, request.start_unix_ns);
    EXPECT_LE(step.end_unix_ns, request.end_unix_ns);
    std::vector<std::string> stages;
    for (const SpanData& span : spans.spans()) {
      if (span.parent_span_id == step.span_id && span.trace_id == step.trace_id)
        stages.push_back(span.name);
    }
    EXPECT_THAT(stages, ::testing::UnorderedElementsAre("queue", "compute", "output")) << name;
  }
  EXPECT_LT(spans.Named("ensemble step 1").end_unix_ns,
            spans.Named("ensemble step 2").start_unix_ns + 1);

  testing::SpanRecorder failed_spans;
  b_fails_ = true;
  auto failing = std::make_shared<RequestTrace>(&failed_spans, Duration(0), std::nullopt,
                                                "ModelInfer", Clock::now());
  EXPECT_FALSE(Submit(*ensemble, &sink, nullptr, kNoDeadline, failing).get().ok());
  const SpanData broke = failed_spans.Named("ensemble step 2");
  EXPECT_TRUE(broke.error);
  EXPECT_THAT(broke.status_message, HasSubstr("the model broke"));
  b_fails_ = false;
}

// The response cache's single flight raises a run's deadline as later waiters join: the steps
// not started yet get the later one. Step 2 is submitted after the first deadline has passed.
TEST_F(EnsembleSchedulerTest, RescheduleRaisesTheDeadlineOfStepsNotStartedYet) {
  auto ensemble = Make(Chain());
  QueueSharing& sharing = *ensemble;
  EXPECT_TRUE(sharing.AdmitWaiter(InferRequest{}).ok());  // no queue of its own
  auto soon = [this] { return clock_.Now() + std::chrono::milliseconds(100); };
  auto run = [&](bool raise) {
    a_backend_->CloseGate();
    const int started = a_backend_->started();
    auto tag = std::make_shared<std::atomic<bool>>(false);
    TensorSink sink;
    std::future<Status> answer = Submit(*ensemble, &sink, tag, soon());
    a_backend_->WaitStarted(started + 1);  // step 1 runs, held at the gate
    if (raise) {
      EXPECT_TRUE(
          sharing.Reschedule(tag.get(), 1, clock_.Now() + std::chrono::seconds(60), kNoDeadline));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the first deadline
    a_backend_->OpenGate();
    return answer.get();
  };
  const Status expired = run(/*raise=*/false);
  EXPECT_EQ(expired.code(), absl::StatusCode::kDeadlineExceeded) << expired;
  EXPECT_TRUE(run(/*raise=*/true).ok());
  std::atomic<bool> nobody{false};
  EXPECT_FALSE(sharing.Reschedule(&nobody, 1, kNoDeadline, kNoDeadline));  // no such run
}

TEST_F(EnsembleSchedulerTest, CreateChecksEachStepAgainstItsModel) {
  EnsembleScheduler::Options options;
  options.lookup = &lookup_;
  options.clock = &clock_;
  auto unmapped = EnsembleScheduler::Create(Chain("z"), options);
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unmapped.status().message(),
              HasSubstr("step 2 (model 'b'): model 'b' has no input 'z'"));
  ModelSpec unknown = Chain();
  unknown.ensemble.steps[1].model = "loading";
  auto not_ready = EnsembleScheduler::Create(unknown, options);
  EXPECT_EQ(not_ready.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(not_ready.status().message(), HasSubstr("step 2 (model 'loading') cannot be served"));
  ModelSpec mistyped = Chain();
  mistyped.outputs[0].dtype = DataType::kFp32;
  auto wrong = EnsembleScheduler::Create(mistyped, options);
  EXPECT_THAT(
      wrong.status().message(),
      HasSubstr("its output 'out' is declared FP32 [-1], but output 'y' of step 2 is INT32 [-1]"));
  ModelSpec too_big = Chain();
  too_big.max_batch_size = 16;
  EXPECT_THAT(
      EnsembleScheduler::Create(too_big, options).status().message(),
      HasSubstr("takes batches of at most 8 (max_batch_size), less than the ensemble's 16"));
}

}  // namespace
}  // namespace sluice
