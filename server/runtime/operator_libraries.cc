#include "server/runtime/operator_libraries.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "server/os/child_process.h"

namespace sluice {
namespace fs = std::filesystem;
namespace {

using InitFn = void* (*)(const char*, int);
constexpr char kInitSymbol[] = "triton_pytorch_model_init";
constexpr char kFiniSymbol[] = "triton_pytorch_model_fini";

// The last lines of a child's stderr, for a refusal's reason (a library that aborts says why
// there: "Only a single TORCH_LIBRARY can be used to register the namespace ...").
std::string LastWords(const std::string& err) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    // LibTorch's C++ backtraces ("frame #3: ...", "Exception raised from ...") say nothing to an
    // operator.
    if (absl::StartsWith(line, "frame #") || absl::StartsWith(line, "Exception raised from"))
      continue;
    // The head of a line says what happened; LibTorch's tail says where it was registered.
    lines.emplace_back(line.size() > 300 ? absl::StrCat(line.substr(0, 300), "...")
                                         : std::string(line));
  }
  if (lines.size() > 3) lines.erase(lines.begin(), lines.end() - 3);
  return absl::StrJoin(lines, " / ");
}

bool Within(const fs::path& path, const fs::path& dir) {
  auto [dir_end, path_at] = std::mismatch(dir.begin(), dir.end(), path.begin(), path.end());
  return dir_end == dir.end();
}

}  // namespace

std::vector<std::string> OperatorLibrary::Namespaces() const {
  std::set<std::string> namespaces;
  for (const std::string& op : operators) {
    const size_t colons = op.find("::");
    namespaces.insert(colons == std::string::npos ? op : op.substr(0, colons));
  }
  return {namespaces.begin(), namespaces.end()};
}

fs::path BundledOperatorDirectory() {
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return program.parent_path().parent_path() / "lib" / "sluice";
}

OperatorLibraries::OperatorLibraries(Options options) : options_(std::move(options)) {
  for (const fs::path& dir : options_.allowed_dirs) {
    std::error_code ec;
    fs::path canonical = fs::canonical(dir, ec);
    if (!ec) allowed_canonical_.push_back(std::move(canonical));
  }
}

StatusOr<fs::path> OperatorLibraries::Resolve(const std::string& written,
                                              const fs::path& model_dir) const {
  if (written.empty()) return absl::InvalidArgumentError("an operator library path is empty");
  if (written.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("an operator library path holds a NUL character");
  }
  const fs::path asked(written);
  for (const fs::path& part : asked) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("operator library '", written,
                       "': '..' is not allowed; name a path inside the model's "
                       "directory or an --operator-library-dir"));
    }
  }
  std::error_code ec;
  std::vector<fs::path> roots;
  fs::path model_root = fs::canonical(model_dir, ec);
  if (!ec) roots.push_back(model_root);
  roots.insert(roots.end(), allowed_canonical_.begin(), allowed_canonical_.end());

  std::vector<fs::path> candidates;
  if (asked.is_absolute()) {
    candidates.push_back(asked);
  } else {
    candidates.push_back(model_dir / asked);
    for (const fs::path& dir : allowed_canonical_) candidates.push_back(dir / asked);
  }
  for (const fs::path& candidate : candidates) {
    if (!fs::exists(candidate, ec)) continue;
    const fs::path canonical = fs::canonical(candidate, ec);
    if (ec) continue;
    const bool inside = std::any_of(roots.begin(), roots.end(),
                                    [&](const fs::path& root) { return Within(canonical, root); });
    if (!inside) {
      return absl::InvalidArgumentError(
          absl::StrCat("operator library '", written, "' resolves to ", canonical.string(),
                       ", outside the model's directory and every --operator-library-dir; put it "
                       "there or allow its directory "
                       "with --operator-library-dir"));
    }
    if (!fs::is_regular_file(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("operator library '", written, "' is not a regular file"));
    }
    return canonical;
  }
  std::vector<std::string> looked;
  for (const fs::path& candidate : candidates) looked.push_back(candidate.string());
  return absl::NotFoundError(absl::StrCat("operator library '", written, "' not found (looked at ",
                                          absl::StrJoin(looked, ", "), ")"));
}

StatusOr<OperatorLibrary> OperatorLibraries::LoadTrusted(const fs::path& path,
                                                         const std::string& origin, bool probe) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(path, ec);
  if (ec || !fs::is_regular_file(canonical, ec)) {
    return absl::NotFoundError(
        absl::StrCat("operator library ", path.string(), " (", origin, ") does not exist"));
  }
  return Load(canonical, origin, probe);
}

StatusOr<OperatorLibrary> OperatorLibraries::LoadForModel(const std::string& written,
                                                          const fs::path& model_dir,
                                                          const std::string& model) {
  SLUICE_ASSIGN_OR_RETURN(const fs::path canonical, Resolve(written, model_dir));
  return Load(canonical, absl::StrCat("model ", model), /*probe=*/true, /*pin=*/true);
}

StatusOr<OperatorLibrary> OperatorLibraries::Load(const fs::path& canonical,
                                                  const std::string& origin, bool probe, bool pin) {
  const auto started = std::chrono::steady_clock::now();
  struct stat st {};
  if (stat(canonical.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("operator library ", canonical.string(), " cannot be read"));
  }
  const FileIdentity identity{
      static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
      static_cast<uint64_t>(st.st_size),
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  MutexLock lock(&mutex_);
  for (const Loaded& loaded : loaded_) {
    if (loaded.library.path != canonical) continue;
    if (!(loaded.identity == identity)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "operator library ", canonical.string(), " changed on disk since it was loaded (",
          loaded.library.origin,
          "); a loaded library cannot be replaced: restart the server to use the new file"));
    }
    return loaded.library;
  }
  if (auto it = refused_.find(canonical); it != refused_.end() && it->second.first == identity) {
    return it->second.second;
  }

  OperatorLibrary library;
  library.path = canonical;
  library.origin = origin;
  // A pinned library is probed and loaded from its checked copy, so that nothing of a file whose
  // digest differs runs, not even in the probe's child. A refusal is not remembered: the
  // operator may pin the new bytes.
  fs::path load_from = canonical;
  if (pin && options_.pinning != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(load_from, options_.pinning->Pin(canonical, "operator library"));
  }
  if (probe) {
    std::vector<std::string> preload;
    for (const Loaded& loaded : loaded_) preload.push_back(loaded.loaded_from.string());
    if (Status probed = Probe(load_from, preload); !probed.ok()) {
      refused_[canonical] = {identity, probed};
      return probed;
    }
  }
  // Never closed (RTLD_NODELETE says so to the loader too). RTLD_NOW: a missing symbol is an
  // error here, not a crash at the first call.
  const std::vector<std::string> before = RegisteredOperators();
  void* handle = dlopen(load_from.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* error = dlerror();
    Status status = absl::FailedPreconditionError(
        absl::StrCat("operator library ", canonical.string(),
                     " does not load: ", error ? error : "unknown error"));
    refused_[canonical] = {identity, status};
    return status;
  }
  library.init_hook = dlsym(handle, kInitSymbol) != nullptr;
  const std::vector<std::string> after = RegisteredOperators();
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(library.operators));
  library.load_time = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - started);
  loaded_.push_back(Loaded{library, identity, handle, load_from});
  refused_.erase(canonical);
  if (listener_) listener_(library);
  return library;
}

Status OperatorLibraries::Probe(const fs::path& path,
                                const std::vector<std::string>& preload) const {
  std::vector<std::string> argv = {
      options_.probe_program.empty() ? std::string("/proc/self/exe") : options_.probe_program,
      kProbeArgument, path.string()};
  argv.insert(argv.end(), preload.begin(), preload.end());
  ChildOptions child;
  child.timeout = options_.probe_timeout;
  StatusOr<ChildOutcome> outcome = RunChildProcess(argv, child);
  if (!outcome.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "operator library ", path.string(), " could not be probed: ", outcome.status().message()));
  }
  // What the child registered is read again in this process once the library loads here; the
  // child's last line ("init_hook ...") says it went through to the end.
  std::string error;
  bool finished = false;
  for (absl::string_view line : absl::StrSplit(outcome->out, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "error: ")) error = std::string(line);
    if (absl::StartsWith(line, "init_hook ")) finished = true;
  }
  if (outcome->succeeded() && finished) return absl::OkStatus();
  std::string reason;
  if (!error.empty()) {
    reason = error;
  } else if (outcome->timed_out) {
    reason = absl::StrCat("loading it did not finish within ",
                          options_.probe_timeout.count() / 1000.0, " s");
  } else {
    const std::string words = LastWords(outcome->err);
    reason = absl::StrCat("loading it in a child process ", outcome->Describe(),
                          words.empty() ? "" : absl::StrCat(": ", words));
    if (absl::StrContains(words, "TORCH_LIBRARY")) {
      absl::StrAppend(
          &reason,
          " (an operator namespace it registers is already registered by LibTorch or a library "
          "loaded before it)");
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("operator library ", path.string(), " is refused: ", reason));
}

std::unique_ptr<ModelInitState> OperatorLibraries::CallInitHook(const OperatorLibrary& library,
                                                                const fs::path& version_dir,
                                                                int device_index) const {
  if (!library.init_hook) return nullptr;
  void* handle = nullptr;
  {
    MutexLock lock(&mutex_);
    for (const Loaded& loaded : loaded_) {
      if (loaded.library.path == library.path) handle = loaded.handle;
    }
  }
  if (handle == nullptr) return nullptr;
  auto init = reinterpret_cast<InitFn>(dlsym(handle, kInitSymbol));
  auto fini = reinterpret_cast<ModelInitState::Fini>(dlsym(handle, kFiniSymbol));
  if (init == nullptr) return nullptr;
  void* state = init(version_dir.c_str(), device_index);
  return std::make_unique<ModelInitState>(state, fini);
}

void OperatorLibraries::SetListener(Listener listener) {
  MutexLock lock(&mutex_);
  listener_ = std::move(listener);
}

std::string FormatOperatorLibraries(const std::vector<OperatorLibrary>& libraries) {
  std::string report;
  if (libraries.empty()) return "operator libraries: none\n";
  for (const OperatorLibrary& library : libraries) {
    const std::vector<std::string> namespaces = library.Namespaces();
    absl::StrAppend(&report, "operator library: ", library.path.string(), " (", library.origin,
                    "): ", library.operators.size(), " operators",
                    namespaces.empty() ? "" : absl::StrCat(" in ", absl::StrJoin(namespaces, ", ")),
                    library.init_hook ? ", init hook" : "", "\n");
  }
  return report;
}

std::vector<OperatorLibrary> OperatorLibraries::List() const {
  MutexLock lock(&mutex_);
  std::vector<OperatorLibrary> libraries;
  for (const Loaded& loaded : loaded_) libraries.push_back(loaded.library);
  return libraries;
}

}  // namespace sluice
