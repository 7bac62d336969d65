// LibTorch implementation of the backend seam: loads TorchScript files and AOTInductor packages
// and runs them. This header
// is torch-free on purpose; only torch_backend.cc includes LibTorch.
#pragma once

#include <memory>
#include <string>

#include "server/core/backend.h"
#include "server/core/model_description.h"
#include "server/runtime/environment.h"
#include "server/runtime/operator_libraries.h"

namespace sluice {

// LibTorch's process-wide cuDNN switches, set once at start-up, before any model loads.
struct CudnnSettings {
  bool benchmark = false;      // the global flag: what convolutions the graph rewrite cannot
                               // reach follow (--cudnn-benchmark on sets it)
  bool deterministic = false;  // --cudnn-deterministic
  bool allow_tf32 = true;      // --allow-tf32: TF32 in cuDNN convolutions (LibTorch's default)
};
void ConfigureCudnn(const CudnnSettings& settings);

// Factory for model instances of both PyTorch formats: TorchScript files (below) and, for
// platform "torch_aoti", AOTInductor packages (see aoti_backend.h and aoti_package.h).
//
// Input mapping (as Triton's PyTorch backend): config inputs bind to forward() arguments by name
// when every config input name is a forward argument name; otherwise by the `<name>__<index>`
// suffix (INPUT__0, INPUT__1, ...). Outputs: forward may return a tensor (one output), a
// tuple/list of tensors (bound by `__<index>` suffix, else in config order) or a dict of tensors
// (bound by key). Every convolution is rewritten to carry the model's cuDNN benchmark decision
// (ModelSpec::cudnn_benchmark) and the process's cuDNN flags (see convolution_rewrite.h); where
// that is impossible the model claims LibTorch's global flag (the first such model wins; the
// conflict is reported in ModelBackend::Tuning). Forward runs under c10::InferenceMode; LibTorch
// exceptions become statuses that keep the torch message (truncated). The operator libraries a
// model names (ModelSpec::operator_libraries, init_library) are loaded through `libraries` before
// the model's file, and an init library's hook is called for each instance before it loads (see
// operator_libraries.h); with `libraries` null such a model is refused. `info` is what ProbeRuntime
// found (pass it when you already probed, as the server does).
std::unique_ptr<BackendFactory> MakeTorchBackendFactory(const RuntimeInfo& info,
                                                        OperatorLibraries* libraries = nullptr);
std::unique_ptr<BackendFactory> MakeTorchBackendFactory();

// Describes AOTInductor packages (.pt2) for Triton's auto-complete (core/model_description.h):
// their inputs and outputs with the batch range, from the metadata Sluice's export recipe
// (models/sluice_export.py) writes into them. A package without that metadata is
// FAILED_PRECONDITION: LibTorch 2.11's loader cannot tell its tensors.
std::unique_ptr<ModelDescriber> MakePackageDescriber();

}  // namespace sluice
