// HTTP/1.1 request framing (RFC 9112), without threads, sockets or clocks: bytes go in as they
// arrive, complete requests (head and de-chunked body) come out. The transport (http_server.cc)
// owns the socket, the deadlines and the byte budget; this decides only what the bytes mean, so
// every framing rule is tested alone and fuzzed (tests/fuzz/fuzz_http_framing.cc).
//
// What it refuses, each with the status the transport answers before closing the connection:
//   400  a malformed request line, header line or chunk (size, extension, the CRLF after the data,
//        the trailer); a header name with whitespace before its colon; obs-fold; control bytes in a
//        value; Content-Length that is not one decimal number, or given twice (even when equal);
//        Transfer-Encoding beside Content-Length, given twice, or on HTTP/1.0; no Host on HTTP/1.1,
//        or Host twice. A message framed two ways is the request-smuggling vector: it is refused,
//        not resolved.
//   413  a declared or chunked body past max_body_bytes
//   417  an Expect other than 100-continue
//   431  a head (request line, headers, or a chunked body's trailer) past max_head_bytes, or more
//        than max_header_count fields
//   501  a Transfer-Encoding other than chunked
//   505  an HTTP version other than 1.0 and 1.1
// Empty lines before a request line are skipped (RFC 9112 section 2.2); in the head a bare LF ends
// a line as CRLF does, while inside a chunked body (size lines, after the data, the trailer) only
// CRLF does; a bare CR anywhere is refused. Field values lose surrounding spaces and tabs only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace sluice {

struct HttpReaderLimits {
  size_t max_head_bytes = 64 << 10;         // request line and headers together (431 beyond)
  size_t max_header_count = 128;            // header fields (431 beyond)
  size_t max_body_bytes = size_t{1} << 30;  // declared or de-chunked body (413 beyond)
};

// The request line and headers of one request, as sent (names keep their case; values are
// trimmed of surrounding whitespace).
struct HttpRequestHead {
  std::string method;  // "GET", "POST", ... (a token, as sent)
  std::string target;  // origin form ("/v2/..."), the absolute form reduced to its path and query
  int minor_version = 1;  // HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;
  bool keep_alive = true;        // HTTP/1.1 unless Connection: close; HTTP/1.0 with keep-alive
  bool expect_continue = false;  // Expect: 100-continue
  bool chunked = false;          // Transfer-Encoding: chunked
  uint64_t content_length = 0;   // declared (0 when chunked or absent)

  // The first field named `name` (ASCII case-insensitive); null when absent.
  const std::string* Find(absl::string_view name) const;
};

class HttpRequestReader {
 public:
  enum class Event {
    kNeedMore,  // everything given was consumed; feed more
    kHead,      // the head is complete (head() is valid); the body, if any, follows
    kComplete,  // the request is complete (head() and body() valid); TakeBody, then Reset
    kError,     // the bytes are not a request this server takes: error_code() and error()
  };
  struct Step {
    Event event = Event::kNeedMore;
    size_t consumed = 0;  // bytes of the input used; the rest belongs to later steps
  };

  explicit HttpRequestReader(HttpReaderLimits limits = {}) : limits_(limits) {}

  // Reads as far into `data` as the next event. After kHead, kComplete or kError the rest of
  // `data` is left unread: call again with data.substr(consumed) (after kComplete: after Reset).
  // After kError, every call answers kError again.
  Step Feed(absl::string_view data);
  // Ready for the next request on the connection.
  void Reset();

  const HttpRequestHead& head() const { return head_; }
  // The body received so far (all of it once kComplete), de-chunked.
  const std::string& body() const { return body_; }
  // Reserves room for `bytes` of body (after the head, once the caller has admitted that many):
  // one allocation instead of a growing string. May throw std::bad_alloc.
  void ReserveBody(size_t bytes) { body_.reserve(bytes); }
  std::string TakeBody() { return std::move(body_); }
  // Whether any byte of a request's head (beyond empty lines before it) has arrived since Reset.
  bool started() const { return started_; }
  // Whether the head is complete and the body is being read.
  bool in_body() const { return state_ >= State::kBodyIdentity && state_ <= State::kTrailer; }
  // Body bytes still expected after what has arrived, for a declared length (0 when chunked).
  uint64_t body_remaining() const { return remaining_; }
  int error_code() const { return error_code_; }
  const std::string& error() const { return error_; }

 private:
  enum class State {
    kHead,
    kBodyIdentity,
    kChunkSize,
    kChunkData,
    kChunkDataEnd,
    kTrailer,
    kDone,
    kFailed,
  };

  Step Fail(int code, std::string message, size_t consumed);
  // Takes one line from `data` into line_ (without its terminator): the bytes used, and whether
  // the line is complete. Marks bad_line_ for a bare CR, or (`crlf_only`) a bare LF; keeps one
  // byte past `limit` for the caller to refuse.
  size_t TakeLine(absl::string_view data, size_t limit, bool crlf_only, bool* complete);
  bool ParseHead();  // line_s_ -> head_; Fail on error (returns false)
  bool ParseChunkSize(absl::string_view line);

  HttpReaderLimits limits_;
  State state_ = State::kHead;
  HttpRequestHead head_;
  std::string body_;
  std::string line_;                // the line being read
  std::vector<std::string> lines_;  // the head's lines so far
  size_t head_bytes_ = 0;           // the head's bytes so far (line terminators included)
  uint64_t remaining_ = 0;          // of the declared body, or of the current chunk
  bool started_ = false;
  bool bad_line_ = false;  // TakeLine saw a bare CR
  bool chunk_cr_ = false;  // the CR after a chunk's data has arrived, its LF not yet
  int error_code_ = 0;
  std::string error_;
};

}  // namespace sluice
