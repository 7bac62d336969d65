#include "server/manager/model_errors.h"

#include "absl/strings/str_cat.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

std::string Because(absl::string_view why) {
  return why.empty() ? "" : absl::StrCat(" (", why, ")");
}

}  // namespace

Status UnknownModelError(absl::string_view model) {
  return absl::NotFoundError(
      absl::StrCat("Request for unknown model: '", QuoteClientText(model), "' is not found"));
}

Status UnknownVersionError(absl::string_view model, absl::string_view version,
                           absl::string_view detail) {
  return absl::NotFoundError(absl::StrCat("Request for unknown model: '", QuoteClientText(model),
                                          "' version ", QuoteClientText(version), " is not found",
                                          Because(detail)));
}

Status NoReadyVersionError(absl::string_view model, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat("Request for unknown model: '", QuoteClientText(model),
                                             "' has no available versions", Because(why)));
}

Status VersionNotReadyError(absl::string_view model, int64_t version, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat("Request for unknown model: '", QuoteClientText(model),
                                             "' version ", version, " is not at ready state",
                                             Because(why)));
}

}  // namespace sluice
