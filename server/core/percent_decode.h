// %XX escapes (RFC 3986) in text that came from a URI: an HTTP path segment, a gRPC peer string
// ("ipv6:%5B::1%5D:5000").
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace sluice {

// `text` with each %XX escape (either case) decoded into its byte; nullopt when a '%' is not
// followed by two hexadecimal digits.
std::optional<std::string> PercentDecode(absl::string_view text);

}  // namespace sluice
