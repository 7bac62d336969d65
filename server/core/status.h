// One error type across Sluice: absl::Status / absl::StatusOr (gRPC already depends on absl).
// Codes carry meaning across modules: NOT_FOUND unknown model/version, INVALID_ARGUMENT bad
// request, UNAVAILABLE model not ready or queue full, RESOURCE_EXHAUSTED out of memory, INTERNAL
// model failure. server/grpc/grpc_status.h is the one place that turns them into gRPC
// codes, server/http/http_status.h into HTTP status codes.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

}  // namespace sluice

#define SLUICE_CONCAT_INNER_(a, b) a##b
#define SLUICE_CONCAT_(a, b) SLUICE_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK status.
#define SLUICE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status sluice_status_ = (expr);          \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

// `lhs = value of expr`, or returns its status when it failed.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_CONCAT_(sluice_statusor_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
