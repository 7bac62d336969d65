// The queue that keeps a batcher's waiting requests (BatchQueue), alone: ranks, groups, caps and
// the ordered indexes that answer "when" without a walk. No policy, no threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/batching/batch_queue.h"
#include "tests/unit/batch_former_fixture.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class BatchQueueTest : public ::testing::Test {
 protected:
  // Adds a one-row request with `rank` to group `key`, tagged with the next id.
  Status Add(BatchQueue& queue, const std::string& key, int rank = 0,
             TimePoint deadline = kNoDeadline, int share = 0,
             TimePoint rank_changes_at = kNoDeadline) {
    testing::Owned owned = testing::Make(1, 2, next_tag_++, deadline);
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(), 8};
    pending.rank = static_cast<int16_t>(rank);
    pending.share = static_cast<int16_t>(share);
    pending.request->delay_after = rank_changes_at;  // read by RankChangesAtDelay
    data_.push_back(std::move(owned.data));
    return queue.Add(pending, key, [](size_t waiting) {
      return absl::UnavailableError(absl::StrCat(waiting, " wait"));
    });
  }
  static std::vector<std::string> Ids(const BatchQueue& queue, const std::string& key) {
    std::vector<std::string> ids;
    for (const PendingRequest& pending : queue.groups().at(key).queue)
      ids.push_back(pending.request->id);
    return ids;
  }
  // Options::rank_changes_at for the tests that change ranks: a request's delay_after while its
  // rank is even.
  static TimePoint RankChangesAtDelay(const PendingRequest& pending) {
    return pending.rank % 2 == 0 ? pending.request->delay_after : kNoDeadline;
  }
  FakeTimeSource clock_;
  int32_t next_tag_ = 1;
  std::vector<std::vector<int32_t>> data_;
};

TEST_F(BatchQueueTest, RequestsWaitByRankThenArrivalAndATakenBatchEmptiesItsGroup) {
  BatchQueue queue(BatchQueue::Options{});
  for (int rank : {4, 2, 4, 2, 0}) ASSERT_TRUE(Add(queue, "a", rank).ok());
  EXPECT_THAT(Ids(queue, "a"), ElementsAre("5", "2", "4", "1", "3"));
  EXPECT_EQ(queue.groups().at("a").rows, 5);
  FormedBatch batch = queue.TakeFront("a", 3);
  EXPECT_EQ(batch.rows, 3);
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue.PopFront("a").request->id, "1");
  EXPECT_EQ(queue.PopFront("a").request->id, "3");
  EXPECT_EQ(queue.group_count(), 0u);
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.bytes(), 0u);
}

TEST_F(BatchQueueTest, TheEarliestDeadlineIsKeptAsRequestsComeAndGo) {
  BatchQueue queue(BatchQueue::Options{});
  const TimePoint t0 = clock_.Now();
  ASSERT_TRUE(Add(queue, "a", 0, t0 + 30us).ok());  // "1"
  ASSERT_TRUE(Add(queue, "b", 0, t0 + 10us).ok());  // "2"
  ASSERT_TRUE(Add(queue, "a").ok());                // "3": none
  EXPECT_EQ(queue.EarliestDeadline(), t0 + 10us);
  queue.TakeFront("b", 1);
  EXPECT_EQ(queue.EarliestDeadline(), t0 + 30us);
  // A deadline that changes in place is indexed again.
  ASSERT_TRUE(queue.ChangeOne([](const PendingRequest& p) { return p.request->id == "1"; },
                              [&](PendingRequest& p) {
                                p.request->deadline = t0 + 50us;
                                return false;
                              }));
  EXPECT_EQ(queue.EarliestDeadline(), t0 + 50us);
  EXPECT_THAT(Ids(queue, "a"), ElementsAre("1", "3"));  // kept its place
  queue.TakeAll();
  EXPECT_EQ(queue.EarliestDeadline(), kNoDeadline);
  EXPECT_EQ(queue.size(), 0u);
}

TEST_F(BatchQueueTest, ExpiryLooksAtEveryRequestOnlyWhenADeadlineIsDueOrCancellationsAreAsked) {
  BatchQueue queue(BatchQueue::Options{});
  const TimePoint t0 = clock_.Now();
  ASSERT_TRUE(Add(queue, "a", 0, t0 + 20us).ok());  // "1"
  ASSERT_TRUE(Add(queue, "a").ok());                // "2": cancelled below
  queue.groups().at("a").queue.back().request->cancelled =
      std::make_shared<std::atomic<bool>>(true);
  EXPECT_TRUE(queue.TakeExpired(t0, /*look_for_cancelled=*/false).empty());
  std::vector<PendingRequest> expired = queue.TakeExpired(t0, /*look_for_cancelled=*/true);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].request->id, "2");
  expired = queue.TakeExpired(t0 + 20us, /*look_for_cancelled=*/false);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].request->id, "1");
  EXPECT_EQ(queue.EarliestDeadline(), kNoDeadline);
  EXPECT_EQ(queue.group_count(), 0u);
}

TEST_F(BatchQueueTest, RerankChangesOnlyTheRequestsDueAndMovesThemBehindTheirNewRank) {
  BatchQueue::Options options;
  options.rank_changes_at = RankChangesAtDelay;
  BatchQueue queue(options);
  const TimePoint t0 = clock_.Now();
  ASSERT_TRUE(Add(queue, "a", 2, kNoDeadline, 0, t0 + 10us).ok());  // "1"
  ASSERT_TRUE(Add(queue, "a", 2, kNoDeadline, 0, t0 + 10us).ok());  // "2"
  ASSERT_TRUE(Add(queue, "a", 2).ok());                             // "3"
  ASSERT_TRUE(Add(queue, "a", 4).ok());                             // "4"
  int changed = 0;
  const auto demote = [&](PendingRequest& pending) {
    ++changed;
    pending.rank = 3;
  };
  queue.Rerank(t0 + 9us, demote);
  EXPECT_EQ(changed, 0);
  queue.Rerank(t0 + 10us, demote);
  EXPECT_EQ(changed, 2);
  EXPECT_THAT(Ids(queue, "a"), ElementsAre("3", "1", "2", "4"));
  queue.Rerank(t0 + 1s, demote);  // none due any more
  EXPECT_EQ(changed, 2);
}

TEST_F(BatchQueueTest, WithRanksTheOldestRequestIsFoundBehindYoungerOnes) {
  BatchQueue::Options options;
  options.index_arrivals = true;
  BatchQueue queue(options);
  const TimePoint t0 = clock_.Now();
  ASSERT_TRUE(Add(queue, "a", 4).ok());
  clock_.Advance(5us);
  ASSERT_TRUE(Add(queue, "a", 2).ok());  // at the front, younger
  EXPECT_EQ(queue.groups().at("a").queue.front().enqueued, t0 + 5us);
  EXPECT_EQ(queue.Oldest(queue.groups().at("a")), t0);
  queue.PopFront("a");
  EXPECT_EQ(queue.Oldest(queue.groups().at("a")), t0);
}

TEST_F(BatchQueueTest, GroupsAndSharesAreCapped) {
  BatchQueue::Options options;
  options.max_groups = 2;
  options.share_max_requests = {1, 2};
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, "a", 0, kNoDeadline, /*share=*/0).ok());
  const Status full = Add(queue, "a", 0, kNoDeadline, /*share=*/0);
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(full.message(), HasSubstr("1 wait"));  // the caller's words
  ASSERT_TRUE(Add(queue, "b", 0, kNoDeadline, /*share=*/1).ok());
  const Status shapes = Add(queue, "c", 0, kNoDeadline, /*share=*/1);
  EXPECT_EQ(shapes.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(shapes.message(), HasSubstr("sluice.max_shape_groups"));
  EXPECT_EQ(queue.size(), 2u);
  // Outside the queue, counted as if queued.
  EXPECT_FALSE(
      queue.AdmitOutside(0, 8, "m", [](size_t) { return absl::UnavailableError("x"); }).ok());
  ASSERT_TRUE(
      queue.AdmitOutside(1, 8, "m", [](size_t) { return absl::UnavailableError("x"); }).ok());
  EXPECT_EQ(queue.size(), 3u);
  queue.ReleaseOutside(1, 8);
  EXPECT_EQ(queue.size(), 2u);
}

}  // namespace
}  // namespace sluice
