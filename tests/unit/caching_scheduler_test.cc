// The response cache as a scheduler decorator (CachingScheduler) over a fake inner scheduler:
// hits answered without reaching it, identical misses sharing one run, the rest forwarded, and
// Stop dropping the version's answers.
#include <cstring>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/core/output_sink.h"
#include "server/manager/caching_scheduler.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

// Holds every request it is given until the test answers it; counts what is forwarded to it.
class HeldInner final : public Scheduler, public QueueSharing {
 public:
  struct Run {
    std::unique_ptr<InferRequest> request;
    OutputSink* sink = nullptr;
    InferCompletion done;
  };
  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override {
    runs.push_back({std::move(request), sink, std::move(done)});
  }
  void Poke() override { ++pokes; }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    ++warm_ups;
    return WarmupReport{};
  }
  void SetCallerRuns(bool allowed) override { caller_runs = allowed; }
  void SetBatchSizeLadder(std::vector<int> sizes) override { ladder = std::move(sizes); }
  void Stop() override {
    ++stops;
    for (Run& run : runs) {
      if (run.done) run.done(ShutdownStatus());
    }
  }
  Status AdmitWaiter(const InferRequest&) override {
    ++waiters;
    return absl::OkStatus();
  }
  void ReleaseWaiter(int, size_t) override { --waiters; }
  bool Reschedule(const std::atomic<bool>*, int, TimePoint, TimePoint) override { return true; }
  uint64_t AnswersGeneration() const override { return generation; }

  // Writes `bytes` as run `index`'s one output "y" and answers it.
  void Answer(size_t index, const std::string& bytes) {
    Run& run = runs.at(index);
    const Shape shape = {static_cast<int64_t>(bytes.size())};
    StatusOr<char*> memory =
        run.sink->Allocate({"y", DataType::kUint8, shape, bytes.size(), MemoryType::kCpu});
    ASSERT_TRUE(memory.ok()) << memory.status();
    std::memcpy(*memory, bytes.data(), bytes.size());
    std::exchange(run.done, nullptr)(absl::OkStatus());
  }

  std::vector<Run> runs;
  uint64_t generation = 0;
  int pokes = 0, warm_ups = 0, stops = 0, waiters = 0;
  bool caller_runs = false;
  std::vector<int> ladder;
};

class CachingSchedulerTest : public ::testing::Test {
 protected:
  CachingSchedulerTest() : cache_(std::make_shared<ResponseCache>(1 << 20)) {
    auto inner = std::make_unique<HeldInner>();
    inner_ = inner.get();
    CachingScheduler::Options options;
    options.model = "m";
    options.output_names = {"y"};
    options.clock = &clock_;
    options.stats = stats_;
    options.cache = cache_;
    options.queue = inner_;
    scheduler_ = std::make_unique<CachingScheduler>(std::move(options), std::move(inner));
  }

  struct Call {
    std::string input = "abcdefgh";
    TensorSink sink;
    std::optional<Status> answer;
  };
  void Send(Call& call) {
    auto request = std::make_unique<InferRequest>();
    request->model_name = "m";
    request->inputs.push_back({"x",
                               DataType::kUint8,
                               {static_cast<int64_t>(call.input.size())},
                               call.input.data(),
                               call.input.size(),
                               {}});
    scheduler_->Enqueue(std::move(request), &call.sink,
                        [&call](Status status) { call.answer = std::move(status); });
  }

  FakeTimeSource clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  std::shared_ptr<ResponseCache> cache_;
  HeldInner* inner_ = nullptr;
  std::unique_ptr<CachingScheduler> scheduler_;
};

TEST_F(CachingSchedulerTest, AMissRunsOnceAndAnIdenticalRequestIsThenAnsweredFromTheCache) {
  Call first, second;
  Send(first);
  ASSERT_EQ(inner_->runs.size(), 1u);
  inner_->Answer(0, "answer");
  ASSERT_TRUE(first.answer.has_value() && first.answer->ok());
  EXPECT_EQ(first.sink.outputs().at(0).data, "answer");
  Send(second);
  EXPECT_EQ(inner_->runs.size(), 1u);  // not run again
  ASSERT_TRUE(second.answer.has_value() && second.answer->ok());
  EXPECT_EQ(second.sink.outputs().at(0).data, "answer");
  EXPECT_EQ(stats_->Snapshot().cache_hit.count, 1u);
}

// An ensemble step's held input (a composing model with a response cache) comes to the host for
// the key, counted as copied through the host: the same input held or as bytes is one entry.
TEST_F(CachingSchedulerTest, AHeldInputIsKeyedByItsBytes) {
  Call first;
  Send(first);
  inner_->Answer(0, "answer");
  auto held = std::make_shared<testing::HostHeldTensor>(DataType::kUint8, Shape{8}, "abcdefgh",
                                                        /*device=*/0);
  auto ledger = std::make_shared<CopyLedger>();
  held->set_ledger(ledger);
  auto request = std::make_unique<InferRequest>();
  request->model_name = "m";
  request->inputs.push_back({"x", DataType::kUint8, {8}, nullptr, 8, {HeldRows{0, held}}});
  TensorSink sink;
  std::optional<Status> answer;
  scheduler_->Enqueue(std::move(request), &sink, [&](Status status) { answer = status; });
  EXPECT_EQ(inner_->runs.size(), 1u);  // a hit
  ASSERT_TRUE(answer.has_value() && answer->ok());
  EXPECT_EQ(sink.outputs().at(0).data, "answer");
  EXPECT_EQ(ledger->through_host.load(), 8u);
}

// An ensemble's answers change when a model its steps run changes (AnswersGeneration): the
// answers cached before are not given after, and the next run's answer is cached again.
TEST_F(CachingSchedulerTest, ANewAnswersGenerationDropsWhatWasCached) {
  Call first, second, third, stale_run;
  Send(first);
  inner_->Answer(0, "old");
  inner_->generation = 1;
  Send(second);
  ASSERT_EQ(inner_->runs.size(), 2u);  // ran again
  inner_->Answer(1, "new");
  EXPECT_EQ(second.sink.outputs().at(0).data, "new");
  Send(third);
  EXPECT_EQ(inner_->runs.size(), 2u);  // the new answer is cached
  ASSERT_TRUE(third.answer.has_value());
  EXPECT_EQ(third.sink.outputs().at(0).data, "new");
  // A run that began under generation 1 and answers after 2 began is never found.
  stale_run.input = "another!";
  Send(stale_run);
  inner_->generation = 2;
  Call fresh;
  fresh.input = "another!";
  Send(fresh);  // a new namespace: its own run
  ASSERT_EQ(inner_->runs.size(), 4u);
  inner_->Answer(2, "stale");
  inner_->Answer(3, "fresh");
  Call after;
  after.input = "another!";
  Send(after);
  EXPECT_EQ(inner_->runs.size(), 4u);
  EXPECT_EQ(after.sink.outputs().at(0).data, "fresh");
}

TEST_F(CachingSchedulerTest, IdenticalMissesShareOneRunAndCountTheWaitersInTheInnerQueue) {
  Call first, second, other;
  other.input = "12345678";
  Send(first);
  Send(second);
  Send(other);
  ASSERT_EQ(inner_->runs.size(), 2u);  // one per distinct request
  EXPECT_EQ(inner_->waiters, 1);       // the second waits outside, counted in the inner's caps
  inner_->Answer(0, "first");
  ASSERT_TRUE(second.answer.has_value() && second.answer->ok());
  EXPECT_EQ(second.sink.outputs().at(0).data, "first");
  EXPECT_EQ(inner_->waiters, 0);
  EXPECT_FALSE(other.answer.has_value());
  scheduler_->Stop();
  ASSERT_TRUE(other.answer.has_value());
  EXPECT_EQ(other.answer->code(), absl::StatusCode::kUnavailable);
}

TEST_F(CachingSchedulerTest, EverythingElseIsTheInnerSchedulersAndStopDropsTheAnswers) {
  scheduler_->SetCallerRuns(true);
  scheduler_->SetBatchSizeLadder({1, 4});
  ASSERT_TRUE(scheduler_->WarmUp({}, nullptr).ok());
  scheduler_->Poke();
  EXPECT_TRUE(inner_->caller_runs);
  EXPECT_THAT(inner_->ladder, ::testing::ElementsAre(1, 4));
  EXPECT_EQ(inner_->warm_ups, 1);
  EXPECT_EQ(inner_->pokes, 1);
  Call first;
  Send(first);
  inner_->Answer(0, "answer");
  EXPECT_EQ(cache_->Stats().entries, 1u);
  scheduler_->Stop();
  scheduler_->Stop();  // idempotent
  EXPECT_EQ(inner_->stops, 1);
  EXPECT_EQ(cache_->Stats().entries, 0u);
}

}  // namespace
}  // namespace sluice
