// Percent-decoding of URI text: escapes of either case, bytes that are not text, malformed escapes.
#include "server/core/percent_decode.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(PercentDecodeTest, DecodesEscapesOfEitherCaseAndLeavesTheRest) {
  EXPECT_EQ(PercentDecode("plain"), "plain");
  EXPECT_EQ(PercentDecode("%2e%2E%2f"), "../");
  EXPECT_EQ(PercentDecode("%5B::1%5d:80"), "[::1]:80");
  EXPECT_EQ(PercentDecode("%00%C0"), std::string("\0\xC0", 2));
  EXPECT_EQ(PercentDecode(""), "");
}

TEST(PercentDecodeTest, RefusesAPercentWithoutTwoHexDigits) {
  for (const char* bad : {"%", "%4", "a%zz", "%4g", "100%"}) {
    EXPECT_FALSE(PercentDecode(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace sluice
