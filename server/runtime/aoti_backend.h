// The AOTInductor runtime: serves torch.export packages (.pt2, platform "torch_aoti") through
// the backend seam. Internal to server/runtime (torch_backend.cc's factory calls it); includes
// LibTorch through torch_common.h.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "server/core/backend.h"
#include "server/runtime/aoti_package.h"
#include "server/runtime/torch_common.h"

namespace sluice {

// Sets AOTI_RUNTIME_CHECK_INPUTS=1, so that a package given inputs it was not compiled for
// answers with an error instead of undefined behaviour. Call before any package loads.
void EnableAotiInputChecks();

// Loads `count` instances of a package on `device`: the package file for the device
// (PackageFileFor), its metadata checked against this host and the config (CheckPackageHost,
// BindAotiPackage) before any of its code is loaded, then one AOTIModelPackageLoader with
// `count` runners (the weights are shared; each instance's run takes a free runner, on the
// instance's own CUDA stream on a GPU). Loaders are built one at a time, process-wide.
// `warnings` gets what serves but deserves a word.
StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadAotiInstances(
    const ModelSpec& spec, const std::filesystem::path& file, const Device& device, int count,
    const AotiHost& host, std::shared_ptr<StreamRecycler> streams);

}  // namespace sluice
