// Tensors in and out of the CLI: NumPy .npy files, random data, printable previews.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include "absl/strings/string_view.h"

#include "server/core/status.h"
#include "server/core/tensor.h"

namespace sluice {

// Parses the bytes of a .npy file (format 1.0, 2.0 or 3.0; C order; little-endian or
// byte-order-free types among BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64).
// INVALID_ARGUMENT says what is wrong with the file.
StatusOr<Tensor> ParseNpy(absl::string_view bytes, const std::string& name);
StatusOr<Tensor> ReadNpyFile(const std::string& path, const std::string& name);

// A tensor of `shape` filled with random values (floats in [0, 1), integers in [0, 10)).
StatusOr<Tensor> RandomTensor(const std::string& name, DataType dtype, const Shape& shape,
                              std::mt19937_64& rng);

// The first `max_values` elements as text: "[0.125, 3, ...]".
std::string PreviewValues(const Tensor& tensor, size_t max_values);

// One element as a double (FP16 and BF16 decoded).
double ElementAsDouble(const Tensor& tensor, size_t index);

}  // namespace sluice
