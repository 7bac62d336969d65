// Reading PEM files (TLS certificates and keys) with errors that name the flag that gave them.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

// The contents of `path`. INVALID_ARGUMENT naming `flag` when the file cannot be read, is empty, or
// holds no PEM block ("-----BEGIN ...").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

// OK when `key_pem` is the private key of the first certificate in `certificate_pem` (OpenSSL's
// libcrypto). INVALID_ARGUMENT naming `what` ("--grpc-server-key") when either does not parse or
// the key belongs to another certificate: a server that started with them would fail every
// handshake.
absl::Status CheckKeyPair(const std::string& certificate_pem, const std::string& key_pem,
                          const std::string& what);

}  // namespace sluice
