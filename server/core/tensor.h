// The tensor types that cross Sluice's module seams (no protobuf, no torch on either side).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/status.h"

namespace sluice {

using Shape = std::vector<int64_t>;

// Number of elements in `shape`; INVALID_ARGUMENT for negative dimensions or an element count that
// overflows (so a hostile shape cannot make us allocate or index out of range).
StatusOr<int64_t> ElementCount(const Shape& shape);

// "[2,3,224,224]", for messages and logs.
std::string ShapeToString(const Shape& shape);

// A non-owning view of one input tensor's little-endian, row-major bytes. Whoever builds the
// InferRequest guarantees that `data` outlives it (see InferRequest).
struct TensorView {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape shape;
  const char* data = nullptr;
  size_t byte_size = 0;
};

// An owning tensor, used for outputs: `data` is a std::string so that the front ends can move it
// into the protobuf response without another copy.
struct Tensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape shape;
  std::string data;
};

}  // namespace sluice
