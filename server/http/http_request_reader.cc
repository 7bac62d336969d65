#include "server/http/http_request_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

// A chunk-size line (size and extensions) longer than this is refused: extensions carry nothing
// this server reads.
constexpr size_t kMaxChunkLineBytes = 4096;

// RFC 9110 section 5.6.2: tchar.
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool IsToken(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), IsTokenChar);
}

// Field values: visible bytes, obs-text (0x80 and up), spaces and tabs; no other controls.
bool IsFieldValue(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte == '\t' || (byte >= 0x20 && byte != 0x7f);
  });
}

// Request targets: visible ASCII and obs-text, no whitespace or controls.
bool IsTarget(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte > 0x20 && byte != 0x7f;
  });
}

// `text` without the optional whitespace around a field value: spaces and tabs only (RFC 9110
// section 5.6.3). Other whitespace (\v, \f) stays and is refused as a control byte: a proxy that
// skips it would read the field differently.
absl::string_view StripOws(absl::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Whether the comma-separated token list `value` holds `token` (case-insensitive).
bool ListHas(absl::string_view value, absl::string_view token) {
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    if (absl::EqualsIgnoreCase(StripOws(item), token)) return true;
  }
  return false;
}

}  // namespace

const std::string* HttpRequestHead::Find(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return &value;
  }
  return nullptr;
}

void HttpRequestReader::Reset() {
  state_ = State::kHead;
  head_ = HttpRequestHead{};
  body_.clear();
  line_.clear();
  lines_.clear();
  head_bytes_ = 0;
  remaining_ = 0;
  started_ = false;
  bad_line_ = false;
  chunk_cr_ = false;
  error_code_ = 0;
  error_.clear();
}

HttpRequestReader::Step HttpRequestReader::Fail(int code, std::string message, size_t consumed) {
  state_ = State::kFailed;
  error_code_ = code;
  error_ = std::move(message);
  return {Event::kError, consumed};
}

size_t HttpRequestReader::TakeLine(absl::string_view data, size_t limit, bool crlf_only,
                                   bool* complete) {
  const size_t newline = data.find('\n');
  *complete = newline != absl::string_view::npos;
  const size_t take = *complete ? newline + 1 : data.size();
  absl::string_view part = data.substr(0, *complete ? newline : take);
  if (line_.size() + part.size() > limit) {
    // Past the limit (the caller refuses): one byte more than the limit is enough to tell.
    const absl::string_view kept = part.substr(0, limit + 1 - std::min(line_.size(), limit));
    line_.append(kept.data(), kept.size());
    return take;
  }
  // A CR must be the one before the LF: one ending the line so far waits for the next byte, one
  // anywhere else (or one from the last call followed by more than an LF) is refused. Only the
  // new bytes are looked at.
  if (!part.empty() && !line_.empty() && line_.back() == '\r') bad_line_ = true;
  const size_t cr = part.find('\r');
  if (cr != absl::string_view::npos && cr + 1 < part.size()) bad_line_ = true;
  line_.append(part.data(), part.size());
  if (*complete) {
    if (!line_.empty() && line_.back() == '\r') {
      line_.pop_back();
    } else if (crlf_only) {
      bad_line_ = true;  // a bare LF, where only CRLF ends a line
    }
  }
  return take;
}

HttpRequestReader::Step HttpRequestReader::Feed(absl::string_view data) {
  size_t used = 0;
  while (true) {
    switch (state_) {
      case State::kFailed:
        return {Event::kError, used};
      case State::kDone:
        return {Event::kComplete, used};
      case State::kHead: {
        if (used == data.size()) return {Event::kNeedMore, used};
        const size_t room =
            limits_.max_head_bytes > head_bytes_ ? limits_.max_head_bytes - head_bytes_ : 0;
        bool complete = false;
        const size_t taken = TakeLine(data.substr(used), room, /*crlf_only=*/false, &complete);
        used += taken;
        if (!line_.empty()) started_ = true;
        if (line_.size() > room) {
          return Fail(431,
                      absl::StrCat("the request line and headers exceed ", limits_.max_head_bytes,
                                   " bytes"),
                      used);
        }
        if (bad_line_)
          return Fail(400, "a bare CR in the request head (lines end with CRLF)", used);
        if (!complete) return {Event::kNeedMore, used};
        if (lines_.empty() && line_.empty())
          continue;  // an empty line before the request line: skipped
        head_bytes_ += line_.size() + 2;
        if (!line_.empty()) {
          if (lines_.size() > limits_.max_header_count) {
            return Fail(431,
                        absl::StrCat("the request has more than ", limits_.max_header_count,
                                     " header fields"),
                        used);
          }
          lines_.push_back(std::move(line_));
          line_.clear();
          continue;
        }
        // The empty line: the head is complete.
        if (!ParseHead()) return {Event::kError, used};
        lines_.clear();
        if (head_.chunked) {
          state_ = State::kChunkSize;
        } else if (head_.content_length > 0) {
          remaining_ = head_.content_length;
          state_ = State::kBodyIdentity;
        } else {
          state_ = State::kDone;
        }
        return {Event::kHead, used};
      }
      case State::kBodyIdentity: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size() - used));
        body_.append(data.data() + used, take);
        used += take;
        remaining_ -= take;
        if (remaining_ > 0) return {Event::kNeedMore, used};
        state_ = State::kDone;
        continue;
      }
      case State::kChunkSize: {
        if (used == data.size()) return {Event::kNeedMore, used};
        bool complete = false;
        used += TakeLine(data.substr(used), kMaxChunkLineBytes, /*crlf_only=*/true, &complete);
        if (line_.size() > kMaxChunkLineBytes)
          return Fail(400, "a chunk-size line is too long", used);
        if (bad_line_)
          return Fail(400, "a chunk-size line not ended by CRLF (or a bare CR in it)", used);
        if (!complete) return {Event::kNeedMore, used};
        std::string line = std::move(line_);
        line_.clear();
        if (!ParseChunkSize(line)) return {Event::kError, used};
        if (remaining_ == 0) {
          state_ = State::kTrailer;
        } else {
          state_ = State::kChunkData;
        }
        continue;
      }
      case State::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size() - used));
        body_.append(data.data() + used, take);
        used += take;
        remaining_ -= take;
        if (remaining_ > 0) return {Event::kNeedMore, used};
        state_ = State::kChunkDataEnd;
        continue;
      }
      case State::kChunkDataEnd: {
        // CRLF after the chunk's data, nothing else (a bare LF included: inside a chunked body a
        // lenient reader and a strict one would disagree on where the next chunk starts).
        if (used == data.size()) return {Event::kNeedMore, used};
        const char c = data[used++];
        if (c == '\r' && !chunk_cr_) {
          chunk_cr_ = true;
          continue;
        }
        if (c != '\n' || !chunk_cr_)
          return Fail(400, "a chunk's data is not followed by CRLF", used);
        chunk_cr_ = false;
        state_ = State::kChunkSize;
        continue;
      }
      case State::kTrailer: {
        if (used == data.size()) return {Event::kNeedMore, used};
        const size_t room =
            limits_.max_head_bytes > head_bytes_ ? limits_.max_head_bytes - head_bytes_ : 0;
        bool complete = false;
        used += TakeLine(data.substr(used), room, /*crlf_only=*/true, &complete);
        if (line_.size() > room) {
          return Fail(431,
                      absl::StrCat("the request's head and trailer exceed ", limits_.max_head_bytes,
                                   " bytes"),
                      used);
        }
        if (bad_line_)
          return Fail(400, "a trailer line not ended by CRLF (or a bare CR in it)", used);
        if (!complete) return {Event::kNeedMore, used};
        head_bytes_ += line_.size() + 2;
        if (line_.empty()) {
          state_ = State::kDone;
          continue;
        }
        // A trailer field: checked for its form, then ignored (nothing here reads trailers).
        const size_t colon = line_.find(':');
        if (colon == std::string::npos || !IsToken(absl::string_view(line_).substr(0, colon)) ||
            !IsFieldValue(absl::string_view(line_).substr(colon + 1))) {
          return Fail(400, "a malformed trailer field after the last chunk", used);
        }
        line_.clear();
        continue;
      }
    }
  }
}

bool HttpRequestReader::ParseHead() {
  // The request line: method SP target SP version.
  const std::string& request_line = lines_.front();
  std::vector<absl::string_view> parts = absl::StrSplit(request_line, ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || !IsTarget(parts[1])) {
    Fail(400, "a malformed request line (expected: METHOD /path HTTP/1.1)", 0);
    return false;
  }
  absl::string_view version = parts[2];
  if (!absl::ConsumePrefix(&version, "HTTP/") || version.size() != 3 || version[1] != '.' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[0])) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[2]))) {
    Fail(400, "a malformed HTTP version in the request line", 0);
    return false;
  }
  if (version[0] != '1' || (version[2] != '0' && version[2] != '1')) {
    Fail(505, absl::StrCat("HTTP version ", version, " is not supported; use HTTP/1.1"), 0);
    return false;
  }
  head_.method = std::string(parts[0]);
  head_.minor_version = version[2] - '0';
  absl::string_view target = parts[1];
  // The absolute form (as sent to proxies): only its path and query matter here.
  if (absl::StartsWithIgnoreCase(target, "http://") ||
      absl::StartsWithIgnoreCase(target, "https://")) {
    const size_t authority = target.find("//") + 2;
    const size_t path = target.find_first_of("/?", authority);
    target = path == absl::string_view::npos ? absl::string_view("/") : target.substr(path);
  }
  head_.target = std::string(target);

  int content_lengths = 0;
  int transfer_encodings = 0;
  int hosts = 0;
  for (size_t i = 1; i < lines_.size(); ++i) {
    absl::string_view line = lines_[i];
    if (line.front() == ' ' || line.front() == '\t') {
      Fail(400, "a header line folded onto the next (obs-fold) is not accepted", 0);
      return false;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      Fail(400, "a malformed header field (expected Name: value, no space before the colon)", 0);
      return false;
    }
    absl::string_view value = StripOws(line.substr(colon + 1));
    if (!IsFieldValue(value)) {
      Fail(400, "a header value holds control bytes", 0);
      return false;
    }
    std::string name(line.substr(0, colon));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      ++content_lengths;
      uint64_t length = 0;
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(),
                       [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
        Fail(400, "Content-Length is not one decimal number", 0);
        return false;
      }
      for (char c : value) length = length * 10 + static_cast<uint64_t>(c - '0');
      head_.content_length = length;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      ++transfer_encodings;
      if (!absl::EqualsIgnoreCase(value, "chunked")) {
        Fail(501, "only Transfer-Encoding: chunked is supported", 0);
        return false;
      }
      head_.chunked = true;
    } else if (absl::EqualsIgnoreCase(name, "Host")) {
      ++hosts;
    } else if (absl::EqualsIgnoreCase(name, "Expect")) {
      if (!absl::EqualsIgnoreCase(value, "100-continue")) {
        Fail(417, "the only expectation supported is Expect: 100-continue", 0);
        return false;
      }
      head_.expect_continue = true;
    } else if (absl::EqualsIgnoreCase(name, "Connection")) {
      if (ListHas(value, "close")) head_.keep_alive = false;
    }
    head_.headers.emplace_back(std::move(name), std::string(value));
  }
  if (content_lengths > 1) {
    Fail(400, "Content-Length is given more than once (the body's length would be ambiguous)", 0);
    return false;
  }
  if (transfer_encodings > 1) {
    Fail(400, "Transfer-Encoding is given more than once", 0);
    return false;
  }
  if (transfer_encodings > 0 && content_lengths > 0) {
    Fail(400, "both Transfer-Encoding and Content-Length frame the body; send one", 0);
    return false;
  }
  if (transfer_encodings > 0 && head_.minor_version == 0) {
    Fail(400, "Transfer-Encoding is not defined for HTTP/1.0", 0);
    return false;
  }
  if (hosts > 1 || (hosts == 0 && head_.minor_version == 1)) {
    Fail(400,
         hosts > 1 ? "Host is given more than once" : "an HTTP/1.1 request must have a Host header",
         0);
    return false;
  }
  if (head_.minor_version == 0) {
    const std::string* connection = head_.Find("Connection");
    head_.keep_alive = connection != nullptr && ListHas(*connection, "keep-alive") &&
                       !ListHas(*connection, "close");
  }
  if (head_.content_length > limits_.max_body_bytes) {
    Fail(413,
         absl::StrCat("the request body (", head_.content_length, " bytes) exceeds the limit of ",
                      limits_.max_body_bytes, " bytes (--http-max-body-bytes)"),
         0);
    return false;
  }
  if (!head_.chunked && head_.content_length == 0)
    head_.expect_continue = false;  // nothing to wait for
  return true;
}

bool HttpRequestReader::ParseChunkSize(absl::string_view line) {
  // chunk-size [ BWS ";" chunk-ext ]: hex digits, then nothing, or extensions after a ';' (with
  // only spaces or tabs before it).
  size_t digits = 0;
  while (digits < line.size() && absl::ascii_isxdigit(static_cast<unsigned char>(line[digits])))
    ++digits;
  if (digits == 0 || digits > 15) {
    Fail(400, "a malformed chunk size (expected hexadecimal digits)", 0);
    return false;
  }
  uint64_t value = 0;
  for (char c : line.substr(0, digits)) {
    value = value * 16 + static_cast<uint64_t>(
                             absl::ascii_isdigit(static_cast<unsigned char>(c))
                                 ? c - '0'
                                 : absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10);
  }
  absl::string_view extensions = line.substr(digits);
  while (!extensions.empty() && (extensions.front() == ' ' || extensions.front() == '\t'))
    extensions.remove_prefix(1);
  if (line.size() > digits &&
      (extensions.empty() || extensions.front() != ';' || !IsFieldValue(extensions))) {
    Fail(400,
         "a malformed chunk size or extension (expected hexadecimal digits, then ';' extensions or "
         "nothing)",
         0);
    return false;
  }
  if (value > limits_.max_body_bytes - std::min<uint64_t>(body_.size(), limits_.max_body_bytes)) {
    Fail(413,
         absl::StrCat("the chunked request body exceeds the limit of ", limits_.max_body_bytes,
                      " bytes (--http-max-body-bytes)"),
         0);
    return false;
  }
  remaining_ = value;
  return true;
}

}  // namespace sluice
