// The batching policies alone over a bare queue, with a fake clock: dynamic batching's sizes and
// delay, one request per batch, and the policy chosen for a model's options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_former.h"
#include "server/batching/batch_policy.h"
#include "server/batching/latency_target_policy.h"
#include "tests/unit/batch_former_fixture.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

class BatchPolicyTest : public ::testing::Test {
 protected:
  void Add(BatchQueue& queue, const BatchPolicy& policy, int64_t rows, int64_t width = 2) {
    testing::Owned owned = testing::Make(rows, width, next_tag_++);
    const std::string key = policy.KeyOf(*owned.request);
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(), 8};
    data_.push_back(std::move(owned.data));
    ASSERT_TRUE(
        queue.Add(pending, key, [](size_t) { return absl::UnavailableError("full"); }).ok());
  }
  FakeTimeSource clock_;
  BatchQueue queue_{BatchQueue::Options{}};
  int32_t next_tag_ = 1;
  std::vector<std::vector<int32_t>> data_;
};

TEST_F(BatchPolicyTest, DynamicBatchingWaitsForAPreferredSizeOrTheDelayAndCutsAtTheLadder) {
  DynamicBatchingPolicy::Options options;
  options.max_batch_size = 8;
  options.preferred_batch_sizes = {4};
  options.max_queue_delay = 100us;
  DynamicBatchingPolicy policy(options);
  Add(queue_, policy, 1);
  Add(queue_, policy, 2);
  const auto& [key, group] = *queue_.groups().begin();
  EXPECT_EQ(policy.ReadyPrefix(queue_, key, group, clock_.Now()), 0u);
  EXPECT_EQ(policy.ReadyAt(queue_, key, group), clock_.Now() + 100us);
  Add(queue_, policy, 1);  // 4 rows: preferred
  EXPECT_EQ(policy.ReadyPrefix(queue_, key, group, clock_.Now()), 3u);
  Add(queue_, policy, 3);  // 7 rows: past the preferred size, not full
  DynamicBatchingPolicy::Prefix prefix = policy.Measure(queue_, group, clock_.Now());
  EXPECT_EQ(prefix.fitting, 4u);
  EXPECT_EQ(prefix.rows, 7);
  EXPECT_EQ(prefix.preferred, 3u);
  EXPECT_FALSE(prefix.full);
  EXPECT_FALSE(prefix.waited);
  clock_.Advance(100us);
  EXPECT_EQ(policy.ReadyPrefix(queue_, key, group, clock_.Now()), 4u);
  policy.SetBatchSizeLadder({1, 2, 4});  // 7 rows reach 4: the prefix within 4 rows
  EXPECT_EQ(policy.ReadyPrefix(queue_, key, group, clock_.Now()), 3u);
  EXPECT_EQ(policy.Largest(), 4);
  EXPECT_EQ(policy.PaddedRows(3), 3);
  EXPECT_EQ(policy.EarliestAnswerBy(queue_), kNoDeadline);
  EXPECT_TRUE(policy.TakeRefused(queue_, clock_.Now(), true).empty());
}

TEST_F(BatchPolicyTest, DynamicBatchingPadsToThePreferredSizeAboveTheRows) {
  DynamicBatchingPolicy::Options options;
  options.max_batch_size = 16;
  options.preferred_batch_sizes = {4, 8};
  options.pad_to_preferred = true;
  DynamicBatchingPolicy policy(options);
  EXPECT_EQ(policy.PaddedRows(3), 4);
  EXPECT_EQ(policy.PaddedRows(8), 8);
  EXPECT_EQ(policy.PaddedRows(9), 16);
}

TEST_F(BatchPolicyTest, OneRequestPerBatchPutsEveryShapeInOneGroupAndRunsEachAlone) {
  OneRequestPerBatchPolicy policy(Duration::zero());
  Add(queue_, policy, 3, 2);
  Add(queue_, policy, 1, 5);
  ASSERT_EQ(queue_.group_count(), 1u);
  const auto& [key, group] = *queue_.groups().begin();
  EXPECT_EQ(key, "");
  EXPECT_EQ(policy.ReadyPrefix(queue_, key, group, clock_.Now()), 1u);
  EXPECT_EQ(policy.ReadyAt(queue_, key, group), clock_.Now());
  EXPECT_EQ(policy.PaddedRows(3), 3);
}

TEST_F(BatchPolicyTest, TheOptionsChooseThePolicy) {
  BatchFormer::Options options;
  options.max_batch_size = 8;
  EXPECT_NE(dynamic_cast<DynamicBatchingPolicy*>(BatchFormer::MakePolicy(options).get()), nullptr);
  options.one_request_per_batch = true;
  EXPECT_NE(dynamic_cast<OneRequestPerBatchPolicy*>(BatchFormer::MakePolicy(options).get()),
            nullptr);
  options.latency_target = 1ms;
  // A target without a cost model to plan with is no target.
  EXPECT_NE(dynamic_cast<OneRequestPerBatchPolicy*>(BatchFormer::MakePolicy(options).get()),
            nullptr);
  options.costs = std::make_shared<BatchCostModel>(1);
  EXPECT_NE(dynamic_cast<LatencyTargetPolicy*>(BatchFormer::MakePolicy(options).get()), nullptr);
  options.one_request_per_batch = false;
  EXPECT_NE(dynamic_cast<LatencyTargetPolicy*>(BatchFormer::MakePolicy(options).get()), nullptr);
}

}  // namespace
}  // namespace sluice
