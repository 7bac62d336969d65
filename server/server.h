// The server as one object: the model repository, the models (VersionLoader, ModelManager,
// ModelControl), the metrics endpoint and GPU telemetry, the server's health, the gRPC and HTTP
// front ends, started in order and stopped in reverse. main() owns signals and
// nothing else.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "server/core/backend.h"
#include "server/core/liveness.h"
#include "server/core/model_description.h"
#include "server/frontend/server_health.h"
#include "server/grpc/grpc_server.h"
#include "server/grpc/grpc_service.h"
#include "server/http/http_server.h"
#include "server/http/http_service.h"
#include "server/manager/model_control.h"
#include "server/manager/on_demand.h"
#include "server/manager/model_manager.h"
#include "server/manager/version_loader.h"
#include "server/metrics/client_quota_metrics.h"
#include "server/metrics/gpu_telemetry.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/server_metrics.h"
#include "server/repository/model_repository.h"
#include "server/runtime/environment.h"
#include "server/runtime/operator_libraries.h"
#include "server/server_flags.h"

namespace sluice {

// The operator libraries every model gets, before the server starts: the bundled torchvision
// operators (--torchvision-ops) and each --operator-library, in order. An error stops the start
// (a --operator-library that is missing or fails its probe, --torchvision-ops on without them);
// what an operator should know but does not stop it ("torchvision's operators are not bundled")
// comes back as notes.
StatusOr<std::vector<std::string>> LoadStartupOperatorLibraries(const ServerConfig& config,
                                                                OperatorLibraries* libraries);

class Server {
 public:
  // Scans the repository, serves metrics (before the models load, so that a dashboard sees them
  // go from LOADING to READY), listens for gRPC (live at once, ready once the models are, or at
  // once without strict readiness), and starts loading the models on the control thread. Failures
  // that stop the server from starting come back (a missing repository, a --load-model the
  // repository lacks, --device cuda without a GPU, a port in use, unusable TLS files). Start-up
  // loading that fails for every model (--device cuda without a usable GPU) is logged and
  // `on_load_failed` is called, on the control thread; main then shuts down and exits non-zero.
  // `libraries` (may be null: models that name operator libraries are refused) outlives the
  // server; what it loads is logged and exported as metrics from here on.
  static StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config,
                                                 const RuntimeInfo& runtime,
                                                 OperatorLibraries* libraries,
                                                 std::function<void()> on_load_failed);
  ~Server();

  int grpc_port() const { return grpc_->port(); }
  int http_port() const { return http_ ? http_->port() : 0; }  // 0: HTTP is off
  int metrics_port() const {
    return metrics_endpoint_ ? metrics_endpoint_->port() : 0;
  }  // 0: metrics are off
  // Start-up loading is still going on.
  bool loading() const { return loading_; }
  // Start-up loading failed (see Start).
  bool load_failed() const { return load_failed_; }

  // A shutdown signal while models load: warm-ups are abandoned, versions not loaded stay
  // UNAVAILABLE, and this returns once the control thread has let go (ModelControl::Stop).
  void AbandonLoading();
  // Readiness goes NOT_SERVING at once (probes and load balancers stop sending); liveness stays
  // SERVING and calls are still served.
  void BeginDrain();
  // Refuses new calls, lets the calls in flight (running and queued) finish for up to `grace_ms`,
  // cancels the rest, then stops every model and the control thread. Idempotent.
  void Shutdown(int grace_ms);

 private:
  Server() = default;
  // The steps of Start, in order.
  static VersionLoader::Options LoaderOptions(const ServerConfig& config,
                                              LivenessMonitor* liveness);
  Status StartMetrics(const ServerConfig& config, const RuntimeInfo& runtime);  // and GPU telemetry
  void StartModelControl(const ServerConfig& config, std::vector<RepositoryModel> models,
                         const VersionLoader::Options& loader_options);  // and the server's health
  Status StartTracing(
      const ServerConfig& config);  // the exporter and the tracer both front ends use
  Status StartGrpc(const ServerConfig& config);
  Status StartHttp(const ServerConfig& config);

  // Construction order; destroyed in reverse.
  OperatorLibraries* libraries_ = nullptr;  // not owned; its listener is ours until we go
  LivenessMonitor liveness_;
  std::unique_ptr<BackendFactory> factory_;
  // Null without --client-quota; the front ends' calls hold tickets until answered, so the
  // quotas go after them (and after the metrics that read them).
  std::shared_ptr<ClientQuotas> quotas_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::shared_ptr<ClientQuotaMetrics> quota_metrics_;  // served by metrics_endpoint_
  std::unique_ptr<GpuTelemetry> gpu_telemetry_;
  // Made even with tracing off: the trace settings API may turn it on. Declared before the
  // models and front ends, so destroyed after them: every span of their last answers is queued
  // and then flushed (for up to 2 s) when the exporter goes.
  std::unique_ptr<OtlpHttpExporter> span_exporter_;
  std::unique_ptr<Tracer> tracer_;
  std::shared_ptr<ResponseCache> response_cache_;  // null without --cache-config; tells metrics_
  std::unique_ptr<LoadedFileStore> load_files_;    // null unless --allow-load-files
  std::unique_ptr<ModelDescriber> describer_;      // null: --disable-auto-complete-config
  std::unique_ptr<DirectoryModelSource> source_;
  std::unique_ptr<VersionLoader> loader_;
  std::unique_ptr<ModelManager> manager_;
  std::unique_ptr<ModelControl> control_;
  std::unique_ptr<OnDemandLoader> on_demand_;  // null without --model-load-on-demand
  std::unique_ptr<ServerHealth> health_;
  std::unique_ptr<SharedMemoryManager> shared_memory_;  // null unless --allow-client-shm=true
  std::unique_ptr<GrpcService> grpc_service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<HttpService> http_service_;  // null with --allow-http false
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> loading_{true};
  std::atomic<bool> load_failed_{false};
  bool shut_down_ = false;  // main's thread only
};

}  // namespace sluice
