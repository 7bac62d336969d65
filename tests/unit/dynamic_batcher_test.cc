// The threaded batcher: fakes for the model, a fake clock moved by the test (no sleeps), and a
// stress test on the real clock. Also run under ThreadSanitizer by scripts/test.sh.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/dynamic_batcher.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A request for input "x" (INT32, `rows` x `width`) whose values all equal `tag`.
struct Call {
  std::vector<int32_t> data;
  TensorSink sink;
  std::promise<StatusOr<testing::Outputs>> answer;
  std::atomic<int> answers{0};
};

std::unique_ptr<InferRequest> Request(Call& call, int64_t rows, int64_t width, int32_t tag) {
  call.data.assign(static_cast<size_t>(rows * width), tag);
  auto request = std::make_unique<InferRequest>();
  request->model_name = "m";
  request->batch_size = rows;
  request->inputs.push_back({"x",
                             DataType::kInt32,
                             {rows, width},
                             reinterpret_cast<const char*>(call.data.data()),
                             call.data.size() * 4,
                             {}});
  return request;
}

InferCompletion Answer(Call& call) {
  return [&call](Status status) {
    if (call.answers.fetch_add(1) == 0)
      call.answer.set_value(testing::Collected(status, call.sink));
  };
}

ModelSpec Spec() { return testing::EchoSpec(); }

class DynamicBatcherTest : public ::testing::Test {
 protected:
  std::unique_ptr<DynamicBatcher> Make(int instances = 1, Duration delay = 1s,
                                       std::vector<int> preferred = {}) {
    std::vector<std::unique_ptr<ModelBackend>> backends;
    for (int i = 0; i < instances; ++i) {
      auto echo = std::make_unique<testing::EchoBackend>();
      echoes_.push_back(echo.get());
      backends.push_back(std::move(echo));
    }
    DynamicBatcher::Options options;
    options.queue.max_batch_size = 8;
    options.queue.max_queue_delay = delay;
    options.queue.preferred_batch_sizes = std::move(preferred);
    options.clock = &clock_;
    options.stats = stats_;
    options.on_fatal = [this](const Status& status) {
      fatal_.set_value(std::string(status.message()));
    };
    return *DynamicBatcher::Create(Spec(), std::move(backends), options);
  }

  FakeTimeSource clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  std::vector<testing::EchoBackend*> echoes_;
  std::promise<std::string> fatal_;
};

// The names of this process's threads (/proc/self/task/*/comm).
std::multiset<std::string> ThreadNames() {
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.insert(name);
  }
  return names;
}

TEST_F(DynamicBatcherTest, ItsThreadsAreNamedForTopAndPerf) {
  auto batcher = Make(/*instances=*/2);
  std::multiset<std::string> names;
  // Each thread names itself when it starts, in any order on a busy machine: read /proc until
  // all three have.
  testing::Eventually([&] {
    names = ThreadNames();
    return names.count("sluice-batcher") == 1 && names.count("sluice-worker-0") == 1 &&
           names.count("sluice-worker-1") == 1;
  });
  EXPECT_EQ(names.count("sluice-batcher"), 1u);
  EXPECT_EQ(names.count("sluice-worker-0"), 1u);
  EXPECT_EQ(names.count("sluice-worker-1"), 1u);
  batcher->Stop();
}

// Which batchers run as the front ends do (SCHED_BATCH under --model-threads-first): only those
// that form batches at once and keep no configured timer.
TEST(DynamicBatcherPolicyTest, OnlyBatchersWithoutConfiguredTimersRunLikeTheFrontEnds) {
  BatchFormer::Options at_once;
  at_once.max_batch_size = 8;
  EXPECT_TRUE(DynamicBatcher::RunsLikeTheFrontEnds(at_once));
  at_once.preferred_batch_sizes = {4, 8};  // preferred sizes without a delay: still at once
  at_once.one_request_per_batch = true;
  EXPECT_TRUE(DynamicBatcher::RunsLikeTheFrontEnds(at_once));

  BatchFormer::Options delayed = at_once;
  delayed.max_queue_delay = 100us;
  EXPECT_FALSE(DynamicBatcher::RunsLikeTheFrontEnds(delayed));
  BatchFormer::Options targeted = at_once;
  targeted.latency_target = 5ms;
  EXPECT_FALSE(DynamicBatcher::RunsLikeTheFrontEnds(targeted));
  BatchFormer::Options delaying_policy = at_once;
  delaying_policy.delays = true;
  EXPECT_FALSE(DynamicBatcher::RunsLikeTheFrontEnds(delaying_policy));
}

// Stage ahead: while the only instance runs, a batch of max_batch_size forms at once and is
// assembled behind it; fewer rows keep waiting for the instance, growing meanwhile.
TEST_F(DynamicBatcherTest, StageAheadFormsOnlyFullBatchesWhileTheInstanceIsBusy) {
  auto backend = std::make_unique<testing::FakeBackend>(
      [](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
        const TensorView& x = request.inputs.at(0);
        return std::vector<Tensor>{{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}};
      });
  testing::FakeBackend* model = backend.get();
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::move(backend));
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.clock = &clock_;
  options.stats = stats_;
  options.stage_ahead = true;
  auto batcher = *DynamicBatcher::Create(Spec(), std::move(backends), options);
  model->CloseGate();
  Call first;
  batcher->Enqueue(Request(first, 1, 2, 1), &first.sink, Answer(first));
  model->WaitStarted(1);  // a lone request: it runs on its own bytes, no staging used
  std::vector<std::unique_ptr<Call>> full, partial;
  for (int i = 0; i < 8; ++i) {
    full.push_back(std::make_unique<Call>());
    batcher->Enqueue(Request(*full.back(), 1, 2, 100 + i), &full.back()->sink,
                     Answer(*full.back()));
  }
  // The eighth row made a full batch: the batcher formed it and the stager assembled it.
  ASSERT_TRUE(testing::Eventually([&] { return batcher->StagingAllocations() == 1; }));
  for (int i = 0; i < 3; ++i) {
    partial.push_back(std::make_unique<Call>());
    batcher->Enqueue(Request(*partial.back(), 1, 2, 200 + i), &partial.back()->sink,
                     Answer(*partial.back()));
  }
  EXPECT_EQ(model->started(), 1);
  model->OpenGate();
  ASSERT_TRUE(first.answer.get_future().get().ok());
  for (int i = 0; i < 8; ++i) {
    auto answer = full[static_cast<size_t>(i)]->answer.get_future().get();
    ASSERT_TRUE(answer.ok()) << answer.status();
    int32_t value = 0;
    std::memcpy(&value, answer->outputs.at(0).data.data(), 4);
    EXPECT_EQ(value, 100 + i);
  }
  for (auto& call : partial) ASSERT_TRUE(call->answer.get_future().get().ok());
  batcher->Stop();
  const ModelStatsSnapshot stats = stats_->Snapshot();
  EXPECT_EQ(stats.phases.staged_ahead, 1u);
  EXPECT_EQ(stats.execution_count, 3u);
  EXPECT_EQ(stats.batches.count(8), 1u);  // the staged one
  EXPECT_EQ(stats.batches.count(3), 1u);  // the rest, formed when the instance was free
}

TEST_F(DynamicBatcherTest, DelayExpiryRunsOneBatchAndEachCallerGetsItsRows) {
  auto batcher = Make();
  Call a, b, c;
  batcher->Enqueue(Request(a, 1, 2, 10), &a.sink, Answer(a));
  batcher->Enqueue(Request(b, 3, 2, 20), &b.sink, Answer(b));  // carries its own batch dimension
  batcher->Enqueue(Request(c, 2, 2, 30), &c.sink, Answer(c));
  clock_.Advance(1s);
  batcher->Poke();
  auto ra = a.answer.get_future().get(), rb = b.answer.get_future().get(),
       rc = c.answer.get_future().get();
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  EXPECT_EQ(ra->outputs[0].shape, (Shape{1, 2}));
  EXPECT_EQ(rb->outputs[0].shape, (Shape{3, 2}));
  std::vector<int32_t> values(6);
  std::memcpy(values.data(), rb->outputs[0].data.data(), 24);
  EXPECT_EQ(values, std::vector<int32_t>(6, 20));
  EXPECT_EQ(echoes_[0]->batch_sizes(), (std::vector<int64_t>{6}));
  auto stats = stats_->Snapshot();
  EXPECT_EQ(stats.inference_count, 6u);
  EXPECT_EQ(stats.execution_count, 1u);
  EXPECT_EQ(stats.success.count, 3u);
  EXPECT_EQ(stats.batches.at(6).compute_infer.count, 1u);
}

TEST_F(DynamicBatcherTest, ABatchSizeLadderLimitsTheBatchesFormed) {
  auto batcher = Make();
  batcher->SetBatchSizeLadder({1, 2});  // as sluice.auto_batch_sizes sets it after warm-up
  Call calls[5];
  for (int i = 0; i < 5; ++i)
    batcher->Enqueue(Request(calls[i], 1, 2, i), &calls[i].sink, Answer(calls[i]));
  // Two rows are as full as the ladder goes: those batches run without waiting for the delay.
  ASSERT_TRUE(calls[3].answer.get_future().get().ok());
  clock_.Advance(1s);
  batcher->Poke();
  ASSERT_TRUE(calls[4].answer.get_future().get().ok());
  EXPECT_EQ(echoes_[0]->batch_sizes(), (std::vector<int64_t>{2, 2, 1}));
}

TEST_F(DynamicBatcherTest, AThrowingBatchFailsOnlyItsOwnRequests) {
  auto batcher = Make();
  Call poisoned, same_group, other_group;
  batcher->Enqueue(Request(poisoned, 1, 2, static_cast<int32_t>(0xEEEEEEEE)), &poisoned.sink,
                   Answer(poisoned));
  batcher->Enqueue(Request(same_group, 1, 2, 5), &same_group.sink, Answer(same_group));
  batcher->Enqueue(Request(other_group, 1, 3, 7), &other_group.sink,
                   Answer(other_group));  // another shape
  clock_.Advance(1s);
  batcher->Poke();
  EXPECT_THAT(poisoned.answer.get_future().get().status().message(), HasSubstr("poisoned row"));
  EXPECT_THAT(same_group.answer.get_future().get().status().message(), HasSubstr("poisoned row"));
  EXPECT_TRUE(other_group.answer.get_future().get().ok());  // the instance serves the next batch
  EXPECT_EQ(stats_->Snapshot().fail.count, 2u);
}

TEST_F(DynamicBatcherTest, DeadlineAndCancellationWhileQueuedNeverReachTheModel) {
  auto batcher = Make();
  Call late, cancelled;
  auto request = Request(late, 1, 2, 1);
  request->deadline = clock_.Now() + 10ms;
  batcher->Enqueue(std::move(request), &late.sink, Answer(late));
  auto flagged = Request(cancelled, 1, 2, 2);
  flagged->cancelled = std::make_shared<std::atomic<bool>>(false);
  auto flag = flagged->cancelled;
  batcher->Enqueue(std::move(flagged), &cancelled.sink, Answer(cancelled));
  flag->store(true);
  batcher->Poke();
  EXPECT_EQ(cancelled.answer.get_future().get().status().code(), absl::StatusCode::kCancelled);
  clock_.Advance(10ms);
  batcher->Poke();
  EXPECT_EQ(late.answer.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(echoes_[0]->batch_sizes().empty());
}

TEST_F(DynamicBatcherTest, FatalErrorsAreReported) {
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::make_unique<testing::FakeBackend>(
      [](const InferRequest&) -> StatusOr<std::vector<Tensor>> {
        return MarkFatal(
            absl::InternalError("CUDA error: an illegal memory access was encountered"));
      }));
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.clock = &clock_;
  options.on_fatal = [this](const Status& status) {
    fatal_.set_value(std::string(status.message()));
  };
  auto batcher = *DynamicBatcher::Create(Spec(), std::move(backends), options);
  Call call;
  batcher->Enqueue(Request(call, 1, 2, 1), &call.sink, Answer(call));
  EXPECT_THAT(call.answer.get_future().get().status().message(),
              HasSubstr("illegal memory access"));
  EXPECT_THAT(fatal_.get_future().get(), HasSubstr("illegal memory access"));
}

// Waits (yielding, not sleeping) until the batcher thread is in a wait it began after ending
// `after` waits.
DynamicBatcher::BatcherWaits WhenWaiting(const DynamicBatcher& batcher, uint64_t after = 0) {
  DynamicBatcher::BatcherWaits waits = batcher.Waits();
  while (!waits.waiting || waits.ended < after) {
    std::this_thread::yield();
    waits = batcher.Waits();
  }
  return waits;
}

TEST_F(DynamicBatcherTest, ArrivalsWhileEveryInstanceIsBusyWakeTheBatcherOnlyForAnEarlierDeadline) {
  testing::ThreadNotingEcho echo;
  std::unique_ptr<testing::FakeBackend> gated = echo.Backend();
  testing::FakeBackend* model = gated.get();
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::move(gated));
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.queue.max_queue_delay = 0s;
  options.clock = &clock_;
  options.stats = stats_;
  auto batcher = *DynamicBatcher::Create(Spec(), std::move(backends), options);

  model->CloseGate();
  Call first;
  batcher->Enqueue(Request(first, 1, 2, 1), &first.sink,
                   Answer(first));  // an instance idle: signals
  model->WaitStarted(1);            // the only instance is busy
  const DynamicBatcher::BatcherWaits busy = WhenWaiting(*batcher);
  EXPECT_EQ(busy.arrival_signals, 1u);
  Call queued[5];
  for (int i = 0; i < 5; ++i)
    batcher->Enqueue(Request(queued[i], 1, 2, 10 + i), &queued[i].sink, Answer(queued[i]));
  // Nothing the batcher could do: the instance going idle will wake it.
  EXPECT_EQ(batcher->Waits().arrival_signals, 1u);

  Call urgent;
  auto request = Request(urgent, 1, 2, 99);
  request->deadline = clock_.Now() + 1h;  // earlier than the batcher's plan (none)
  batcher->Enqueue(std::move(request), &urgent.sink, Answer(urgent));
  EXPECT_EQ(batcher->Waits().arrival_signals, 2u);
  WhenWaiting(*batcher, busy.ended + 1);  // it woke, planned its look at the deadline, and waits
  Call later;
  auto relaxed = Request(later, 1, 2, 100);
  relaxed->deadline = clock_.Now() + 2h;  // after the batcher's planned look (1 h)
  batcher->Enqueue(std::move(relaxed), &later.sink, Answer(later));
  EXPECT_EQ(batcher->Waits().arrival_signals, 2u);

  model->OpenGate();  // the instance goes idle: everything queued runs in one batch
  EXPECT_TRUE(first.answer.get_future().get().ok());
  for (Call& call : queued) EXPECT_TRUE(call.answer.get_future().get().ok());
  EXPECT_TRUE(urgent.answer.get_future().get().ok());
  EXPECT_TRUE(later.answer.get_future().get().ok());
  EXPECT_EQ(model->executed(), 2);
}

// preserve_ordering: the answer of a request that ends first on the second instance waits for the
// one taken into a batch before it; a request refused at arrival is answered at once.
TEST_F(DynamicBatcherTest, PreserveOrderingHoldsAnEarlyAnswerAndNeverARefusal) {
  testing::ThreadNotingEcho echo;
  std::vector<testing::FakeBackend*> models;
  std::vector<std::unique_ptr<ModelBackend>> backends;
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<testing::FakeBackend> gated = echo.Backend();
    gated->CloseGate();
    models.push_back(gated.get());
    backends.push_back(std::move(gated));
  }
  ModelSpec spec = Spec();
  spec.dynamic_batching.preserve_ordering = true;
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 1;
  options.queue.max_queue_delay = 0s;
  options.queue.max_requests = 1;
  options.clock = &clock_;
  options.stats = stats_;
  auto batcher = *DynamicBatcher::Create(spec, std::move(backends), options);
  std::mutex mutex;
  std::vector<int> answered;
  auto noting = [&](Call& call, int tag) {
    return [&, tag, done = Answer(call)](Status status) mutable {
      {
        std::lock_guard<std::mutex> lock(mutex);
        answered.push_back(tag);
      }
      done(std::move(status));
    };
  };
  auto running = [&] { return models[0]->started() + models[1]->started(); };
  const int warmed = running();
  Call first, second, queued, refused;
  batcher->Enqueue(Request(first, 1, 2, 1), &first.sink, noting(first, 1));
  while (running() < warmed + 1) std::this_thread::yield();
  testing::FakeBackend* first_model = models[0]->started() > 0 ? models[0] : models[1];
  testing::FakeBackend* second_model = first_model == models[0] ? models[1] : models[0];
  batcher->Enqueue(Request(second, 1, 2, 2), &second.sink, noting(second, 2));
  while (running() < warmed + 2) std::this_thread::yield();
  batcher->Enqueue(Request(queued, 1, 2, 3), &queued.sink, noting(queued, 3));  // waits: both busy
  batcher->Enqueue(Request(refused, 1, 2, 4), &refused.sink,
                   noting(refused, 4));  // over the cap of 1
  EXPECT_EQ(refused.answer.get_future().get().status().code(), absl::StatusCode::kUnavailable);
  second_model->OpenGate();  // "2" ends first, then "3" runs there and ends: both are held
  auto second_answer = second.answer.get_future();
  auto queued_answer = queued.answer.get_future();
  while (second_model->executed() < 2) std::this_thread::yield();
  EXPECT_EQ(second_answer.wait_for(50ms), std::future_status::timeout);
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(answered, std::vector<int>({4}));
  }
  first_model->OpenGate();
  EXPECT_TRUE(first.answer.get_future().get().ok());
  EXPECT_TRUE(second_answer.get().ok());
  EXPECT_TRUE(queued_answer.get().ok());
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(answered, std::vector<int>({4, 1, 2, 3}));
}

// A batcher over one ThreadNotingEcho instance.
struct ThreadNotingModel {
  testing::ThreadNotingEcho echo;
  testing::FakeBackend* backend = nullptr;

  std::unique_ptr<DynamicBatcher> Make(FakeTimeSource* clock, Duration delay) {
    std::unique_ptr<testing::FakeBackend> fake = echo.Backend();
    backend = fake.get();
    std::vector<std::unique_ptr<ModelBackend>> backends;
    backends.push_back(std::move(fake));
    DynamicBatcher::Options options;
    options.queue.max_batch_size = 8;
    options.queue.max_queue_delay = delay;
    options.clock = clock;
    return *DynamicBatcher::Create(Spec(), std::move(backends), options);
  }
  std::vector<std::thread::id> Threads() const { return echo.Threads(); }
};

TEST_F(DynamicBatcherTest, WithCallerRunsALoneRequestRunsOnTheEnqueuingThreadAndOthersQueue) {
  ThreadNotingModel model;
  auto batcher = model.Make(&clock_, 0s);
  batcher->SetCallerRuns(true);
  // The worker must be waiting for the claim: the first request may find it still starting.
  std::optional<std::thread::id> ran_here;
  for (int attempt = 0; attempt < 1000 && !ran_here; ++attempt) {
    Call call;
    auto request = Request(call, 1, 2, attempt);
    request->caller_may_run = true;
    batcher->Enqueue(std::move(request), &call.sink, Answer(call));
    auto answer = call.answer.get_future();
    answer.wait();
    ASSERT_TRUE(answer.get().ok());
    if (model.Threads().back() == std::this_thread::get_id()) ran_here = std::this_thread::get_id();
  }
  ASSERT_TRUE(ran_here.has_value());
  // A request from a front end that may not be held runs on the worker.
  Call http;
  batcher->Enqueue(Request(http, 1, 2, 7), &http.sink, Answer(http));
  ASSERT_TRUE(http.answer.get_future().get().ok());
  EXPECT_NE(model.Threads().back(), std::this_thread::get_id());
  // With the instance busy, a caller_may_run request queues and the worker runs it.
  model.backend->CloseGate();
  Call busy, queued;
  const int started = model.backend->started();
  batcher->Enqueue(Request(busy, 1, 2, 8), &busy.sink, Answer(busy));
  model.backend->WaitStarted(started + 1);
  auto request = Request(queued, 1, 2, 9);
  request->caller_may_run = true;
  batcher->Enqueue(std::move(request), &queued.sink,
                   Answer(queued));  // returns: it did not run here
  model.backend->OpenGate();
  ASSERT_TRUE(busy.answer.get_future().get().ok());
  ASSERT_TRUE(queued.answer.get_future().get().ok());
  EXPECT_NE(model.Threads().back(), std::this_thread::get_id());
  batcher->Stop();
}

TEST_F(DynamicBatcherTest, CallerRunsNeverSkipsTheQueueDelay) {
  ThreadNotingModel model;
  auto batcher = model.Make(&clock_, 1s);
  batcher->SetCallerRuns(true);
  Call call;
  auto request = Request(call, 1, 2, 1);
  request->caller_may_run = true;
  batcher->Enqueue(std::move(request), &call.sink, Answer(call));
  auto answer = call.answer.get_future();
  EXPECT_EQ(answer.wait_for(std::chrono::seconds(0)),
            std::future_status::timeout);  // waits for company
  clock_.Advance(1s);
  batcher->Poke();
  ASSERT_TRUE(answer.get().ok());
  EXPECT_NE(model.Threads().back(), std::this_thread::get_id());
}

TEST_F(DynamicBatcherTest, StopAnswersEverythingQueued) {
  auto batcher = Make();
  Call a, b;
  batcher->Enqueue(Request(a, 1, 2, 1), &a.sink, Answer(a));
  batcher->Enqueue(Request(b, 1, 5, 2), &b.sink, Answer(b));
  batcher->Stop();
  EXPECT_EQ(a.answer.get_future().get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.answer.get_future().get().status().code(), absl::StatusCode::kUnavailable);
  Call late;
  batcher->Enqueue(Request(late, 1, 2, 3), &late.sink, Answer(late));
  EXPECT_THAT(late.answer.get_future().get().status().message(), HasSubstr("shutting down"));
}

TEST_F(DynamicBatcherTest, StagingIsReusedAcrossManyBatches) {
  auto batcher = Make(/*instances=*/1, /*delay=*/0s);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < 1 + round % 3; ++i) {
      calls.push_back(std::make_unique<Call>());
      batcher->Enqueue(Request(*calls.back(), 1 + i, 4, round), &(*calls.back()).sink,
                       Answer(*calls.back()));
    }
    for (auto& call : calls) ASSERT_TRUE(call->answer.get_future().get().ok());
  }
  // One input, so at most one allocation per growth: a handful, not one per batch.
  EXPECT_LE(batcher->StagingAllocations(), 3u);
  EXPECT_EQ(static_cast<size_t>(echoes_[0]->staging_allocations()), batcher->StagingAllocations());
}

TEST_F(DynamicBatcherTest, EachCallerGetsOnlyTheOutputsItAskedForWrittenOnce) {
  std::vector<std::unique_ptr<ModelBackend>> backends;
  auto echo = std::make_unique<testing::EchoBackend>(/*with_sum=*/true);
  testing::EchoBackend* model = echo.get();
  backends.push_back(std::move(echo));
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.queue.max_queue_delay = 1s;
  options.clock = &clock_;
  ModelSpec spec = Spec();
  spec.outputs.push_back({"sum", DataType::kInt64, {1}});
  auto batcher = *DynamicBatcher::Create(spec, std::move(backends), options);
  Call a, b, c;
  auto only_sum = Request(a, 1, 2, 10);
  only_sum->requested_outputs = {"sum"};
  auto every = Request(b, 3, 2, 20);  // no outputs named: every output, in config order
  auto reversed = Request(c, 2, 2, 30);
  reversed->requested_outputs = {"sum", "y"};
  batcher->Enqueue(std::move(only_sum), &a.sink, Answer(a));
  batcher->Enqueue(std::move(every), &b.sink, Answer(b));
  batcher->Enqueue(std::move(reversed), &c.sink, Answer(c));
  clock_.Advance(1s);
  batcher->Poke();
  auto ra = a.answer.get_future().get(), rb = b.answer.get_future().get(),
       rc = c.answer.get_future().get();
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  EXPECT_EQ(model->batch_sizes(), (std::vector<int64_t>{6}));  // one forward pass for all three
  ASSERT_EQ(ra->outputs.size(), 1u);
  EXPECT_EQ(ra->outputs[0].name, "sum");
  EXPECT_EQ(ra->outputs[0].shape, (Shape{1, 1}));
  int64_t sum = 0;
  std::memcpy(&sum, ra->outputs[0].data.data(), 8);
  EXPECT_EQ(sum, 20);  // the bytes of [10, 10]
  ASSERT_EQ(rb->outputs.size(), 2u);
  EXPECT_EQ(rb->outputs[0].name, "y");
  EXPECT_EQ(rb->outputs[1].shape, (Shape{3, 1}));
  ASSERT_EQ(rc->outputs.size(), 2u);
  EXPECT_EQ(rc->outputs[0].name, "sum");  // the caller's order
  EXPECT_EQ(rc->outputs[1].name, "y");
  EXPECT_EQ(rc->outputs[1].shape, (Shape{2, 2}));
  // Each requested output reaches its caller's sink in one copy, and nothing else is copied:
  // a: sum 8 bytes; b: y 24 + sum 24; c: sum 16 + y 16.
  EXPECT_EQ(model->bytes_copied(), 88u);
  EXPECT_EQ(a.sink.bytes() + b.sink.bytes() + c.sink.bytes(), 88u);
}

// Without dynamic_batching: the same batcher, one request per forward pass.
std::unique_ptr<DynamicBatcher> MakeUnbatched(std::unique_ptr<ModelBackend> backend,
                                              const TimeSource* clock, size_t max_requests = 1024) {
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::move(backend));
  DynamicBatcher::Options options;
  options.queue.one_request_per_batch = true;
  options.queue.max_batch_size = 8;
  options.queue.max_requests = max_requests;
  options.clock = clock;
  return *DynamicBatcher::Create(Spec(), std::move(backends), options);
}

TEST_F(DynamicBatcherTest, WithoutDynamicBatchingEachRequestRunsAloneWithItsOwnBatchSize) {
  auto echo = std::make_unique<testing::EchoBackend>();
  testing::EchoBackend* model = echo.get();
  auto batcher = MakeUnbatched(std::move(echo), &clock_);
  // Warm-up takes the path requests take: alone, on their own bytes, no staging.
  ASSERT_TRUE(batcher->WarmUp(testing::ZeroWarmup(4, 2), nullptr).ok());
  Call a, b, c;
  batcher->Enqueue(Request(a, 3, 2, 1), &a.sink, Answer(a));
  batcher->Enqueue(Request(b, 1, 5, 2), &b.sink, Answer(b));
  batcher->Enqueue(Request(c, 2, 2, 3), &c.sink, Answer(c));
  auto rb = b.answer.get_future().get();
  ASSERT_TRUE(a.answer.get_future().get().ok() && rb.ok() && c.answer.get_future().get().ok());
  EXPECT_EQ(rb->outputs[0].shape, (Shape{1, 5}));
  EXPECT_EQ(model->batch_sizes(),
            (std::vector<int64_t>{4, 3, 1, 2}));  // warm-up, then arrival order, never merged
  EXPECT_EQ(batcher->StagingAllocations(), 0u);   // a lone request runs on its own bytes
}

TEST_F(DynamicBatcherTest, WithoutDynamicBatchingQueueCapsAndExpiryApply) {
  auto gated = std::make_unique<testing::FakeBackend>();
  testing::FakeBackend* model = gated.get();
  model->CloseGate();
  auto batcher = MakeUnbatched(std::move(gated), &clock_, /*max_requests=*/1);
  Call running, waiting, rejected;
  batcher->Enqueue(Request(running, 1, 2, 1), &running.sink, Answer(running));
  model->WaitStarted(1);
  auto expiring = Request(waiting, 1, 2, 2);
  expiring->deadline = clock_.Now() + 10ms;
  batcher->Enqueue(std::move(expiring), &waiting.sink, Answer(waiting));
  batcher->Enqueue(Request(rejected, 1, 2, 3), &rejected.sink, Answer(rejected));
  auto full = rejected.answer.get_future().get();
  EXPECT_EQ(full.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(full.status().message(), HasSubstr("requests waiting (its max_queue_size)"));
  // The expiry timer answers the waiting request while the instance is still busy.
  clock_.Advance(10ms);
  batcher->Poke();
  EXPECT_EQ(waiting.answer.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  model->OpenGate();
  EXPECT_TRUE(running.answer.get_future().get().ok());
  EXPECT_EQ(model->executed(), 1);
}

// 64 threads x N requests with random sizes, shapes, deadlines and cancellations on the real
// clock. Invariant: every request is answered exactly once, and a successful answer carries its
// own data. N: SLUICE_STRESS_REQUESTS (default 1000).
// 64 threads, each sending `per_thread` requests of random shapes (some expiring, some cancelled)
// to a batcher of three echo instances: every request is answered exactly once, with its own rows.
// Returns how many batches were staged ahead.
uint64_t StressEveryRequestAnswered(bool stage_ahead, int per_thread) {
  constexpr int kThreads = 64;
  SteadyTimeSource clock;
  std::vector<std::unique_ptr<ModelBackend>> backends;
  for (int i = 0; i < 3; ++i) backends.push_back(std::make_unique<testing::EchoBackend>());
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.queue.max_queue_delay = 200us;
  options.queue.preferred_batch_sizes = {4, 8};
  options.queue.max_requests = 100000;
  options.queue.max_bytes = size_t{1} << 30;
  options.queue.max_groups = 8;
  options.clock = &clock;
  options.stage_ahead = stage_ahead;
  auto stats = std::make_shared<ModelStats>();
  options.stats = stats;
  auto batcher = *DynamicBatcher::Create(Spec(), std::move(backends), options);

  struct Slot {
    std::vector<int32_t> data;
    TensorSink sink;
    std::atomic<int> answers{0};
    std::atomic<bool> correct{false};
    std::atomic<int> code{-1};
  };
  std::vector<Slot> slots(static_cast<size_t>(kThreads * per_thread));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < per_thread; ++i) {
        const int index = t * per_thread + i;
        Slot& slot = slots[static_cast<size_t>(index)];
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
        const int64_t width = 1 + static_cast<int64_t>(rng() % 3);
        slot.data.assign(static_cast<size_t>(rows * width), index);
        auto request = std::make_unique<InferRequest>();
        request->model_name = "m";
        request->batch_size = rows;
        request->inputs.push_back({"x",
                                   DataType::kInt32,
                                   {rows, width},
                                   reinterpret_cast<const char*>(slot.data.data()),
                                   slot.data.size() * 4,
                                   {}});
        const unsigned dice = rng() % 10;
        if (dice == 0) request->deadline = clock.Now();  // already due: must expire
        std::shared_ptr<std::atomic<bool>> cancel;
        if (dice == 1) {
          cancel = std::make_shared<std::atomic<bool>>(false);
          request->cancelled = cancel;
        }
        batcher->Enqueue(std::move(request), &slot.sink, [&slot, index](Status status) {
          slot.answers.fetch_add(1);
          slot.code.store(static_cast<int>(status.code()));
          if (status.ok()) {
            const Tensor& y = slot.sink.outputs().at(0);
            bool mine = y.data.size() == slot.data.size() * 4;
            for (size_t k = 0; mine && k < slot.data.size(); ++k) {
              int32_t value;
              std::memcpy(&value, y.data.data() + k * 4, 4);
              mine = value == index;
            }
            slot.correct.store(mine);
          }
        });
        if (cancel) {
          cancel->store(true);
          batcher->Poke();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Wait until every request has been answered (bounded: the batcher runs on the real clock).
  // Under ThreadSanitizer on two cores the whole run takes 110-125 s, so the bound is generous.
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  for (Slot& slot : slots) {
    while (slot.answers.load() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  batcher->Stop();
  size_t ok = 0, expired = 0, cancelled = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i].answers.load(), 1) << "request " << i;
    const auto code = static_cast<absl::StatusCode>(slots[i].code.load());
    if (code == absl::StatusCode::kOk) {
      EXPECT_TRUE(slots[i].correct.load()) << "request " << i << " got someone else's rows";
      ++ok;
    } else if (code == absl::StatusCode::kDeadlineExceeded) {
      ++expired;
    } else {
      EXPECT_EQ(code, absl::StatusCode::kCancelled) << "request " << i;
      ++cancelled;
    }
    if (::testing::Test::HasFailure()) break;  // one request's story is enough
  }
  EXPECT_GT(ok, slots.size() / 2);
  EXPECT_GT(expired, 0u);
  EXPECT_EQ(ok + expired + cancelled, slots.size());
  return stats->Snapshot().phases.staged_ahead;
}

int StressRequests(int plain) {
  return std::getenv("SLUICE_STRESS_REQUESTS") ? std::atoi(std::getenv("SLUICE_STRESS_REQUESTS"))
                                               : plain;
}

TEST(DynamicBatcherStressTest, EveryRequestAnsweredExactlyOnceWithItsOwnResult) {
  EXPECT_EQ(StressEveryRequestAnswered(/*stage_ahead=*/false, StressRequests(1000)), 0u);
}

// The same with batches staged behind running ones: full batches (8 rows) form while the three
// instances are busy, and the stagers assemble them beside the workers.
TEST(DynamicBatcherStressTest, WithStagingAheadEveryRequestAnsweredExactlyOnce) {
  const uint64_t staged =
      StressEveryRequestAnswered(/*stage_ahead=*/true, StressRequests(1000) / 2);
  std::cout << "batches staged ahead: " << staged << "\n";
  // 16,000 requests or more from 64 threads keep the three instances busy while full batches
  // wait: hundreds are staged in every run seen (205 to 1,450), so none means staging broke.
  EXPECT_GT(staged, 0u);
}

}  // namespace
}  // namespace sluice
