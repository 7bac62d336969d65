// LibTorch implementation of the backend seam: loads TorchScript files and runs them. This header
// is torch-free on purpose; only torch_backend.cc includes LibTorch.
#pragma once

#include <memory>
#include <string>

#include "server/core/backend.h"

namespace sluice {

// What this process runs on, for the start-up log and ServerMetadata.
struct RuntimeInfo {
  std::string torch_version;    // "2.11.0"
  bool cuda_built = false;      // LibTorch was built with CUDA
  bool cuda_usable = false;     // ...and a driver and a GPU are there
  int cuda_device_count = 0;
  std::string cuda_runtime_version;  // "13.0", empty without CUDA
  std::string cudnn_version;         // "9.19.0", empty without cuDNN
  std::string problem;               // why CUDA is not usable, in words an operator can act on
};

RuntimeInfo ProbeRuntime();

// Factory for TorchScript model instances.
//
// Input mapping (as Triton's PyTorch backend): config inputs bind to forward() arguments by name
// when every config input name is a forward argument name; otherwise by the `<name>__<index>`
// suffix (INPUT__0, INPUT__1, ...). Outputs: forward may return a tensor (one output), a
// tuple/list of tensors (bound by `__<index>` suffix, else in config order) or a dict of tensors
// (bound by key). Forward runs under c10::InferenceMode; LibTorch exceptions become statuses that
// keep the torch message (truncated).
// `info` is what ProbeRuntime found (pass it when you already probed, as the server does).
std::unique_ptr<BackendFactory> MakeTorchBackendFactory(const RuntimeInfo& info);
std::unique_ptr<BackendFactory> MakeTorchBackendFactory();

}  // namespace sluice
