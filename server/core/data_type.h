// Tensor element types Sluice serves, with their KServe v2 wire names ("FP32", "INT64", ...).
#pragma once

#include <cstddef>
#include <cstdint>
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
  // Variable-length byte strings (Triton's TYPE_STRING). On the wire and inside Sluice each element
  // is a 4-byte little-endian length followed by that many bytes, elements back to back in
  // row-major order (server/core/bytes_tensor.h); TorchScript models take and return List[str].
  kBytes,
};

// All supported types, in declaration order (for tests and documentation).
inline constexpr DataType kAllDataTypes[] = {DataType::kBool,  DataType::kUint8, DataType::kInt8,
                                             DataType::kInt16, DataType::kInt32, DataType::kInt64,
                                             DataType::kFp16,  DataType::kBf16,  DataType::kFp32,
                                             DataType::kFp64,  DataType::kBytes};

// The protocol name: "BOOL", "UINT8", ..., "BF16", "FP32", "BYTES".
const char* DataTypeName(DataType type);

// Parses a protocol name; nullopt for names Sluice does not serve ("UINT16", "UINT32", ...).
std::optional<DataType> ParseDataTypeName(std::string_view name);

// Bytes per element on the wire (BOOL is one byte per element); 0 for BYTES, whose elements have
// no fixed size: every caller that sizes a buffer from a shape must treat BYTES on its own.
size_t ElementSize(DataType type);
inline bool HasFixedSize(DataType type) { return type != DataType::kBytes; }

// The supported protocol names, comma-separated, for error messages.
const char* SupportedDataTypeNames();

// An FP16 / BF16 element's value (every half and bfloat16 value is exact as a float).
float HalfToFloat(uint16_t half);
float Bfloat16ToFloat(uint16_t bfloat16);

// One element of `type` holding `value` (converted as a C++ cast would; FP16 and BF16 rounded to
// nearest even), as the little-endian bytes the wire and the runtime use. BYTES: one element
// holding the value's decimal text.
std::string ScalarBytes(DataType type, double value);

}  // namespace sluice
