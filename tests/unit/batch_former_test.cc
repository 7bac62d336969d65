// The batching decisions (BatchFormer) with a fake clock: no threads, no sleeps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_former.h"
#include "server/core/bytes_tensor.h"
#include "tests/unit/batch_former_fixture.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class BatchFormerTest : public testing::BatchFormerFixture {};
using testing::Make;

TEST_F(BatchFormerTest, DelayExpiryFormsPartialBatch) {
  BatchFormer queue(Options());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 2).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(queue.NextBatchTime(), clock_.Now() + 100us);
  EXPECT_EQ(queue.NextDeadline(), kNoDeadline);
  clock_.Advance(99us);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  clock_.Advance(1us);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "2"));
  EXPECT_EQ(batch->rows, 3);
  EXPECT_EQ(batch->padded_rows, 3);
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.bytes(), 0u);
  EXPECT_EQ(queue.NextBatchTime(), kNoDeadline);
}

TEST_F(BatchFormerTest, MaxBatchSizeCutsAtOnce) {
  BatchFormer queue(Options());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 3).ok());  // 9 rows > 8
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 6);  // the third does not fit: the batch is as full as it gets
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // the rest waits for its delay
  ASSERT_TRUE(Add(queue, 5).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 8);  // exactly max
}

TEST_F(BatchFormerTest, PreferredSizeCutsBeforeTheDelay) {
  auto options = Options();
  options.preferred_batch_sizes = {2, 4};
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 3 rows waiting: the prefix of 2 is preferred
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 2);
  ASSERT_TRUE(Add(queue, 3).ok());  // 1 + 3 = 4, preferred
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
}

TEST_F(BatchFormerTest, ZeroDelayBatchesWhateverWaits) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 2).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 3);
}

TEST_F(BatchFormerTest, BatchSizeLadderCutsAtTheLargestSizeReached) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  queue.SetBatchSizeLadder({1, 2, 4});
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  std::vector<int64_t> rows;
  while (auto batch = queue.TakeReadyBatch(clock_.Now())) rows.push_back(batch->rows);
  EXPECT_THAT(rows, ElementsAre(4, 2, 1));  // not 7: sizes 5-8 serve fewer rows per second

  // Requests of several rows: the longest prefix within the size reached, at least one request.
  ASSERT_TRUE(Add(queue, 3).ok());
  ASSERT_TRUE(Add(queue, 3).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 3 rows reach 2 only; the first runs alone
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 3);
  ASSERT_TRUE(Add(queue, 1).ok());
  batch = queue.TakeReadyBatch(clock_.Now());  // 3 + 1 = 4, a ladder size
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
  // A request larger than the ladder's largest size (within max_batch_size) runs, alone.
  ASSERT_TRUE(Add(queue, 6).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 6);
  EXPECT_EQ(queue.size(), 1u);
}

TEST_F(BatchFormerTest, BatchSizeLadderLargestSizeIsFull) {
  BatchFormer queue(Options());  // 100 us delay
  queue.SetBatchSizeLadder({1, 2, 4});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // 3 rows wait for company
  ASSERT_TRUE(Add(queue, 1).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 4 rows: as full as the ladder goes
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(100us);
  batch = queue.TakeReadyBatch(clock_.Now());  // the delay passed: 3 rows reach 2
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 2);
}

// Stage ahead: only a batch no arrival could make larger forms while every instance is busy; the
// delay, preferred sizes and the ladder's smaller sizes do not count.
TEST_F(BatchFormerTest, AFullBatchIsOnlyOneThatCannotGrow) {
  auto options = Options();
  options.preferred_batch_sizes = {2, 4};
  BatchFormer queue(options);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(1s);  // long past the delay, and a preferred size waits: ready, but not full
  EXPECT_FALSE(queue.HasFullBatch(clock_.Now()));
  EXPECT_FALSE(queue.TakeFullBatch(clock_.Now()).has_value());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Add(queue, 1).ok());  // 9 rows: 8 are full
  EXPECT_TRUE(queue.HasFullBatch(clock_.Now()));
  auto batch = queue.TakeFullBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 8);
  EXPECT_EQ(Ids(*batch).front(), "1");  // the oldest first, as TakeReadyBatch takes them
  EXPECT_FALSE(queue.HasFullBatch(clock_.Now()));
  // A next request that does not fit leaves what fits as full as it can get.
  ASSERT_TRUE(Add(queue, 6).ok());  // 1 + 6 = 7
  EXPECT_FALSE(queue.HasFullBatch(clock_.Now()));
  ASSERT_TRUE(Add(queue, 3).ok());  // 10 rows: the 3 does not fit behind the 7
  batch = queue.TakeFullBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 7);
  EXPECT_EQ(queue.size(), 1u);
  // The ladder's largest size is full too.
  queue.SetBatchSizeLadder({1, 2});
  batch = queue.TakeFullBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 3);  // alone: larger than the ladder's largest size
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeFullBatch(clock_.Now()).has_value());
  ASSERT_TRUE(Add(queue, 1).ok());
  batch = queue.TakeFullBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 2);
}

TEST_F(BatchFormerTest, PoliciesThatDecideByTimeFormNoFullBatches) {
  auto options = Options();
  options.one_request_per_batch = true;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 8).ok());
  EXPECT_FALSE(queue.HasFullBatch(clock_.Now()));
  EXPECT_TRUE(queue.TakeReadyBatch(clock_.Now() + 1s).has_value());
}

TEST_F(BatchFormerTest, ShapeGroupsDoNotDisturbEachOther) {
  BatchFormer queue(Options());
  ASSERT_TRUE(Add(queue, 1, /*width=*/2).ok());
  clock_.Advance(50us);
  ASSERT_TRUE(Add(queue, 1, /*width=*/3).ok());
  ASSERT_TRUE(Add(queue, 1, /*width=*/2).ok());
  EXPECT_EQ(queue.groups(), 2u);
  clock_.Advance(50us);  // the width-2 group's oldest has waited 100us; the width-3 one 50us
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "3"));  // a different shape never flushed it early
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // the other keeps its own timer
  EXPECT_EQ(queue.NextBatchTime(), clock_.Now() + 50us);
  clock_.Advance(50us);
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("2"));
}

TEST_F(BatchFormerTest, OldestReadyGroupGoesFirst) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1, 5).ok());
  clock_.Advance(1us);
  ASSERT_TRUE(Add(queue, 1, 2).ok());
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("1"));
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("2"));
}

TEST_F(BatchFormerTest, CapsReject) {
  auto options = Options();
  options.max_requests = 2;
  options.max_groups = 1;
  options.max_bytes = 40;  // 5 rows of 2 INT32
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  Status groups = Add(queue, 1, /*width=*/3);
  EXPECT_EQ(groups.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(groups.message(), HasSubstr("sluice.max_shape_groups"));
  Status bytes = Add(queue, 5);
  EXPECT_THAT(bytes.message(), HasSubstr("sluice.max_queued_bytes=40"));
  ASSERT_TRUE(Add(queue, 2).ok());
  Status requests = Add(queue, 1);
  EXPECT_THAT(requests.message(), HasSubstr("max_queue_size"));
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue.bytes(), 24u);
}

TEST_F(BatchFormerTest, ARequestOverTheByteCapWaitsOnlyAlone) {
  auto options = Options();
  options.max_bytes = 40;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 6).ok());  // 48 bytes: nothing else waits, so it may
  EXPECT_THAT(Add(queue, 1).message(), HasSubstr("sluice.max_queued_bytes=40"));
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now() + 1s).has_value());
  EXPECT_TRUE(Add(queue, 1).ok());
}

TEST_F(BatchFormerTest, ServerWideByteBudgetIsSharedAndReleased) {
  auto budget = std::make_shared<ByteBudget>(32);
  auto options = Options();
  options.server_budget = budget;
  BatchFormer a(options), b(options);
  ASSERT_TRUE(Add(a, 2).ok());  // 16 bytes
  ASSERT_TRUE(Add(b, 2).ok());  // 32
  Status full = Add(a, 1);
  EXPECT_THAT(full.message(), HasSubstr("--max-queued-bytes"));
  EXPECT_EQ(budget->used(), 32u);
  clock_.Advance(100us);
  ASSERT_TRUE(a.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(budget->used(), 16u);
  ASSERT_TRUE(Add(a, 1).ok());
}

TEST_F(BatchFormerTest, DeadlinesAndCancellationExpireQueuedRequests) {
  BatchFormer queue(Options());
  ASSERT_TRUE(Add(queue, 1, 2, clock_.Now() + 30us).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(queue.NextDeadline(), clock_.Now() + 30us);
  EXPECT_TRUE(queue.TakeExpired(clock_.Now()).empty());
  clock_.Advance(30us);
  auto expired = queue.TakeExpired(clock_.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].request->id, "1");
  // Cancel "3" while it waits.
  clock_.Advance(70us);
  std::vector<std::string> left;
  auto all = queue.TakeReadyBatch(clock_.Now());  // (consume to inspect, then re-add)
  ASSERT_TRUE(all.has_value());
  EXPECT_THAT(Ids(*all), ElementsAre("2", "3"));
  all->requests[1].request->cancelled = std::make_shared<std::atomic<bool>>(true);
  ASSERT_TRUE(queue.Add(all->requests[1]).ok());
  EXPECT_TRUE(queue.TakeExpired(clock_.Now()).empty());  // not announced: not looked for
  queue.NoteCancelled();
  expired = queue.TakeExpired(clock_.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_TRUE(expired[0].request->IsCancelled());
  EXPECT_EQ(queue.size(), 0u);
}

TEST_F(BatchFormerTest, PaddingToPreferredSizes) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 3).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  EXPECT_EQ(batch->rows, 3);
  EXPECT_EQ(batch->padded_rows, 4);
  ASSERT_TRUE(Add(queue, 5).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  EXPECT_EQ(batch->padded_rows, 8);  // above every preferred size: max_batch_size
}

TEST_F(BatchFormerTest, OneRequestPerBatchKeepsArrivalOrderAcrossShapes) {
  auto options = Options();
  options.one_request_per_batch = true;
  options.max_groups = 1;        // never reached: every shape waits in the one queue
  options.max_queue_delay = 1s;  // ignored: a lone request needs no company
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 2).ok());
  ASSERT_TRUE(Add(queue, 3, /*width=*/5).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  for (int64_t rows : {2, 3, 1}) {
    auto batch = queue.TakeReadyBatch(clock_.Now());
    ASSERT_TRUE(batch.has_value());
    ASSERT_EQ(batch->requests.size(), 1u);
    EXPECT_EQ(batch->rows, rows);
    EXPECT_EQ(batch->padded_rows, rows);
  }
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
}

// Priorities: requests of a level and a DELAY deadline, added on the fake clock.
class PriorityQueueTest : public testing::BatchFormerFixture {
 protected:
  Status AddAt(BatchFormer& queue, int level, int64_t rows = 2, TimePoint delay_after = kNoDeadline,
               int64_t width = 2) {
    testing::Owned owned = Make(rows, width, next_tag_++);
    owned.request->priority_level = level;
    owned.request->delay_after = delay_after;
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(),
                           owned.data.size() * 4};
    data_.push_back(std::move(owned.data));
    return queue.Add(pending);
  }
  BatchFormer::Options Levels(std::vector<size_t> caps) {
    BatchFormer::Options options = Options();
    options.level_max_requests = std::move(caps);
    return options;
  }
};

TEST_F(PriorityQueueTest, HigherLevelsGoFirstAndABatchMixesLevelsWhereTheyLeaveRoom) {
  BatchFormer queue(Levels({8, 8, 8}));
  for (int level : {3, 2, 1, 3, 1}) ASSERT_TRUE(AddAt(queue, level).ok());  // ids 1..5, 2 rows each
  clock_.Advance(100us);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  // Level 1 in arrival order, then level 2, then the oldest of level 3: 8 rows.
  EXPECT_THAT(Ids(*batch), ElementsAre("3", "5", "2", "1"));
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("4"));
}

// Single flight: requests waiting outside the queue for an identical one count in their level's
// cap; the queued run moves up to a waiter's higher level and waits to the latest deadline.
TEST_F(PriorityQueueTest, WaitersOutsideCountAtTheirLevelAndARescheduledRequestMovesUp) {
  BatchFormer queue(Levels({2, 8}));
  ASSERT_TRUE(AddAt(queue, 1).ok());               // "1"
  ASSERT_TRUE(AddAt(queue, 2).ok());               // "2"
  testing::Owned owned = Make(2, 2, next_tag_++);  // "3": level 2, until 50 us from now
  auto tag = std::make_shared<std::atomic<bool>>(false);
  owned.request->cancelled = tag;
  owned.request->priority_level = 2;
  owned.request->deadline = clock_.Now() + 50us;
  PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(),
                         owned.data.size() * 4};
  data_.push_back(std::move(owned.data));
  ASSERT_TRUE(queue.Add(pending).ok());

  InferRequest outside;
  outside.model_name = "m";
  outside.priority_level = 2;
  ASSERT_TRUE(queue.AdmitOutside(outside).ok());
  EXPECT_EQ(queue.size(), 4u);

  auto stranger = std::make_shared<std::atomic<bool>>(false);
  EXPECT_FALSE(queue.Reschedule(stranger.get(), 1, kNoDeadline, kNoDeadline));
  EXPECT_TRUE(queue.Reschedule(tag.get(), 1, clock_.Now() + 500us, kNoDeadline));
  // "3" counts where it was admitted (level 2), not at the level it moved to: level 1 holds "1"
  // and room for one more.
  outside.priority_level = 1;
  ASSERT_TRUE(queue.AdmitOutside(outside).ok());
  const Status refused = queue.AdmitOutside(outside);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("priority level 1"));
  EXPECT_EQ(queue.size(), 5u);
  queue.ReleaseOutside(1, 0);
  queue.ReleaseOutside(2, 0);
  EXPECT_EQ(queue.size(), 3u);

  clock_.Advance(100us);  // past "3"'s first deadline, not its new one
  EXPECT_TRUE(queue.TakeExpired(clock_.Now()).empty());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "3", "2"));
}

TEST_F(PriorityQueueTest, TheDelayRunsFromTheOldestRequestWhateverItsLevel) {
  BatchFormer queue(Levels({8, 8}));
  ASSERT_TRUE(AddAt(queue, 2).ok());
  clock_.Advance(60us);
  ASSERT_TRUE(AddAt(queue, 1).ok());  // now first in line, but not the oldest
  EXPECT_EQ(queue.NextBatchTime(), clock_.Now() + 40us);
  clock_.Advance(39us);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  clock_.Advance(1us);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("2", "1"));
}

TEST_F(PriorityQueueTest, AmongReadyGroupsTheHigherLevelGoesFirst) {
  auto options = Levels({8, 8});
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(AddAt(queue, 2, 1, kNoDeadline, /*width=*/5).ok());  // older, lower level
  clock_.Advance(1us);
  ASSERT_TRUE(AddAt(queue, 1, 1).ok());
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("2"));
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("1"));
}

TEST_F(PriorityQueueTest, EachLevelHasItsOwnRequestCapAndTheBytesAreCappedTogether) {
  auto options = Levels({1, 2});
  options.max_bytes = 40;  // 5 rows of 2 INT32
  BatchFormer queue(options);
  ASSERT_TRUE(AddAt(queue, 1, 1).ok());
  Status full = AddAt(queue, 1, 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      full.message(),
      HasSubstr("has 1 requests waiting at priority level 1 (that level's max_queue_size)"));
  ASSERT_TRUE(AddAt(queue, 2, 1).ok());
  ASSERT_TRUE(AddAt(queue, 2, 2).ok());  // 4 rows: 32 bytes over both levels
  EXPECT_EQ(queue.size(), 3u);           // every level's requests
  EXPECT_EQ(queue.bytes(), 32u);
  EXPECT_THAT(AddAt(queue, 2, 1).message(), HasSubstr("at priority level 2"));
  queue.TakeAll();
  ASSERT_TRUE(AddAt(queue, 1, 2).ok());
  ASSERT_TRUE(AddAt(queue, 2, 2).ok());
  EXPECT_THAT(AddAt(queue, 2, 2).message(),
              HasSubstr("sluice.max_queued_bytes=40"));  // 48 > 40 together
  // A batch gives its requests' places back to their levels.
  clock_.Advance(100us);
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_TRUE(AddAt(queue, 1, 1).ok());
}

TEST_F(PriorityQueueTest, ATimedOutDelayRequestWaitsBehindItsLevelButAheadOfLowerOnes) {
  auto options = Levels({8, 8});
  options.delays = true;
  options.max_batch_size = 4;
  BatchFormer queue(options);
  ASSERT_TRUE(AddAt(queue, 1, 2, clock_.Now() + 10us).ok());  // "1": DELAY timeout in 10 us
  ASSERT_TRUE(AddAt(queue, 2, 2).ok());                       // "2"
  ASSERT_TRUE(AddAt(queue, 1, 2).ok());                       // "3"
  queue.DelayOverdue(clock_.Now());                           // nothing due: 1, 3, 2
  clock_.Advance(10us);
  queue.DelayOverdue(clock_.Now());  // "1" goes behind "3", still ahead of level 2
  clock_.Advance(90us);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("3", "1"));
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("2"));
}

TEST_F(PriorityQueueTest, DelayWithoutLevelsPutsTimedOutRequestsLastInArrivalOrder) {
  auto options = Options();
  options.delays = true;
  options.max_batch_size = 4;
  BatchFormer queue(options);
  ASSERT_TRUE(AddAt(queue, 0, 1, clock_.Now() + 5us).ok());  // "1"
  ASSERT_TRUE(AddAt(queue, 0, 1, clock_.Now() + 5us).ok());  // "2"
  ASSERT_TRUE(AddAt(queue, 0, 2).ok());                      // "3"
  ASSERT_TRUE(AddAt(queue, 0, 2).ok());                      // "4"
  clock_.Advance(5us);
  queue.DelayOverdue(clock_.Now());
  clock_.Advance(95us);
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("3", "4"));
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("1", "2"));
}

TEST_F(PriorityQueueTest, ANewRequestDoesNotPassADelayedOneOfAHigherLevel) {
  auto options = Levels({8, 8});
  options.delays = true;
  options.max_batch_size = 2;
  BatchFormer queue(options);
  ASSERT_TRUE(AddAt(queue, 1, 1, clock_.Now() + 1us).ok());  // "1"
  clock_.Advance(1us);
  queue.DelayOverdue(clock_.Now());
  ASSERT_TRUE(AddAt(queue, 2, 1).ok());  // "2": level 2, after level 1's delayed request
  ASSERT_TRUE(AddAt(queue, 1, 1).ok());  // "3": level 1, ahead of both
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("3", "1"));
}

}  // namespace
}  // namespace sluice
