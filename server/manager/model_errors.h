// Triton's wording for the errors of finding a model, which Triton's clients and users' scripts
// match on (Triton's published examples check that an unknown model's message starts "Request for
// unknown model"). The one table: ModelManager answers every lookup with these, so gRPC, gRPC
// streams and HTTP say the same; Sluice's own explanation follows Triton's sentence in brackets.
//
//   case                     code          message
//   no such model            NOT_FOUND     Request for unknown model: 'm' is not found
//   no such version          NOT_FOUND     Request for unknown model: 'm' version v is not found
//   (detail) no version ready         UNAVAILABLE   Request for unknown model: 'm' has no available
//   versions (why) that version not ready   UNAVAILABLE   Request for unknown model: 'm' version v
//   is not at ready state (why)
//
// The model name and a version as the client sent it are shown through QuoteClientText
// (core/message_text.h): a usual name as it is, a long or odd one cut short and escaped.
//
// The front ends map the codes (NOT_FOUND: HTTP 404; UNAVAILABLE: 503), see grpc/grpc_status.h and
// http/http_status.h.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

#include "server/core/status.h"

namespace sluice {

Status UnknownModelError(absl::string_view model);
// `version` as the client sent it; `detail` may be empty.
Status UnknownVersionError(absl::string_view model, absl::string_view version,
                           absl::string_view detail);
Status NoReadyVersionError(absl::string_view model, absl::string_view why);
Status VersionNotReadyError(absl::string_view model, int64_t version, absl::string_view why);

}  // namespace sluice
