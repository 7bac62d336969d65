// Element counts and shape text (server/core/tensor.h).
#include "server/core/tensor.h"

#include <cstdint>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(TensorTest, ElementCountRejectsNegativeAndOverflow) {
  EXPECT_EQ(*ElementCount({2, 3, 4}), 24);
  EXPECT_EQ(*ElementCount({}), 1);
  EXPECT_EQ(*ElementCount({5, 0}), 0);
  EXPECT_THAT(ElementCount({2, -1}).status().message(), HasSubstr("negative"));
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THAT(ElementCount({big, 3}).status().message(), HasSubstr("too many elements"));
  EXPECT_EQ(ShapeToString({1, 2, 3}), "[1,2,3]");
}

}  // namespace
}  // namespace sluice
