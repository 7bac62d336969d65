// spdlog with Sluice's conventions: one line per event, `event=name key=value ...`; per-request
// detail only at debug level. Also teaches fmt to print absl::string_view (Debian's absl has its
// own string_view type, which status.message() returns).
#pragma once

#include <spdlog/spdlog.h>

#include "absl/strings/string_view.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view text, FormatContext& context) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text.data(), text.size()),
                                                    context);
  }
};
