// The KServe v2 REST binding (Triton's HTTP API on port 8000) over HttpServer: health, server
// and model metadata, model configuration, statistics, inference (JSON and Triton's binary tensor
// extension) and the model repository extension. Each endpoint answers what the gRPC service
// answers (model_queries.h); inference takes the same path after parsing (the model handle's
// validation, batching with gRPC requests, statistics), with its own output sink. Handlers run on
// the HTTP thread (or, for a compressed body, the codec thread that inflated it) and never wait
// for a model: the worker that finishes a request answers it. They keep no state of their own.
//
// Endpoints (a model name is percent-decoded; /versions/{v} is optional wherever {m} is):
//   GET  /v2/health/live, /v2/health/ready      200, or 400 when not (Triton's choice)
//   GET  /v2                                    server metadata
//   GET  /v2/models/{m}                         model metadata
//   GET  /v2/models/{m}/ready                   200, or 400 when not ready
//   GET  /v2/models/{m}/config                  config.pbtxt as JSON
//   GET  /v2/models/stats, /v2/models/{m}/stats statistics
//   POST /v2/models/{m}/infer                   inference
//   POST /v2/repository/index                   repository index ({"ready": true} optional)
//   POST /v2/repository/models/{m}/load|unload  model control (explicit mode)
//   GET  /v2/systemsharedmemory[/region/{r}]/status       regions (a JSON array)
//   POST /v2/systemsharedmemory/region/{r}/register       {"key", "offset", "byte_size"}
//   POST /v2/systemsharedmemory[/region/{r}]/unregister   one region, or all
//   the same under /v2/cudasharedmemory (nothing registered; a registration is refused)
// Errors are {"error": "..."} with ToHttpStatusCode's code.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "server/frontend/client_quotas.h"
#include "server/frontend/restricted_protocols.h"
#include "server/frontend/server_health.h"
#include "server/frontend/shared_memory.h"
#include "server/http/http_server.h"
#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "server/tracing/tracer.h"

namespace sluice {

class HttpService {
 public:
  struct Options {
    std::string server_version = "0.1.0";  // reported by GET /v2
    const ServerHealth* health = nullptr;  // /v2/health/live and ready; null: live and ready
    std::vector<ProtocolRestriction> restrictions;  // --http-restricted-api; empty: all open
    const ModelLookup* lookup = nullptr;  // where inference finds models; null: the manager
    SharedMemoryManager* shared_memory =
        nullptr;  // client shared memory; null: off (--allow-client-shm)
    // Which requests are traced (their traceparent header, the trace settings), and the
    // /v2/[models/{m}/]trace/setting answers; null: nothing is traced and those answer 503.
    Tracer* tracer = nullptr;
    // Quotas per client on inference requests (client_quotas.h); null: off. Outlives the service.
    ClientQuotas* quotas = nullptr;
  };

  // `manager` and `control` outlive the service (`control` null: load and unload answer
  // FAILED_PRECONDITION), and the service outlives the HttpServer that calls it.
  HttpService(ModelManager* manager, ModelControl* control, Options options);

  // HttpServer's handler.
  void Handle(HttpResponder responder);

 private:
  // OK, or why the request may not use `group` (its headers lack the restriction's).
  Status Allow(const HttpExchange& exchange, ProtocolGroup group) const;
  void Infer(HttpResponder responder, const std::string& model, const std::string& version);
  void Control(HttpResponder responder, const std::string& model, bool unload);
  // GET and POST /v2/trace/setting (`model` empty) and /v2/models/{m}/trace/setting (the "trace"
  // API group). The export URL is not a setting.
  void TraceSetting(HttpResponder responder, const std::string& model);
  // /v2/{systemsharedmemory,cudasharedmemory}[/region/{r}]/{status,register,unregister}.
  void SharedMemory(HttpResponder responder, bool cuda, const std::string& region,
                    const std::string& action);

  ModelManager* const manager_;
  ModelControl* const control_;
  const Options options_;
  const ModelLookup* const lookup_;
};

}  // namespace sluice
