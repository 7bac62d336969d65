#include "server/api/inference_service.h"

#include <mutex>

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

// One ModelInfer call. Lives from the handler until gRPC calls OnDone (after Finish). Finish is
// called exactly once, by whoever answers the request (the handler for early errors, else the
// scheduler's completion). A cancellation only flags the queued request and pokes its
// scheduler, which then answers it CANCELLED without running it.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  InferReactor() : cancelled_(std::make_shared<std::atomic<bool>>(false)) {}

  void Watch(std::shared_ptr<Scheduler> scheduler) {
    std::lock_guard<std::mutex> lock(mutex_);
    scheduler_ = std::move(scheduler);
  }
  const std::shared_ptr<std::atomic<bool>>& cancelled() const { return cancelled_; }

  void OnCancel() override {
    cancelled_->store(true);
    std::shared_ptr<Scheduler> scheduler;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      scheduler = scheduler_;
    }
    if (scheduler) scheduler->Poke();
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<std::atomic<bool>> cancelled_;
  std::mutex mutex_;
  std::shared_ptr<Scheduler> scheduler_;
};

// The request's deadline on our clock: the gRPC deadline, or the queue timeout (the request's
// own "timeout" parameter in microseconds when the model allows it, else its default), whichever
// comes first.
TimePoint RequestDeadline(const grpc::CallbackServerContext& context,
                          const inference::ModelInferRequest& proto, const DynamicBatchingSpec& batching,
                          TimePoint now) {
  TimePoint deadline = kNoDeadline;
  const auto grpc_deadline = context.deadline();
  if (grpc_deadline != std::chrono::system_clock::time_point::max()) {
    const auto left = grpc_deadline - std::chrono::system_clock::now();
    deadline = now + std::chrono::duration_cast<Duration>(left);
  }
  int64_t timeout_us = batching.default_timeout_us;
  auto parameter = proto.parameters().find("timeout");
  if (batching.allow_timeout_override && parameter != proto.parameters().end() &&
      parameter->second.parameter_choice_case() == inference::InferParameter::kInt64Param &&
      parameter->second.int64_param() > 0) {
    timeout_us = parameter->second.int64_param();
  }
  if (timeout_us > 0) deadline = std::min(deadline, now + std::chrono::microseconds(timeout_us));
  return deadline;
}

}  // namespace

InferenceService::InferenceService(ModelManager* manager, Options options)
    : manager_(manager), options_(std::move(options)), clock_(options_.clock ? options_.clock : &steady_) {}

Status InferenceService::Allow(const grpc::CallbackServerContext& context, ProtocolGroup group) const {
  if (options_.restrictions.empty()) return absl::OkStatus();
  return CheckProtocolAccess(options_.restrictions, group, context.client_metadata());
}

bool InferenceService::Ready() const {
  if (!started_ || !Live()) return false;
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
  StatusOr<const RepositoryModel*> model = manager_->FindModel(request->name());
  if (!model.ok()) return FinishNow(context, model.status());
  response->set_ready(manager_->Find(request->name(), request->version()).ok());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  response->set_name("sluice");
  response->set_version(options_.server_version);
  // Only what Sluice really implements.
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<ServableModel> servable = manager_->Find(request->name(), request->version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  FillModelMetadata(servable->model->spec, manager_->ReadyVersions(request->name()), response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(grpc::CallbackServerContext* context,
                                                        const inference::ModelConfigRequest* request,
                                                        inference::ModelConfigResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelConfig); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<ServableModel> servable = manager_->Find(request->name(), request->version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  *response->mutable_config() = servable->model->config;
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelRepository); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
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

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kStatistics); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<std::vector<VersionStatistics>> statistics =
      manager_->Statistics(request->name(), request->version());
  if (!statistics.ok()) return FinishNow(context, statistics.status());
  for (const VersionStatistics& version : *statistics) {
    FillModelStatistics(version.name, version.version, version.stats, response->add_model_stats());
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kInference); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<ServableModel> servable = manager_->Find(request->model_name(), request->model_version());
  if (!servable.ok()) return FinishNow(context, servable.status());
  StatusOr<std::unique_ptr<InferRequest>> converted = InferRequestFromProto(*request);
  if (!converted.ok()) {
    servable->stats->RecordRejected(converted.status());
    return FinishNow(context, converted.status());
  }
  std::unique_ptr<InferRequest> infer = *std::move(converted);
  infer->model_version = servable->version;
  if (Status valid = ValidateRequest(servable->model->spec, infer.get()); !valid.ok()) {
    spdlog::debug("event=request_rejected model={} request_id={} reason=\"{}\"",
                  request->model_name(), request->id(), valid.message());
    servable->stats->RecordRejected(valid);
    return FinishNow(context, valid);
  }
  infer->deadline = RequestDeadline(*context, *request, servable->model->spec.dynamic_batching,
                                    clock_->Now());
  auto* reactor = new InferReactor();
  infer->cancelled = reactor->cancelled();
  reactor->Watch(servable->scheduler);
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
