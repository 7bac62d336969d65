// What a model file says about its own tensors, for filling in a configuration that leaves them
// out (Triton's auto-complete). The runtime reads model files (server/runtime: an AOTInductor
// package's metadata); the repository fills config.pbtxt's fields from the description. Neither
// torch nor protobuf here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/status.h"
#include "server/core/tensor.h"

namespace sluice {

struct DescribedTensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape dims;  // without the batch dimension; -1 where the size may vary
};

struct ModelDescription {
  std::string platform;  // the config platform that serves the file ("torch_aoti")
  // Whether dimension 0 of every tensor is the batch, and its largest size (-1: unbounded).
  bool batched = false;
  int64_t batch_max = -1;
  std::vector<DescribedTensor> inputs, outputs;
};

class ModelDescriber {
 public:
  virtual ~ModelDescriber() = default;
  // The tensors of the model file `file` (a version directory's model file). FAILED_PRECONDITION
  // saying what the file lacks and what to write instead when it cannot tell them; the error of
  // reading it otherwise.
  virtual StatusOr<ModelDescription> Describe(const std::filesystem::path& file) const = 0;
};

}  // namespace sluice
