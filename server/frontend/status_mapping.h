// The mappings from Sluice statuses to gRPC statuses and to HTTP status codes.
#pragma once

#include <grpcpp/support/status.h>

#include "server/core/status.h"

namespace sluice {

// Same-named codes map one to one (absl and gRPC share the canonical code space). A non-canonical
// code becomes UNKNOWN. The message is kept as CapMessage bounds it (message_text.h): at most
// kStatusMessageBytes of valid UTF-8, whatever the status carries, since gRPC sends it in the
// trailing metadata and a client refuses metadata over its limit (8 KiB by default) with
// RESOURCE_EXHAUSTED instead of the status.
grpc::Status ToGrpcStatus(const Status& status);

// The HTTP status code of the REST binding's answer for `status`. Triton's mapping where Triton has
// one (OK 200, INTERNAL and UNKNOWN 500, NOT_FOUND 404, UNAVAILABLE 503, UNIMPLEMENTED 501, the
// rest 400); Sluice also answers RESOURCE_EXHAUSTED 429 (a full queue: retry later),
// DEADLINE_EXCEEDED 504 (the request's timeout passed before it ran), UNAUTHENTICATED 401,
// PERMISSION_DENIED 403 (restricted APIs) and CANCELLED 499 (the client went away; only logs see
// it).
int ToHttpStatusCode(const Status& status);

}  // namespace sluice
