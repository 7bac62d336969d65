#include "server/grpc/grpc_status.h"

#include <string>

#include "server/core/message_text.h"
#include "server/core/retry_after.h"

namespace sluice {

grpc::Status ToGrpcStatus(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return grpc::Status::OK;
    case absl::StatusCode::kCancelled:
      code = grpc::StatusCode::CANCELLED;
      break;
    case absl::StatusCode::kUnknown:
      code = grpc::StatusCode::UNKNOWN;
      break;
    case absl::StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    case absl::StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = grpc::StatusCode::PERMISSION_DENIED;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case absl::StatusCode::kAborted:
      code = grpc::StatusCode::ABORTED;
      break;
    case absl::StatusCode::kOutOfRange:
      code = grpc::StatusCode::OUT_OF_RANGE;
      break;
    case absl::StatusCode::kUnimplemented:
      code = grpc::StatusCode::UNIMPLEMENTED;
      break;
    case absl::StatusCode::kInternal:
      code = grpc::StatusCode::INTERNAL;
      break;
    case absl::StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case absl::StatusCode::kDataLoss:
      code = grpc::StatusCode::DATA_LOSS;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    default:
      code = grpc::StatusCode::UNKNOWN;
      break;
  }
  return grpc::Status(code, CapMessage(status.message()));
}

void AddRetryAfter(grpc::ServerContextBase* context, const Status& status) {
  const std::optional<std::chrono::milliseconds> after = RetryAfter(status);
  if (!after || context == nullptr) return;
  context->AddTrailingMetadata("retry-after", std::to_string(RetryAfterSeconds(*after)));
  context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(after->count()));
}

}  // namespace sluice
