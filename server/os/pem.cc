#include "server/os/pem.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace sluice {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is required"));
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  std::string pem = contents.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return pem;
}

}  // namespace sluice
