// Data type names and sizes (server/core/data_type.h).
#include "server/core/data_type.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(DataTypeTest, NamesRoundTripAndSizes) {
  for (DataType type : kAllDataTypes) {
    ASSERT_EQ(ParseDataTypeName(DataTypeName(type)), type);
  }
  EXPECT_EQ(ElementSize(DataType::kBool), 1u);
  EXPECT_EQ(ElementSize(DataType::kBf16), 2u);
  EXPECT_EQ(ElementSize(DataType::kFp32), 4u);
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
  EXPECT_EQ(ParseDataTypeName("BYTES"), DataType::kBytes);
  EXPECT_EQ(ElementSize(DataType::kBytes), 0u);  // no fixed size
  EXPECT_FALSE(HasFixedSize(DataType::kBytes));
  EXPECT_FALSE(ParseDataTypeName("fp32").has_value());
  EXPECT_FALSE(ParseDataTypeName("UINT16").has_value());
}

}  // namespace
}  // namespace sluice
