// Reads a Triton-layout model repository:
//   <root>/<model>/config.pbtxt
//   <root>/<model>/<version>/<default_model_filename, model.pt unless the config says otherwise>
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"

#include "model_config.pb.h"  // completes RepositoryModel::config for the code that reads it
#include "server/core/model_description.h"
#include "server/core/mutex.h"
#include "server/core/repository_model.h"
#include "server/core/status.h"

namespace sluice {

// Scans `root`. NOT_FOUND when root is not a readable directory; a broken model never fails the
// scan, it comes back with its own status. Models are sorted by name. Directories whose name
// starts with '.', and __pycache__ (Python's bytecode cache), are ignored.
// With a `describer`, configurations are completed from the model files (see ReadModelDirectory).
StatusOr<std::vector<RepositoryModel>> ScanModelRepository(
    const std::filesystem::path& root, const ModelDescriber* describer = nullptr);

// Reads one model directory (exposed for tests). With `override.config_json`, that JSON
// (protobuf's JSON form of ModelConfig, Triton's field names) is the configuration instead of
// config.pbtxt. What Triton would complete from the model file itself, and a TorchScript file
// cannot tell (the inputs and outputs, the platform or backend), comes from config.pbtxt when the
// override has none of it; everything else is the override's alone (or Sluice's default).
// `name` empty: the directory's name. With a `describer` (Triton's auto-complete, on unless
// --disable-auto-complete-config), a configuration that names no inputs and outputs, or a missing
// config.pbtxt, is completed from the newest version's model file: inputs, outputs, the platform,
// max_batch_size (the exported batch dimension's upper bound, else kDefaultMaxBatchSize) and
// dynamic_batching {}; a TorchScript file, which cannot tell its tensors, is refused saying what
// to declare. The ModelConfig RPC shows the completed configuration.
RepositoryModel ReadModelDirectory(const std::filesystem::path& directory,
                                   const ModelOverride& override = {}, const std::string& name = "",
                                   const ModelDescriber* describer = nullptr);

// max_batch_size for a completed configuration whose model's batch dimension has no upper bound
// (Triton's default-max-batch-size).
inline constexpr int kDefaultMaxBatchSize = 4;

// Where the model files sent with loads go (--allow-load-files): a private directory, never the
// user's repository, emptied when the store is made and removed when it is destroyed; each load
// gets a directory of its own below it (<model>.<n>), removed once that load serves no more
// (ModelSource::Retain), or at once when it fails. Thread-safe.
class LoadedFileStore {
 public:
  struct Options {
    std::filesystem::path root;        // --load-files-dir
    uint64_t disk_bytes = 8ull << 30;  // --load-files-disk-bytes: all loads' files together
  };
  // Creates (or empties) `root`. INVALID_ARGUMENT when it cannot.
  static StatusOr<std::unique_ptr<LoadedFileStore>> Create(Options options);
  ~LoadedFileStore();

  // Writes `files` into a new directory for `name` and returns it. RESOURCE_EXHAUSTED (with the
  // numbers) when they would take the store past disk_bytes; INTERNAL when writing fails. Nothing
  // is left behind on an error.
  StatusOr<std::filesystem::path> Write(const std::string& name,
                                        const std::map<std::string, std::string>& files);
  // Removes every directory written for `name` except `serving`.
  void Retain(const std::string& name, const std::filesystem::path& serving);
  // Removes the one directory `directory` (a load of it failed).
  void Discard(const std::filesystem::path& directory);
  uint64_t bytes_in_use() const;
  const std::filesystem::path& root() const { return options_.root; }

 private:
  explicit LoadedFileStore(Options options) : options_(std::move(options)) {}
  const Options options_;
  mutable Mutex mutex_;
  struct Written {
    std::string name;
    uint64_t bytes = 0;
  };
  // Forgets and deletes the directories `which` picks.
  void Remove(absl::FunctionRef<bool(const std::filesystem::path&, const Written&)> which)
      ABSL_LOCKS_EXCLUDED(mutex_);
  std::map<std::filesystem::path, Written> written_ ABSL_GUARDED_BY(mutex_);
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t next_ ABSL_GUARDED_BY(mutex_) = 1;
};

// The repository on disk at `root`, and the store for files sent with loads (null: none).
class DirectoryModelSource final : public ModelSource {
 public:
  // `describer`: completes configurations from model files (null: auto-complete off).
  explicit DirectoryModelSource(std::filesystem::path root, LoadedFileStore* files = nullptr,
                                const ModelDescriber* describer = nullptr)
      : root_(std::move(root)), files_(files), describer_(describer) {}
  StatusOr<std::vector<RepositoryModel>> Scan() const override {
    return ScanModelRepository(root_, describer_);
  }
  // With override.files, the model is those files (written to the store) and the override's
  // config, whether or not the repository has a directory `name`; FAILED_PRECONDITION without a
  // store.
  StatusOr<RepositoryModel> Read(const std::string& name,
                                 const ModelOverride& override) const override;
  void Retain(const std::string& name, const std::filesystem::path& serving) const override;

 private:
  const std::filesystem::path root_;
  LoadedFileStore* const files_;
  const ModelDescriber* const describer_;
};

}  // namespace sluice
