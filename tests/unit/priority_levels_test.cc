// Priority levels and DELAY (PriorityLevels) over a bare queue: where requests wait, their caps'
// words, the DELAY demotion and the single-flight reschedule. No policy, no threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/priority_levels.h"
#include "tests/unit/batch_former_fixture.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class PriorityLevelsTest : public ::testing::Test {
 protected:
  PriorityLevelsTest()
      : levels_(PriorityLevels::Options{{4, 4}, /*delays=*/true}),
        queue_(BatchQueue::Options{1024, 1u << 20, nullptr, 16, levels_.share_max_requests(),
                                   levels_.Ranked(), levels_.RankChanges()}) {}
  // Adds a one-row request at `level` whose DELAY timeout passes at `delay_after`.
  const PendingRequest& Add(int level, TimePoint delay_after = kNoDeadline) {
    testing::Owned owned = testing::Make(1, 2, next_tag_++);
    owned.request->priority_level = level;
    owned.request->delay_after = delay_after;
    owned.request->cancelled = std::make_shared<std::atomic<bool>>(false);
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(), 8};
    data_.push_back(std::move(owned.data));
    levels_.Place(pending);
    EXPECT_TRUE(queue_
                    .Add(pending, "x",
                         [&](size_t waiting) {
                           return PriorityLevels::QueueFull(*pending.request, waiting);
                         })
                    .ok());
    return queue_.groups().at("x").queue.back();
  }
  std::vector<std::string> Ids() const {
    std::vector<std::string> ids;
    for (const PendingRequest& pending : queue_.groups().at("x").queue)
      ids.push_back(pending.request->id);
    return ids;
  }
  FakeTimeSource clock_;
  PriorityLevels levels_;
  BatchQueue queue_;
  int32_t next_tag_ = 1;
  std::vector<std::vector<int32_t>> data_;
};

TEST_F(PriorityLevelsTest, ARequestCountsInItsLevelsShareAndRanksByLevel) {
  testing::Owned owned = testing::Make(1, 2, 9);
  owned.request->priority_level = 2;
  owned.request->delay_after = clock_.Now() + 5us;
  PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(), 8};
  levels_.Place(pending);
  EXPECT_EQ(pending.share, 1);
  EXPECT_EQ(pending.rank, 4);
  EXPECT_EQ(levels_.RankChanges()(pending), clock_.Now() + 5us);
  EXPECT_EQ(PriorityLevels(PriorityLevels::Options{{4}, false}).RankChanges(), nullptr);
  EXPECT_TRUE(levels_.Ranked());
  EXPECT_FALSE(PriorityLevels(PriorityLevels::Options{}).Ranked());
  EXPECT_THAT(PriorityLevels::QueueFull(*pending.request, 4).message(),
              HasSubstr("4 requests waiting at priority level 2"));
}

TEST_F(PriorityLevelsTest, ATimedOutDelayRequestGoesBehindItsLevelOnlyOnceDue) {
  const TimePoint t0 = clock_.Now();
  Add(1, t0 + 10us);  // "1"
  Add(1);             // "2"
  Add(2);             // "3"
  levels_.DelayOverdue(queue_, t0 + 9us);
  EXPECT_THAT(Ids(), ElementsAre("1", "2", "3"));
  levels_.DelayOverdue(queue_, t0 + 10us);
  EXPECT_THAT(Ids(), ElementsAre("2", "1", "3"));
}

TEST_F(PriorityLevelsTest, ARescheduledRequestMovesUpKeepsItsShareAndTakesTheLaterDeadline) {
  const TimePoint t0 = clock_.Now();
  Add(1);                              // "1"
  const PendingRequest& low = Add(2);  // "2"
  const std::atomic<bool>* tag = low.request->cancelled.get();
  std::atomic<bool> stranger{false};
  EXPECT_FALSE(levels_.Reschedule(queue_, &stranger, 1, kNoDeadline, kNoDeadline));
  ASSERT_TRUE(levels_.Reschedule(queue_, tag, 1, t0 + 500us, kNoDeadline));
  EXPECT_THAT(Ids(), ElementsAre("1", "2"));  // behind the level-1 request already waiting
  const PendingRequest& moved = queue_.groups().at("x").queue.back();
  EXPECT_EQ(moved.request->priority_level, 1);
  EXPECT_EQ(moved.share, 1);                        // counted where it was admitted
  EXPECT_EQ(moved.request->deadline, kNoDeadline);  // the later of the two: none
  EXPECT_EQ(queue_.size(), 2u);
}

TEST_F(PriorityLevelsTest, ALaterDelayTimeoutUndoesTheDemotion) {
  const TimePoint t0 = clock_.Now();
  const PendingRequest& first = Add(1, t0 + 10us);  // "1"
  const std::atomic<bool>* tag = first.request->cancelled.get();
  Add(1);  // "2"
  levels_.DelayOverdue(queue_, t0 + 10us);
  EXPECT_THAT(Ids(), ElementsAre("2", "1"));
  ASSERT_TRUE(levels_.Reschedule(queue_, tag, 1, kNoDeadline, t0 + 50us));
  EXPECT_THAT(Ids(), ElementsAre("2", "1"));  // undelayed: behind those of its rank already there
  levels_.DelayOverdue(queue_, t0 + 49us);
  EXPECT_EQ(queue_.groups().at("x").queue.back().rank, 2);
  levels_.DelayOverdue(queue_, t0 + 50us);
  EXPECT_EQ(queue_.groups().at("x").queue.back().rank, 3);
}

}  // namespace
}  // namespace sluice
