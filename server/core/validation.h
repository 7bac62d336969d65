// Checks an InferRequest against the model it targets, before it may reach the model.
#pragma once

#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// Validates names, datatypes, ranks, dimensions, byte sizes and batch size of every input, and the
// requested outputs. Errors are INVALID_ARGUMENT with a message that names the tensor and says
// what was expected. On success sets request->batch_size and reorders nothing.
Status ValidateRequest(const ModelSpec& spec, InferRequest* request);

}  // namespace sluice
