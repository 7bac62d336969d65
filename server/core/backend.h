// The seam between scheduling and execution. server/runtime implements it with LibTorch; tests
// implement it with fakes. Nothing here pulls in torch.
#pragma once

#include <filesystem>
#include <memory>

#include "server/core/device.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// One loaded model instance on one device. Thread-compatible: a scheduler calls Execute from one
// worker thread at a time per instance.
class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  // Runs one forward pass over a validated request; outputs come back in the order of
  // request.requested_outputs (every declared output, in config order, when that is empty).
  // Never throws: model failures are statuses (INTERNAL, RESOURCE_EXHAUSTED for out of memory).
  virtual StatusOr<InferResponse> Execute(const InferRequest& request) = 0;
};

// Loads model instances. Thread-safe.
class BackendFactory {
 public:
  virtual ~BackendFactory() = default;
  virtual StatusOr<std::unique_ptr<ModelBackend>> Load(const ModelSpec& spec,
                                                       const std::filesystem::path& model_file,
                                                       const Device& device) = 0;
  // Whether CUDA is usable (a driver, a GPU, and a CUDA build of the runtime), and how many GPUs.
  virtual bool CudaUsable() const = 0;
  virtual int CudaDeviceCount() const = 0;
};

}  // namespace sluice
