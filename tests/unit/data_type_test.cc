// Data type names and sizes (server/core/data_type.h).
#include "server/core/data_type.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

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

uint16_t Bits16(const std::string& bytes) {
  uint16_t bits = 0;
  std::memcpy(&bits, bytes.data(), sizeof(bits));
  return bits;
}

TEST(DataTypeTest, HalfAndBfloat16ReadBackWhatScalarBytesWrote) {
  for (double value : {0.0, -0.0, 1.0, -2.5, 0.333251953125, 65504.0, 6.103515625e-05,
                       5.960464477539063e-08 /* the smallest subnormal half */}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(HalfToFloat(Bits16(ScalarBytes(DataType::kFp16, value))), static_cast<float>(value));
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  for (double value : {0.0, 1.0, -3.0, 0.5, 1e30}) {
    SCOPED_TRACE(value);
    const float exact = Bfloat16ToFloat(Bits16(ScalarBytes(DataType::kBf16, value)));
    EXPECT_NEAR(exact, value, std::abs(value) / 128);  // 8 bits of mantissa
  }
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(0x7fc0)));
}

}  // namespace
}  // namespace sluice
