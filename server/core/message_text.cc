#include "server/core/message_text.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// The length of the valid UTF-8 sequence (RFC 3629) that starts at `text[at]`, with its code point
// in `*code_point`; 0 when the byte there starts none.
size_t DecodeUtf8(absl::string_view text, size_t at, char32_t* code_point) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + at;
  const unsigned char lead = bytes[0];
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length = 0;
  char32_t value = 0;
  unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    value = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    value = lead & 0x0f;
    if (lead == 0xe0) low = 0xa0;   // no overlong 3-byte forms
    if (lead == 0xed) high = 0x9f;  // no UTF-16 surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    value = lead & 0x07;
    if (lead == 0xf0) low = 0x90;   // no overlong 4-byte forms
    if (lead == 0xf4) high = 0x8f;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - at < length || bytes[1] < low || bytes[1] > high) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((bytes[k] & 0xc0) != 0x80) return 0;
    value = (value << 6) | (bytes[k] & 0x3f);
  }
  *code_point = value;
  return length;
}

// Characters that move or hide the text around them: C1 controls, bidirectional marks, overrides
// and isolates, line and paragraph separators.
bool RearrangesText(char32_t code_point) {
  return (code_point >= 0x80 && code_point <= 0x9f) || code_point == 0x061c ||
         code_point == 0x200e || code_point == 0x200f ||
         (code_point >= 0x2028 && code_point <= 0x202e) ||
         (code_point >= 0x2066 && code_point <= 0x2069);
}

void AppendEscape(const char* prefix, uint32_t value, int digits, std::string* out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out->append(prefix);
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4)
    out->push_back(kHex[(value >> shift) & 0xf]);
}

enum class Escapes { kClientText, kInvalidUtf8Only };

// Appends the rendering of the character (or invalid byte) at `text[at]` to `*out`; returns how
// many bytes of `text` it took.
size_t RenderOne(absl::string_view text, size_t at, Escapes escapes, std::string* out) {
  char32_t code_point = 0;
  const size_t length = DecodeUtf8(text, at, &code_point);
  if (length == 0) {
    AppendEscape("\\x", static_cast<unsigned char>(text[at]), 2, out);
    return 1;
  }
  if (escapes == Escapes::kClientText) {
    if (code_point < 0x20 || code_point == 0x7f) {
      AppendEscape("\\x", code_point, 2, out);
      return 1;
    }
    if (RearrangesText(code_point)) {
      AppendEscape("\\u", code_point, 4, out);
      return length;
    }
  }
  out->append(text.data() + at, length);
  return length;
}

size_t DecimalDigits(size_t value) {
  size_t digits = 1;
  while (value >= 10) {
    value /= 10;
    ++digits;
  }
  return digits;
}

std::string Render(absl::string_view text, size_t max_bytes, Escapes escapes) {
  max_bytes = std::max(max_bytes, kMinMessageTextBytes);
  // "...(" N " bytes)": at most 31 bytes, so it always fits kMinMessageTextBytes.
  const size_t marker_size = 4 + DecimalDigits(text.size()) + 7;
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  size_t fits =
      0;  // the size of `out` at the last character boundary with room for the marker after it
  for (size_t at = 0; at < text.size();) {
    if (out.size() + marker_size <= max_bytes) fits = out.size();
    at += RenderOne(text, at, escapes, &out);
    if (out.size() > max_bytes) {
      out.resize(fits);
      absl::StrAppend(&out, "...(", text.size(), " bytes)");
      return out;
    }
  }
  return out;
}

}  // namespace

std::string QuoteClientText(absl::string_view text, size_t max_bytes) {
  return Render(text, max_bytes, Escapes::kClientText);
}

std::string CapMessage(absl::string_view message, size_t max_bytes) {
  return Render(message, max_bytes, Escapes::kInvalidUtf8Only);
}

}  // namespace sluice
