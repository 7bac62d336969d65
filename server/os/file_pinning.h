// Pinned model code: a model's native code (a .pt2 package, an operator library, a TorchScript
// file) loads only when its bytes are the bytes an operator pinned with a SHA-256 digest.
//
// The digests come from a manifest outside what they pin (--model-digests): sha256sum's own
// format, so that `cd <repository> && sha256sum */1/model.pt2 > digests` writes one. There is
// no window between the check and the use: the file is opened once, the bytes read from that
// descriptor are hashed as they are copied into a private directory (0700, this process's), and
// the loader is given the copy. A file swapped in the repository after it was read cannot be
// loaded, and a mismatch is refused before anything of the file runs.
//
// Torch-free and server-free: the runtime asks ModelPinning for the path to load.
#pragma once

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

// SHA-256, fed in pieces. Thread-compatible.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  // The digest of everything fed, as 64 lower-case hex digits. Call once.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};
std::string Sha256Hex(absl::string_view data);

// A digests manifest: lines "<64 hex digits>  <path>" (sha256sum's text mode; " *<path>", its
// binary mode, too), blank lines and lines starting with '#' skipped. A relative path is relative
// to `root`. Keys are the paths made absolute and lexically normal; digests lower-case.
// INVALID_ARGUMENT naming `source` and the line for anything else, and for a path given twice
// with two digests.
absl::StatusOr<std::map<std::string, std::string>> ParseDigestManifest(
    absl::string_view text, const std::filesystem::path& root, const std::string& source);

// A copy of a file and the SHA-256 of the bytes copied.
struct CopiedFile {
  std::filesystem::path path;
  std::string sha256;
};
// Opens `source` once (a regular file, after following symbolic links), and copies what it reads
// from that descriptor into a new file in `directory` named `name` (O_EXCL: never an existing
// file), hashing the same bytes. The copy is readable and executable by its owner only.
absl::StatusOr<CopiedFile> CopyAndHash(const std::filesystem::path& source,
                                       const std::filesystem::path& directory,
                                       const std::string& name);

// Thread-safe.
class ModelPinning {
 public:
  struct Options {
    std::filesystem::path manifest;    // --model-digests; empty: no digests (only `require`)
    std::filesystem::path repository;  // what the manifest's relative paths are relative to
    bool require = false;              // --require-model-digests: every file must be pinned
    // Where the copies go: created (0700) when missing; an existing one must be this process's
    // owner's and closed to everyone else. Removed with its copies when this is destroyed.
    std::filesystem::path directory;
  };
  // INVALID_ARGUMENT when `require` has no manifest, or the manifest cannot be read or parsed;
  // FAILED_PRECONDITION when the directory cannot be made private.
  static absl::StatusOr<std::unique_ptr<ModelPinning>> Create(Options options);
  ~ModelPinning();

  // The path to load `file` from (`what` names it in messages: "operator library", "model
  // file"). A file the manifest pins: a copy in the private directory whose digest was checked
  // (the caller may remove it once loaded, or keep it: it goes with this object). A file it does
  // not pin: `file` itself, or PERMISSION_DENIED with `require`. A digest that differs:
  // PERMISSION_DENIED with the expected and the actual digest, and no copy is left. The
  // manifest is read again on each call, so that an operator updates it with the repository.
  absl::StatusOr<std::filesystem::path> Pin(const std::filesystem::path& file,
                                            absl::string_view what) const;

  bool require() const { return options_.require; }
  const std::filesystem::path& directory() const { return options_.directory; }

 private:
  explicit ModelPinning(Options options) : options_(std::move(options)) {}
  absl::StatusOr<std::map<std::string, std::string>> ReadManifest() const;

  const Options options_;
  mutable std::atomic<uint64_t> copies_{0};  // names each copy uniquely
};

}  // namespace sluice
