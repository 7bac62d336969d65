// The HTTP transport's content codings (gzip and deflate, zlib): the Accept-Encoding choice, the
// bounded inflation of request bodies, and the compression of answers. No sockets, no threads:
// the transport decides where each runs (the codec threads), and the framing fuzz target
// inflates what it reads through the same function.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "server/core/status.h"

namespace sluice {

enum Encoding { kIdentity = 0, kGzip = 1, kDeflate = 2 };

// The encoding to answer with for an Accept-Encoding header (null: none): gzip, else deflate,
// else identity (a coding with q=0 is refused by the client and not chosen).
int ChooseEncoding(const char* accept);

// Inflates a gzip or zlib (HTTP "deflate") body, or a raw deflate stream as some clients send
// for "deflate", into `out`, in steps: `grow(total)` is asked before the output grows to `total`
// bytes and may refuse (the server's byte budget), its status returned. After a zlib or gzip
// attempt fails, the raw deflate attempt starts over from 0, asking for the same totals again.
// RESOURCE_EXHAUSTED past `limit` bytes, naming `limit_reason` (a small body can inflate to
// gigabytes); INVALID_ARGUMENT for data that is not gzip or deflate.
Status Inflate(absl::string_view in, size_t limit, absl::string_view limit_reason,
               const std::function<Status(size_t)>& grow, std::string* out);

// `segments` compressed into one body, gzip or zlib (kGzip, kDeflate).
std::string Deflate(const std::vector<std::string>& segments, int encoding);

}  // namespace sluice
