// KServe v2 messages <-> Sluice domain types. Pure functions: no state, no I/O.
#pragma once

#include <memory>
#include <vector>

#include "grpc_service.pb.h"
#include "server/batching/batch_sizes.h"
#include "server/batching/model_stats.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"

namespace sluice {

// Protocol-level checks and conversion of one ModelInferRequest: known datatype names, raw and
// typed contents not mixed, one raw entry per input, typed contents converted to raw bytes (with
// range checks for narrow integer types), element counts that fit the shape. Model-level checks
// are ValidateRequest's. The returned request views `proto`'s raw bytes: `proto` must outlive it.
// Errors are INVALID_ARGUMENT naming the tensor.
StatusOr<std::unique_ptr<InferRequest>> InferRequestFromProto(const inference::ModelInferRequest& proto);

// Echoes model name, version and request id into the response.
void FillInferResponseHeader(const InferRequest& request, int64_t version, inference::ModelInferResponse* proto);

// The gRPC path's output sink: each output the backend writes becomes an entry of `outputs` and
// its bytes one raw_output_contents entry of the response message itself, written once. Outputs
// appear in the order the backend delivers them (the requested order). `response` outlives it.
class ResponseSink final : public OutputSink {
 public:
  explicit ResponseSink(inference::ModelInferResponse* response) : response_(response) {}
  StatusOr<char*> Allocate(const OutputDescription& output) override;

 private:
  inference::ModelInferResponse* const response_;
};

// ModelMetadata for a model spec and its ready versions (shapes carry a leading -1 when the
// model batches).
void FillModelMetadata(const ModelSpec& spec, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* proto);

// Adds the batch sizes warm-up chose to a ModelConfig answer's parameters (kAutoBatchSizesChosenKey,
// kAutoBatchSizesRatesKey); nothing when they were not measured.
void AddBatchSizeChoice(const BatchSizeChoice& choice, inference::ModelConfig* config);

// One ModelStatistics entry with Triton's meaning (durations in nanoseconds).
void FillModelStatistics(const std::string& name, int64_t version, const ModelStatsSnapshot& stats,
                         inference::ModelStatistics* proto);

}  // namespace sluice
