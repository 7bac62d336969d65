#include "tests/runtime/test_modules.h"

#include <unistd.h>

#include <torch/script.h>

namespace sluice::testing {

std::filesystem::path SaveModule(const std::string& name, const std::string& source) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("sluice_runtime_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  torch::jit::Module module(name);
  module.define(source);
  const auto path = dir / (name + ".pt");
  module.save(path.string());
  return path;
}

}  // namespace sluice::testing

namespace sluice::testing {

ModelSpec ConvSpec() {
  ModelSpec spec;
  spec.name = "conv";
  spec.max_batch_size = 4;
  spec.inputs = {{"INPUT__0", DataType::kFp32, {1, 4, 4}}};
  spec.outputs = {{"OUTPUT__0", DataType::kFp32, {2, 4, 4}}};
  return spec;
}

std::unique_ptr<ConvRequest> MakeConvRequest() {
  auto conv = std::make_unique<ConvRequest>();
  conv->request.batch_size = 1;
  conv->request.inputs = {{"INPUT__0",
                           DataType::kFp32,
                           {1, 1, 4, 4},
                           reinterpret_cast<const char*>(conv->ones.data()),
                           64,
                           {}}};
  return conv;
}

std::string ExpectedConvOutput() {
  const float plane[16] = {4, 6, 6, 4, 6, 9, 9, 6, 6, 9, 9, 6, 4, 6, 6, 4};
  std::string one(reinterpret_cast<const char*>(plane), sizeof(plane));
  return one + one;
}

}  // namespace sluice::testing
