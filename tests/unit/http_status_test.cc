#include <gtest/gtest.h>

#include "server/http/http_status.h"

namespace sluice {
namespace {

TEST(HttpStatusTest, HttpCodesFollowTritonAndNameWhatTritonLumpsInto400) {
  const std::pair<absl::StatusCode, int> pairs[] = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kUnimplemented, 501},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kAlreadyExists, 400},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kDeadlineExceeded, 504},
      {absl::StatusCode::kUnauthenticated, 401},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kCancelled, 499},
  };
  for (const auto& [ours, code] : pairs) {
    EXPECT_EQ(ToHttpStatusCode(Status(ours, "why")), code) << absl::StatusCodeToString(ours);
  }
}

}  // namespace
}  // namespace sluice
