// The instance pool on its own: batches handed over by a test instead of a queue policy.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/instance_pool.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

ModelSpec Spec() { return testing::EchoSpec(); }

// One request of `rows` x 2 INT32 values equal to `tag`, answered into `answer`.
struct Call {
  std::vector<int32_t> data;
  TensorSink sink;
  std::promise<StatusOr<testing::Outputs>> answer;

  PendingRequest Pending(int64_t rows, int32_t tag, OutputSink* sink_override = nullptr) {
    data.assign(static_cast<size_t>(rows * 2), tag);
    PendingRequest pending;
    pending.request = std::make_unique<InferRequest>();
    pending.request->model_name = "m";
    pending.request->batch_size = rows;
    pending.request->inputs.push_back({"x",
                                       DataType::kInt32,
                                       {rows, 2},
                                       reinterpret_cast<const char*>(data.data()),
                                       data.size() * 4,
                                       {}});
    pending.sink = sink_override != nullptr ? sink_override : &sink;
    pending.done = [this](Status status) { answer.set_value(testing::Collected(status, sink)); };
    return pending;
  }
};

// A caller's sink that refuses every output (a shared-memory region that is too small, say).
class RefusingSink final : public OutputSink {
 public:
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    return absl::InvalidArgumentError("the output region is too small");
  }
};

class InstancePoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<InstancePool> Make(std::unique_ptr<ModelBackend> backend) {
    std::vector<std::unique_ptr<ModelBackend>> backends;
    backends.push_back(std::move(backend));
    InstancePool::Options options;
    options.clock = &clock_;
    options.stats = stats_;
    options.on_idle = [this](size_t, bool) { idle_calls_.fetch_add(1); };
    return *InstancePool::Create(Spec(), std::move(backends), options);
  }

  FakeTimeSource clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  std::atomic<int> idle_calls_{0};
};

// How many warm-up runs overlap across two instances. A run waits (bounded) for the other
// instance to join it: with instances warming all at once they meet at once; one at a time they
// never can, and each run gives up after `alone`.
int MostWarmupRunsAtOnce(bool one_at_a_time, std::chrono::milliseconds alone) {
  struct Overlap {
    std::mutex mutex;
    std::condition_variable joined;
    int active = 0, most = 0;
    bool met = false;  // two runs were active at once (stays true: the first to leave must not
                       // leave the other waiting for a meeting that already happened)
  };
  auto overlap = std::make_shared<Overlap>();
  auto behaviour = [overlap, alone](const InferRequest&) -> StatusOr<std::vector<Tensor>> {
    std::unique_lock<std::mutex> lock(overlap->mutex);
    overlap->most = std::max(overlap->most, ++overlap->active);
    if (overlap->active > 1) overlap->met = true;
    overlap->joined.notify_all();
    overlap->joined.wait_for(lock, alone, [&] { return overlap->met; });
    --overlap->active;
    return std::vector<Tensor>{};
  };
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::make_unique<testing::FakeBackend>(behaviour));
  backends.push_back(std::make_unique<testing::FakeBackend>(behaviour));
  FakeTimeSource clock;
  InstancePool::Options options;
  options.clock = &clock;
  options.warm_up_one_at_a_time = one_at_a_time;
  auto pool = *InstancePool::Create(Spec(), std::move(backends), options);
  EXPECT_TRUE(pool->WarmUp(testing::ZeroWarmup(1, 2), nullptr).ok());
  pool->Stop();
  return overlap->most;
}

// With cuDNN benchmark mode on GPU instances the version loader asks for one instance at a time
// (cudnnFind timings on one GPU disturb each other); otherwise they warm up together.
TEST(InstancePoolWarmupTest, InstancesWarmUpOneAtATimeWhenAskedAndTogetherOtherwise) {
  EXPECT_EQ(MostWarmupRunsAtOnce(/*one_at_a_time=*/false, std::chrono::seconds(30)), 2);
  EXPECT_EQ(MostWarmupRunsAtOnce(/*one_at_a_time=*/true, std::chrono::milliseconds(50)), 1);
}

// Counts the CUDA graph events a pool reports; the rest is ignored.
class GraphCountingSink final : public StatsSink {
 public:
  void OnAdmitted() override {}
  void OnStarted(int64_t) override {}
  void OnExecution(int64_t, Duration, Duration, Duration) override {}
  void OnSuccess(int64_t, Duration, Duration, Duration, Duration, Duration, Protocol) override {}
  void OnFailure(FailureReason, Duration, bool, bool, Protocol) override {}
  void OnGraphRun(ModelBackend::GraphRun run) override {
    ++(run == ModelBackend::GraphRun::kCaptured ? captures : replays);
  }
  std::atomic<int> captures{0}, replays{0};
};

TEST(InstancePoolGraphsTest, CapturesCountAtWarmUpAndInServingReplaysOnlyInServing) {
  using GraphRun = ModelBackend::GraphRun;
  auto backend = std::make_unique<testing::FakeBackend>();
  // Warm-up's four runs: two eager, the capture, a replay; then served batches: a replay, an
  // eager pass, a capture of a new shape, a replay.
  backend->graph_runs = {GraphRun::kNone,     GraphRun::kNone,     GraphRun::kCaptured,
                         GraphRun::kReplayed, GraphRun::kReplayed, GraphRun::kNone,
                         GraphRun::kCaptured, GraphRun::kReplayed};
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::move(backend));
  auto sink = std::make_shared<GraphCountingSink>();
  FakeTimeSource clock;
  InstancePool::Options options;
  options.clock = &clock;
  options.stats = std::make_shared<ModelStats>(sink);
  auto pool = *InstancePool::Create(Spec(), std::move(backends), options);
  auto warmup = testing::ZeroWarmup(1, 2);
  warmup[0].runs = 4;
  ASSERT_TRUE(pool->WarmUp(std::move(warmup), nullptr).ok());
  EXPECT_EQ(sink->captures.load(), 1);
  EXPECT_EQ(sink->replays.load(), 0);  // warm-up's replay is not a served batch
  for (int i = 0; i < 4; ++i) {
    Call call;
    FormedBatch batch;
    batch.requests.push_back(call.Pending(1, i));
    batch.rows = batch.padded_rows = 1;
    pool->Run(std::move(batch));
    ASSERT_TRUE(call.answer.get_future().get().ok());
  }
  pool->Stop();
  EXPECT_EQ(sink->captures.load(), 2);
  EXPECT_EQ(sink->replays.load(), 2);
}

TEST_F(InstancePoolTest, NeedsInstancesAndAClock) {
  InstancePool::Options options;
  options.clock = &clock_;
  EXPECT_EQ(InstancePool::Create(Spec(), {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::make_unique<testing::EchoBackend>());
  EXPECT_EQ(
      InstancePool::Create(Spec(), std::move(backends), InstancePool::Options{}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(InstancePoolTest, RunsABatchAnswersEachRequestAndGoesIdleAgain) {
  auto echo = std::make_unique<testing::EchoBackend>();
  testing::EchoBackend* model = echo.get();
  auto pool = Make(std::move(echo));
  EXPECT_EQ(pool->idle(), 1);
  Call a, b;
  FormedBatch batch;
  batch.requests.push_back(a.Pending(1, 7));
  batch.requests.push_back(b.Pending(2, 9));
  batch.rows = 3;
  batch.padded_rows = 4;
  pool->Run(std::move(batch));
  auto ra = a.answer.get_future().get(), rb = b.answer.get_future().get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->outputs[0].shape, (Shape{1, 2}));
  EXPECT_EQ(rb->outputs[0].shape, (Shape{2, 2}));
  EXPECT_EQ(model->batch_sizes(), (std::vector<int64_t>{4}));  // padded
  EXPECT_EQ(model->bytes_copied(), 8u + 16u);                  // each caller's rows, once
  pool->Stop();  // joins the worker: its idle notification has happened
  EXPECT_EQ(pool->idle(), 1);
  EXPECT_EQ(idle_calls_.load(), 1);
  const ModelStatsSnapshot stats = stats_->Snapshot();
  EXPECT_EQ(stats.success.count, 2u);
  EXPECT_EQ(stats.inference_count, 3u);
  EXPECT_EQ(stats.batches.at(4).compute_output.count, 1u);
}

// Every batch's cycle, phase by phase: the instance's idle time since its previous batch, the
// backend's execute and its device phases, the real and padded rows.
TEST_F(InstancePoolTest, EachBatchRecordsItsCycle) {
  using std::chrono::milliseconds;
  auto backend = std::make_unique<testing::FakeBackend>(
      [this](const InferRequest&) -> StatusOr<std::vector<Tensor>> {
        clock_.Advance(milliseconds(3));  // the pass
        return std::vector<Tensor>{{"y", DataType::kInt64, {1}, std::string(8, '\0')}};
      });
  backend->phases = DevicePhases{milliseconds(1), milliseconds(1), milliseconds(1)};
  auto pool = Make(std::move(backend));
  for (int i = 0; i < 2; ++i) {
    if (i == 1) clock_.Advance(milliseconds(5));  // the instance idles between the batches
    Call call;
    FormedBatch batch;
    batch.requests.push_back(call.Pending(3, i));
    batch.rows = 3;
    batch.padded_rows = 4;
    pool->Run(std::move(batch));
    ASSERT_TRUE(call.answer.get_future().get().ok());
    ASSERT_TRUE(clock_.AwaitWaiting(1));  // the worker is back waiting: the batch has ended
  }
  pool->Stop();
  const BatchPhaseTotals phases = stats_->Snapshot().phases;
  EXPECT_EQ(phases.batches, 2u);
  EXPECT_EQ(phases.measured_on_device, 2u);
  EXPECT_EQ(phases.rows, 6u);
  EXPECT_EQ(phases.padded_rows, 8u);
  EXPECT_EQ(phases.idle, milliseconds(5));  // nothing before the first batch
  EXPECT_EQ(phases.execute, milliseconds(6));
  EXPECT_EQ(phases.assembly, Duration::zero());
  EXPECT_EQ(phases.forward, milliseconds(2));
  EXPECT_EQ(phases.to_device + phases.to_host, milliseconds(4));
}

// Stage ahead: a pool of one gated instance whose model answers each row with its own input.
class StageAheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = std::make_unique<testing::FakeBackend>(
        [](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
          const TensorView& x = request.inputs.at(0);
          return std::vector<Tensor>{{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}};
        });
    model_ = backend.get();
    std::vector<std::unique_ptr<ModelBackend>> backends;
    backends.push_back(std::move(backend));
    InstancePool::Options options;
    options.clock = &clock_;
    options.stats = stats_;
    options.stage_ahead = true;
    options.on_idle = [this](size_t, bool after_batch) {
      if (after_batch) after_batch_calls_.fetch_add(1);
    };
    pool_ = *InstancePool::Create(Spec(), std::move(backends), options);
  }
  // A failed assertion must not leave a worker held at the gate (the pool's end joins it).
  void TearDown() override { model_->OpenGate(); }

  // A batch of two requests (1 and 2 rows, tagged `tag` and `tag` + 1), padded to 4 rows.
  FormedBatch Batch(Call& first, Call& second, int32_t tag) {
    FormedBatch batch;
    batch.requests.push_back(first.Pending(1, tag));
    batch.requests.push_back(second.Pending(2, tag + 1));
    batch.rows = 3;
    batch.padded_rows = 4;
    return batch;
  }

  // The values a request was answered with.
  static std::vector<int32_t> Values(Call& call) {
    auto answer = call.answer.get_future().get();
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (!answer.ok()) return {};
    const std::string& bytes = answer->outputs.at(0).data;
    std::vector<int32_t> values(bytes.size() / 4);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }

  FakeTimeSource clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  testing::FakeBackend* model_ = nullptr;
  std::unique_ptr<InstancePool> pool_;
  std::atomic<int> after_batch_calls_{0};
};

TEST_F(StageAheadTest, ABatchStagedBehindARunningOneIsAssembledMeanwhileAndRunsNext) {
  EXPECT_EQ(pool_->ahead_slots(), 0);  // nothing runs: nothing to stage behind
  model_->CloseGate();
  Call a, b, c, d;
  pool_->Run(Batch(a, b, 10));
  model_->WaitStarted(1);
  EXPECT_EQ(pool_->idle(), 0);
  EXPECT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(c, d, 20));
  EXPECT_EQ(pool_->ahead_slots(), 0);
  // The stager assembles it in the second set of buffers while the first batch is held.
  EXPECT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 2; }));
  EXPECT_EQ(model_->started(), 1);
  model_->OpenGate();
  EXPECT_EQ(Values(a), (std::vector<int32_t>{10, 10}));
  EXPECT_EQ(Values(b), (std::vector<int32_t>{11, 11, 11, 11}));
  EXPECT_EQ(Values(c), (std::vector<int32_t>{20, 20}));
  EXPECT_EQ(Values(d), (std::vector<int32_t>{21, 21, 21, 21}));
  pool_->Stop();
  EXPECT_EQ(pool_->idle(), 1);
  EXPECT_EQ(pool_->ahead_slots(), 0);
  EXPECT_EQ(after_batch_calls_.load(), 2);  // one per batch, as a scheduler counts on
  const BatchPhaseTotals phases = stats_->Snapshot().phases;
  EXPECT_EQ(phases.batches, 2u);
  EXPECT_EQ(phases.staged_ahead, 1u);
  EXPECT_EQ(stats_->Snapshot().success.count, 4u);
  EXPECT_EQ(pool_->StagingAllocations(), 2u);  // one buffer in each set
}

// The batch that ends with another staged behind it is answered by the stager while the staged
// one runs: the first answer's delivery holds (bounded) until the next batch has started, which
// it only sees where the worker did not stay to deliver it. Its completion time is counted off
// the cycle.
TEST_F(StageAheadTest, TheStagerAnswersTheEndedBatchWhileTheStagedOneRuns) {
  model_->CloseGate();
  Call a, b, c, d;
  FormedBatch first = Batch(a, b, 10);
  std::atomic<bool> next_started_first{false};
  first.requests[0].done = [&, answer = std::move(first.requests[0].done)](Status status) mutable {
    next_started_first =
        testing::Eventually([&] { return model_->started() == 2; }, std::chrono::seconds(5));
    clock_.Advance(std::chrono::milliseconds(3));  // the completion's time
    answer(status);
  };
  pool_->Run(std::move(first));
  model_->WaitStarted(1);
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(c, d, 20));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 2; }));
  model_->AllowOne();  // the first batch ends; the staged one starts and is held at the gate
  EXPECT_EQ(Values(a), (std::vector<int32_t>{10, 10}));
  EXPECT_TRUE(next_started_first.load());
  EXPECT_EQ(Values(b), (std::vector<int32_t>{11, 11, 11, 11}));
  EXPECT_EQ(model_->started(), 2);
  model_->OpenGate();
  EXPECT_EQ(Values(c), (std::vector<int32_t>{20, 20}));
  EXPECT_EQ(Values(d), (std::vector<int32_t>{21, 21, 21, 21}));
  pool_->Stop();
  EXPECT_EQ(after_batch_calls_.load(), 2);
  const ModelStatsSnapshot stats = stats_->Snapshot();
  EXPECT_EQ(stats.success.count, 4u);
  EXPECT_EQ(stats.phases.batches, 2u);
  // The first batch's 3 ms were spent behind the second; the second, with nothing staged behind
  // it, was completed by its worker in no time (the fake clock stood still).
  EXPECT_EQ(stats.phases.complete_behind, std::chrono::milliseconds(3));
  EXPECT_EQ(stats.phases.complete, Duration::zero());
}

// While the stager is still completing one batch, the worker completes the next itself: answers
// never queue behind a stager that falls behind.
TEST_F(StageAheadTest, AWorkerCompletesItsBatchItselfWhileTheStagerIsStillCompleting) {
  model_->CloseGate();
  Call a, b, c, d, e, f;
  FormedBatch first = Batch(a, b, 10);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  first.requests[0].done = [answer = std::move(first.requests[0].done),
                            released](Status status) mutable {
    released.wait();  // the stager is held here, completing the first batch
    answer(status);
  };
  pool_->Run(std::move(first));
  model_->WaitStarted(1);
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  FormedBatch second = Batch(c, d, 20);
  std::atomic<bool> second_answered{false};
  second.requests[1].done = [answer = std::move(second.requests[1].done),
                             &second_answered](Status status) mutable {
    answer(status);
    second_answered = true;
  };
  pool_->StageAhead(std::move(second));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 2; }));
  model_->AllowOne();  // the first batch ends and goes to the stager; the second starts
  ASSERT_TRUE(testing::Eventually([&] { return model_->started() == 2; }));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(e, f, 30));
  model_->AllowOne();  // the second ends while the stager still holds the first
  EXPECT_TRUE(testing::Eventually([&] { return second_answered.load(); }, std::chrono::seconds(5)));
  release.set_value();
  EXPECT_EQ(Values(c), (std::vector<int32_t>{20, 20}));
  EXPECT_EQ(Values(d), (std::vector<int32_t>{21, 21, 21, 21}));
  EXPECT_EQ(Values(a), (std::vector<int32_t>{10, 10}));
  EXPECT_EQ(Values(b), (std::vector<int32_t>{11, 11, 11, 11}));
  model_->OpenGate();
  EXPECT_EQ(Values(e), (std::vector<int32_t>{30, 30}));
  EXPECT_EQ(Values(f), (std::vector<int32_t>{31, 31, 31, 31}));
  pool_->Stop();
  EXPECT_EQ(after_batch_calls_.load(), 3);
  EXPECT_EQ(stats_->Snapshot().success.count, 6u);
}

// Warm-up brings both staging sets to their size: the first batch staged in serving allocates
// nothing (on a GPU, pinned memory).
TEST_F(StageAheadTest, WarmUpSizesBothSets) {
  ASSERT_TRUE(pool_->WarmUp(testing::ZeroWarmup(4, 2), nullptr).ok());
  EXPECT_EQ(pool_->StagingAllocations(), 2u);
  model_->CloseGate();
  Call a, b, c, d;
  pool_->Run(Batch(a, b, 10));
  model_->WaitStarted(2);  // warm-up's run, then this batch
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(c, d, 20));
  model_->OpenGate();
  EXPECT_EQ(Values(c), (std::vector<int32_t>{20, 20}));
  Values(a);
  Values(b);
  Values(d);
  pool_->Stop();
  EXPECT_EQ(pool_->StagingAllocations(), 2u);
}

TEST_F(StageAheadTest, TheSetsTakeTurnsWithoutGrowing) {
  for (int round = 0; round < 3; ++round) {
    model_->CloseGate();
    Call a, b, c, d;
    pool_->Run(Batch(a, b, 10 * round));
    model_->WaitStarted(2 * round + 1);
    ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
    pool_->StageAhead(Batch(c, d, 10 * round + 5));
    // The first round waits for the stager to start, so that both sets exist.
    if (round == 0)
      ASSERT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 2; }));
    model_->OpenGate();
    EXPECT_EQ(Values(c), (std::vector<int32_t>{10 * round + 5, 10 * round + 5}));
    EXPECT_EQ(Values(a), (std::vector<int32_t>{10 * round, 10 * round}));
    Values(b);
    Values(d);
    ASSERT_TRUE(clock_.AwaitWaiting(1));  // the worker is back waiting
  }
  pool_->Stop();
  // Whichever set each batch went into (the worker assembles a staged batch itself when it ends
  // its batch before the stager starts), the two sets hold one buffer each.
  EXPECT_EQ(pool_->StagingAllocations(), 2u);
  EXPECT_GE(stats_->Snapshot().phases.staged_ahead, 1u);
}

// A batch staged behind a batch that was itself staged: the stager assembles it in the set the
// first batch used (the sets swap when the worker takes a staged batch), while the second runs on
// the other; each answer is its own rows.
TEST_F(StageAheadTest, ABatchStagedBehindAStagedOneUsesTheOtherSet) {
  model_->CloseGate();
  Call a, b, c, d, e, f;
  pool_->Run(Batch(a, b, 10));
  model_->WaitStarted(1);
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(c, d, 20));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 2; }));
  // Let exactly the first batch through: the second then starts and is held at the gate.
  model_->AllowOne();
  ASSERT_TRUE(testing::Eventually([&] { return model_->started() == 2; }));
  EXPECT_EQ(Values(a), (std::vector<int32_t>{10, 10}));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  // Larger than the others (20 rows, 160 bytes, past the sets' first 64-byte buffers): the set
  // it goes into grows, which shows the stager has started it (the worker then waits for it
  // rather than assembling it itself).
  FormedBatch larger;
  larger.requests.push_back(e.Pending(8, 30));
  larger.requests.push_back(f.Pending(12, 31));
  larger.rows = larger.padded_rows = 20;
  pool_->StageAhead(std::move(larger));
  ASSERT_TRUE(testing::Eventually([&] { return pool_->StagingAllocations() == 3; }));
  model_->OpenGate();
  EXPECT_EQ(Values(c), (std::vector<int32_t>{20, 20}));
  EXPECT_EQ(Values(d), (std::vector<int32_t>{21, 21, 21, 21}));
  EXPECT_EQ(Values(e), std::vector<int32_t>(16, 30));
  EXPECT_EQ(Values(f), std::vector<int32_t>(24, 31));
  Values(b);
  pool_->Stop();
  EXPECT_EQ(pool_->StagingAllocations(), 3u);
  EXPECT_EQ(after_batch_calls_.load(), 3);
  EXPECT_EQ(stats_->Snapshot().phases.staged_ahead, 2u);  // both assembled by the stager
}

TEST_F(StageAheadTest, WithNothingRunningAStagedBatchIsAnOrdinaryHandOver) {
  Call a, b;
  pool_->StageAhead(Batch(a, b, 1));
  EXPECT_EQ(Values(a), (std::vector<int32_t>{1, 1}));
  Values(b);
  pool_->Stop();
  EXPECT_EQ(pool_->idle(), 1);
  EXPECT_EQ(stats_->Snapshot().phases.staged_ahead, 0u);
  EXPECT_EQ(after_batch_calls_.load(), 1);
}

TEST_F(StageAheadTest, StopRunsTheBatchStagedBehindTheRunningOne) {
  model_->CloseGate();
  Call a, b, c, d;
  pool_->Run(Batch(a, b, 1));
  model_->WaitStarted(1);
  ASSERT_TRUE(testing::Eventually([&] { return pool_->ahead_slots() == 1; }));
  pool_->StageAhead(Batch(c, d, 3));
  std::thread stop([&] { pool_->Stop(); });
  model_->OpenGate();
  stop.join();
  EXPECT_EQ(Values(a), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(Values(c), (std::vector<int32_t>{3, 3}));
  Values(b);
  Values(d);
  // After Stop a batch staged is refused as a Run is.
  Call e, f;
  pool_->StageAhead(Batch(e, f, 5));
  EXPECT_EQ(e.answer.get_future().get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(InstancePoolTest, ABatchWithTracedRequestsStampsThemAndExportsOneLinkedBatchSpan) {
  auto pool = Make(std::make_unique<testing::EchoBackend>());
  testing::SpanRecorder sink;
  Call traced, plain, also_traced;
  FormedBatch batch;
  batch.requests.push_back(traced.Pending(1, 1));
  batch.requests.push_back(plain.Pending(1, 2));
  batch.requests.push_back(also_traced.Pending(2, 3));
  auto first =
      std::make_shared<RequestTrace>(&sink, Duration::zero(), std::nullopt, "a", clock_.Now());
  auto second =
      std::make_shared<RequestTrace>(&sink, Duration::zero(), std::nullopt, "b", clock_.Now());
  first->SetDevice("cpu");
  batch.requests[0].request->trace = first;
  batch.requests[0].enqueued = clock_.Now();
  batch.requests[2].request->trace = second;
  batch.requests[2].enqueued = clock_.Now();
  batch.rows = 4;
  batch.padded_rows = 4;
  pool->Run(std::move(batch));
  ASSERT_TRUE(traced.answer.get_future().get().ok());
  ASSERT_TRUE(plain.answer.get_future().get().ok());
  ASSERT_TRUE(also_traced.answer.get_future().get().ok());
  pool->Stop();
  // Exactly one batch span, linked to both traced requests (not to the untraced one).
  ASSERT_EQ(sink.spans().size(), 1u);
  const SpanData span = sink.spans()[0];
  EXPECT_EQ(span.name, "batch");
  ASSERT_EQ(span.links.size(), 2u);
  EXPECT_EQ(span.links[0].span_id, first->span_id());
  EXPECT_EQ(span.links[1].span_id, second->span_id());
  // Each trace now has its queue and run: ending it exports queue, compute (linked to the batch
  // span) and output under its request span.
  first->End(absl::OkStatus(), clock_.Now());
  EXPECT_EQ(sink.Named("queue").parent_span_id, first->span_id());
  const SpanData compute = sink.Named("compute");
  ASSERT_EQ(compute.links.size(), 1u);
  EXPECT_EQ(compute.links[0].span_id, span.span_id);
}

TEST_F(InstancePoolTest, DroppingATracedRequestStampsItsQueueTime) {
  auto pool = Make(std::make_unique<testing::EchoBackend>());
  testing::SpanRecorder sink;
  Call dropped;
  PendingRequest pending = dropped.Pending(1, 1);
  auto trace =
      std::make_shared<RequestTrace>(&sink, Duration::zero(), std::nullopt, "r", clock_.Now());
  pending.request->trace = trace;
  pending.enqueued = clock_.Now();
  pool->Drop(pending, absl::DeadlineExceededError("expired"));
  EXPECT_FALSE(dropped.answer.get_future().get().ok());
  trace->End(absl::DeadlineExceededError("expired"), clock_.Now());
  EXPECT_EQ(sink.Named("queue").parent_span_id, trace->span_id());
  EXPECT_EQ(sink.spans().size(), 2u);  // queue and the request span; it never ran
  pool->Stop();
}

TEST_F(InstancePoolTest, ASinkThatRefusesFailsOnlyItsOwnRequest) {
  auto pool = Make(std::make_unique<testing::EchoBackend>());
  Call refused, served;
  RefusingSink refusing;
  FormedBatch batch;
  batch.requests.push_back(refused.Pending(1, 1, &refusing));
  batch.requests.push_back(served.Pending(1, 2));
  batch.rows = batch.padded_rows = 2;
  pool->Run(std::move(batch));
  EXPECT_THAT(refused.answer.get_future().get().status().message(),
              HasSubstr("output region is too small"));
  auto ok = served.answer.get_future().get();
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::vector<int32_t> values(2);
  std::memcpy(values.data(), ok->outputs[0].data.data(), 8);
  EXPECT_EQ(values, (std::vector<int32_t>{2, 2}));  // its own row, not the refused one's
  pool->Stop();
  EXPECT_EQ(stats_->Snapshot().fail.count, 1u);
  EXPECT_EQ(stats_->Snapshot().success.count, 1u);
}

// What happened, in order: holds and releases of connections, and answers (from the worker).
class EventLog {
 public:
  void Add(std::string event) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> events_;
};

class LoggedConnection final : public AnswerConnection {
 public:
  LoggedConnection(std::string name, EventLog* log) : name_(std::move(name)), log_(log) {}
  bool Hold() override {
    log_->Add("hold " + name_);
    return true;
  }
  void Release() override { log_->Add("release " + name_); }

 private:
  const std::string name_;
  EventLog* const log_;
};

// A caller's sink whose answer goes to `connection`; the outputs go to `inner`.
class ConnectedSink final : public OutputSink {
 public:
  ConnectedSink(OutputSink* inner, std::shared_ptr<AnswerConnection> connection,
                std::atomic<int>* asked)
      : inner_(inner), connection_(std::move(connection)), asked_(asked) {}
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    return inner_->Allocate(output);
  }
  std::shared_ptr<AnswerConnection> Connection() override {
    asked_->fetch_add(1);
    return connection_;
  }

 private:
  OutputSink* const inner_;
  const std::shared_ptr<AnswerConnection> connection_;
  std::atomic<int>* const asked_;
};

// A batch's answers to a connection that two or more of its callers share are sent while that
// connection is held: held before the first answer, released after the last. A connection only
// one answer goes to, and a batch of one caller, hold nothing (a lone batch does not even ask).
TEST_F(InstancePoolTest, AnswersToOneConnectionAreSentWhileItIsHeld) {
  auto pool = Make(std::make_unique<testing::EchoBackend>());
  EventLog log;
  std::atomic<int> asked{0};
  auto shared = std::make_shared<LoggedConnection>("shared", &log);
  auto alone = std::make_shared<LoggedConnection>("alone", &log);
  Call calls[3];
  ConnectedSink sinks[3] = {{&calls[0].sink, shared, &asked},
                            {&calls[1].sink, alone, &asked},
                            {&calls[2].sink, shared, &asked}};
  FormedBatch batch;
  for (int i = 0; i < 3; ++i) {
    PendingRequest pending = calls[i].Pending(1, i, &sinks[i]);
    pending.done = [&log, &call = calls[i], i](Status status) {
      log.Add("answer " + std::to_string(i));
      call.answer.set_value(testing::Collected(status, call.sink));
    };
    batch.requests.push_back(std::move(pending));
  }
  batch.rows = batch.padded_rows = 3;
  pool->Run(std::move(batch));
  for (Call& call : calls) {
    auto answer = call.answer.get_future().get();
    ASSERT_TRUE(answer.ok()) << answer.status();
  }
  pool->Stop();  // joins the worker: the release after the last answer has happened
  EXPECT_EQ(log.events(), (std::vector<std::string>{"hold shared", "answer 0", "answer 1",
                                                    "answer 2", "release shared"}));
  EXPECT_EQ(asked.load(), 3);

  auto lone_pool = Make(std::make_unique<testing::EchoBackend>());
  Call lone;
  ConnectedSink lone_sink(&lone.sink, shared, &asked);
  FormedBatch one;
  one.requests.push_back(lone.Pending(1, 5, &lone_sink));
  one.rows = one.padded_rows = 1;
  lone_pool->Run(std::move(one));
  ASSERT_TRUE(lone.answer.get_future().get().ok());
  lone_pool->Stop();
  EXPECT_EQ(asked.load(), 3);
  EXPECT_EQ(log.events().size(), 5u);
}

TEST_F(InstancePoolTest, DropAnswersWithoutRunningAndRunAfterStopIsUnavailable) {
  auto gated = std::make_unique<testing::FakeBackend>();
  testing::FakeBackend* model = gated.get();
  auto pool = Make(std::move(gated));
  Call dropped, late;
  PendingRequest pending = dropped.Pending(1, 1);
  pool->Drop(pending, absl::DeadlineExceededError("expired"));
  EXPECT_EQ(dropped.answer.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  pool->Stop();
  FormedBatch batch;
  batch.requests.push_back(late.Pending(1, 2));
  batch.rows = batch.padded_rows = 1;
  pool->Run(std::move(batch));
  EXPECT_EQ(late.answer.get_future().get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(model->executed(), 0);
  EXPECT_EQ(stats_->Snapshot().fail.count, 2u);
}

// Claims an instance as soon as one waits (its worker reaches its wait on its own).
size_t ClaimWhenWaiting(InstancePool& pool) {
  for (;;) {
    if (std::optional<size_t> claimed = pool.TryClaim()) return *claimed;
    std::this_thread::yield();
  }
}

TEST_F(InstancePoolTest, AClaimedInstanceRunsOnTheCallersThreadAndItsWorkerLeavesItAlone) {
  testing::ThreadNotingEcho first, second;
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(first.Backend());
  backends.push_back(second.Backend());
  InstancePool::Options options;
  options.clock = &clock_;
  options.stats = stats_;
  std::atomic<int> after_batch{0}, other{0};
  options.on_idle = [&](size_t, bool batch) { (batch ? after_batch : other).fetch_add(1); };
  auto pool = *InstancePool::Create(Spec(), std::move(backends), options);

  const size_t claimed = ClaimWhenWaiting(*pool);
  EXPECT_EQ(pool->idle(), 1);  // the claim counts as busy
  // A batch handed over meanwhile goes to the other instance.
  Call queued;
  FormedBatch batch;
  batch.requests.push_back(queued.Pending(1, 3));
  batch.rows = batch.padded_rows = 1;
  pool->Run(std::move(batch));
  ASSERT_TRUE(queued.answer.get_future().get().ok());
  {
    const std::vector<std::thread::id> on_claimed = (claimed == 0 ? first : second).Threads();
    const std::vector<std::thread::id> on_other = (claimed == 0 ? second : first).Threads();
    EXPECT_TRUE(on_claimed.empty());
    ASSERT_EQ(on_other.size(), 1u);
    EXPECT_NE(on_other[0], std::this_thread::get_id());
  }
  Call here;
  FormedBatch mine;
  mine.requests.push_back(here.Pending(2, 5));
  mine.rows = mine.padded_rows = 2;
  pool->RunClaimed(claimed, std::move(mine));
  // Answered before RunClaimed returned, on this thread, on the claimed instance.
  auto future = here.answer.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  ASSERT_TRUE(future.get().ok());
  {
    const std::vector<std::thread::id> on_claimed = (claimed == 0 ? first : second).Threads();
    ASSERT_EQ(on_claimed.size(), 1u);
    EXPECT_EQ(on_claimed[0], std::this_thread::get_id());
  }
  EXPECT_EQ(other.load(), 1);  // RunClaimed's idle notification, not counted as a handed-over batch
  pool->Stop();
  EXPECT_EQ(after_batch.load(), 1);
  EXPECT_EQ(pool->idle(), 2);
  EXPECT_EQ(stats_->Snapshot().success.count, 2u);
}

TEST_F(InstancePoolTest, NoClaimWhileTheOnlyInstanceIsBusyOrClaimedOrAfterStop) {
  auto gated = std::make_unique<testing::FakeBackend>();
  testing::FakeBackend* model = gated.get();
  auto pool = Make(std::move(gated));
  const size_t claimed = ClaimWhenWaiting(*pool);
  EXPECT_FALSE(pool->TryClaim().has_value());  // claimed already
  pool->Unclaim(claimed);
  EXPECT_EQ(pool->idle(), 1);
  EXPECT_EQ(idle_calls_.load(), 0);  // Unclaim tells no one

  model->CloseGate();
  Call busy;
  FormedBatch batch;
  batch.requests.push_back(busy.Pending(1, 1));
  batch.rows = batch.padded_rows = 1;
  pool->Run(std::move(batch));
  model->WaitStarted(1);
  EXPECT_FALSE(pool->TryClaim().has_value());  // running
  EXPECT_EQ(pool->ahead_slots(), 0);           // and nothing can be staged without stage ahead
  model->OpenGate();
  ASSERT_TRUE(busy.answer.get_future().get().ok());
  pool->Stop();
  EXPECT_FALSE(pool->TryClaim().has_value());
}

}  // namespace
}  // namespace sluice
