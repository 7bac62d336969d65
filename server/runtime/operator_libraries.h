// Operator libraries: shared libraries that register TorchScript and AOTInductor operators
// (TORCH_LIBRARY) and their kernels, loaded into the server before the models that call them.
//
// Rules (docs/guide/model-repository.md, "Operator libraries and detection models"):
//   - A library is process-global and never unloaded: unloading would deregister kernels that
//     loaded graphs still call. A model that names a library already loaded shares it; a file
//     that changed on disk since it was loaded is refused (restart to take the new one).
//   - Registering an operator namespace that is already taken aborts the process from the
//     library's static initializers, so each library is first loaded in a child process (the
//     probe: this program again, with kProbeArgument, after the libraries already loaded), and a
//     library whose probe fails is refused with the reason (the child's exit, its last words on
//     stderr) while the server goes on. A refusal is remembered for that file until it changes.
//   - A library a model names resolves only inside the model's directory or a directory the
//     operator allowed (--operator-library-dir), after following symbolic links; `..` is never
//     accepted. The repository layer refuses absolute paths from configuration overrides and
//     libraries among files sent with a load (server/repository).
//   - MODEL_INIT_LIBRARY (Triton's PyTorch backend): when the library exports
//     `void* triton_pytorch_model_init(const char* version_dir, int device_index)`, it is called
//     once per model instance before the instance loads (device_index -1 on the CPU), and
//     `void triton_pytorch_model_fini(void*)`, when exported, with what it returned once the
//     instance is gone.
//
// This header and operator_libraries.cc are torch-free; the probe's child side, which asks
// LibTorch's dispatcher what a library registered, is in operator_library_probe.cc.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/core/mutex.h"
#include "server/core/status.h"
#include "server/os/file_pinning.h"

namespace sluice {

// The first argument that makes sluice-server a probe: argv = {program, kProbeArgument,
// candidate, already-loaded libraries...}. It loads them in order and prints one
// "operator <name>" line per operator the candidate registered, then "init_hook yes|no"; exit
// status 0. A library that does not load: "error: <reason>" and exit status 3.
inline constexpr char kProbeArgument[] = "--probe-operator-library";
// The probe's child side (operator_library_probe.cc): what main() runs for kProbeArgument.
int RunOperatorLibraryProbe(int argc, char** argv);

// Every operator LibTorch's dispatcher knows ("aten::add.Tensor", "torchvision::nms"), sorted.
std::vector<std::string> RegisteredOperators();

// Where the operator libraries a build bundles lie, relative to the running program:
// <program's directory>/../lib/sluice/ (build/lib/sluice, or /opt/sluice/lib/sluice in the image).
std::filesystem::path BundledOperatorDirectory();
// torchvision's operators in that directory (scripts/bundle_torchvision_ops.sh).
inline constexpr char kTorchvisionOpsFile[] = "torchvision_ops.so";

// One loaded library.
struct OperatorLibrary {
  std::filesystem::path path;          // canonical
  std::string origin;                  // "bundled", "--operator-library", "model <name>"
  std::vector<std::string> operators;  // the operators it registered ("torchvision::nms"), sorted
  bool init_hook = false;              // exports triton_pytorch_model_init
  std::chrono::microseconds load_time{0};  // the probe (if any) and the load
  // The namespaces of `operators` ("torchvision"), sorted, each once.
  std::vector<std::string> Namespaces() const;
};

// The environment report's lines (sluice-server --print-env): one per library, what it registered.
std::string FormatOperatorLibraries(const std::vector<OperatorLibrary>& libraries);

// What an init hook returned for one model instance; the library's fini hook gets it back when
// this is destroyed. Destroy it after the instance (TorchInstance holds it).
class ModelInitState {
 public:
  using Fini = void (*)(void*);
  ModelInitState(void* state, Fini fini) : state_(state), fini_(fini) {}
  ModelInitState(const ModelInitState&) = delete;
  ModelInitState& operator=(const ModelInitState&) = delete;
  ~ModelInitState() {
    if (fini_ != nullptr) fini_(state_);
  }

 private:
  void* const state_;
  const Fini fini_;
};

// The process's operator libraries. Thread-safe; loads (and probes) one at a time.
class OperatorLibraries {
 public:
  struct Options {
    // A program with the probe mode (sluice-server); empty: this process's own program.
    std::string probe_program;
    // --operator-library-dir: where model configurations may name libraries from, beside the
    // model's own directory.
    std::vector<std::filesystem::path> allowed_dirs;
    std::chrono::milliseconds probe_timeout{60000};  // a probe that hangs is refused after this
    // --model-digests: the libraries models name are probed and loaded from checked copies
    // (server/os/file_pinning.h), and so are the models' own files (the runtime asks pinning());
    // null: from where they lie. Outlives this.
    const ModelPinning* pinning = nullptr;
  };
  explicit OperatorLibraries(Options options);

  // Options::pinning: what the runtime loads model files through; may be null.
  const ModelPinning* pinning() const { return options_.pinning; }

  // Told about each library loaded from now on, under the registry's lock (the server logs it
  // and exports it as a metric); null: nobody.
  using Listener = std::function<void(const OperatorLibrary&)>;
  void SetListener(Listener listener) ABSL_LOCKS_EXCLUDED(mutex_);

  // Loads a library the operator named (--operator-library, or the bundled ones with
  // `probe` false: they are built with the server). No directory restriction. NOT_FOUND for a
  // missing file; FAILED_PRECONDITION for a failed probe or load, with the reason.
  StatusOr<OperatorLibrary> LoadTrusted(const std::filesystem::path& path,
                                        const std::string& origin, bool probe = true);

  // Resolves `written` (a relative path, or an absolute one, as the model's configuration names
  // it) against the model's directory and then each allowed directory, and loads it (see the
  // rules above). INVALID_ARGUMENT for a path with `..`, or one that resolves outside them;
  // NOT_FOUND when no directory has it (the message lists where it looked).
  StatusOr<OperatorLibrary> LoadForModel(const std::string& written,
                                         const std::filesystem::path& model_dir,
                                         const std::string& model);

  // Calls `library`'s init hook for one instance (see the rules above). Null when it exports none.
  std::unique_ptr<ModelInitState> CallInitHook(const OperatorLibrary& library,
                                               const std::filesystem::path& version_dir,
                                               int device_index) const;

  // Every library loaded, in load order.
  std::vector<OperatorLibrary> List() const;

  // The path `written` resolves to for a model in `model_dir` (exposed for tests).
  StatusOr<std::filesystem::path> Resolve(const std::string& written,
                                          const std::filesystem::path& model_dir) const;

 private:
  struct FileIdentity {
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileIdentity& other) const {
      return device == other.device && inode == other.inode && size == other.size &&
             mtime_ns == other.mtime_ns;
    }
  };
  struct Loaded {
    OperatorLibrary library;
    FileIdentity identity;
    void* handle = nullptr;             // never closed
    std::filesystem::path loaded_from;  // library.path, or its checked copy (pinned)
  };
  // `pin`: a library a model names, loaded through Options::pinning when there is one.
  StatusOr<OperatorLibrary> Load(const std::filesystem::path& canonical, const std::string& origin,
                                 bool probe, bool pin = false) ABSL_LOCKS_EXCLUDED(mutex_);
  // Runs the probe of `path` after the `preload` libraries: OK when the child loaded it, else
  // FAILED_PRECONDITION with what the child said.
  Status Probe(const std::filesystem::path& path, const std::vector<std::string>& preload) const;

  const Options options_;
  std::vector<std::filesystem::path> allowed_canonical_;  // options_.allowed_dirs that exist
  mutable Mutex mutex_;
  std::vector<Loaded> loaded_ ABSL_GUARDED_BY(mutex_);
  Listener listener_ ABSL_GUARDED_BY(mutex_);
  // Libraries refused, by path, with the file they were: the same file is refused again at once.
  std::map<std::filesystem::path, std::pair<FileIdentity, Status>> refused_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
