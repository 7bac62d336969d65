#include "server/os/file_pinning.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace fs = std::filesystem;

struct Sha256::State {
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  ~State() { EVP_MD_CTX_free(context); }
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr);
}

Sha256::~Sha256() = default;

void Sha256::Update(const void* data, size_t size) {
  EVP_DigestUpdate(state_->context, data, size);
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(state_->context, digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 sha;
  sha.Update(data.data(), data.size());
  return sha.HexDigest();
}

namespace {

std::string Normal(const fs::path& path, const fs::path& root) {
  const fs::path absolute = path.is_absolute() ? path : root / path;
  return absolute.lexically_normal().string();
}

std::string ErrnoText() { return std::strerror(errno); }

// Closes a descriptor when it goes.
struct Descriptor {
  int fd = -1;
  explicit Descriptor(int value) : fd(value) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseDigestManifest(absl::string_view text,
                                                                       const fs::path& root,
                                                                       const std::string& source) {
  std::map<std::string, std::string> digests;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (absl::StripLeadingAsciiWhitespace(line).empty() || absl::StartsWith(line, "#")) continue;
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " line ", number, ": ", why,
                       " (each line is \"<64 hex digits>  <path>\", as sha256sum writes it)"));
    };
    if (line.size() < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      return refuse("not a digest and a path");
    }
    const std::string digest = absl::AsciiStrToLower(line.substr(0, 64));
    for (char c : digest) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
        return refuse("the digest is not 64 hex digits");
      }
    }
    const std::string path = Normal(fs::path(std::string(line.substr(66))), root);
    auto [it, fresh] = digests.emplace(path, digest);
    if (!fresh && it->second != digest) {
      return refuse(absl::StrCat("'", path, "' has two different digests"));
    }
  }
  return digests;
}

absl::StatusOr<CopiedFile> CopyAndHash(const fs::path& source, const fs::path& directory,
                                       const std::string& name) {
  Descriptor in(open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", source.string(), ": ", ErrnoText()));
  }
  struct stat st {};
  if (fstat(in.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(source.string(), " is not a regular file"));
  }
  const fs::path target = directory / name;
  Descriptor out(open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (out.fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", target.string(), ": ", ErrnoText()));
  }
  auto fail = [&](const std::string& why) {
    unlink(target.c_str());
    return absl::FailedPreconditionError(why);
  };
  Sha256 sha;
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t got = read(in.fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail(absl::StrCat("cannot read ", source.string(), ": ", ErrnoText()));
    if (got == 0) break;
    sha.Update(buffer.data(), static_cast<size_t>(got));
    for (ssize_t written = 0; written < got;) {
      const ssize_t put =
          write(out.fd, buffer.data() + written, static_cast<size_t>(got - written));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) return fail(absl::StrCat("cannot write ", target.string(), ": ", ErrnoText()));
      written += put;
    }
  }
  if (fchmod(out.fd, 0500) != 0) {
    return fail(absl::StrCat("cannot protect ", target.string(), ": ", ErrnoText()));
  }
  return CopiedFile{target, sha.HexDigest()};
}

absl::StatusOr<std::unique_ptr<ModelPinning>> ModelPinning::Create(Options options) {
  if (options.require && options.manifest.empty()) {
    return absl::InvalidArgumentError(
        "--require-model-digests needs the digests: give them with --model-digests FILE");
  }
  std::unique_ptr<ModelPinning> pinning(new ModelPinning(std::move(options)));
  // Read once now so that a broken manifest stops the start-up instead of every load.
  if (!pinning->options_.manifest.empty()) {
    absl::StatusOr<std::map<std::string, std::string>> read = pinning->ReadManifest();
    if (!read.ok()) return read.status();
  }
  const fs::path& directory = pinning->options_.directory;
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", directory.string(), ": ", ErrnoText()));
  }
  struct stat st {};
  if (lstat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        directory.string(),
        " must be a directory of this user's that no one else may read or write (mode 0700) to "
        "hold the checked copies of model files"));
  }
  return pinning;
}

ModelPinning::~ModelPinning() {
  // POSIX calls, not std::filesystem: this runs as the process exits, and in the server the
  // std::filesystem symbols resolve into LibTorch's copy, which may be torn down by then.
  if (DIR* directory = opendir(options_.directory.c_str())) {
    while (const dirent* entry = readdir(directory)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink((options_.directory / name).c_str());
    }
    closedir(directory);
  }
  rmdir(options_.directory.c_str());
}

absl::StatusOr<std::map<std::string, std::string>> ModelPinning::ReadManifest() const {
  std::ifstream in(options_.manifest, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --model-digests ", options_.manifest.string()));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(options_.repository, ec);
  return ParseDigestManifest(text.str(), ec ? options_.repository : root,
                             absl::StrCat("--model-digests ", options_.manifest.string()));
}

absl::StatusOr<fs::path> ModelPinning::Pin(const fs::path& file, absl::string_view what) const {
  std::map<std::string, std::string> digests;
  if (!options_.manifest.empty()) {
    absl::StatusOr<std::map<std::string, std::string>> read = ReadManifest();
    if (!read.ok()) return read.status();
    digests = *std::move(read);
  }
  // Found by the path as the model names it (made absolute), or as it resolves.
  std::error_code ec;
  const std::string given = Normal(file, fs::current_path(ec));
  const fs::path resolved = fs::weakly_canonical(file, ec);
  auto found = digests.find(given);
  if (found == digests.end() && !ec) found = digests.find(resolved.string());
  if (found == digests.end()) {
    if (!options_.require) return file;
    return absl::PermissionDeniedError(absl::StrCat(
        what, " ", file.string(), " has no digest in --model-digests ", options_.manifest.string(),
        ", and --require-model-digests loads only pinned files"));
  }
  const std::string name = absl::StrCat(copies_.fetch_add(1) + 1, "-", file.filename().string());
  absl::StatusOr<CopiedFile> copy = CopyAndHash(file, options_.directory, name);
  if (!copy.ok()) return copy.status();
  if (copy->sha256 != found->second) {
    fs::remove(copy->path, ec);
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", file.string(), " has SHA-256 ", copy->sha256, ", not ",
                     found->second, " as --model-digests pins it: it was not loaded"));
  }
  return copy->path;
}

}  // namespace sluice
