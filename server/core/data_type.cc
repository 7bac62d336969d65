#include "server/core/data_type.h"

namespace sluice {

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kBool: return "BOOL";
    case DataType::kUint8: return "UINT8";
    case DataType::kInt8: return "INT8";
    case DataType::kInt16: return "INT16";
    case DataType::kInt32: return "INT32";
    case DataType::kInt64: return "INT64";
    case DataType::kFp16: return "FP16";
    case DataType::kBf16: return "BF16";
    case DataType::kFp32: return "FP32";
    case DataType::kFp64: return "FP64";
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
    case DataType::kInt8: return 1;
    case DataType::kInt16:
    case DataType::kFp16:
    case DataType::kBf16: return 2;
    case DataType::kInt32:
    case DataType::kFp32: return 4;
    case DataType::kInt64:
    case DataType::kFp64: return 8;
  }
  return 0;
}

}  // namespace sluice
