// The one mapping from Sluice statuses to gRPC statuses.
#pragma once

#include <grpcpp/support/status.h>

#include "server/core/status.h"

namespace sluice {

// Same-named codes map one to one (absl and gRPC share the canonical code space); the message is
// kept. A non-canonical code becomes UNKNOWN.
grpc::Status ToGrpcStatus(const Status& status);

}  // namespace sluice
