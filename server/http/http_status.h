// Sluice statuses as HTTP status codes: the one mapping the REST front end answers with.
#pragma once

#include "server/core/status.h"

namespace sluice {

// The HTTP status code of the REST binding's answer for `status`. Triton's mapping where Triton has
// one (OK 200, INTERNAL and UNKNOWN 500, NOT_FOUND 404, UNAVAILABLE 503, UNIMPLEMENTED 501, the
// rest 400); Sluice also answers RESOURCE_EXHAUSTED 429 (a full queue: retry later),
// DEADLINE_EXCEEDED 504 (the request's timeout passed before it ran), UNAUTHENTICATED 401,
// PERMISSION_DENIED 403 (restricted APIs) and CANCELLED 499 (the client went away; only logs see
// it).
int ToHttpStatusCode(const Status& status);

}  // namespace sluice
