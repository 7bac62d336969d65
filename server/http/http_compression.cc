#include "server/http/http_compression.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {

int ChooseEncoding(const char* accept) {
  if (accept == nullptr) return kIdentity;
  bool gzip = false;
  bool deflate = false;
  for (absl::string_view item : absl::StrSplit(accept, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const std::string coding = absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    bool refused = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      absl::string_view q = absl::StripAsciiWhitespace(parts[i]);
      if (absl::ConsumePrefix(&q, "q=") && !q.empty() &&
          std::all_of(q.begin(), q.end(), [](char c) { return c == '0' || c == '.'; })) {
        refused = true;
      }
    }
    if (refused) continue;
    if (coding == "gzip" || coding == "x-gzip") gzip = true;
    if (coding == "deflate") deflate = true;
  }
  return gzip ? kGzip : deflate ? kDeflate : kIdentity;
}

namespace {

Status InflateAs(absl::string_view in, size_t limit, absl::string_view limit_reason,
                 const std::function<Status(size_t)>& grow, std::string* out, bool raw) {
  z_stream stream{};
  // 15 + 32: zlib or gzip header, detected; -15: no header.
  if (inflateInit2(&stream, raw ? -15 : 15 + 32) != Z_OK)
    return absl::InternalError("zlib inflateInit2 failed");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  out->clear();
  int result = Z_OK;
  while (result == Z_OK) {
    if (out->size() >= limit) {
      inflateEnd(&stream);
      return absl::ResourceExhaustedError(absl::StrCat("the request body inflates to more than ",
                                                       limit, " bytes (", limit_reason, ")"));
    }
    const size_t used = out->size();
    const size_t size = std::min(
        limit, std::max<size_t>(used * 2, std::min<size_t>(in.size() * 4 + 4096, 1 << 20)));
    if (Status allowed = grow(size); !allowed.ok()) {
      inflateEnd(&stream);
      return allowed;
    }
    out->resize(size);
    stream.next_out = reinterpret_cast<Bytef*>(out->data() + used);
    stream.avail_out = static_cast<uInt>(out->size() - used);
    result = inflate(&stream, Z_NO_FLUSH);
    out->resize(out->size() - stream.avail_out);
    if (result == Z_BUF_ERROR && stream.avail_in > 0) result = Z_OK;  // output full: grow
  }
  const bool complete = result == Z_STREAM_END;
  inflateEnd(&stream);
  if (!complete) {
    if (!raw) return InflateAs(in, limit, limit_reason, grow, out, /*raw=*/true);
    return absl::InvalidArgumentError(
        "the request body is not valid gzip or deflate data (Content-Encoding)");
  }
  return absl::OkStatus();
}

}  // namespace

Status Inflate(absl::string_view in, size_t limit, absl::string_view limit_reason,
               const std::function<Status(size_t)>& grow, std::string* out) {
  return InflateAs(in, limit, limit_reason, grow, out, /*raw=*/false);
}

std::string Deflate(const std::vector<std::string>& segments, int encoding) {
  z_stream stream{};
  deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, encoding == kGzip ? 15 + 16 : 15, 8,
               Z_DEFAULT_STRATEGY);
  size_t total = 0;
  for (const std::string& segment : segments) total += segment.size();
  std::string out(deflateBound(&stream, total) + 64 * (segments.size() + 1), '\0');
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  for (const std::string& segment : segments) {
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(segment.data()));
    stream.avail_in = static_cast<uInt>(segment.size());
    deflate(&stream, Z_NO_FLUSH);
  }
  deflate(&stream, Z_FINISH);
  out.resize(out.size() - stream.avail_out);
  deflateEnd(&stream);
  return out;
}

}  // namespace sluice
