#include "server/core/data_type.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t raw_exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (raw_exponent == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  const int exponent = static_cast<int>(raw_exponent) - 127 + 15;
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (exponent <= 0) {                                               // subnormal or zero
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    const int shift = 14 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t middle = 1u << (shift - 1);
    if (rest > middle || (rest == middle && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry rounds up the exponent
  return static_cast<uint16_t>(half);
}

uint16_t FloatToBfloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
std::string BytesOf(T value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {        // subnormal: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(127 - 15 + 1 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

float Bfloat16ToFloat(uint16_t bfloat16) {
  const uint32_t bits = static_cast<uint32_t>(bfloat16) << 16;
  float value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

std::string ScalarBytes(DataType type, double value) {
  switch (type) {
    case DataType::kBool:
      return BytesOf<uint8_t>(value != 0 ? 1 : 0);
    case DataType::kUint8:
      return BytesOf(static_cast<uint8_t>(value));
    case DataType::kInt8:
      return BytesOf(static_cast<int8_t>(value));
    case DataType::kInt16:
      return BytesOf(static_cast<int16_t>(value));
    case DataType::kInt32:
      return BytesOf(static_cast<int32_t>(value));
    case DataType::kInt64:
      return BytesOf(static_cast<int64_t>(value));
    case DataType::kFp16:
      return BytesOf(FloatToHalf(static_cast<float>(value)));
    case DataType::kBf16:
      return BytesOf(FloatToBfloat16(static_cast<float>(value)));
    case DataType::kFp32:
      return BytesOf(static_cast<float>(value));
    case DataType::kFp64:
      return BytesOf(value);
    case DataType::kBytes: {
      std::string text = absl::StrCat(value);
      std::string element = BytesOf(static_cast<uint32_t>(text.size()));
      return element + text;
    }
  }
  return "";
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kBool:
      return "BOOL";
    case DataType::kUint8:
      return "UINT8";
    case DataType::kInt8:
      return "INT8";
    case DataType::kInt16:
      return "INT16";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kFp16:
      return "FP16";
    case DataType::kBf16:
      return "BF16";
    case DataType::kFp32:
      return "FP32";
    case DataType::kFp64:
      return "FP64";
    case DataType::kBytes:
      return "BYTES";
  }
  return "INVALID";
}

std::optional<DataType> ParseDataTypeName(std::string_view name) {
  for (DataType type : kAllDataTypes) {
    if (name == DataTypeName(type)) return type;
  }
  return std::nullopt;
}

size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kBool:
    case DataType::kUint8:
    case DataType::kInt8:
      return 1;
    case DataType::kInt16:
    case DataType::kFp16:
    case DataType::kBf16:
      return 2;
    case DataType::kInt32:
    case DataType::kFp32:
      return 4;
    case DataType::kInt64:
    case DataType::kFp64:
      return 8;
    case DataType::kBytes:
      return 0;
  }
  return 0;
}

const char* SupportedDataTypeNames() {
  return "BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES";
}

}  // namespace sluice
