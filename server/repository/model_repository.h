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

// Reads one model directory (exposed for tests).
RepositoryModel ReadModelDirectory(const std::filesystem::path& directory);

// The repository on disk at `root`.
class DirectoryModelSource final : public ModelSource {
 public:
  explicit DirectoryModelSource(std::filesystem::path root) : root_(std::move(root)) {}
  StatusOr<std::vector<RepositoryModel>> Scan() const override { return ScanModelRepository(root_); }
  StatusOr<RepositoryModel> Read(const std::string& name) const override;

 private:
  const std::filesystem::path root_;
};

}  // namespace sluice
