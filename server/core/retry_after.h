// A refusal that tells the client when to try again (a client over its quota): the time rides on
// the status as a payload, and each protocol states it its own way (HTTP: Retry-After in whole
// seconds; gRPC: trailing metadata retry-after, and grpc-retry-pushback-ms, which gRPC's own retry
// policy obeys).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

#include "server/core/clock.h"
#include "server/core/status.h"

namespace sluice {

inline constexpr char kRetryAfterPayload[] = "type.sluice.dev/retry-after-ms";

// `status` (not OK) carrying "try again in `after`" (at least 1 ms).
inline Status WithRetryAfter(Status status, Duration after) {
  const int64_t ms =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(after).count());
  status.SetPayload(kRetryAfterPayload, absl::Cord(std::to_string(ms)));
  return status;
}

// The time a refusal asks the client to wait, or nullopt when it names none.
inline std::optional<std::chrono::milliseconds> RetryAfter(const Status& status) {
  if (status.ok()) return std::nullopt;
  const auto payload = status.GetPayload(kRetryAfterPayload);  // absl::optional<absl::Cord>
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms) || ms <= 0) return std::nullopt;
  return std::chrono::milliseconds(ms);
}

// Whole seconds, rounded up (HTTP's Retry-After has no fractions; 0 would invite a retry now).
inline int64_t RetryAfterSeconds(std::chrono::milliseconds after) {
  return std::max<int64_t>(1, (after.count() + 999) / 1000);
}

}  // namespace sluice
