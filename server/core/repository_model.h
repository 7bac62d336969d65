// A model of the repository as the server stages see it: its spec, its selected versions and
// whether it can load at all. No protobuf: Triton's ModelConfig message rides along as an opaque
// reference that only the repository (which fills it) and the api (which reports it) look into,
// so the manager neither includes nor links protobuf.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace inference {
class ModelConfig;  // model_config.proto; complete in server/repository and the front ends only
}  // namespace inference

namespace sluice {

// One model directory as found on disk. When `status` is not OK the model cannot load and
// `status.message()` says why (config error, no version directory, ...); `spec` is then empty.
struct RepositoryModel {
  std::string name;
  std::filesystem::path directory;
  Status status;
  // The parsed config.pbtxt with Sluice's defaults filled in (what the ModelConfig RPC reports);
  // null when the config could not be parsed, and in tests that need no protobuf.
  std::shared_ptr<const inference::ModelConfig> config;
  ModelSpec spec;
  std::map<int64_t, std::filesystem::path> versions;  // chosen by the version policy
  // The files as they were read (every file under the directory: relative path, size, mtime).
  // Model control reloads a model in poll mode when this changes. Set for broken models too, so
  // that fixing one is noticed.
  std::string fingerprint;
};

// What a load request sends in place of the repository's configuration and files (Triton's load
// parameters), for this load only; a later load without them goes back to the repository.
//   config_json: "config", a ModelConfig in JSON, used instead of config.pbtxt.
//   files: "file:<path>" entries, the model directory's files (path relative to it, e.g.
//          "1/model.pt"); with files the model is these files and the config alone, not the
//          repository's directory. The front ends check the paths and the sizes.
struct ModelOverride {
  std::optional<std::string> config_json;
  std::map<std::string, std::string> files;
  bool empty() const { return !config_json.has_value() && files.empty(); }
};

// Where model control reads models from while the server runs (start-up, RepositoryModelLoad,
// polling). An interface so that the manager's tests need no files. Thread-safe.
class ModelSource {
 public:
  virtual ~ModelSource() = default;
  // Every model, sorted by name, as ScanModelRepository (server/repository).
  virtual StatusOr<std::vector<RepositoryModel>> Scan() const = 0;
  // One model as it is now. INVALID_ARGUMENT for a name that is not a plain directory name
  // ("", ".", "..", "a/b", ".hidden"): a client-supplied name never leaves the repository.
  // NOT_FOUND when the repository has no such directory. A broken model is returned with its
  // own status, as by ScanModelRepository. With an override, the model is read with its config
  // (see DirectoryModelSource); a bad override is the model's status (INVALID_ARGUMENT).
  virtual StatusOr<RepositoryModel> Read(const std::string& name,
                                         const ModelOverride& override) const = 0;
  // Model files sent with loads are kept where the source writes them until the load that wrote
  // them is no longer served: after every load and unload of `name`, model control names the
  // directory that serves now (empty: none), and the source removes the others it wrote for
  // `name`. Nothing to do for a source that writes nothing.
  virtual void Retain(const std::string& name, const std::filesystem::path& serving) const {}
};

}  // namespace sluice
