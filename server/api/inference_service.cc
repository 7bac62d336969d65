#include "server/api/inference_service.h"

#include <type_traits>

#include "server/core/logging.h"
#include "server/core/mutex.h"

#include "absl/strings/str_cat.h"
#include "server/api/model_queries.h"
#include "server/api/protocol.h"
#include "server/api/status_mapping.h"
#include "server/core/validation.h"

namespace sluice {
namespace {

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, const Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One ModelInfer call. Lives from the handler until gRPC calls OnDone (after Finish), and owns
// the parsed request, the response message (which is the call's output sink) and the pointer to
// gRPC's response bytes. Finish is called exactly once, by whoever answers the request (the
// handler for early errors, else the scheduler's completion through Answer). A cancellation only flags the queued request and pokes its model, which then answers
// it CANCELLED without running it. The reactor holds the model reference (which counts as in
// flight) from submission until the answer, not until OnDone.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit InferReactor(grpc::ByteBuffer* response_bytes)
      : response_bytes_(response_bytes), cancelled_(std::make_shared<std::atomic<bool>>(false)) {}

  // Parses the call's request bytes into request(); INVALID_ARGUMENT when they are no
  // ModelInferRequest.
  Status Parse(const grpc::ByteBuffer& bytes) {
    grpc::ByteBuffer consumed(bytes);  // shares the slices; parsing consumes the copy
    const grpc::Status parsed =
        grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(&consumed, &request_);
    if (parsed.ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid inference.ModelInferRequest message (", parsed.error_message(),
                     "); is the client built from the KServe v2 grpc_service.proto?"));
  }

  const inference::ModelInferRequest& request() const { return request_; }
  inference::ModelInferResponse* response() { return &response_; }
  OutputSink* sink() { return &sink_; }
  const std::shared_ptr<std::atomic<bool>>& cancelled() const { return cancelled_; }

  void Watch(std::shared_ptr<ModelHandle> model) { model_.Set(std::move(model)); }

  // The completion: drops the model reference, then finishes the call. The reactor may be
  // deleted as soon as Finish returns.
  void Answer(const Status& status) {
    model_.Release();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    bool own_buffer = false;
    const grpc::Status serialized =
        grpc::SerializationTraits<inference::ModelInferResponse>::Serialize(response_, response_bytes_, &own_buffer);
    Finish(serialized);
  }

  void OnCancel() override {
    cancelled_->store(true);
    model_.Poke();
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const response_bytes_;
  const std::shared_ptr<std::atomic<bool>> cancelled_;
  inference::ModelInferRequest request_;
  inference::ModelInferResponse response_;
  ResponseSink sink_{&response_};
  ModelHold model_;
};

// The caller's gRPC deadline on our clock; kNoDeadline when it set none.
TimePoint CallerDeadline(const grpc::CallbackServerContext& context, TimePoint now) {
  const auto grpc_deadline = context.deadline();
  if (grpc_deadline == std::chrono::system_clock::time_point::max()) return kNoDeadline;
  return now + std::chrono::duration_cast<Duration>(grpc_deadline - std::chrono::system_clock::now());
}

}  // namespace

InferenceService::InferenceService(ModelManager* manager, ModelControl* control, Options options)
    : manager_(manager),
      control_(control),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &steady_),
      lookup_(options_.lookup ? options_.lookup : manager) {}

grpc::ServerUnaryReactor* InferenceService::RunControl(grpc::CallbackServerContext* context,
                                                       std::function<Status()> task) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_->Submit(std::move(task), [reactor](const Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

template <typename Request>
Status InferenceService::CheckControl(const grpc::CallbackServerContext& context, const Request& request) const {
  SLUICE_RETURN_IF_ERROR(Allow(context, ProtocolGroup::kModelRepository));
  std::vector<std::string> keys;
  for (const auto& [key, value] : request.parameters()) keys.push_back(key);
  return CheckModelControl(control_, "gRPC", request.repository_name(), request.model_name(), keys,
                           std::is_same_v<Request, inference::RepositoryModelUnloadRequest>);
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  if (Status allowed = CheckControl(*context, *request); !allowed.ok()) return FinishNow(context, allowed);
  return RunControl(context, [this, name = request->model_name()] { return control_->LoadModel(name); });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (Status allowed = CheckControl(*context, *request); !allowed.ok()) return FinishNow(context, allowed);
  return RunControl(context, [this, name = request->model_name()] {
    spdlog::info("event=model_unload_requested model={}", name);
    return control_->UnloadModel(name);
  });
}

Status InferenceService::Allow(const grpc::CallbackServerContext& context, ProtocolGroup group) const {
  if (options_.restrictions.empty()) return absl::OkStatus();
  return CheckProtocolAccess(options_.restrictions, group, context.client_metadata());
}

bool InferenceService::Ready() const {
  if (!started_ || draining_ || !Live()) return false;
  return !options_.readiness.strict || manager_->AllReady();
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  response->set_live(Live());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  response->set_ready(Ready());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<bool> ready = AnswerModelReady(*manager_, request->name(), request->version());
  if (ready.ok()) response->set_ready(*ready);
  return FinishNow(context, ready.status());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  AnswerServerMetadata(options_.server_version, response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, AnswerModelMetadata(*manager_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(grpc::CallbackServerContext* context,
                                                        const inference::ModelConfigRequest* request,
                                                        inference::ModelConfigResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelConfig); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, AnswerModelConfig(*manager_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelRepository); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, AnswerRepositoryIndex(*manager_, request->repository_name(), request->ready(), response));
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kStatistics); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, AnswerModelStatistics(*manager_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response_bytes) {
  if (Status allowed = Allow(*context, ProtocolGroup::kInference); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  auto* reactor = new InferReactor(response_bytes);
  const inference::ModelInferRequest& request = reactor->request();
  if (Status parsed = reactor->Parse(*request_bytes); !parsed.ok()) {
    reactor->Answer(parsed);
    return reactor;
  }
  StatusOr<std::shared_ptr<ModelHandle>> found = lookup_->Find(request.model_name(), request.model_version());
  if (!found.ok()) {
    reactor->Answer(found.status());
    return reactor;
  }
  std::shared_ptr<ModelHandle> model = *std::move(found);
  StatusOr<std::unique_ptr<InferRequest>> converted = InferRequestFromProto(request);
  if (!converted.ok()) {
    reactor->Answer(model->Reject(converted.status(), Protocol::kGrpc));
    return reactor;
  }
  std::unique_ptr<InferRequest> infer = *std::move(converted);
  infer->deadline = CallerDeadline(*context, clock_->Now());
  // Written before submission: from then on only the worker that answers touches the response.
  FillInferResponseHeader(*infer, model->version(), reactor->response());
  infer->cancelled = reactor->cancelled();
  // The reactor's copy keeps the version in flight until the answer; ours keeps it alive until
  // Submit has returned (the answer may come before that).
  reactor->Watch(model);
  // The request proto (whose bytes `infer` views) and the sink live until reactor->Finish.
  model->Submit(std::move(infer), reactor->sink(), [reactor](Status status) {
    if (!status.ok()) {
      spdlog::debug("event=infer_failed model={} request_id={} reason=\"{}\"", reactor->request().model_name(),
                    reactor->request().id(), status.message());
    }
    reactor->Answer(status);
  });
  return reactor;
}

}  // namespace sluice
