// Batching to a latency target (sluice.latency_target_us): BatchFormer's decisions with a fake
// clock and costs given by hand, then the threaded batcher learning costs from its workers.
#include <future>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_former.h"
#include "server/batching/dynamic_batcher.h"
#include "tests/unit/batch_former_fixture.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Pick = BatchCostModel::Pick;

constexpr char kGroup[] = "x[2,]";  // the fixture's requests: input "x", rows of 2 values

class LatencyTargetQueueTest : public testing::BatchFormerFixture {
 protected:
  // Target 1 ms, one instance, no max_queue_delay unless a test sets one; the caller seeds costs.
  BatchFormer::Options TargetOptions(int instances = 1) {
    BatchFormer::Options options = Options();
    options.max_queue_delay = Duration::zero();
    options.latency_target = 1000us;
    options.costs = costs_ = std::make_shared<BatchCostModel>(instances);
    options.instances = instances;
    return options;
  }
  // 100 us per row, from 1 to 8 rows.
  void SeedLinear() {
    costs_->Seed(0, kGroup, 1, 100us);
    costs_->Seed(0, kGroup, 8, 800us);
  }
  // 100 us per batch plus 10 us per row.
  void SeedWithOverhead() {
    costs_->Seed(0, kGroup, 1, 110us);
    costs_->Seed(0, kGroup, 8, 180us);
  }
  // The queue's waiting group is due at `stop` (NextBatchTime) and not a microsecond before, and
  // then forms a batch of `rows`. Advances the clock to `stop`.
  void ExpectReadyExactlyAt(BatchFormer& queue, TimePoint stop, int64_t rows) {
    EXPECT_EQ(queue.NextBatchTime(), stop);
    clock_.Advance(stop - clock_.Now() - 1us);
    EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
    clock_.Advance(1us);
    auto batch = queue.TakeReadyBatch(clock_.Now());
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->rows, rows);
  }
  // Adds `count` one-row requests `gap` apart (the clock ends at the last one's arrival).
  void AddRowsEvery(BatchFormer& queue, int count, Duration gap) {
    for (int i = 0; i < count; ++i) {
      if (i > 0) clock_.Advance(gap);
      ASSERT_TRUE(Add(queue, 1).ok()) << i;
    }
  }
  std::shared_ptr<BatchCostModel> costs_;
};

TEST_F(LatencyTargetQueueTest, ABatchIsCutSoThatItsOldestRequestAnswersInTime) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(500us);  // 500 us left: five rows at 100 us each
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "2", "3", "4", "5"));
  // The other three could grow, and arrivals came all at once (faster than any batch serves),
  // but nothing has arrived for 500 us, more than four smoothed gaps between arrivals (0 us):
  // arrivals have stopped, and they run now rather than wait for one that may never come.
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("6", "7", "8"));
}

TEST_F(LatencyTargetQueueTest, WithArrivalsSlowerThanALoneRequestRunsNothingWaits) {
  auto options = TargetOptions();
  options.max_queue_delay = 100us;  // without the target the first request would wait this long
  BatchFormer queue(options);
  SeedWithOverhead();
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());  // no arrival rate yet: no waiting
  clock_.Advance(2ms);
  ASSERT_TRUE(Add(queue, 1).ok());  // one row per 2 ms; a lone row is served in 110 us
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());

  BatchFormer plain(Options());  // the same delay, no target
  ASSERT_TRUE(Add(plain, 1).ok());
  EXPECT_FALSE(plain.TakeReadyBatch(clock_.Now()).has_value());
}

TEST_F(LatencyTargetQueueTest,
       WithArrivalsFasterThanSmallBatchesServeTheGroupWaitsWhileRowsKeepArriving) {
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();  // 2 rows: 120 us, 60 us a row; arrivals: one row per 20 us
  const TimePoint first = clock_.Now();
  ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(20us);
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  // It waits while something arrives within four smoothed gaps (4 x 20 us) of the last arrival.
  EXPECT_EQ(queue.NextBatchTime(), first + 20us + 80us);
  clock_.Advance(20us);
  ASSERT_TRUE(Add(queue, 1).ok());  // three rows: 130 us, 43.3 us a row, still more than 20
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  ExpectReadyExactlyAt(queue, first + 40us + 80us, 3);
}

TEST_F(LatencyTargetQueueTest, AWaitingGroupStopsWhenOneMoreArrivalWouldMakeItsOldestLate) {
  BatchFormer queue(TargetOptions());
  costs_->Seed(0, kGroup, 1,
               600us);  // dear batches: 2 rows about 643 us (321 a row), 3 about 686 us
  costs_->Seed(0, kGroup, 8, 900us);
  const TimePoint first = clock_.Now();
  ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(100us);
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  // One more arrival (100 us) and a batch of 3 would end past the oldest's 1,000 us before the
  // silence bound (100 + 4 x 100 us) comes.
  const TimePoint stop = first + 1000us - *costs_->Predict(kGroup, 3, Pick::kSlowest) - 100us;
  EXPECT_LT(stop, first + 500us);
  ExpectReadyExactlyAt(queue, stop, 2);
}

TEST_F(LatencyTargetQueueTest, AClosedLoopWhoseCallersAllWaitIsNotHeldUntilItsTarget) {
  // Every caller of a closed loop of four has a request here: none can arrive until this batch
  // runs. Rounds of four come 5 us apart, one round per 400 us. The smoothed rate says one more
  // row is due within tens of microseconds; before the silence bound the group then waited until
  // its oldest had nearly used its target.
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();  // 4 rows: 140 us, 35 us a row
  for (int round = 0; round < 3; ++round) {
    const TimePoint first = clock_.Now();
    AddRowsEvery(queue, 4, 5us);
    auto batch = queue.TakeReadyBatch(clock_.Now());
    // The first round waits (its gaps say rows come every 5 us); later ones, whose smoothed gap
    // takes in the pause between rounds, find that waiting does not pay at all.
    if (round == 0) EXPECT_FALSE(batch.has_value());
    if (!batch.has_value()) {
      const TimePoint next = queue.NextBatchTime();
      EXPECT_LT(next, first + 200us) << "round " << round;  // the target would allow about 850 us
      clock_.Advance(next - clock_.Now());
      batch = queue.TakeReadyBatch(clock_.Now());
    }
    ASSERT_TRUE(batch.has_value()) << "round " << round;
    EXPECT_EQ(batch->rows, 4);
    clock_.Advance(first + 400us - clock_.Now());
  }
}

TEST_F(LatencyTargetQueueTest, APositiveMaxQueueDelayBoundsTheWait) {
  auto options = TargetOptions();
  options.max_queue_delay = 100us;
  BatchFormer queue(options);
  SeedWithOverhead();
  const TimePoint first = clock_.Now();
  AddRowsEvery(queue, 5, 20us);  // five rows take 30 us a row, still more than 20
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(queue.NextBatchTime(), first + 100us);  // before the silence bound (80 + 4 x 20 us)
  clock_.Advance(20us);
  EXPECT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());
}

TEST_F(LatencyTargetQueueTest, ARequestTheWorkAheadWouldMakeLateIsRefusedAtArrival) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  // The tenth finds 900 us of work ahead and needs 100 us itself: exactly in time.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Add(queue, 1).ok()) << i;
  EarlyRefusal why = EarlyRefusal::kNone;
  Status refused = Add(queue, 1, 2, kNoDeadline, &why);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(),
              HasSubstr("within its latency target of 1000 us (sluice.latency_target_us)"));
  EXPECT_THAT(refused.message(), HasSubstr("about 1000 us of work is queued ahead of it"));
  EXPECT_EQ(why, EarlyRefusal::kTarget);
  EXPECT_EQ(queue.size(), 10u);
}

TEST_F(LatencyTargetQueueTest, TheWorkAheadIsSpreadOverTheInstances) {
  BatchFormer queue(TargetOptions(/*instances=*/2));
  SeedLinear();  // instance 0 only; the other has not run the group and counts as unknown
  for (int i = 0; i < 19; ++i) ASSERT_TRUE(Add(queue, 1).ok()) << i;
  EXPECT_FALSE(Add(queue, 1).ok());  // 1900 us of work over two instances + 100 us > 1000 us
}

TEST_F(LatencyTargetQueueTest, ARequestWhoseOwnDeadlineComesFirstIsRefusedWithDeadlineExceeded) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EarlyRefusal why = EarlyRefusal::kNone;
  Status refused = Add(queue, 1, 2, clock_.Now() + 350us, &why);  // 300 us ahead + 100 us
  EXPECT_EQ(refused.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.message(), HasSubstr("before its deadline or queue timeout"));
  EXPECT_EQ(why, EarlyRefusal::kDeadline);
  EXPECT_TRUE(Add(queue, 1, 2, clock_.Now() + 400us).ok());
}

TEST_F(LatencyTargetQueueTest, AShapeWithoutCostsIsBatchedAsWithoutATargetAndNeverRefused) {
  auto options = TargetOptions();
  options.max_queue_delay = 100us;
  BatchFormer queue(options);
  costs_->Seed(0, "x[3,]", 1, 1s);  // another shape's cost says nothing about this one
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 8);
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 8);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // four rows wait for the delay
  clock_.Advance(100us);
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 4);
}

TEST_F(LatencyTargetQueueTest, RequestsThatCanNoLongerBeAnsweredInTimeLeaveTheQueue) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  const TimePoint first = clock_.Now();
  ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(850us);
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1, /*width=*/3).ok());     // a shape without costs
  EXPECT_EQ(queue.NextDeadline(), first + 1000us);  // the target is a deadline too
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(100us);  // the first now needs until 1050 us
  std::vector<RefusedRequest> refused = queue.TakeRefused(clock_.Now(), /*forming=*/false);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].pending.request->id, "1");
  EXPECT_EQ(refused[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused[0].status.message(), HasSubstr("after it waited 950 us"));
  EXPECT_EQ(refused[0].reason, EarlyRefusal::kTarget);
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue.bytes(), 8u + 12u);
  clock_.Advance(800us);  // the second now needs until 1850 us: exactly its target
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(1us);
  refused = queue.TakeRefused(clock_.Now(), /*forming=*/false);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].pending.request->id, "2");
  // Without a cost, only a target already past is certain.
  clock_.Advance(99us);  // the third's target, not past yet
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(1us);
  refused = queue.TakeRefused(clock_.Now(), /*forming=*/false);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].pending.request->id, "3");
  EXPECT_EQ(queue.size(), 0u);
}

TEST_F(LatencyTargetQueueTest, UnderOverloadTheOldestMakeWayForABatchThatKeepsUp) {
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();  // 110 us + 10 us a row: even 8 rows (22.5 us a row) serve slower than rows
                       // arrive
  const TimePoint first = clock_.Now();
  AddRowsEvery(queue, 8, 20us);
  // Requests keep arriving (of a shape without costs, so that this group does not fill).
  while (clock_.Now() < first + 880us) {
    clock_.Advance(20us);
    ASSERT_TRUE(Add(queue, 1, /*width=*/3).ok());
  }
  // The first has 120 us left (a batch of 2), the second 140 us (4 of 7 waiting), the third
  // 160 us: a batch of all 6 left. Cutting for the first would serve 2 rows in 120 us while 6
  // arrive.
  std::vector<RefusedRequest> refused = queue.TakeRefused(clock_.Now(), /*forming=*/true);
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_EQ(refused[0].pending.request->id, "1");
  EXPECT_EQ(refused[1].pending.request->id, "2");
  EXPECT_EQ(refused[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused[0].status.message(), HasSubstr("is overloaded"));
  EXPECT_THAT(refused[0].status.message(),
              HasSubstr("within its latency target of 1000 us (sluice.latency_target_us)"));
  EXPECT_THAT(refused[0].status.message(), HasSubstr("it waited 880 us"));
  EXPECT_EQ(refused[0].reason, EarlyRefusal::kTarget);
  EXPECT_EQ(queue.size(), 6u + 37u);
  EXPECT_EQ(queue.bytes(), 6 * 8u + 37 * 12u);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("3", "4", "5", "6", "7", "8"));
}

TEST_F(LatencyTargetQueueTest, NothingIsShedOnceArrivalsHaveStopped) {
  // The same eight arrivals, then nothing: every caller waits (a closed loop), so no later
  // arrival needs the room shedding would make, whatever the rate of the burst said.
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();
  const TimePoint first = clock_.Now();
  AddRowsEvery(queue, 8, 20us);
  clock_.Advance(first + 880us - clock_.Now());
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/true).empty());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // cut so that the oldest answers in time
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "2"));
}

TEST_F(LatencyTargetQueueTest, AnotherShapeArrivingDoesNotKeepAGroupWaiting) {
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();
  ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(20us);
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // two rows wait for a third
  for (int i = 0; i < 20; ++i) {  // another shape every 5 us: none of them joins the group
    clock_.Advance(5us);
    ASSERT_TRUE(Add(queue, 1, /*width=*/3).ok());
  }
  // The group has heard nothing for 100 us, far more than four gaps between the model's
  // arrivals: it runs now, first (its oldest is the oldest waiting).
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "2"));
}

TEST_F(LatencyTargetQueueTest, WithoutOverloadTheOldestIsServedInABatchCutForIt) {
  BatchFormer queue(TargetOptions());
  SeedWithOverhead();
  const TimePoint first = clock_.Now();
  AddRowsEvery(queue, 3, 200us);                 // a row per 200 us: a lone row (110 us) keeps up
  clock_.Advance(first + 885us - clock_.Now());  // the first has 115 us left: a batch of its own
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/true).empty());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1"));
}

TEST_F(LatencyTargetQueueTest, NothingIsShedOnALoneRowCostBeyondTheTarget) {
  BatchFormer queue(TargetOptions());
  ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(10us);
  ASSERT_TRUE(Add(queue, 1).ok());
  // Learned after they queued: twice the target, as warm-up on a busy host can say (see
  // AnIdleModelTakesARequestWhateverItsCostsSay). The oldest runs and corrects it.
  costs_->Seed(0, kGroup, 1, 2000us);
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/true).empty());
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());
}

TEST_F(LatencyTargetQueueTest, LateAnswersShrinkThePartOfTheTargetTheBatcherPlansWith) {
  auto options = TargetOptions();
  options.costs = costs_ = std::make_shared<BatchCostModel>(1, kBatchCostSmoothing, 1000us);
  BatchFormer queue(options);
  SeedLinear();
  const TimePoint first = clock_.Now();
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(queue.NextDeadline(), first + 1000us);
  // Half the answers came late inside the server: the plan keeps well within the target.
  for (int i = 0; i < 20; ++i) costs_->ObserveAnswer(i % 2 == 0 ? 1500us : 500us);
  const double share = costs_->PlanShare();
  ASSERT_LT(share, 0.95);
  const TimePoint planned = first + std::chrono::duration_cast<Duration>(1000us * share);
  EXPECT_EQ(queue.NextDeadline(), planned);
  clock_.Advance(planned - clock_.Now() - 100us);  // exactly one row's time left of the plan
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(1us);
  EXPECT_EQ(queue.TakeRefused(clock_.Now(), /*forming=*/false).size(),
            1u);  // refused before the whole target passed
}

TEST_F(LatencyTargetQueueTest, CostsThatTurnOutWrongAreCorrectedAndChangeTheBatchesFormed) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 8);  // 800 us predicted: in time
  clock_.Advance(800us);                                   // it ended
  // The batches run three times slower than warm-up said.
  for (int i = 0; i < 30; ++i) {
    costs_->Observe(0, kGroup, 8, 2400us);
    costs_->Observe(0, kGroup, 1, 300us);
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(Add(queue, 1).ok());                        // 900 us ahead + 300 us
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 3);  // 300 us a row: three rows fit
}

TEST_F(LatencyTargetQueueTest, AnIdleModelTakesARequestWhateverItsCostsSay) {
  BatchFormer queue(TargetOptions());
  costs_->Seed(0, kGroup, 1, 2000us);  // twice the target: warm-up on a busy host, say
  EarlyRefusal why = EarlyRefusal::kNone;
  ASSERT_TRUE(Add(queue, 1, 2, kNoDeadline, &why)
                  .ok());  // nothing ahead: refusing would leave nothing to correct the cost
  EXPECT_EQ(why, EarlyRefusal::kNone);
  EXPECT_FALSE(Add(queue, 1).ok());  // behind it, 2000 us of work ahead
  // Queued, only a target already past refuses it: not an estimate longer than the target.
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(1000us);
  EXPECT_TRUE(queue.TakeRefused(clock_.Now(), /*forming=*/false).empty());
  clock_.Advance(1us);
  EXPECT_EQ(queue.TakeRefused(clock_.Now(), /*forming=*/false).size(), 1u);
}

TEST_F(LatencyTargetQueueTest, ABatchHandedOutCountsAsWorkAheadUntilItsPredictedEnd) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // full: predicted to end in 800 us
  ASSERT_TRUE(batch.has_value());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Add(queue, 1).ok()) << i;  // 800 + 100 + 100 us
  EXPECT_FALSE(Add(queue, 1).ok());
  clock_.Advance(200us);  // 600 us of it left: 600 + 200 + 100 us
  EXPECT_TRUE(Add(queue, 1).ok());
}

TEST_F(LatencyTargetQueueTest, ABatchThatEndedEarlyStopsCountingOnceItsInstanceIsIdle) {
  BatchFormer queue(TargetOptions());
  SeedLinear();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());  // predicted to end in 800 us
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Add(queue, 1).ok()) << i;
  clock_.Advance(10us);
  EarlyRefusal why = EarlyRefusal::kNone;
  EXPECT_FALSE(
      Add(queue, 1, 2, kNoDeadline, &why, /*busy=*/1).ok());  // still running: 790 + 200 + 100 us
  EXPECT_EQ(why, EarlyRefusal::kTarget);
  // It ended early: its instance is idle, and only the two queued rows are ahead (200 + 100 us).
  EXPECT_TRUE(Add(queue, 1, 2, kNoDeadline, nullptr, /*busy=*/0).ok());
}

TEST_F(LatencyTargetQueueTest, WithoutDynamicBatchingOnlyRefusalsApply) {
  auto options = TargetOptions();
  options.one_request_per_batch = true;
  BatchFormer queue(options);
  costs_->Seed(0, "", 1, 400us);  // one group, keyed "", each request its own batch
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(Add(queue, 1).code(), absl::StatusCode::kUnavailable);  // 800 us ahead + 400 us
  EXPECT_EQ(queue.TakeReadyBatch(clock_.Now())->rows, 1);
}

struct Call {
  std::vector<int32_t> data;
  TensorSink sink;
  std::promise<Status> answer;
  std::future<Status> future = answer.get_future();
};

class LatencyTargetBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Echoes "x" as "y", taking 100 us of the fake clock per row; held at its gate on demand.
    auto model = std::make_unique<testing::FakeBackend>(
        [this](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
          {
            std::lock_guard<std::mutex> lock(sizes_mutex_);
            sizes_.push_back(request.batch_size);
          }
          clock_.Advance(100us * request.batch_size);
          const TensorView& x = request.inputs[0];
          return std::vector<Tensor>{{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}};
        });
    model_ = model.get();
    std::vector<std::unique_ptr<ModelBackend>> backends;
    backends.push_back(std::move(model));
    DynamicBatcher::Options options;
    options.queue.max_batch_size = 8;
    options.queue.latency_target = 1000us;
    options.clock = &clock_;
    options.stats = stats_;
    batcher_ = *DynamicBatcher::Create(testing::EchoSpec(), std::move(backends), options);
  }
  void TearDown() override { batcher_->Stop(); }

  void Send(Call& call) {
    call.data.assign(2, 7);
    auto request = std::make_unique<InferRequest>();
    request->model_name = "m";
    request->batch_size = 1;
    request->inputs.push_back(
        {"x", DataType::kInt32, {1, 2}, reinterpret_cast<const char*>(call.data.data()), 8, {}});
    batcher_->Enqueue(std::move(request), &call.sink,
                      [&call](Status status) { call.answer.set_value(status); });
  }

  // The batch sizes the model ran, in order.
  std::vector<int64_t> Sizes() {
    std::lock_guard<std::mutex> lock(sizes_mutex_);
    return sizes_;
  }

  FakeTimeSource clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  std::mutex sizes_mutex_;
  std::vector<int64_t> sizes_;
  testing::FakeBackend* model_ = nullptr;
  std::unique_ptr<DynamicBatcher> batcher_;
};

TEST_F(LatencyTargetBatcherTest, WarmUpSeedsTheCosts) {
  std::vector<WarmupRequest> warmup = testing::ZeroWarmup(4, 2);
  warmup[0].timed_runs = 3;
  ASSERT_TRUE(batcher_->WarmUp(std::move(warmup), nullptr).ok());
  ASSERT_NE(batcher_->costs(), nullptr);
  EXPECT_EQ(batcher_->costs()->Predict(kGroup, 4, Pick::kSlowest), 400us);
  // The model's statistics show the target and the costs, live.
  const ModelStatsSnapshot stats = stats_->Snapshot();
  EXPECT_EQ(stats.latency_target, 1000us);
  ASSERT_EQ(stats.batch_costs.size(), 1u);
  EXPECT_EQ(stats.batch_costs[0].group, kGroup);
  EXPECT_EQ(stats.batch_costs[0].rows, 4);
  EXPECT_EQ(stats.batch_costs[0].cost, 400us);
  EXPECT_EQ(stats.batch_costs[0].observations, 0u);
}

TEST_F(LatencyTargetBatcherTest, CostsLearnedFromTheWorkersRefuseWhatCannotBeAnsweredInTime) {
  Call first;
  Send(first);  // nothing known yet: admitted, and its batch teaches the model 100 us a row
  ASSERT_TRUE(first.future.get().ok());
  EXPECT_EQ(batcher_->costs()->Predict(kGroup, 1, Pick::kSlowest), 100us);

  model_->CloseGate();
  Call running;
  Send(running);
  model_->WaitStarted(2);
  Call queued[9], late;
  // 100 us each, after the running request's 100 us: the ninth is exactly in time.
  for (Call& call : queued) Send(call);
  Send(late);
  ASSERT_EQ(late.future.wait_for(0s), std::future_status::ready);  // answered at once
  const Status refused = late.future.get();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("latency target"));

  model_->OpenGate();
  ASSERT_TRUE(running.future.get().ok());
  int answered = 0, refused_queued = 0;
  for (Call& call : queued) {
    const Status status = call.future.get();
    if (status.ok()) {
      ++answered;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      ++refused_queued;
    }
  }
  // The running request took 100 us: the next batch, eight rows (the most), ends at 900 us and
  // the last row alone at 1000 us: all in time, as admission predicted.
  EXPECT_EQ(answered, 9);
  EXPECT_EQ(refused_queued, 0);
  EXPECT_EQ(Sizes(), (std::vector<int64_t>{1, 1, 8, 1}));
  const ModelStatsSnapshot stats = stats_->Snapshot();
  EXPECT_EQ(stats.refused_for_target, 1u);
  EXPECT_EQ(stats.refused_for_deadline, 0u);
}

TEST_F(LatencyTargetBatcherTest, RequestsHeldPastTheirTargetAreRefusedWhileQueuedAndNeverRun) {
  Call first;
  Send(first);
  ASSERT_TRUE(first.future.get().ok());
  model_->CloseGate();
  Call running;
  Send(running);
  model_->WaitStarted(2);
  Call queued[3];
  for (Call& call : queued) Send(call);
  // The running batch is held far past its predicted 100 us: at their target the batcher's timer
  // refuses the waiting requests without running them.
  clock_.Advance(1000us);
  for (Call& call : queued) {
    const Status status = call.future.get();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("after it waited 1000 us"));
  }
  model_->OpenGate();
  ASSERT_TRUE(running.future.get().ok());
  EXPECT_EQ(Sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(stats_->Snapshot().refused_for_target, 3u);
}

}  // namespace
}  // namespace sluice
