// Fuzzes the HTTP transport's framing as a client on the network controls it: the bytes of a
// connection (request lines, headers, Content-Length and chunked bodies, trailers, pipelined
// requests), cut into reads at places the input chooses, through HttpRequestReader; each
// complete request's body is then inflated as a gzip/deflate body would be (bounded, with a
// budget that refuses at a point the input chooses). Nothing may crash, trip a sanitizer, read
// past what was given, or keep more than the limits allow; and the same bytes read whole must
// come out as the same requests and bodies, then refused or not, as when cut into reads (a reader
// that depended on where reads end would frame a message two ways).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/http/http_compression.h"
#include "server/http/http_request_reader.h"

namespace {

// What the reader made of `bytes` fed `piece` bytes at a time: one line per request or refusal.
std::string Transcript(const std::string& bytes, size_t piece, size_t budget) {
  sluice::HttpReaderLimits limits;
  limits.max_head_bytes = 4096;
  limits.max_header_count = 16;
  limits.max_body_bytes = 1 << 16;
  sluice::HttpRequestReader reader(limits);
  std::string transcript;
  size_t at = 0;
  while (at < bytes.size()) {
    // A copy the size of the read, so that AddressSanitizer sees reads past its end.
    const std::string read = bytes.substr(at, piece);
    absl::string_view rest = read;
    while (true) {
      const sluice::HttpRequestReader::Step step = reader.Feed(rest);
      if (step.consumed > rest.size()) abort();
      rest.remove_prefix(step.consumed);
      if (reader.body().size() > limits.max_body_bytes) abort();
      if (step.event == sluice::HttpRequestReader::Event::kError) {
        if (reader.error_code() < 400 || reader.error().empty()) abort();
        // Which refusal may depend on where reads end (a line with a bare CR that also passes the
        // head limit is 400 or 431): only that it is refused, after the same requests, must not.
        return transcript + "refused\n";
      }
      if (step.event == sluice::HttpRequestReader::Event::kComplete) {
        std::string inflated;
        size_t charged = 0;
        const sluice::Status status = sluice::Inflate(
            reader.body(), 1 << 18, "the fuzz limit",
            [&](size_t total) {
              if (total > budget) return absl::ResourceExhaustedError("budget");
              charged = std::max(charged, total);
              return absl::OkStatus();
            },
            &inflated);
        if (status.ok() && inflated.size() > (1 << 18)) abort();
        if (charged > budget) abort();
        const sluice::HttpRequestHead& head = reader.head();
        absl::StrAppend(&transcript, head.method, " ", head.target, " 1.", head.minor_version,
                        " keep-alive ", head.keep_alive, " body ", reader.body(), " headers ",
                        head.headers.size(), "\n");
        reader.Reset();
        continue;
      }
      if (step.event == sluice::HttpRequestReader::Event::kNeedMore) break;
      // kHead: the body (if any) follows in the same bytes or the next read.
    }
    at += read.size();
  }
  return transcript;
}

}  // namespace

// Layout: byte 0: read size (1-64, then whole reads); byte 1: the budget for inflating, in KiB;
// the connection's bytes follow.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t piece = data[0] % 65 == 0 ? size : data[0] % 65;
  const size_t budget = static_cast<size_t>(data[1]) << 10;
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::string split = Transcript(bytes, piece, budget);
  if (piece < bytes.size() && split != Transcript(bytes, bytes.size(), budget)) abort();
  return 0;
}
