// SingleFlight against a scheduler that holds what it is given, on a fake clock: identical
// requests share one run, each waiter keeps its own deadline, caller and priority, and counts in
// the caps; the run is dropped only when every waiter has gone.
#include "server/manager/single_flight.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/manager/response_cache.h"

namespace sluice {
namespace {

using std::chrono::microseconds;

// Keeps every request it is given; counts waiters against a cap; notes Reschedule and Poke.
class HeldRuns final : public Scheduler, public QueueSharing {
 public:
  struct Run {
    std::unique_ptr<InferRequest> request;
    OutputSink* sink = nullptr;
    InferCompletion done;
  };
  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override {
    if (refuse_runs) {
      done(absl::UnavailableError("queue full"));
      return;
    }
    runs.push_back({std::move(request), sink, std::move(done)});
  }
  Status AdmitWaiter(const InferRequest& request) override {
    if (waiters >= waiter_cap)
      return absl::UnavailableError("model 'm' has too many requests waiting");
    ++waiters;
    waiter_bytes += request.InputBytes();
    return absl::OkStatus();
  }
  void ReleaseWaiter(int, size_t bytes) override {
    --waiters;
    waiter_bytes -= bytes;
  }
  bool Reschedule(const std::atomic<bool>* tag, int level, TimePoint deadline,
                  TimePoint delay_after) override {
    reschedules.push_back({tag, level, deadline, delay_after});
    return true;
  }
  void Poke() override { ++pokes; }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    return WarmupReport{};
  }
  void SetBatchSizeLadder(std::vector<int>) override {}
  void SetCallerRuns(bool) override {}
  void Stop() override {}

  // Writes `bytes` as the run's one output "y" and answers it.
  void Answer(size_t index, const std::string& bytes) {
    Run& run = runs.at(index);
    const std::string name = "y";
    const Shape shape = {static_cast<int64_t>(bytes.size())};
    StatusOr<char*> memory =
        run.sink->Allocate({name, DataType::kUint8, shape, bytes.size(), MemoryType::kCpu});
    ASSERT_TRUE(memory.ok()) << memory.status();
    std::memcpy(*memory, bytes.data(), bytes.size());
    run.done(absl::OkStatus());
  }

  struct Rescheduled {
    const std::atomic<bool>* tag;
    int level;
    TimePoint deadline;
    TimePoint delay_after;
  };
  std::vector<Run> runs;
  std::vector<Rescheduled> reschedules;
  size_t waiter_cap = 100;
  size_t waiters = 0;
  size_t waiter_bytes = 0;
  int pokes = 0;
  bool refuse_runs = false;
};

// One caller: its request's bytes, its sink, and its answer once it comes.
struct Caller {
  explicit Caller(std::string input = "abcdefgh") : input(std::move(input)) {}
  std::string input;
  TensorSink sink;
  std::optional<Status> answer;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  std::string Output() { return sink.outputs().empty() ? "" : sink.outputs()[0].data; }
};

class SingleFlightTest : public ::testing::Test {
 protected:
  SingleFlightTest() : cache_(1 << 20), space_(cache_.OpenNamespace()) {
    SingleFlight::Options options;
    options.model = "m";
    options.clock = &clock_;
    options.scheduler = &scheduler_;
    options.queue = &scheduler_;
    options.stats = &stats_;
    options.keep = [this](const ResponseCache::Key&, absl::Span<const OutputView> outputs) {
      kept_.push_back(outputs.empty() ? "" : std::string(outputs[0].bytes));
      kept_at_ = outputs.empty() ? nullptr : outputs[0].bytes.data();
    };
    flights_ = std::make_unique<SingleFlight>(std::move(options));
  }
  ~SingleFlightTest() override { flights_->Stop(); }

  // Submits `caller`'s request (at `level`, until `deadline`) as ModelHandle does after a miss.
  void Submit(Caller& caller, int level = 0, TimePoint deadline = kNoDeadline,
              bool shared_memory = false, TimePoint delay_after = kNoDeadline) {
    auto request = std::make_unique<InferRequest>();
    request->model_name = "m";
    request->inputs.push_back({"x",
                               DataType::kUint8,
                               {static_cast<int64_t>(caller.input.size())},
                               caller.input.data(),
                               caller.input.size(),
                               {}});
    request->priority_level = level;
    request->deadline = deadline;
    request->delay_after = delay_after;
    request->cancelled = caller.cancelled;
    request->shared_memory = shared_memory;
    ResponseCache::Key key = cache_.MakeKey(space_, *request);
    flights_->Submit(
        std::move(key), std::move(request), &caller.sink,
        [&caller](Status status) { caller.answer = std::move(status); }, Duration::zero());
  }
  // Lets the flights' thread catch up with the clock or a Poke.
  void Settle() { ASSERT_TRUE(clock_.AwaitWaiting(1)); }

  FakeTimeSource clock_;
  HeldRuns scheduler_;
  ModelStats stats_;
  ResponseCache cache_;
  const uint64_t space_;
  std::vector<std::string> kept_;
  const char* kept_at_ = nullptr;  // where the last answer kept was written
  std::unique_ptr<SingleFlight> flights_;
};

TEST_F(SingleFlightTest, IdenticalRequestsShareOneRunAndEachGetsItsAnswer) {
  Caller first, second, third, other("different");
  Submit(first);
  Submit(second);
  Submit(third);
  Submit(other);
  ASSERT_EQ(scheduler_.runs.size(), 2u);  // one per distinct request
  EXPECT_EQ(flights_->flights(), 2u);
  EXPECT_EQ(flights_->waiters(), 4u);
  EXPECT_EQ(scheduler_.waiters,
            2u);  // the run counts for the first; the two that joined count here
  EXPECT_EQ(scheduler_.waiter_bytes, 16u);
  EXPECT_FALSE(first.answer || second.answer || third.answer);

  scheduler_.Answer(0, "answer");
  for (Caller* caller : {&first, &second, &third}) {
    ASSERT_TRUE(caller->answer && caller->answer->ok());
    EXPECT_EQ(caller->Output(), "answer");
  }
  EXPECT_FALSE(other.answer);
  EXPECT_EQ(kept_, std::vector<std::string>{"answer"});  // the cache keeps it once
  EXPECT_EQ(scheduler_.waiters, 0u);
  EXPECT_EQ(scheduler_.waiter_bytes, 0u);
  EXPECT_EQ(flights_->flights(), 1u);

  // Once answered, the key starts a new flight.
  Caller later;
  Submit(later);
  EXPECT_EQ(scheduler_.runs.size(), 3u);
  scheduler_.Answer(1, "other");
  scheduler_.Answer(2, "again");
  EXPECT_EQ(later.Output(), "again");
  const ModelStatsSnapshot stats = stats_.Snapshot();
  EXPECT_EQ(stats.success.count, 2u);     // the shared answers; the runs' own are the scheduler's
  EXPECT_EQ(stats.cache_miss.count, 3u);  // one per run
}

TEST_F(SingleFlightTest, TheRunReadsItsInputsFromTheKeyAlignedNotFromItsCaller) {
  Caller first;
  Submit(first);
  ASSERT_EQ(scheduler_.runs.size(), 1u);
  const TensorView& input = scheduler_.runs[0].request->inputs[0];
  EXPECT_NE(input.data, first.input.data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(input.data) % alignof(std::max_align_t), 0u);
  first.input.assign("XXXXXXXX");  // the caller's bytes may go once it has gone
  EXPECT_EQ(std::string(input.data, input.byte_size), "abcdefgh");
  EXPECT_NE(scheduler_.runs[0].request->cancelled, first.cancelled);  // the run's own flag
  scheduler_.Answer(0, "a");
}

TEST_F(SingleFlightTest, TheFirstWaiterGetsTheOutputsWrittenAndTheOthersACopy) {
  Caller shared_memory, plain, joined;
  Submit(shared_memory, 0, kNoDeadline, /*shared_memory=*/true);
  Submit(plain);
  Submit(joined);
  scheduler_.Answer(0, "answer");
  // The run wrote into the first waiter whose outputs are not in shared memory (one copy less);
  // the others, and the cache, copied from there.
  ASSERT_EQ(plain.sink.outputs().size(), 1u);
  EXPECT_EQ(kept_at_, plain.sink.outputs()[0].data.data());
  for (Caller* caller : {&shared_memory, &plain, &joined}) {
    ASSERT_TRUE(caller->answer && caller->answer->ok());
    EXPECT_EQ(caller->Output(), "answer");
  }
}

TEST_F(SingleFlightTest, AWaiterTheCapsRefuseIsAnsweredUnavailableAndTheOthersWait) {
  scheduler_.waiter_cap = 1;
  Caller first, second, refused;
  Submit(first);
  Submit(second);
  Submit(refused);
  ASSERT_TRUE(refused.answer.has_value());
  EXPECT_EQ(refused.answer->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stats_.Snapshot().fail.count, 1u);
  scheduler_.Answer(0, "a");
  EXPECT_TRUE(first.answer->ok() && second.answer->ok());
  EXPECT_EQ(scheduler_.waiters, 0u);
}

TEST_F(SingleFlightTest, TheRunTakesTheHighestPriorityAndTheLatestDeadlineOfItsWaiters) {
  const TimePoint now = clock_.Now();
  Caller first, urgent, patient, none;
  Submit(first, 3, now + microseconds(100));
  Submit(urgent, 1, now + microseconds(50));
  ASSERT_EQ(scheduler_.reschedules.size(), 1u);
  const std::atomic<bool>* tag = scheduler_.runs[0].request->cancelled.get();
  EXPECT_EQ(scheduler_.reschedules[0].tag, tag);
  EXPECT_EQ(scheduler_.reschedules[0].level, 1);
  EXPECT_EQ(scheduler_.reschedules[0].deadline, now + microseconds(100));
  Submit(patient, 2, now + microseconds(400));
  ASSERT_EQ(scheduler_.reschedules.size(), 2u);
  EXPECT_EQ(scheduler_.reschedules[1].level, 1);  // never lowered
  EXPECT_EQ(scheduler_.reschedules[1].deadline, now + microseconds(400));
  Submit(none, 2);
  ASSERT_EQ(scheduler_.reschedules.size(), 3u);
  EXPECT_EQ(scheduler_.reschedules[2].deadline, kNoDeadline);
  EXPECT_EQ(scheduler_.reschedules[2].delay_after, kNoDeadline);
  scheduler_.Answer(0, "a");

  // DELAY: the run is demoted only from the latest waiter's DELAY timeout.
  Caller delayed, later;
  Submit(delayed, 2, kNoDeadline, false, now + microseconds(100));
  Submit(later, 2, kNoDeadline, false, now + microseconds(900));
  ASSERT_EQ(scheduler_.reschedules.size(), 4u);
  EXPECT_EQ(scheduler_.reschedules[3].delay_after, now + microseconds(900));
  scheduler_.Answer(1, "b");
}

TEST_F(SingleFlightTest, EachWaiterKeepsItsOwnDeadline) {
  const TimePoint now = clock_.Now();
  Caller first, soon, never;
  Submit(first, 0, now + microseconds(100));
  Submit(soon, 0, now + microseconds(300));
  Submit(never);
  Settle();
  // The run now waits with no deadline; the first waiter's still holds for it.
  clock_.Advance(microseconds(150));
  Settle();
  ASSERT_TRUE(first.answer.has_value());
  EXPECT_EQ(first.answer->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(soon.answer || never.answer);
  clock_.Advance(microseconds(200));
  Settle();
  ASSERT_TRUE(soon.answer.has_value());
  EXPECT_EQ(soon.answer->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(never.answer);
  EXPECT_FALSE(scheduler_.runs[0].request->cancelled->load());
  // The run stood for the first waiter and now stands for the last: only it counts in the caps.
  EXPECT_EQ(scheduler_.waiters, 0u);
  scheduler_.Answer(0, "a");
  ASSERT_TRUE(never.answer && never.answer->ok());
  EXPECT_EQ(never.Output(), "a");
  EXPECT_EQ(stats_.Snapshot().fail.count, 2u);  // the run records the last one
}

TEST_F(SingleFlightTest, ACancelLeavesTheOthersWaitingAndTheLastOneCancelsTheRun) {
  Caller first, second, third;
  Submit(first);
  Submit(second);
  Submit(third);
  first.cancelled->store(true);
  flights_->Poke();
  Settle();
  ASSERT_TRUE(first.answer.has_value());
  EXPECT_EQ(first.answer->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(scheduler_.waiters, 1u);  // the run stands for the second now
  second.cancelled->store(true);
  flights_->Poke();
  Settle();
  EXPECT_EQ(second.answer->code(), absl::StatusCode::kCancelled);
  const auto& run_cancelled = scheduler_.runs[0].request->cancelled;
  EXPECT_FALSE(run_cancelled->load());
  EXPECT_EQ(scheduler_.pokes, 0);

  // The last one goes: the run is cancelled, and the scheduler answers it (its last waiter) so.
  third.cancelled->store(true);
  flights_->Poke();
  Settle();
  EXPECT_TRUE(run_cancelled->load());
  EXPECT_EQ(scheduler_.pokes, 1);
  EXPECT_FALSE(third.answer);
  EXPECT_EQ(flights_->flights(), 0u);  // an identical request now starts a new run
  Caller fresh;
  Submit(fresh);
  EXPECT_EQ(scheduler_.runs.size(), 2u);
  scheduler_.runs[0].done(absl::CancelledError("cancelled while queued"));
  EXPECT_EQ(third.answer->code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(fresh.answer);
  scheduler_.Answer(1, "b");
  EXPECT_TRUE(fresh.answer->ok());
}

TEST_F(SingleFlightTest, AFailedOrRefusedRunAnswersEveryWaiterWithItsError) {
  Caller first, second;
  Submit(first);
  Submit(second);
  scheduler_.runs[0].done(absl::InternalError("model failed"));
  EXPECT_EQ(first.answer->code(), absl::StatusCode::kInternal);
  EXPECT_EQ(second.answer->code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(kept_.empty());
  EXPECT_EQ(scheduler_.waiters, 0u);

  scheduler_.refuse_runs = true;
  Caller refused;
  Submit(refused);
  EXPECT_EQ(refused.answer->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(flights_->flights(), 0u);
}

}  // namespace
}  // namespace sluice
