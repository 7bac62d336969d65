#include "server/http/http_status.h"

namespace sluice {

int ToHttpStatusCode(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return 500;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kCancelled:
      return 499;
    default:
      return 400;
  }
}

}  // namespace sluice
