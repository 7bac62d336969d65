// Checks an InferRequest against the model it targets, before it may reach the model.
#pragma once

#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// Validates names, datatypes, ranks, dimensions, byte sizes and batch size of every input, and the
// requested outputs. Errors are INVALID_ARGUMENT with a message that names the tensor and says
// what was expected. On success sets request->batch_size and reorders nothing.
// The request's classifications (InferRequest::classifications) are checked too: each names a
// requested output whose datatype CheckClassifiable takes, at most once, with a count >= 1.
Status ValidateRequest(const ModelSpec& spec, InferRequest* request);

// OK when an output of `dtype` can be answered as its top classes (frontend/classification.h);
// INVALID_ARGUMENT in Triton's words ("class result not available for output due to unsupported
// type 'BYTES'") for BOOL and BYTES.
Status CheckClassifiable(DataType dtype);

}  // namespace sluice
