// TorchScript modules for the runtime tests, defined from C++ (no files lying on disk).
#pragma once

#include <filesystem>
#include <string>

#include <memory>
#include <vector>

#include "server/core/backend.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"

namespace sluice::testing {

// Defines a module whose body is `source` (TorchScript methods), saves it under a fresh
// temporary directory and returns the file's path.
std::filesystem::path SaveModule(const std::string& name, const std::string& source);

// A 3x3 convolution with all-ones weights, 1 -> 2 channels, padding 1, on the input's device.
inline constexpr char kConvSource[] = R"(
def forward(self, INPUT__0):
    w = torch.ones([2, 1, 3, 3], device=INPUT__0.device)
    return torch.conv2d(INPUT__0, w, None, [1, 1], [1, 1])
)";
ModelSpec ConvSpec();
// A batch of one 1x4x4 image of ones for kConvSource; the request views `ones`.
struct ConvRequest {
  std::vector<float> ones = std::vector<float>(16, 1.0f);
  InferRequest request;
};
std::unique_ptr<ConvRequest> MakeConvRequest();
// kConvSource's output bytes for a 1x1x4x4 input of ones (window sums: 4 at corners, 6 at edges,
// 9 inside), as FP32.
std::string ExpectedConvOutput();

// What one caller got from an execution: its outputs, as its sink received them.
struct Executed {
  std::vector<Tensor> outputs;
};
// Runs `request` on `backend` as the only caller: one target with the request's rows and
// requested outputs.
inline StatusOr<Executed> Run(ModelBackend& backend, const InferRequest& request) {
  TensorSink sink;
  const OutputTarget target{request.batch_size, &request.requested_outputs, &sink};
  SLUICE_RETURN_IF_ERROR(backend.Execute(request, absl::MakeConstSpan(&target, 1)));
  return Executed{std::move(sink.outputs())};
}

}  // namespace sluice::testing
