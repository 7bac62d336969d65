// The admission policy every scheduler shares: caps per share, one larger request alone, the
// server budget shared by every model, and everything given back.
#include "server/batching/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

Status Full(size_t waiting) { return absl::UnavailableError("full at " + std::to_string(waiting)); }

TEST(AdmissionTest, TheRequestCapIsPerShareAndItsWordsAreTheSchedulers) {
  Admission admission({/*max_requests=*/2, /*max_bytes=*/1000, nullptr, /*shares=*/2});
  ASSERT_TRUE(admission.Admit(0, 10, "m", Full).ok());
  ASSERT_TRUE(admission.Admit(0, 10, "m", Full).ok());
  EXPECT_EQ(admission.Admit(0, 10, "m", Full).message(), "full at 2");
  ASSERT_TRUE(admission.Admit(1, 10, "m", Full).ok());  // the other share has room
  EXPECT_EQ(admission.requests(0), 2u);
  EXPECT_EQ(admission.total_requests(), 3u);
  admission.Release(0, 10);
  EXPECT_TRUE(admission.Admit(0, 10, "m", Full).ok());
}

TEST(AdmissionTest, TheByteCapAdmitsOneLargerRequestAloneOnly) {
  Admission admission({/*max_requests=*/10, /*max_bytes=*/100, nullptr, 1});
  ASSERT_TRUE(admission.Admit(0, 250, "m", Full).ok());  // alone: it could never run otherwise
  const Status refused = admission.Admit(0, 1, "m", Full);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(),
              HasSubstr("model 'm' has 250 input bytes waiting and this request brings 1 (limit "
                        "sluice.max_queued_bytes=100)"));
  admission.Release(0, 250);
  ASSERT_TRUE(admission.Admit(0, 60, "m", Full).ok());
  EXPECT_FALSE(admission.Admit(0, 41, "m", Full).ok());
  EXPECT_TRUE(admission.Admit(0, 40, "m", Full).ok());
  EXPECT_EQ(admission.bytes(), 100u);
}

TEST(AdmissionTest, TheServerBudgetIsSharedAndGivenBackByReleaseMoveKeepsItAndDestructionFreesIt) {
  auto budget = std::make_shared<ByteBudget>(100);
  {
    Admission first({10, 1000, budget, 2});
    Admission second({10, 1000, budget, 1});
    ASSERT_TRUE(first.Admit(0, 70, "a", Full).ok());
    const Status refused = second.Admit(0, 40, "b", Full);
    EXPECT_THAT(refused.message(),
                HasSubstr("the server has 70 input bytes waiting (limit 100, --max-queued-bytes)"));
    EXPECT_EQ(second.requests(), 0u);  // a refusal counts nothing
    ASSERT_TRUE(second.Admit(0, 30, "b", Full).ok());
    EXPECT_EQ(budget->used(), 100u);
    first.Move(0, 1, 1, 70);  // a sequence got its slot: still waiting, still counted
    EXPECT_EQ(first.requests(0), 0u);
    EXPECT_EQ(first.bytes(1), 70u);
    EXPECT_EQ(budget->used(), 100u);
    second.Release(0, 30);
    EXPECT_EQ(budget->used(), 70u);
  }  // `first` still counted 70 bytes: given back
  EXPECT_EQ(budget->used(), 0u);
}

TEST(AdmissionTest, ReleaseAllEmptiesEveryShare) {
  auto budget = std::make_shared<ByteBudget>(100);
  Admission admission({10, 1000, budget, 2});
  ASSERT_TRUE(admission.Admit(0, 5, "m", Full).ok());
  ASSERT_TRUE(admission.Admit(1, 7, "m", Full).ok());
  admission.ReleaseAll();
  EXPECT_EQ(admission.total_requests(), 0u);
  EXPECT_EQ(admission.bytes(0) + admission.bytes(1), 0u);
  EXPECT_EQ(budget->used(), 0u);
}

}  // namespace
}  // namespace sluice
