#include <gtest/gtest.h>

#include "server/core/bytes_tensor.h"
#include "server/core/message_text.h"
#include "server/grpc/grpc_status.h"

namespace sluice {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeMapsToItsGrpcTwin) {
  const std::pair<absl::StatusCode, grpc::StatusCode> pairs[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [ours, theirs] : pairs) {
    grpc::Status mapped = ToGrpcStatus(Status(ours, "why"));
    EXPECT_EQ(mapped.error_code(), theirs) << absl::StatusCodeToString(ours);
    EXPECT_EQ(mapped.error_message(), "why");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(Status(static_cast<absl::StatusCode>(99), "odd")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

// gRPC sends the message in the trailing metadata: past the client's limit (8 KiB by default) the
// client would see RESOURCE_EXHAUSTED "received metadata size exceeds hard limit" instead.
TEST(GrpcStatusTest, TheGrpcMessageIsCappedToShortValidUtf8AndTheCodeKept) {
  const std::string long_name(20000, 'n');
  const grpc::Status mapped = ToGrpcStatus(
      absl::NotFoundError("Request for unknown model: '" + long_name + "' is not found"));
  EXPECT_EQ(mapped.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(mapped.error_message().size(), kStatusMessageBytes);
  EXPECT_EQ(mapped.error_message().rfind("Request for unknown model: 'nnn", 0), 0u);
  EXPECT_EQ(mapped.error_message().substr(kStatusMessageBytes - 16), "...(20042 bytes)");

  const grpc::Status invalid =
      ToGrpcStatus(absl::InvalidArgumentError("bad '\xff\xfe'\nnext line"));
  EXPECT_TRUE(IsValidUtf8(invalid.error_message()));
  EXPECT_EQ(invalid.error_message(), "bad '\\xFF\\xFE'\nnext line");
}

}  // namespace
}  // namespace sluice
