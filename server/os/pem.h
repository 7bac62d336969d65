// Reading PEM files (TLS certificates and keys) with errors that name the flag that gave them.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

// The contents of `path`. INVALID_ARGUMENT naming `flag` when the file cannot be read, is empty, or
// holds no PEM block ("-----BEGIN ...").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

}  // namespace sluice
