// Reads a Triton-layout model repository:
//   <root>/<model>/config.pbtxt
//   <root>/<model>/<version>/<default_model_filename, model.pt unless the config says otherwise>
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model_config.pb.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// One model directory as found on disk. When `status` is not OK the model cannot load and
// `status.message()` says why (config error, no version directory, ...); `spec` is then empty.
struct RepositoryModel {
  std::string name;
  std::filesystem::path directory;
  Status status;
  inference::ModelConfig config;                        // with Sluice's defaults filled in
  ModelSpec spec;
  std::map<int64_t, std::filesystem::path> versions;    // chosen by the version policy
};

// Scans `root`. NOT_FOUND when root is not a readable directory; a broken model never fails the
// scan, it comes back with its own status. Models are sorted by name. Directories whose name
// starts with '.' are ignored.
StatusOr<std::vector<RepositoryModel>> ScanModelRepository(const std::filesystem::path& root);

// Reads one model directory (exposed for tests).
RepositoryModel ReadModelDirectory(const std::filesystem::path& directory);

}  // namespace sluice
