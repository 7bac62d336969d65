#include "server/api/inference_service.h"

#include "server/core/logging.h"

#include "absl/strings/str_cat.h"
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

}  // namespace

InferenceService::InferenceService(ModelManager* manager, Options options)
    : manager_(manager), options_(std::move(options)) {}

bool InferenceService::Ready() const {
  if (!started_) return false;
  return !options_.readiness.strict || manager_->AllReady();
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  response->set_live(true);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  response->set_ready(Ready());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  StatusOr<const RepositoryModel*> model = manager_->FindModel(request->name());
  if (!model.ok()) return FinishNow(context, model.status());
  response->set_ready(manager_->Find(request->name(), request->version()).ok());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  response->set_name("sluice");
  response->set_version(options_.server_version);
  // Only what Sluice really implements.
  response->add_extensions("model_configuration");
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  StatusOr<ServableModel> servable = manager_->Find(request->name(), request->version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  FillModelMetadata(servable->model->spec, manager_->ReadyVersions(request->name()), response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(grpc::CallbackServerContext* context,
                                                        const inference::ModelConfigRequest* request,
                                                        inference::ModelConfigResponse* response) {
  StatusOr<ServableModel> servable = manager_->Find(request->name(), request->version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  *response->mutable_config() = servable->model->config;
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (!request->repository_name().empty()) {
    return FinishNow(context, absl::NotFoundError(absl::StrCat(
                                  "unknown repository '", request->repository_name(),
                                  "'; Sluice serves one repository (leave repository_name empty)")));
  }
  for (const ModelIndexEntry& entry : manager_->Index()) {
    if (request->ready() && entry.state != ModelState::kReady) continue;
    auto* model = response->add_models();
    model->set_name(entry.name);
    model->set_version(entry.version);
    model->set_state(std::string(ModelStateName(entry.state)));
    model->set_reason(entry.reason);
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  StatusOr<ServableModel> servable = manager_->Find(request->model_name(), request->model_version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  StatusOr<std::unique_ptr<InferRequest>> converted = InferRequestFromProto(*request);
  if (!converted.ok()) return FinishNow(context, converted.status());
  std::unique_ptr<InferRequest> infer = *std::move(converted);
  infer->model_version = servable->version;
  if (Status valid = ValidateRequest(servable->model->spec, infer.get()); !valid.ok()) {
    spdlog::debug("event=request_rejected model={} request_id={} reason=\"{}\"",
                  request->model_name(), request->id(), valid.message());
    return FinishNow(context, valid);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The request proto (and so the bytes `infer` views) lives until reactor->Finish.
  const InferRequest* raw_request = infer.get();
  servable->scheduler->Enqueue(
      std::move(infer), [reactor, response, raw_request](StatusOr<InferResponse> result) {
        if (!result.ok()) {
          spdlog::debug("event=infer_failed model={} request_id={} reason=\"{}\"",
                        raw_request->model_name, raw_request->id, result.status().message());
          reactor->Finish(ToGrpcStatus(result.status()));
          return;
        }
        FillInferResponse(*raw_request, *std::move(result), response);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

}  // namespace sluice
