#include "server/grpc/grpc_service.h"

#include <memory>
#include <string>
#include <type_traits>

#include <grpc/grpc_security_constants.h>

#include "server/core/logging.h"
#include "server/core/mutex.h"

#include "absl/strings/str_cat.h"
#include "server/core/message_text.h"
#include "server/core/validation.h"
#include "server/frontend/model_queries.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/grpc_codec.h"
#include "server/grpc/stream_flow.h"

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
// handler for early errors, else the shared path's Answer). A cancellation only flags the queued
// request and pokes its model, which then answers it CANCELLED without running it.
class InferReactor final : public grpc::ServerUnaryReactor, public GrpcInferCall {
 public:
  InferReactor(grpc::CallbackServerContext* context, grpc::ByteBuffer* response_bytes,
               const SharedMemoryManager* shared_memory)
      : GrpcInferCall(&request_message_, &response_message_, shared_memory),
        context_(context),
        response_bytes_(response_bytes) {
    cancelled = std::make_shared<std::atomic<bool>>(false);
    // The handler's thread is one of gRPC's callback threads: it may run a cheap model itself.
    caller_may_run = true;
  }

  // Parses the call's request bytes; INVALID_ARGUMENT when they are no ModelInferRequest.
  Status Parse(const grpc::ByteBuffer& bytes) {
    grpc::ByteBuffer consumed(bytes);  // shares the slices; parsing consumes the copy
    const grpc::Status parsed =
        grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(&consumed,
                                                                             &request_message_);
    if (parsed.ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the request is not a valid inference.ModelInferRequest message (", parsed.error_message(),
        "); is the client built from the KServe v2 grpc_service.proto?"));
  }

  // Finishes the call (serialising the response when OK). The reactor may be deleted as soon as
  // Finish returns.
  void Answer(const Status& status) override {
    if (!status.ok()) {
      AddRetryAfter(context_, status);
      Finish(ToGrpcStatus(status));
      return;
    }
    bool own_buffer = false;
    const grpc::Status serialized =
        grpc::SerializationTraits<inference::ModelInferResponse>::Serialize(
            response_message_, response_bytes_, &own_buffer);
    Finish(serialized);
  }

  void OnCancel() override {
    cancelled->store(true);
    hold.Poke();
  }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_bytes_;
  inference::ModelInferRequest request_message_;
  inference::ModelInferResponse response_message_;
};

// One ModelStreamInfer stream: reads requests one at a time and submits each like a unary call;
// the next read starts only when the previous request has been handed on (Submitted), so
// requests reach their models in stream order. It writes each response when its request is
// answered (one write at a time, in answer order). Between read and written a request is "in
// flight"; at max_in_flight the next read waits, so a stream holds at most that many requests and
// responses. Every event feeds the stream's flow (stream_flow.h: its states and transitions) under
// mutex_, then starts what the flow plans (Step); Finish is planned once and is the last thing its
// thread does with the reactor (OnDone deletes it).
class StreamReactor final : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                                           inference::ModelStreamInferResponse>,
                            public SubmissionObserver {
 public:
  StreamReactor(GrpcService* service, grpc::CallbackServerContext* context, int max_in_flight,
                const SharedMemoryManager* shared_memory, const Status& allowed)
      : service_(service),
        context_(context),
        shared_memory_(shared_memory),
        cancelled_(std::make_shared<std::atomic<bool>>(false)),
        flow_(max_in_flight) {
    if (!allowed.ok()) {
      {
        MutexLock lock(&mutex_);
        flow_.Refuse();
      }
      Finish(ToGrpcStatus(allowed));
      return;
    }
    Step(false);
  }

  void OnReadDone(bool ok) override {
    Call* call = nullptr;
    {
      MutexLock lock(&mutex_);
      call = flow_.ReadDone(ok);
    }
    if (call != nullptr) {
      ++requests_;
      service_->SubmitInfer(*context_, call, "inference.GRPCInferenceService/ModelStreamInfer");
    }
    Step(true);
  }

  // The request last read has been handed on (on this thread inside SubmitInfer, or later on the
  // thread that answers its wait for a model loading on demand): read the next one. The stream
  // cannot finish before this (its read is not idle), so the reactor is alive.
  void Submitted() override ABSL_LOCKS_EXCLUDED(mutex_) {
    {
      MutexLock lock(&mutex_);
      flow_.Enter();
      flow_.Submitted();
    }
    Step(true);
  }

  void OnWriteDone(bool ok) override {
    {
      MutexLock lock(&mutex_);
      flow_.WriteDone(ok);
    }
    if (!ok) {
      cancelled_->store(true);  // nobody reads the answers: queued requests need not run
      PokeInFlight();
    }
    Step(true);
  }

  // The client cancelled, its deadline passed or the connection broke: requests of this stream
  // still queued are answered CANCELLED without running (their responses go nowhere).
  void OnCancel() override {
    cancelled_->store(true);
    {
      MutexLock lock(&mutex_);
      if (flow_.phase() == Flow::Phase::kFinished) return;
      flow_.Enter();
    }
    PokeInFlight();
    Step(true);
  }

  void OnDone() override {
    spdlog::debug("event=stream_done requests={}", requests_);
    delete this;
  }

 private:
  // A stream request's messages, constructed before the call that points into them.
  struct Messages {
    inference::ModelInferRequest request;
    inference::ModelStreamInferResponse response;
  };
  // One request of the stream; answered into the stream (Answered).
  class Call final : public Messages, public GrpcInferCall {
   public:
    Call(StreamReactor* stream, const SharedMemoryManager* shared_memory,
         std::shared_ptr<std::atomic<bool>> stream_cancelled)
        : GrpcInferCall(&request, response.mutable_infer_response(), shared_memory),
          stream_(stream) {
      cancelled = std::move(stream_cancelled);  // one flag for the whole stream
      submission_observer = stream;             // the next read waits for this one's submission
    }
    void Answer(const Status& status) override { stream_->Answered(this, status); }

   private:
    StreamReactor* const stream_;
  };
  using Flow = StreamFlow<Call>;

  // A request's answer (any thread, perhaps inside SubmitInfer): queue its response for writing.
  void Answered(Call* call, const Status& status) {
    if (!status.ok()) {
      inference::ModelInferResponse* response = call->response.mutable_infer_response();
      response->clear_outputs();
      response->clear_raw_output_contents();
      response->set_model_name(call->request.model_name());
      // An id refused for its length is not echoed (it would make the response as long).
      if (call->request.id().size() <= kMaxRequestIdBytes) response->set_id(call->request.id());
      // Bounded and valid UTF-8 like a unary call's status (ToGrpcStatus): a proto3 string must
      // be UTF-8, or the client cannot parse the response.
      call->response.set_error_message(CapMessage(status.message()));
    }
    {
      MutexLock lock(&mutex_);
      flow_.Answered(call);
    }
    Step(true);
  }

  // Starts what the flow plans (a write, a read, the finish). After Step returns, its caller
  // must not touch the reactor. `leaving`: the caller's reaction ends here.
  void Step(bool leaving) {
    Flow::Plan plan;
    {
      MutexLock lock(&mutex_);
      plan = flow_.Next(
          leaving, [this] { return std::make_unique<Call>(this, shared_memory_, cancelled_); });
    }
    // A planned read or write keeps the stream from finishing, so the reactor is alive here.
    if (plan.write != nullptr) StartWrite(&plan.write->response);
    if (plan.read != nullptr) StartRead(&plan.read->request);
    if (plan.finish) Finish(grpc::Status::OK);
  }

  // Pokes the models of this stream's requests, so that those still queued see the cancelled
  // flag and are answered now. The caller's reaction is active.
  void PokeInFlight() {
    std::vector<InFlightModel> models;
    {
      MutexLock lock(&mutex_);
      flow_.ForEachInFlight([&models](Call& call) {
        if (InFlightModel model = call.hold.Get()) models.push_back(std::move(model));
      });
    }
    for (const InFlightModel& model : models) model->Poke();
  }

  GrpcService* const service_;
  grpc::CallbackServerContext* const context_;
  const SharedMemoryManager* const shared_memory_;
  const std::shared_ptr<std::atomic<bool>> cancelled_;  // shared by every request of the stream

  Mutex mutex_;
  Flow flow_ ABSL_GUARDED_BY(mutex_);
  std::atomic<int64_t> requests_{0};  // read so far, for the log
};

// The caller's gRPC deadline on our clock; kNoDeadline when it set none.
TimePoint CallerDeadline(const grpc::CallbackServerContext& context, TimePoint now) {
  const auto grpc_deadline = context.deadline();
  if (grpc_deadline == std::chrono::system_clock::time_point::max()) return kNoDeadline;
  // A deadline years away (gRPC allows about 11,000 years) would overflow the arithmetic below.
  const auto left = grpc_deadline - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return kNoDeadline;
  return now + std::chrono::duration_cast<Duration>(left);
}

}  // namespace

GrpcService::GrpcService(ModelManager* manager, ModelControl* control, Options options)
    : manager_(manager),
      control_(control),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &steady_),
      lookup_(options_.lookup ? options_.lookup : manager),
      connections_(clock_) {}

grpc::ServerUnaryReactor* GrpcService::RunControl(grpc::CallbackServerContext* context,
                                                  std::function<Status()> task) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  control_->Submit(std::move(task),
                   [reactor](const Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

template <typename Request>
StatusOr<ControlRequest> GrpcService::CheckControl(const grpc::CallbackServerContext& context,
                                                   const Request& request) const {
  SLUICE_RETURN_IF_ERROR(Allow(context, ProtocolGroup::kModelRepository));
  std::vector<ControlParameter> parameters;
  for (const auto& [key, value] : request.parameters()) {
    ControlParameter& parameter = parameters.emplace_back();
    parameter.key = key;
    switch (value.parameter_choice_case()) {
      case inference::ModelRepositoryParameter::kBoolParam:
        parameter.kind = ControlParameter::Kind::kBool;
        parameter.value = value.bool_param() ? "true" : "false";
        break;
      case inference::ModelRepositoryParameter::kInt64Param:
        parameter.kind = ControlParameter::Kind::kInt64;
        break;
      case inference::ModelRepositoryParameter::kBytesParam:
        parameter.kind = ControlParameter::Kind::kBytes;
        parameter.value = value.bytes_param();
        break;
      default:
        parameter.kind = ControlParameter::Kind::kString;
        parameter.value = value.string_param();
        break;
    }
  }
  return CheckModelControl(control_, "gRPC", request.repository_name(), request.model_name(),
                           parameters,
                           std::is_same_v<Request, inference::RepositoryModelUnloadRequest>);
}

grpc::ServerUnaryReactor* GrpcService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  StatusOr<ControlRequest> checked = CheckControl(*context, *request);
  if (!checked.ok()) return FinishNow(context, checked.status());
  return RunControl(context,
                    [this, name = request->model_name(), override = std::move(checked->override)] {
                      return control_->LoadModel(name, override);
                    });
}

grpc::ServerUnaryReactor* GrpcService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  StatusOr<ControlRequest> checked = CheckControl(*context, *request);
  if (!checked.ok()) return FinishNow(context, checked.status());
  return RunControl(context,
                    [this, name = request->model_name(), dependents = checked->unload_dependents] {
                      // The name is the client's: quoted, so that it cannot forge log lines.
                      spdlog::info("event=model_unload_requested model=\"{}\" unload_dependents={}",
                                   QuoteClientText(name), dependents);
                      return control_->UnloadModel(name, dependents);
                    });
}

Status GrpcService::Allow(const grpc::CallbackServerContext& context, ProtocolGroup group) const {
  if (options_.restrictions.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  return CheckProtocolAccess(options_.restrictions, group, [&metadata](const std::string& key) {
    std::vector<absl::string_view> values;
    auto [begin, end] = metadata.equal_range(grpc::string_ref(key));
    for (auto it = begin; it != end; ++it)
      values.emplace_back(it->second.data(), it->second.size());
    return values;
  });
}

grpc::ServerUnaryReactor* GrpcService::ServerLive(grpc::CallbackServerContext* context,
                                                  const inference::ServerLiveRequest*,
                                                  inference::ServerLiveResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  response->set_live(Live());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcService::ServerReady(grpc::CallbackServerContext* context,
                                                   const inference::ServerReadyRequest*,
                                                   inference::ServerReadyResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  response->set_ready(Ready());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcService::ModelReady(grpc::CallbackServerContext* context,
                                                  const inference::ModelReadyRequest* request,
                                                  inference::ModelReadyResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kHealth); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<bool> ready = AnswerModelReady(*manager_, request->name(), request->version());
  if (ready.ok()) response->set_ready(*ready);
  return FinishNow(context, ready.status());
}

grpc::ServerUnaryReactor* GrpcService::ServerMetadata(grpc::CallbackServerContext* context,
                                                      const inference::ServerMetadataRequest*,
                                                      inference::ServerMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  AnswerServerMetadata(options_.server_version, options_.shared_memory != nullptr,
                       options_.tracer != nullptr, response);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcService::ModelMetadata(grpc::CallbackServerContext* context,
                                                     const inference::ModelMetadataRequest* request,
                                                     inference::ModelMetadataResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kMetadata); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context,
                   AnswerModelMetadata(*manager_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* GrpcService::ModelConfig(grpc::CallbackServerContext* context,
                                                   const inference::ModelConfigRequest* request,
                                                   inference::ModelConfigResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelConfig); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context,
                   AnswerModelConfig(*manager_, request->name(), request->version(), response));
}

grpc::ServerUnaryReactor* GrpcService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kModelRepository); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, AnswerRepositoryIndex(*manager_, request->repository_name(),
                                                  request->ready(), response));
}

grpc::ServerUnaryReactor* GrpcService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kStatistics); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context,
                   AnswerModelStatistics(*manager_, request->name(), request->version(), response));
}

StatusOr<std::unique_ptr<InferRequest>> GrpcInferCall::Decode(const ModelHandle&) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<InferRequest> decoded,
                          InferRequestFromProto(*request_, &shm_refs_));
  // Outputs that name a shared memory slice go there (the others stay in the response message).
  for (const auto& output : request_->outputs()) {
    if (output.parameters().empty()) continue;  // the common case: no message to build
    const std::string what = absl::StrCat("output '", QuoteClientText(output.name()), "'");
    SLUICE_ASSIGN_OR_RETURN(std::optional<SharedMemoryReference> reference,
                            SharedMemoryReferenceOf(output.parameters(), what));
    if (reference)
      SLUICE_RETURN_IF_ERROR(shm_refs_.ResolveOutput(output.name(), *reference, &sink_));
  }
  decoded->shared_memory = shm_refs_.used();
  return decoded;
}

void GrpcInferCall::Accepted(const InferRequest& request, const InFlightModel& model) {
  FillInferResponseHeader(request, model->version(), response_);
}

OutputSink* GrpcInferCall::sink() {
  return sink_.empty() ? static_cast<OutputSink*>(&response_sink_) : &sink_;
}

void GrpcService::SubmitInfer(const grpc::CallbackServerContext& context, GrpcInferCall* call,
                              const char* method) {
  call->deadline = CallerDeadline(context, clock_->Now());
  if (options_.tracer != nullptr && options_.tracer->active()) {
    const auto& metadata = context.client_metadata();
    call->trace = options_.tracer->Start(
        call->model_name(),
        [&metadata](const char* key) -> absl::string_view {
          auto found = metadata.find(key);
          return found == metadata.end()
                     ? absl::string_view()
                     : absl::string_view(found->second.data(), found->second.size());
        },
        method);
  }
  if (options_.quotas != nullptr) {
    call->quotas = options_.quotas;
    call->client = ClientOf(context);
  }
  RunInference(*lookup_, call);
}

std::string GrpcService::ClientOf(const grpc::CallbackServerContext& context) const {
  const ClientIdentityOptions& identity = options_.quotas->identity();
  std::string header;
  bool has_header = false;
  if (!identity.header.empty()) {
    const auto& metadata = context.client_metadata();
    if (auto found = metadata.find(identity.header); found != metadata.end()) {
      header.assign(found->second.data(), found->second.size());
      has_header = true;
    }
  }
  std::string subject;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& value :
         auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
      subject.assign(value.data(), value.size());
      break;
    }
  }
  return options_.quotas->Identify(IpAddress::FromGrpcPeer(context.peer()), subject,
                                   has_header ? header.c_str() : nullptr);
}

grpc::ServerUnaryReactor* GrpcService::ModelInfer(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request_bytes,
                                                  grpc::ByteBuffer* response_bytes) {
  if (Status allowed = Allow(*context, ProtocolGroup::kInference); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  auto* reactor = new InferReactor(context, response_bytes, options_.shared_memory);
  if (options_.coalesce_answers) reactor->AnswerOn(&connections_, context);
  if (Status parsed = reactor->Parse(*request_bytes); !parsed.ok()) {
    reactor->Answer(parsed);
    return reactor;
  }
  SubmitInfer(*context, reactor);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::TraceSetting(grpc::CallbackServerContext* context,
                                                    const inference::TraceSettingRequest* request,
                                                    inference::TraceSettingResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kTrace); !allowed.ok())
    return FinishNow(context, allowed);
  TraceSettingsMap update;
  for (const auto& [key, value] : request->settings()) {
    update[key].assign(value.value().begin(), value.value().end());
  }
  StatusOr<TraceSettingsMap> settings = AnswerTraceSettings(
      *manager_, options_.tracer, request->model_name(), update.empty() ? nullptr : &update);
  if (!settings.ok()) return FinishNow(context, settings.status());
  for (const auto& [key, values] : *settings) {
    auto& out = (*response->mutable_settings())[key];
    for (const std::string& value : values) out.add_value(value);
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
GrpcService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return new StreamReactor(this, context, options_.stream_max_in_flight, options_.shared_memory,
                           Allow(*context, ProtocolGroup::kInference));
}

// Client shared memory: the answers are shared_memory.h's (the same over HTTP); the registry is
// null when --allow-client-shm is false.
grpc::ServerUnaryReactor* GrpcService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  StatusOr<std::vector<SharedMemoryStatusEntry>> entries =
      sluice::SystemSharedMemoryStatus(options_.shared_memory, request->name());
  if (!entries.ok()) return FinishNow(context, entries.status());
  for (const SharedMemoryStatusEntry& entry : *entries) {
    auto& status = (*response->mutable_regions())[entry.name];
    status.set_name(entry.name);
    status.set_key(entry.key);
    status.set_offset(entry.offset);
    status.set_byte_size(entry.byte_size);
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse*) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, sluice::RegisterSystemSharedMemory(
                                options_.shared_memory, request->name(), request->key(),
                                request->offset(), request->byte_size()));
}

grpc::ServerUnaryReactor* GrpcService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context,
                   sluice::UnregisterSystemSharedMemory(options_.shared_memory, request->name()));
}

grpc::ServerUnaryReactor* GrpcService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse*) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, sluice::CudaSharedMemoryStatus(request->name()));
}

grpc::ServerUnaryReactor* GrpcService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryRegisterRequest* request,
    inference::CudaSharedMemoryRegisterResponse*) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context,
                   sluice::RegisterCudaSharedMemory(options_.shared_memory, request->name()));
}

grpc::ServerUnaryReactor* GrpcService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryUnregisterRequest*,
    inference::CudaSharedMemoryUnregisterResponse*) {
  if (Status allowed = Allow(*context, ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return FinishNow(context, allowed);
  }
  return FinishNow(context, sluice::UnregisterCudaSharedMemory(options_.shared_memory));
}

}  // namespace sluice
