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
  // The files as they were read (every file under the directory: relative path, size, mtime).
  // Model control reloads a model in poll mode when this changes. Set for broken models too, so
  // that fixing one is noticed.
  std::string fingerprint;
};

// Scans `root`. NOT_FOUND when root is not a readable directory; a broken model never fails the
// scan, it comes back with its own status. Models are sorted by name. Directories whose name
// starts with '.' are ignored.
StatusOr<std::vector<RepositoryModel>> ScanModelRepository(const std::filesystem::path& root);

// Reads one model directory (exposed for tests).
RepositoryModel ReadModelDirectory(const std::filesystem::path& directory);

// Where model control reads models from while the server runs (RepositoryModelLoad, polling).
// An interface so that the manager's tests need no files. Thread-safe.
class ModelSource {
 public:
  virtual ~ModelSource() = default;
  // Every model, as ScanModelRepository.
  virtual StatusOr<std::vector<RepositoryModel>> Scan() const = 0;
  // One model as it is now. INVALID_ARGUMENT for a name that is not a plain directory name
  // ("", ".", "..", "a/b", ".hidden"): a client-supplied name never leaves the repository.
  // NOT_FOUND when the repository has no such directory. A broken model is returned with its
  // own status, as by ScanModelRepository.
  virtual StatusOr<RepositoryModel> Read(const std::string& name) const = 0;
};

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
