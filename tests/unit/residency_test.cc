// The memory budget's policy: which models go for a load (least recently used among those that
// may), why the others stay, and the back-off after failed loads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/residency.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;
const TimePoint kStart = TimePoint() + std::chrono::hours(1);

ResidentModel Resident(const std::string& name, uint64_t mib, int last_used_s, int ready_s = 0,
                       const std::string& device = "cpu") {
  ResidentModel model;
  model.name = name;
  model.memory[device] = mib * kMiB;
  model.last_used = kStart + std::chrono::seconds(last_used_s);
  model.ready_since = kStart + std::chrono::seconds(ready_s);
  return model;
}

EvictionPolicy Budget(uint64_t mib, Duration min_residency = std::chrono::seconds(10)) {
  EvictionPolicy policy;
  policy.budget["cpu"] = mib * kMiB;
  policy.min_residency = min_residency;
  return policy;
}

const TimePoint kNow = kStart + std::chrono::seconds(100);

TEST(ResidencyTest, NothingGoesWhenTheLoadFits) {
  auto plan = PlanEviction({Resident("a", 10, 50), Resident("b", 10, 40)}, {{"cpu", 30 * kMiB}},
                           Budget(50), kNow);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
  // Devices without a budget are not limited.
  plan = PlanEviction({Resident("a", 10, 50)}, {{"cuda:0", 1000 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
}

TEST(ResidencyTest, TheLeastRecentlyUsedGoFirstAndOnlyAsManyAsNeeded) {
  std::vector<ResidentModel> resident = {Resident("a", 10, 50), Resident("b", 10, 20),
                                         Resident("c", 10, 80), Resident("d", 10, 30)};
  // 40 of 50 used; 25 more needs 15 freed: b (used at 20 s) and d (30 s).
  auto plan = PlanEviction(resident, {{"cpu", 25 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("b", "d"));
  plan = PlanEviction(resident, {{"cpu", 15 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(*plan, ElementsAre("b"));
}

TEST(ResidencyTest, PinnedAndBusyModelsStayAndTheRefusalSaysWhy) {
  std::vector<ResidentModel> resident = {Resident("pinned", 10, 1), Resident("busy", 10, 2),
                                         Resident("old", 10, 90)};
  resident[0].pinned = true;
  resident[1].busy = true;
  // 30 used of 50, 25 more: only "old" may go, and that is enough.
  auto plan = PlanEviction(resident, {{"cpu", 25 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("old"));
  // 35 more: not enough can go, however old the models are.
  plan = PlanEviction(resident, {{"cpu", 35 * kMiB}}, Budget(50, Duration(0)), kNow);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("needs 35.0 MiB on cpu and the budget of 50.0 MiB has 30.0 MiB"));
  EXPECT_THAT(plan.status().message(), HasSubstr("pinned (pinned)"));
  EXPECT_THAT(plan.status().message(), HasSubstr("busy (requests in flight or active sequences)"));
  EXPECT_THAT(plan.status().message(), ::testing::Not(HasSubstr("old")));
}

// The minimum residency orders eviction and never refuses: models ready for less than it go only
// when the older idle ones do not free enough, and then the youngest last, whatever their use.
TEST(ResidencyTest, YoungIdleModelsGoOnlyAfterTheOlderOnesAndTheYoungestLast) {
  std::vector<ResidentModel> resident = {
      Resident("young", 10, 99, /*ready_s=*/95), Resident("youngest", 10, 80, /*ready_s=*/98),
      Resident("older", 10, 97, /*ready_s=*/50), Resident("busy", 10, 1, 96)};
  resident[3].busy = true;
  // 40 used of 50; 15 more: the older model goes although it was used after "youngest".
  auto plan = PlanEviction(resident, {{"cpu", 15 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("older"));
  // 25 more: one young model too, the one ready longest ("young", ready 5 s ago), although it
  // was used last.
  plan = PlanEviction(resident, {{"cpu", 25 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("older", "young"));
  // 35 more: every idle model, the youngest last; the busy one never.
  plan = PlanEviction(resident, {{"cpu", 35 * kMiB}}, Budget(50), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("older", "young", "youngest"));
  plan = PlanEviction(resident, {{"cpu", 45 * kMiB}}, Budget(50), kNow);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("busy (requests in flight or active sequences)"));
  // Once they are old enough, least recently used decides among them all.
  plan = PlanEviction(resident, {{"cpu", 25 * kMiB}}, Budget(50, std::chrono::seconds(1)), kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("youngest", "older"));
}

TEST(ResidencyTest, TheModelLoadingIsNeverChosenAndALoadLargerThanTheBudgetIsRefused) {
  std::vector<ResidentModel> resident = {Resident("self", 30, 1), Resident("other", 10, 50)};
  // After a load measured more than expected: 40 of 30; only "other" may go.
  EvictionPolicy policy = Budget(30);
  auto plan = PlanEviction(resident, {}, policy, kNow, "self");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("other"));
  plan = PlanEviction({Resident("self", 40, 1)}, {}, policy, kNow, "self");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  plan = PlanEviction({}, {{"cpu", 31 * kMiB}}, policy, kNow);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("more than the whole budget of 30.0 MiB"));
}

TEST(ResidencyTest, OnlyModelsOnADeviceOverItsBudgetAreChosen) {
  EvictionPolicy policy;
  policy.budget = {{"cuda:0", 20 * kMiB}, {"cuda:1", 20 * kMiB}};
  policy.min_residency = Duration(0);
  std::vector<ResidentModel> resident = {Resident("on1", 15, 1, 0, "cuda:1"),
                                         Resident("on0", 15, 2, 0, "cuda:0")};
  auto plan = PlanEviction(resident, {{"cuda:0", 10 * kMiB}}, policy, kNow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre("on0"));  // "on1" is older but frees nothing on cuda:0
  EXPECT_EQ(ResidentBytes(resident).at("cuda:1"), 15 * kMiB);
}

TEST(ResidencyTest, GpuLimitsParseInTritonsSpelling) {
  auto limit = ParseGpuLimit("1:0.25");
  ASSERT_TRUE(limit.ok());
  EXPECT_EQ(limit->first, "cuda:1");
  EXPECT_EQ(limit->second, 0.25);
  EXPECT_TRUE(ParseGpuLimit("0:1").ok());
  for (const char* bad : {"0", "0:0", "0:1.01", ":0.5", "-1:0.5", "a:0.5", "0:x", "0:-0.5"}) {
    EXPECT_EQ(ParseGpuLimit(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(DescribeBytes(512), "0.5 KiB");
  EXPECT_EQ(DescribeBytes(3 * kMiB / 2), "1.5 MiB");
  EXPECT_EQ(DescribeBytes(uint64_t{5} << 30), "5.00 GiB");
  EXPECT_EQ(DescribeDeviceBytes({{"cpu", kMiB}, {"cuda:0", 2 * kMiB}}),
            "cpu 1.0 MiB, cuda:0 2.0 MiB");
  EXPECT_EQ(DescribeDeviceBytes({}), "none");
}

TEST(ResidencyTest, BackoffDoublesPerFailureUpToTheLongestAndASuccessForgets) {
  LoadBackoff backoff(std::chrono::seconds(10), std::chrono::seconds(35));
  EXPECT_TRUE(backoff.Check("m", kStart).ok());
  backoff.RecordFailure("m", absl::InternalError("bad archive"), kStart);
  Status refused = backoff.Check("m", kStart + std::chrono::seconds(9));
  ASSERT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("failed to load 9.0 s ago (1 time(s) in a row)"));
  EXPECT_THAT(refused.message(), HasSubstr("another 1.0 s: bad archive"));
  EXPECT_TRUE(backoff.Check("m", kStart + std::chrono::seconds(10)).ok());
  EXPECT_TRUE(backoff.Check("other", kStart).ok());
  // 20 s after the second failure, then 35 (not 40) after the third and the fourth.
  backoff.RecordFailure("m", absl::InternalError("again"), kStart);
  EXPECT_FALSE(backoff.Check("m", kStart + std::chrono::seconds(19)).ok());
  EXPECT_TRUE(backoff.Check("m", kStart + std::chrono::seconds(20)).ok());
  backoff.RecordFailure("m", absl::InternalError("again"), kStart);
  EXPECT_FALSE(backoff.Check("m", kStart + std::chrono::seconds(34)).ok());
  EXPECT_TRUE(backoff.Check("m", kStart + std::chrono::seconds(35)).ok());
  backoff.RecordFailure("m", absl::InternalError("again"), kStart);
  EXPECT_TRUE(backoff.Check("m", kStart + std::chrono::seconds(35)).ok());
  EXPECT_EQ(backoff.failures().at("m").count, 4);
  backoff.RecordSuccess("m");
  EXPECT_TRUE(backoff.Check("m", kStart).ok());
  EXPECT_TRUE(backoff.failures().empty());
}

}  // namespace
}  // namespace sluice
