// inference.GRPCInferenceService on gRPC's callback API. Handlers validate, hand the request to
// the model's scheduler and return; the scheduler's worker finishes the call. No gRPC thread ever
// waits for model execution. RPCs Sluice does not implement answer UNIMPLEMENTED (the generated
// base class's default).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "server/core/clock.h"
#include "server/frontend/inference_path.h"
#include "server/frontend/model_queries.h"
#include "server/frontend/restricted_protocols.h"
#include "server/frontend/server_health.h"
#include "server/frontend/shared_memory.h"
#include "server/grpc/grpc_codec.h"
#include "server/grpc/tcp_connections.h"
#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "server/tracing/tracer.h"

namespace sluice {

// One gRPC inference request (unary or in a stream) on the shared inference path: its codec
// (ModelInferRequest, shared memory inputs and outputs), its response (written by its sink), its
// shared memory references (keeping those regions mapped). How the answer is sent is the
// owner's (Answer). `request` and `response` outlive the call.
class GrpcInferCall : public InferenceCall {
 public:
  GrpcInferCall(const inference::ModelInferRequest* request,
                inference::ModelInferResponse* response, const SharedMemoryManager* shared_memory)
      : request_(request),
        response_(response),
        response_sink_(response),
        shm_refs_(shared_memory),
        sink_(&response_sink_,
              [this](const OutputDescription& output) { response_sink_.Describe(output); }) {
    shared_memory_refs = &shm_refs_;
  }
  GrpcInferCall(const GrpcInferCall&) = delete;
  GrpcInferCall& operator=(const GrpcInferCall&) = delete;

  const std::string& model_name() const override { return request_->model_name(); }
  const std::string& model_version() const override { return request_->model_version(); }
  StatusOr<std::unique_ptr<InferRequest>> Decode(const ModelHandle& model) override;
  // Writes the response header (model, version, id).
  void Accepted(const InferRequest& request, const InFlightModel& model) override;
  OutputSink* sink() override;
  absl::string_view request_id() const override { return request_->id(); }
  // The answer goes to `context`'s connection, found in `connections` when a batch asks
  // (ResponseSink::Connection). Both outlive the call.
  void AnswerOn(TcpConnections* connections, const grpc::ServerContextBase* context) {
    response_sink_.AnswerOn(connections, context);
  }

 protected:
  const inference::ModelInferRequest* const request_;
  inference::ModelInferResponse* const response_;

 private:
  ResponseSink response_sink_;
  SharedMemoryRefs shm_refs_;
  SharedMemorySink sink_;  // outputs placed in shared memory go there, the others to response_sink_
};

// ModelInfer is a raw method (message bytes in and out): the service parses the request itself,
// so that bytes that are no ModelInferRequest get INVALID_ARGUMENT with a reason (gRPC's typed
// callback handler answers them UNIMPLEMENTED with no message). Marking it raw over the
// callback base logs one line at GRPC_VERBOSITY=info.
class GrpcService final : public inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
                              inference::GRPCInferenceService::CallbackService> {
 public:
  struct Options {
    std::string server_version = "0.1.0";  // reported by ServerMetadata
    const ServerHealth* health = nullptr;  // ServerLive and ServerReady; null: live and ready
    const TimeSource* clock = nullptr;     // for request deadlines; null: the steady clock
    std::vector<ProtocolRestriction> restrictions;  // --grpc-restricted-protocol; empty: all open
    const ModelLookup* lookup = nullptr;  // where ModelInfer finds models; null: the manager
    int stream_max_in_flight = 64;  // per ModelStreamInfer stream (--grpc-stream-max-in-flight)
    // Hold a TCP connection's writes while one execution's answers to several of its unary
    // calls are sent (--grpc-coalesce-answers; core/output_sink.h AnswerConnection).
    bool coalesce_answers = true;
    // System shared memory regions; null: client shared memory is off (--allow-client-shm false):
    // register and unregister calls answer UNIMPLEMENTED, status calls list nothing, and requests
    // naming a region fail FAILED_PRECONDITION.
    SharedMemoryManager* shared_memory = nullptr;
    // Decides which requests are traced (from their traceparent metadata and the trace
    // settings) and answers TraceSetting; null: nothing is traced and TraceSetting answers
    // UNAVAILABLE. Outlives the service.
    Tracer* tracer = nullptr;
    // Quotas per client on inference requests (client_quotas.h); null: off. Outlives the service.
    ClientQuotas* quotas = nullptr;
  };

  // `manager` and `control` must outlive the service. `control` null: model control RPCs answer
  // FAILED_PRECONDITION. Destroy the service after the gRPC server has shut down.
  GrpcService(ModelManager* manager, ModelControl* control, Options options);

  bool Ready() const { return options_.health == nullptr || options_.health->Ready(); }
  bool Live() const { return options_.health == nullptr || options_.health->Live(); }
  // The connections of unary calls whose batched answers were held (coalesce_answers).
  const TcpConnections& connections() const { return connections_; }
  // The port(s) the gRPC server bound: only connections to them are ever held.
  void SetListeningPorts(std::vector<int> ports) {
    connections_.SetListeningPorts(std::move(ports));
  }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  // Load and unload take seconds (loading, warm-up, draining): the handlers hand them to the
  // model control thread (ModelControl::Submit), which runs them one at a time and finishes the
  // call.
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  // `request` holds a serialized ModelInferRequest; `response` gets the serialized
  // ModelInferResponse.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  // One bidirectional stream of inference requests (non-decoupled models: one response per
  // request, written as each is answered, so possibly out of order; each carries its request's
  // id). A request that fails is answered in that response's error_message; the stream and its
  // other requests go on. At most Options::stream_max_in_flight requests of a stream are between
  // read and written; at the bound the stream is not read until one is written. When the stream
  // ends (client cancel, deadline, broken transport), its queued requests are cancelled. The
  // stream finishes OK after the client half-closes and every response is written.
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

  // Runs `call` for `context`'s caller on the shared inference path (inference_path.h): the
  // caller's deadline, its trace when sampled (a request span named `method`, the caller's
  // traceparent metadata as its parent), then RunInference.
  void SubmitInfer(const grpc::CallbackServerContext& context, GrpcInferCall* call,
                   const char* method = "inference.GRPCInferenceService/ModelInfer");

  // Triton's trace settings extension: the server's settings (model_name empty) or a model's,
  // changed first when the request carries settings. Guarded like the other control APIs (the
  // "trace" protocol group). The export URL is not a setting: a client cannot point the server
  // elsewhere.
  grpc::ServerUnaryReactor* TraceSetting(grpc::CallbackServerContext* context,
                                         const inference::TraceSettingRequest* request,
                                         inference::TraceSettingResponse* response) override;

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* response) override;
  // CUDA shared memory answers UNIMPLEMENTED with a sentence saying so.
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
      inference::CudaSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryRegisterRequest* request,
      inference::CudaSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryUnregisterRequest* request,
      inference::CudaSharedMemoryUnregisterResponse* response) override;

 private:
  // The identity of `context`'s client for the quotas (on): the trusted proxy's header, the
  // client certificate's subject, or the peer's address.
  std::string ClientOf(const grpc::CallbackServerContext& context) const;
  // OK, or why the call may not use `group` (see restricted_protocols.h).
  Status Allow(const grpc::CallbackServerContext& context, ProtocolGroup group) const;
  // The checks RepositoryModelLoad and Unload share: access, mode, repository name, parameters.
  // (A load's config override comes back.)
  template <typename Request>
  StatusOr<ControlRequest> CheckControl(const grpc::CallbackServerContext& context,
                                        const Request& request) const;
  // Runs `task` on the control thread and finishes the call with its status.
  grpc::ServerUnaryReactor* RunControl(grpc::CallbackServerContext* context,
                                       std::function<Status()> task);

  ModelManager* const manager_;
  ModelControl* const control_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  const ModelLookup* const lookup_;
  TcpConnections connections_;  // the sockets of unary calls' connections (coalesce_answers)
};

}  // namespace sluice
