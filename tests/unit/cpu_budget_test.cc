// The CPU budget (server/os/cpu_budget.h): cgroup quota files, the smallest limit, CPU lists and
// choices, and the detection from a fake /sys/fs/cgroup.
#include "server/os/cpu_budget.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(CpuBudgetTest, QuotaFilesParse) {
  EXPECT_EQ(ParseCpuMax("max 100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCpuMax("150000 100000\n"), 1.5);
  EXPECT_EQ(ParseCpuMax("garbage"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCfsQuota("200000\n", "100000\n"), 2.0);
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), std::nullopt);
}

TEST(CpuBudgetTest, TheSmallestLimitWinsAndAQuotaRoundsUp) {
  CpuBudget budget = DecideCpuBudget(16, 16, std::nullopt);
  EXPECT_EQ(budget.cpus, 16);
  EXPECT_EQ(budget.limit, "cores");
  budget = DecideCpuBudget(16, 2, std::nullopt);  // taskset -c 0,1
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_EQ(budget.limit, "affinity");
  budget = DecideCpuBudget(16, 16, 1.5);  // docker --cpus 1.5
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_EQ(budget.limit, "cgroup quota");
  EXPECT_EQ(budget.detail, "16 cores, affinity 16, cgroup quota 1.5");
  EXPECT_EQ(DecideCpuBudget(4, 4, 0.2).cpus, 1);
  EXPECT_EQ(DecideCpuBudget(0, 0, std::nullopt).cpus, 1);
}

TEST(CpuListTest, TasksetsFormParsesSortedAndOnceEach) {
  EXPECT_EQ(ParseCpuList("0").value_or(std::vector<int>{}), (std::vector<int>{0}));
  EXPECT_EQ(ParseCpuList("8, 0-3,2").value_or(std::vector<int>{}),
            (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(ParseCpuList("5-5").value_or(std::vector<int>{}), (std::vector<int>{5}));
  for (const char* bad : {"", "a", "-1", "3-1", "1-", "0,,1", "1024", "1-2-3"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseCpuList("3-1").status().message()), HasSubstr("runs backwards"));
  EXPECT_THAT(std::string(ParseCpuList("0-5000").status().message()), HasSubstr("over 1023"));
}

TEST(CpuListTest, TheModelsTakeTheirCpusAndTheFrontEndsTheRest) {
  auto split = SplitCpus({0, 2}, {0, 1, 2, 3});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->model, (std::vector<int>{0, 2}));
  EXPECT_EQ(split->front_ends, (std::vector<int>{1, 3}));
  // Every CPU for the models leaves the front ends nothing; a CPU the process may not use is no
  // CPU at all.
  EXPECT_THAT(std::string(SplitCpus({0, 1}, {0, 1}).status().message()),
              HasSubstr("leave at least one"));
  EXPECT_THAT(std::string(SplitCpus({1, 7}, {0, 1, 2}).status().message()),
              HasSubstr("CPU(s) 7 are not among the CPUs this process may use (0,1,2)"));
  EXPECT_FALSE(SplitCpus({}, {0, 1}).ok());
}

TEST(CpuListTest, FirstAndLastCountFromTheEndsOfTheCpusAllowed) {
  absl::StatusOr<CpuChoice> last = ParseCpuChoice("last:2");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->list.empty());
  EXPECT_FALSE(last->empty());
  // A container's CPUs need not start at 0 nor be contiguous.
  EXPECT_EQ(ChooseCpus(*last, {4, 5, 9, 12}).value_or(std::vector<int>{}),
            (std::vector<int>{9, 12}));
  absl::StatusOr<CpuChoice> first = ParseCpuChoice(" first:1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ChooseCpus(*first, {4, 5, 9, 12}).value_or(std::vector<int>{}), (std::vector<int>{4}));
  // A list is passed on as it is; SplitCpus judges it against the mask.
  absl::StatusOr<CpuChoice> list = ParseCpuChoice("3,1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(ChooseCpus(*list, {0, 1}).value_or(std::vector<int>{}), (std::vector<int>{1, 3}));
  // As many as the process may use leaves the front ends nothing.
  EXPECT_THAT(
      std::string(ChooseCpus(*last, {7, 8}).status().message()),
      HasSubstr(
          "last:2 would give the models every CPU this process may use (7,8): leave at least one"));
  for (const char* bad : {"last:", "last:0", "first:-1", "last:2x", "first:99999", "middle:1",
                          "last:1,2", "LAST:2", "last :2"}) {
    EXPECT_FALSE(ParseCpuChoice(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseCpuChoice("first:99999").status().message()),
              HasSubstr("from 1 to 1024"));
  EXPECT_THAT(std::string(ParseCpuChoice("LAST:2").status().message()),
              HasSubstr("is none of a CPU list (0-3,8), first:N or last:N"));
  // absl's number parsing: spaces around N and a plus sign are accepted.
  EXPECT_EQ(ParseCpuChoice("last: 3 ").value_or(CpuChoice{}).last, 3);
  EXPECT_EQ(ParseCpuChoice("first:+2").value_or(CpuChoice{}).first, 2);
  EXPECT_TRUE(CpuChoice{}.empty());
}

TEST(CpuListTest, ASharedPoolUnderAQuotaIsNamed) {
  // A pod without dedicated CPUs: the node's 64 CPUs in its mask, a quota of 8.
  const std::string warning = SharedCpusWarning(DecideCpuBudget(64, 64, 8.0), 64);
  EXPECT_THAT(warning, HasSubstr("may run on 64 CPUs but its cgroup quota lets it use 8 ("));
  EXPECT_THAT(warning, HasSubstr("shared pool"));
  // Dedicated CPUs (the mask is the quota), no quota, or a mask narrower than the quota: nothing.
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 8, 8.0), 8), "");
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 64, std::nullopt), 64), "");
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 4, 8.0), 4), "");
}

// A fake /sys/fs/cgroup and /proc/self/cgroup under a temporary directory.
class CpuBudgetFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        std::filesystem::temp_directory_path() / ("sluice_cgroup_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    std::filesystem::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  std::filesystem::path root_;
};

TEST_F(CpuBudgetFilesTest, CgroupV2QuotaOnTheProcessOrAnAncestor) {
  Write("proc_cgroup", "0::/kubepods/pod1/container\n");
  Write("sys/kubepods/cpu.max", "max 100000\n");
  Write("sys/kubepods/pod1/cpu.max", "100000 100000\n");  // the pod's limit: 1 CPU
  Write("sys/kubepods/pod1/container/cpu.max", "max 100000\n");
  CpuBudget budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_EQ(budget.cpus, 1);
  EXPECT_EQ(budget.limit, "cgroup quota");
  EXPECT_THAT(budget.detail, ::testing::HasSubstr("kubepods/pod1"));
  // No limit anywhere: the cores (or the affinity mask).
  Write("sys/kubepods/pod1/cpu.max", "max 100000\n");
  budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_NE(budget.limit, "cgroup quota");
}

TEST_F(CpuBudgetFilesTest, CgroupV1CfsQuota) {
  Write("proc_cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  CpuBudget budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_EQ(budget.cpus, 1);
  EXPECT_EQ(budget.limit, "cgroup quota");
  // Missing files: no quota, no error.
  budget = DetectCpuBudget((root_ / "absent").string(), (root_ / "absent_sys").string());
  EXPECT_NE(budget.limit, "cgroup quota");
}

}  // namespace
}  // namespace sluice
