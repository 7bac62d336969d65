// KServe v2 messages <-> Sluice domain types. Pure functions: no state, no I/O.
#pragma once

#include <memory>
#include <vector>

#include "grpc_service.pb.h"
#include "server/batching/model_stats.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// Protocol-level checks and conversion of one ModelInferRequest: known datatype names, raw and
// typed contents not mixed, one raw entry per input, typed contents converted to raw bytes (with
// range checks for narrow integer types), element counts that fit the shape. Model-level checks
// are ValidateRequest's. The returned request views `proto`'s raw bytes: `proto` must outlive it.
// Errors are INVALID_ARGUMENT naming the tensor.
StatusOr<std::unique_ptr<InferRequest>> InferRequestFromProto(const inference::ModelInferRequest& proto);

// Writes outputs into `proto` as raw_output_contents (moving the bytes), echoing model name,
// version and request id.
void FillInferResponse(const InferRequest& request, InferResponse response,
                       inference::ModelInferResponse* proto);

// ModelMetadata for a model spec and its ready versions (shapes carry a leading -1 when the
// model batches).
void FillModelMetadata(const ModelSpec& spec, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* proto);

// One ModelStatistics entry with Triton's meaning (durations in nanoseconds).
void FillModelStatistics(const std::string& name, int64_t version, const ModelStatsSnapshot& stats,
                         inference::ModelStatistics* proto);

}  // namespace sluice
