#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/tensor_io.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A version 1.0 .npy file as numpy writes it.
std::string Npy(const std::string& descr, const std::string& shape, const std::string& data,
                const std::string& fortran = "False") {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  return file + header + data;
}

TEST(TensorIoTest, ParsesNpy) {
  float values[6] = {0, 1, 2, 3, 4, 5.5f};
  auto tensor = ParseNpy(
      Npy("<f4", "(2, 3)", std::string(reinterpret_cast<char*>(values), sizeof(values))), "x");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype, DataType::kFp32);
  EXPECT_THAT(tensor->shape, ElementsAre(2, 3));
  EXPECT_EQ(ElementAsDouble(*tensor, 5), 5.5);
  auto scalar = ParseNpy(Npy("|b1", "()", std::string("\x01", 1)), "b");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  auto vector = ParseNpy(Npy("<i8", "(2,)", std::string(16, '\0')), "v");
  ASSERT_TRUE(vector.ok()) << vector.status();
  EXPECT_THAT(vector->shape, ElementsAre(2));
}

TEST(TensorIoTest, NpyErrors) {
  EXPECT_THAT(ParseNpy("garbage!!!!!", "x").status().message(), HasSubstr("not a .npy file"));
  EXPECT_THAT(ParseNpy(Npy("<f4", "(2,)", std::string(4, '\0')), "x").status().message(),
              HasSubstr("holds 4 data bytes, its shape needs 8"));
  EXPECT_THAT(ParseNpy(Npy(">f4", "(1,)", std::string(4, '\0')), "x").status().message(),
              HasSubstr("big-endian"));
  EXPECT_THAT(ParseNpy(Npy("<c8", "(1,)", std::string(8, '\0')), "x").status().message(),
              HasSubstr("not supported"));
  EXPECT_THAT(ParseNpy(Npy("<f4", "(1,)", std::string(4, '\0'), "True"), "x").status().message(),
              HasSubstr("Fortran"));
}

TEST(TensorIoTest, RandomTensorsHaveTheirShapeAndRange) {
  std::mt19937_64 rng(1);
  for (DataType type : kAllDataTypes) {
    auto tensor = RandomTensor("t", type, {2, 5}, rng);
    ASSERT_TRUE(tensor.ok());
    if (type == DataType::kBytes) {
      EXPECT_TRUE(CheckBytesTensor("t", tensor->data, 10, /*require_utf8=*/true).ok());
      for (std::string_view word : SplitBytesTensor(tensor->data)) {
        EXPECT_THAT(std::string(word), ::testing::MatchesRegex("[a-z]+"));
      }
      EXPECT_THAT(PreviewValues(*tensor, 2),
                  ::testing::MatchesRegex(R"(\["[a-z]+", "[a-z]+", \.\.\. \(10 values\)\])"));
      continue;
    }
    ASSERT_EQ(tensor->data.size(), 10 * ElementSize(type));
    for (size_t i = 0; i < 10; ++i) {
      const double value = ElementAsDouble(*tensor, i);
      EXPECT_GE(value, 0.0) << DataTypeName(type);
      EXPECT_LT(value, 10.0) << DataTypeName(type);
    }
  }
}

TEST(TensorIoTest, HalfAndBfloatDecode) {
  Tensor half{"h", DataType::kFp16, {3}, std::string(6, '\0')};
  const uint16_t bits[3] = {0x3c00, 0xc000, 0x0001};  // 1.0, -2.0, smallest subnormal
  std::memcpy(half.data.data(), bits, sizeof(bits));
  EXPECT_EQ(ElementAsDouble(half, 0), 1.0);
  EXPECT_EQ(ElementAsDouble(half, 1), -2.0);
  EXPECT_NEAR(ElementAsDouble(half, 2), 5.960464477539063e-08, 1e-15);
  Tensor bf{"b", DataType::kBf16, {1}, std::string(2, '\0')};
  const uint16_t one = 0x3f80;
  std::memcpy(bf.data.data(), &one, 2);
  EXPECT_EQ(ElementAsDouble(bf, 0), 1.0);
  EXPECT_EQ(PreviewValues(half, 2), "[1, -2, ... (3 values)]");
}

}  // namespace
}  // namespace sluice
