#include "server/api/inference_service.h"

#include <mutex>
#include <type_traits>

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
    : manager_(manager), options_(std::move(options)), clock_(options_.clock ? options_.clock : &steady_),
      control_thread_([this] { ControlLoop(); }) {}

InferenceService::~InferenceService() {
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    control_stopping_ = true;
  }
  control_wake_.notify_all();
  control_thread_.join();
}

void InferenceService::ControlLoop() {
  std::unique_lock<std::mutex> lock(control_mutex_);
  while (true) {
    control_wake_.wait(lock, [this] { return control_stopping_ || !control_tasks_.empty(); });
    if (control_tasks_.empty()) return;  // stopping, and nothing left to answer
    std::function<void()> task = std::move(control_tasks_.front());
    control_tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

grpc::ServerUnaryReactor* InferenceService::RunControl(grpc::CallbackServerContext* context,
                                                       std::function<Status()> task) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    control_tasks_.push_back([reactor, task = std::move(task)] { reactor->Finish(ToGrpcStatus(task())); });
  }
  control_wake_.notify_one();
  return reactor;
}

template <typename Request>
Status InferenceService::CheckControl(const grpc::CallbackServerContext& context, const Request& request) const {
  SLUICE_RETURN_IF_ERROR(Allow(context, ProtocolGroup::kModelRepository));
  // RepositoryModelLoad/Unload work only in explicit mode (see ModelControlMode).
  if (manager_->control_mode() != ModelControlMode::kExplicit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "models cannot be loaded or unloaded over gRPC with --model-control-mode ",
        ModelControlModeName(manager_->control_mode()),
        "; start the server with --model-control-mode explicit"));
  }
  if (!request.repository_name().empty()) {
    return absl::NotFoundError(absl::StrCat("unknown repository '", request.repository_name(),
                                            "'; Sluice serves one repository (leave repository_name empty)"));
  }
  for (const auto& [key, value] : request.parameters()) {
    // Unload's unload_dependents concerns ensembles, which Sluice does not have: nothing depends
    // on a model, so either value means the same.
    if (std::is_same_v<Request, inference::RepositoryModelUnloadRequest> && key == "unload_dependents") continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", key,
        "' is not supported: Sluice loads models only as the repository has them (edit config.pbtxt "
        "and the version directories, then load)"));
  }
  if (request.model_name().empty()) return absl::InvalidArgumentError("model_name is empty");
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  if (Status allowed = CheckControl(*context, *request); !allowed.ok()) return FinishNow(context, allowed);
  return RunControl(context, [this, name = request->model_name()] { return manager_->LoadModel(name); });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (Status allowed = CheckControl(*context, *request); !allowed.ok()) return FinishNow(context, allowed);
  return RunControl(context, [this, name = request->model_name()] {
    spdlog::info("event=model_unload_requested model={}", name);
    return manager_->UnloadModel(name);
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
  StatusOr<std::shared_ptr<const RepositoryModel>> model = manager_->FindModel(request->name());
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
  response->add_extensions("model_repository");
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
