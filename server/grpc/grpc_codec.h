// KServe v2 messages <-> Sluice domain types. Pure functions: no state, no I/O.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "grpc_service.pb.h"
#include "server/batching/batch_sizes.h"
#include "server/batching/model_stats.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"
#include "server/frontend/shared_memory.h"
#include "server/grpc/tcp_connections.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace sluice {

// Protocol-level checks and conversion of one ModelInferRequest: known datatype names, raw and
// typed contents not mixed, one raw entry per input, typed contents converted to raw bytes (with
// range checks for narrow integer types), element counts that fit the shape. Model-level checks
// are ValidateRequest's. The returned request views `proto`'s raw bytes: `proto` must outlive it.
// Errors are INVALID_ARGUMENT naming the tensor.
//
// An input whose parameters name a shared memory region (shared_memory_region,
// shared_memory_byte_size, shared_memory_offset) views that slice of the region through `shm`
// (which keeps the region mapped); raw_input_contents then has one entry per other input. `shm`
// null: such an input is FAILED_PRECONDITION (shared memory is off).
StatusOr<std::unique_ptr<InferRequest>> InferRequestFromProto(
    const inference::ModelInferRequest& proto, SharedMemoryRefs* shm = nullptr);

// A tensor's shared memory reference in its parameters (ReadSharedMemoryReference's rules).
StatusOr<std::optional<SharedMemoryReference>> SharedMemoryReferenceOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& parameters,
    const std::string& what);

// Echoes model name, version and request id into the response.
void FillInferResponseHeader(const InferRequest& request, int64_t version,
                             inference::ModelInferResponse* proto);

// The gRPC path's output sink: each output the backend writes becomes an entry of `outputs` and
// its bytes one raw_output_contents entry of the response message itself, written once. Outputs
// appear in the order the backend delivers them (the requested order). `response` outlives it.
class ResponseSink final : public OutputSink {
 public:
  explicit ResponseSink(inference::ModelInferResponse* response) : response_(response) {}
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  // The call's connection, when AnswerOn named where to find it (unary calls; a stream writes
  // one response at a time, so its answers could not leave together anyway); null otherwise.
  std::shared_ptr<AnswerConnection> Connection() override;
  void AnswerOn(TcpConnections* connections, const grpc::ServerContextBase* context) {
    connections_ = connections;
    context_ = context;
  }
  // An output whose bytes went elsewhere (shared memory): its entry in `outputs` and an empty
  // raw_output_contents entry, so that the entries still line up with `outputs` (as Triton).
  void Describe(const OutputDescription& output);

 private:
  inference::ModelInferResponse* const response_;
  TcpConnections* connections_ = nullptr;
  const grpc::ServerContextBase* context_ = nullptr;
};

}  // namespace sluice
