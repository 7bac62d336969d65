// Reads a Triton-layout model repository:
//   <root>/<model>/config.pbtxt
//   <root>/<model>/<version>/<default_model_filename, model.pt unless the config says otherwise>
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "model_config.pb.h"  // completes RepositoryModel::config for the code that reads it
#include "server/core/repository_model.h"
#include "server/core/status.h"

namespace sluice {

// Scans `root`. NOT_FOUND when root is not a readable directory; a broken model never fails the
// scan, it comes back with its own status. Models are sorted by name. Directories whose name
// starts with '.', and __pycache__ (Python's bytecode cache), are ignored.
StatusOr<std::vector<RepositoryModel>> ScanModelRepository(const std::filesystem::path& root);

// Reads one model directory (exposed for tests). With `override.config_json`, that JSON
// (protobuf's JSON form of ModelConfig, Triton's field names) is the configuration instead of
// config.pbtxt. What Triton would complete from the model file itself, and a TorchScript file
// cannot tell (the inputs and outputs, the platform or backend), comes from config.pbtxt when the
// override has none of it; everything else is the override's alone (or Sluice's default).
RepositoryModel ReadModelDirectory(const std::filesystem::path& directory, const ModelOverride& override = {});

// The repository on disk at `root`.
class DirectoryModelSource final : public ModelSource {
 public:
  explicit DirectoryModelSource(std::filesystem::path root) : root_(std::move(root)) {}
  StatusOr<std::vector<RepositoryModel>> Scan() const override { return ScanModelRepository(root_); }
  StatusOr<RepositoryModel> Read(const std::string& name, const ModelOverride& override) const override;

 private:
  const std::filesystem::path root_;
};

}  // namespace sluice
