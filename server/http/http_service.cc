#include "server/http/http_service.h"

#include <charconv>
#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#include "server/core/logging.h"
#include "server/core/message_text.h"
#include "server/core/percent_decode.h"
#include "server/core/retry_after.h"
#include "server/frontend/inference_path.h"
#include "server/frontend/model_queries.h"
#include "server/http/http_status.h"
#include "server/http/http_codec.h"

namespace sluice {
namespace {

HttpResponse JsonResponse(int code, std::string json) {
  HttpResponse response;
  response.code = code;
  response.headers.emplace_back("Content-Type", "application/json");
  response.body.push_back(std::move(json));
  return response;
}

void RespondJson(HttpResponder& responder, int code, std::string json) {
  responder.Respond(JsonResponse(code, std::move(json)));
}

void RespondStatus(HttpResponder& responder, const Status& status) {
  if (status.ok()) {
    responder.Respond(HttpResponse{});
    return;
  }
  HttpResponse response = JsonResponse(ToHttpStatusCode(status), ErrorJson(status.message()));
  if (std::optional<std::chrono::milliseconds> after = RetryAfter(status))
    response.headers.emplace_back("Retry-After", std::to_string(RetryAfterSeconds(*after)));
  responder.Respond(std::move(response));
}

// 200, or 400 (Triton's answer for "not live", "not ready"), with the body KServe's clients read
// ({"live": true}, {"ready": false}, {"name": "m", "ready": true}); tritonclient reads the code
// only.
void RespondCondition(HttpResponder& responder, absl::string_view key, bool holds,
                      absl::string_view model = "") {
  RespondJson(responder, holds ? 200 : 400, ConditionJson(key, holds, model));
}

// FP16 and BF16 have no JSON form: an output of those types must be asked for as binary (or as
// its classes, which are strings).
Status CheckJsonOutputs(const ModelSpec& spec, const JsonInferRequest& parsed) {
  const std::vector<ClassificationRequest>& classified = parsed.request->classifications;
  for (const TensorSpec& output : spec.outputs) {
    if (output.dtype != DataType::kFp16 && output.dtype != DataType::kBf16) continue;
    if (output.state_only) continue;
    if (parsed.InSharedMemory(output.name)) continue;
    if (std::any_of(classified.begin(), classified.end(),
                    [&](const ClassificationRequest& each) { return each.output == output.name; }))
      continue;
    const bool requested =
        parsed.outputs.empty() ||
        std::any_of(parsed.outputs.begin(), parsed.outputs.end(),
                    [&](const RequestedOutput& each) { return each.name == output.name; });
    if (requested && !parsed.Binary(output.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", output.name, "' is ", DataTypeName(output.dtype),
                       ", which has no JSON form; ask for it with the binary_data "
                       "parameter (or binary_data_output)"));
    }
  }
  return absl::OkStatus();
}

// One HTTP inference request on the shared inference path: the JSON codec (with the binary
// extension), the HTTP output sink, and the responder of the exchange it answers. Owns the names,
// the parsed request's output forms and the exchange (whose body the binary inputs view) until
// Answer; the path owns the call and destroys it after Answer.
class HttpInferCall final : public InferenceCall {
 public:
  HttpInferCall(HttpResponder responder, std::string model_name, std::string version,
                const SharedMemoryManager* shared_memory)
      : responder_(std::move(responder)),
        model_name_(std::move(model_name)),
        version_(std::move(version)),
        shm_refs_(shared_memory),
        shm_sink_(&sink_, [this](const OutputDescription& output) { sink_.Describe(output); }) {
    protocol = Protocol::kHttp;
    cancelled = responder_->cancelled();
    shared_memory_refs = &shm_refs_;
  }

  const std::string& model_name() const override { return model_name_; }
  const std::string& model_version() const override { return version_; }
  absl::string_view request_id() const override { return id_; }
  OutputSink* sink() override {
    return shm_sink_.empty() ? static_cast<OutputSink*>(&sink_) : &shm_sink_;
  }

  StatusOr<std::unique_ptr<InferRequest>> Decode(const ModelHandle& model) override {
    std::optional<size_t> header_length;
    if (const char* length = responder_->Header("Inference-Header-Content-Length");
        length != nullptr) {
      size_t value = 0;
      const absl::string_view text(length);
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Inference-Header-Content-Length '", QuoteClientText(length), "' is not a byte count"));
      }
      header_length = value;
    }
    SLUICE_ASSIGN_OR_RETURN(parsed_,
                            InferRequestFromJson(responder_->body(), header_length, &shm_refs_));
    SLUICE_RETURN_IF_ERROR(CheckJsonOutputs(model.spec(), parsed_));
    for (const RequestedOutput& output : parsed_.outputs) {  // outputs that go to shared memory
      if (output.shared_memory)
        SLUICE_RETURN_IF_ERROR(
            shm_refs_.ResolveOutput(output.name, *output.shared_memory, &shm_sink_));
    }
    id_ = parsed_.request->id;
    parsed_.request->shared_memory = shm_refs_.used();
    return std::move(parsed_.request);  // the output forms stay here for the response
  }

  // A client that goes away while its request is queued: the model answers it CANCELLED at once.
  void Accepted(const InferRequest&, const InFlightModel& model) override {
    answering_version_ = model->version();
    responder_->OnCancel([weak = model.Watch()] {
      if (std::shared_ptr<ModelHandle> held = weak.lock()) held->Poke();
    });
  }

  // The request; valid until Answer.
  const HttpExchange& exchange() const { return responder_.exchange(); }

  void Answer(const Status& status) override {
    if (!status.ok()) {
      RespondStatus(responder_, status);
    } else {
      HttpResponse response;
      response.compress = true;  // as the request's Accept-Encoding asks (only inference answers)
      size_t header_length = 0;
      response.body = InferResponseToJson(model_name_, answering_version_, id_, parsed_,
                                          &sink_.outputs(), &header_length);
      if (header_length > 0) {
        response.headers.emplace_back("Content-Type", "application/octet-stream");
        response.headers.emplace_back("Inference-Header-Content-Length",
                                      std::to_string(header_length));
      } else {
        response.headers.emplace_back("Content-Type", "application/json");
      }
      responder_.Respond(std::move(response));
    }
  }

 private:
  HttpResponder responder_;
  const std::string model_name_;
  const std::string version_;
  JsonInferRequest
      parsed_;  // after Decode its `request` has moved to the model; the output forms stay
  std::string id_;
  int64_t answering_version_ = 0;
  HttpOutputSink sink_;
  SharedMemoryRefs shm_refs_;  // keeps the regions the request uses mapped until it is destroyed
  SharedMemorySink shm_sink_;  // outputs placed in shared memory go there, the others to sink_
};

}  // namespace

HttpService::HttpService(ModelManager* manager, ModelControl* control, Options options)
    : manager_(manager),
      control_(control),
      options_(std::move(options)),
      lookup_(options_.lookup ? options_.lookup : manager) {}

Status HttpService::Allow(const HttpExchange& exchange, ProtocolGroup group) const {
  if (options_.restrictions.empty()) return absl::OkStatus();
  return CheckProtocolAccess(options_.restrictions, group, [&exchange](const std::string& key) {
    std::vector<absl::string_view> values;
    if (const char* value = exchange.Header(key.c_str()); value != nullptr)
      values.emplace_back(value);
    return values;
  });
}

void HttpService::Handle(HttpResponder responder) {
  const HttpExchange& exchange = responder.exchange();  // valid until the answer
  std::vector<std::string> path;
  for (absl::string_view raw : absl::StrSplit(exchange.path(), '/', absl::SkipEmpty())) {
    std::optional<std::string> segment = PercentDecode(raw);
    if (!segment) {
      RespondStatus(responder, absl::InvalidArgumentError(
                                   absl::StrCat("malformed percent-escape in the path '",
                                                QuoteClientText(exchange.path()), "'")));
      return;
    }
    path.push_back(*std::move(segment));
  }
  const bool get = exchange.method() == "GET" || exchange.method() == "HEAD";
  const bool post = exchange.method() == "POST";
  auto wrong_method = [&](const char* allowed) {
    RespondJson(responder, 405,
                ErrorJson(absl::StrCat(QuoteClientText(exchange.method()), " is not allowed on ",
                                       QuoteClientText(exchange.path()), "; use ", allowed)));
  };
  auto unknown = [&] {
    RespondJson(responder, 404,
                ErrorJson(absl::StrCat("no endpoint ", QuoteClientText(exchange.path()),
                                       " (the KServe v2 REST paths start with /v2)")));
  };
  // Runs `answer` after the restriction check, for a GET endpoint.
  auto guarded_get = [&](ProtocolGroup group, auto answer) {
    if (!get) return wrong_method("GET");
    if (Status allowed = Allow(exchange, group); !allowed.ok())
      return RespondStatus(responder, allowed);
    answer();
  };

  if (path.empty() || path[0] != "v2") return unknown();
  if (path.size() == 1) {
    return guarded_get(ProtocolGroup::kMetadata, [&] {
      inference::ServerMetadataResponse metadata;
      AnswerServerMetadata(options_.server_version, options_.shared_memory != nullptr,
                           options_.tracer != nullptr, &metadata);
      RespondJson(responder, 200, ProtoToJson(metadata));
    });
  }
  if (path[1] == "health" && path.size() == 3 && (path[2] == "live" || path[2] == "ready")) {
    return guarded_get(ProtocolGroup::kHealth, [&] {
      const ServerHealth* health = options_.health;
      RespondCondition(responder, path[2],
                       path[2] == "live" ? !health || health->Live() : !health || health->Ready());
    });
  }
  if (path[1] == "repository") {
    if (path.size() == 3 && path[2] == "index") {
      if (!post) return wrong_method("POST");
      if (Status allowed = Allow(exchange, ProtocolGroup::kModelRepository); !allowed.ok()) {
        return RespondStatus(responder, allowed);
      }
      StatusOr<bool> ready_only = ParseIndexRequest(exchange.body());
      if (!ready_only.ok()) return RespondStatus(responder, ready_only.status());
      inference::RepositoryIndexResponse index;
      Status answered = AnswerRepositoryIndex(*manager_, "", *ready_only, &index);
      if (!answered.ok()) return RespondStatus(responder, answered);
      return RespondJson(responder, 200, RepeatedProtoToJson(index, "models"));
    }
    if (path.size() == 5 && path[2] == "models" && (path[4] == "load" || path[4] == "unload")) {
      if (!post) return wrong_method("POST");
      return Control(std::move(responder), path[3], path[4] == "unload");
    }
    return unknown();
  }
  if (path[1] == "trace") {
    if (path.size() != 3 || path[2] != "setting") return unknown();
    if (!get && !post) return wrong_method("GET or POST");
    return TraceSetting(std::move(responder), "");
  }
  if (path[1] == "systemsharedmemory" || path[1] == "cudasharedmemory") {
    // [/region/{r}]/{status,register,unregister}
    std::string region;
    size_t next = 2;
    if (path.size() >= 4 && path[2] == "region") {
      region = path[3];
      next = 4;
    }
    if (next + 1 != path.size()) return unknown();
    const std::string& action = path[next];
    if (action == "status") {
      if (!get) return wrong_method("GET");
    } else if (action == "register" || action == "unregister") {
      if (!post) return wrong_method("POST");
    } else {
      return unknown();
    }
    return SharedMemory(std::move(responder), path[1] == "cudasharedmemory", region, action);
  }
  if (path[1] != "models" || path.size() < 3) return unknown();
  if (path.size() == 3 && path[2] == "stats") {
    return guarded_get(ProtocolGroup::kStatistics, [&] {
      inference::ModelStatisticsResponse statistics;
      Status answered = AnswerModelStatistics(*manager_, "", "", &statistics);
      if (!answered.ok()) return RespondStatus(responder, answered);
      RespondJson(responder, 200, ProtoToJson(statistics));
    });
  }
  const std::string& model = path[2];
  std::string version;
  size_t next = 3;
  if (path.size() >= 5 && path[3] == "versions") {
    version = path[4];
    next = 5;
  }
  const std::string action = next < path.size() ? path[next] : "";
  if (action == "trace" && version.empty() && next + 2 == path.size() &&
      path[next + 1] == "setting") {
    if (!get && !post) return wrong_method("GET or POST");
    return TraceSetting(std::move(responder), model);
  }
  if (next + 1 < path.size()) return unknown();
  if (action.empty()) {
    return guarded_get(ProtocolGroup::kMetadata, [&] {
      inference::ModelMetadataResponse metadata;
      Status answered = AnswerModelMetadata(*manager_, model, version, &metadata);
      if (!answered.ok()) return RespondStatus(responder, answered);
      RespondJson(responder, 200, ProtoToJson(metadata));
    });
  }
  if (action == "ready") {
    return guarded_get(ProtocolGroup::kHealth, [&] {
      StatusOr<bool> ready = AnswerModelReady(*manager_, model, version);
      if (!ready.ok()) return RespondStatus(responder, ready.status());
      RespondCondition(responder, "ready", *ready, model);
    });
  }
  if (action == "config") {
    return guarded_get(ProtocolGroup::kModelConfig, [&] {
      inference::ModelConfigResponse config;
      Status answered = AnswerModelConfig(*manager_, model, version, &config);
      if (!answered.ok()) return RespondStatus(responder, answered);
      RespondJson(responder, 200, ProtoToJson(config.config()));
    });
  }
  if (action == "stats") {
    return guarded_get(ProtocolGroup::kStatistics, [&] {
      inference::ModelStatisticsResponse statistics;
      Status answered = AnswerModelStatistics(*manager_, model, version, &statistics);
      if (!answered.ok()) return RespondStatus(responder, answered);
      RespondJson(responder, 200, ProtoToJson(statistics));
    });
  }
  if (action == "infer") {
    if (!post) return wrong_method("POST");
    return Infer(std::move(responder), model, version);
  }
  unknown();
}

void HttpService::Control(HttpResponder responder, const std::string& model, bool unload) {
  const HttpExchange& exchange = responder.exchange();
  if (Status allowed = Allow(exchange, ProtocolGroup::kModelRepository); !allowed.ok()) {
    return RespondStatus(responder, allowed);
  }
  StatusOr<std::vector<ControlParameter>> parameters = ParseControlRequest(exchange.body());
  if (!parameters.ok()) return RespondStatus(responder, parameters.status());
  StatusOr<ControlRequest> checked =
      CheckModelControl(control_, "HTTP", "", model, *parameters, unload);
  if (!checked.ok()) return RespondStatus(responder, checked.status());
  // Load and unload take seconds: the control thread runs them and answers.
  control_->Submit(
      [this, model, unload, request = *std::move(checked)] {
        if (!unload) return control_->LoadModel(model, request.override);
        spdlog::info("event=model_unload_requested model=\"{}\" protocol=http unload_dependents={}",
                     QuoteClientText(model), request.unload_dependents);
        return control_->UnloadModel(model, request.unload_dependents);
      },
      [answer = std::make_shared<HttpResponder>(std::move(responder))](const Status& status) {
        RespondStatus(*answer, status);
      });
}

void HttpService::TraceSetting(HttpResponder responder, const std::string& model) {
  const HttpExchange& exchange = responder.exchange();
  if (Status allowed = Allow(exchange, ProtocolGroup::kTrace); !allowed.ok())
    return RespondStatus(responder, allowed);
  std::optional<TraceSettingsMap> update;
  if (exchange.method() == "POST") {
    StatusOr<TraceSettingsMap> parsed = ParseTraceSettingsJson(exchange.body());
    if (!parsed.ok()) return RespondStatus(responder, parsed.status());
    update = *std::move(parsed);
  }
  StatusOr<TraceSettingsMap> settings = AnswerTraceSettings(
      *manager_, options_.tracer, model, update && !update->empty() ? &*update : nullptr);
  if (!settings.ok()) return RespondStatus(responder, settings.status());
  RespondJson(responder, 200, TraceSettingsJson(*settings));
}

// The answers are shared_memory.h's, the same as over gRPC.
void HttpService::SharedMemory(HttpResponder responder, bool cuda, const std::string& region,
                               const std::string& action) {
  if (Status allowed = Allow(responder.exchange(), ProtocolGroup::kSharedMemory); !allowed.ok()) {
    return RespondStatus(responder, allowed);
  }
  SharedMemoryManager* registry = options_.shared_memory;
  if (action == "status") {
    if (cuda) {
      Status found = CudaSharedMemoryStatus(region);
      if (!found.ok()) return RespondStatus(responder, found);
      return RespondJson(responder, 200, SharedMemoryStatusJson({}));
    }
    StatusOr<std::vector<SharedMemoryStatusEntry>> entries =
        SystemSharedMemoryStatus(registry, region);
    if (!entries.ok()) return RespondStatus(responder, entries.status());
    return RespondJson(responder, 200, SharedMemoryStatusJson(*entries));
  }
  if (action == "unregister") {
    return RespondStatus(responder, cuda ? UnregisterCudaSharedMemory(registry)
                                         : UnregisterSystemSharedMemory(registry, region));
  }
  // register: the checks in Triton's order (off, then a name, then the body)
  if (registry == nullptr) return RespondStatus(responder, ClientSharedMemoryDisabledError());
  if (region.empty()) {
    return RespondStatus(responder, absl::InvalidArgumentError(absl::StrCat(
                                        "'region name' is necessary to register ",
                                        cuda ? "cuda" : "system", " shared memory region")));
  }
  if (cuda) return RespondStatus(responder, RegisterCudaSharedMemory(registry, region));
  StatusOr<SystemSharedMemoryRegistration> body =
      ParseSystemSharedMemoryRegister(responder.exchange().body());
  if (!body.ok()) return RespondStatus(responder, body.status());
  RespondStatus(responder, RegisterSystemSharedMemory(registry, region, body->key, body->offset,
                                                      body->byte_size));
}

void HttpService::Infer(HttpResponder responder, const std::string& model_name,
                        const std::string& version) {
  if (Status allowed = Allow(responder.exchange(), ProtocolGroup::kInference); !allowed.ok()) {
    return RespondStatus(responder, allowed);
  }
  std::shared_ptr<RequestTrace> trace;
  if (options_.tracer != nullptr && options_.tracer->active()) {
    const HttpExchange& exchange = responder.exchange();
    trace = options_.tracer->Start(
        model_name,
        [&exchange](const char* name) -> absl::string_view {
          const char* value = exchange.Header(name);
          return value == nullptr ? absl::string_view() : absl::string_view(value);
        },
        "POST /v2/models/{model}/infer");
  }
  auto call = std::make_unique<HttpInferCall>(std::move(responder), model_name, version,
                                              options_.shared_memory);
  call->trace = std::move(trace);
  if (ClientQuotas* quotas = options_.quotas; quotas != nullptr) {
    const HttpExchange& exchange = call->exchange();
    call->quotas = quotas;
    call->client = quotas->Identify(exchange.peer(), exchange.certificate_subject(),
                                    quotas->identity().header.empty()
                                        ? nullptr
                                        : exchange.Header(quotas->identity().header.c_str()));
  }
  RunInference(*lookup_, std::move(call));
}

}  // namespace sluice
