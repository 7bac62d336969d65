#include "server/core/percent_decode.h"

#include "absl/strings/ascii.h"

namespace sluice {

std::optional<std::string> PercentDecode(absl::string_view text) {
  std::string decoded;
  decoded.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      decoded.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size() || !absl::ascii_isxdigit(text[i + 1]) ||
        !absl::ascii_isxdigit(text[i + 2])) {
      return std::nullopt;
    }
    auto digit = [](char c) {
      return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
    };
    decoded.push_back(static_cast<char>(digit(text[i + 1]) * 16 + digit(text[i + 2])));
    i += 2;
  }
  return decoded;
}

}  // namespace sluice
