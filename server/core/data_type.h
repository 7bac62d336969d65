// Tensor element types Sluice serves, with their KServe v2 wire names ("FP32", "INT64", ...).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

enum class DataType {
  kBool,
  kUint8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
};

// All supported types, in declaration order (for tests and documentation).
inline constexpr DataType kAllDataTypes[] = {
    DataType::kBool,  DataType::kUint8, DataType::kInt8, DataType::kInt16, DataType::kInt32,
    DataType::kInt64, DataType::kFp16,  DataType::kBf16, DataType::kFp32,  DataType::kFp64};

// The protocol name: "BOOL", "UINT8", ..., "BF16", "FP32".
const char* DataTypeName(DataType type);

// Parses a protocol name; nullopt for names Sluice does not serve (including "BYTES", "UINT16").
std::optional<DataType> ParseDataTypeName(std::string_view name);

// Bytes per element on the wire (BOOL is one byte per element).
size_t ElementSize(DataType type);

// One element of `type` holding `value` (converted as a C++ cast would; FP16 and BF16 rounded to
// nearest even), as the little-endian bytes the wire and the runtime use.
std::string ScalarBytes(DataType type, double value);

}  // namespace sluice
