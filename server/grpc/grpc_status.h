// Sluice statuses as gRPC statuses: the one mapping the gRPC front end answers with.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "server/core/status.h"

namespace sluice {

// Same-named codes map one to one (absl and gRPC share the canonical code space). A non-canonical
// code becomes UNKNOWN. The message is kept as CapMessage bounds it (message_text.h): at most
// kStatusMessageBytes of valid UTF-8, whatever the status carries, since gRPC sends it in the
// trailing metadata and a client refuses metadata over its limit (8 KiB by default) with
// RESOURCE_EXHAUSTED instead of the status.
grpc::Status ToGrpcStatus(const Status& status);

// A refusal that names a time to retry after (core/retry_after.h) tells it in trailing metadata,
// before the call finishes: `retry-after` (whole seconds, as HTTP's header) and
// `grpc-retry-pushback-ms` (milliseconds; gRPC clients with a retry policy wait that long). Does
// nothing for any other status.
void AddRetryAfter(grpc::ServerContextBase* context, const Status& status);

}  // namespace sluice
