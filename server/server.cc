#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/os/cpu_budget.h"
#include "server/core/logging.h"
#include "server/runtime/torch_backend.h"

namespace sluice {
namespace {

// The environment report's versions, as labels of sluice_build_info.
std::map<std::string, std::string> BuildInfoLabels(const RuntimeInfo& info,
                                                   const ServerConfig& config) {
  auto or_none = [](const std::string& value) {
    return value.empty() ? std::string("none") : value;
  };
  return {{"sluice", SLUICE_VERSION},
          {"libtorch", info.torch_version},
          {"cuda_built_with", or_none(info.cuda_build_version)},
          {"cuda_runtime", or_none(info.cuda_runtime_version)},
          {"driver", info.driver_found ? or_none(info.driver_version) : "none"},
          {"driver_cuda", or_none(info.driver_cuda_version)},
          {"cudnn_compiled", or_none(info.cudnn_version)},
          {"cudnn_loaded", or_none(info.cudnn_loaded_version)},
          {"gpus", std::to_string(info.cuda_device_count)},
          {"cudnn_benchmark", CudnnBenchmarkModeName(config.cudnn_benchmark)},
          {"cudnn_deterministic", config.cudnn_deterministic ? "true" : "false"},
          {"allow_tf32", config.allow_tf32 ? "true" : "false"}};
}

void LogRuntime(const RuntimeInfo& info, const ServerConfig& config) {
  auto or_dash = [](const std::string& value) { return value.empty() ? std::string("-") : value; };
  spdlog::info(
      "event=runtime sluice={} libtorch={} cuda_built_with={} cuda_runtime={} driver={} "
      "driver_cuda={} cudnn_compiled={} cudnn_loaded={} gpus={} cudnn_benchmark={} "
      "cudnn_deterministic={} allow_tf32={} intra_op_threads={} inter_op_threads={}",
      SLUICE_VERSION, info.torch_version, or_dash(info.cuda_build_version),
      or_dash(info.cuda_runtime_version), info.driver_found ? or_dash(info.driver_version) : "none",
      or_dash(info.driver_cuda_version), or_dash(info.cudnn_version),
      or_dash(info.cudnn_loaded_version), info.cuda_device_count,
      CudnnBenchmarkModeName(config.cudnn_benchmark), info.cudnn_deterministic,
      info.cudnn_allow_tf32, info.intra_op_threads, info.inter_op_threads);
  for (const GpuInfo& gpu : info.gpus) {
    spdlog::info("event=gpu index={} name=\"{}\" compute_capability={}.{} memory_mib={} uuid={}",
                 gpu.index, gpu.name, gpu.major, gpu.minor, gpu.memory_bytes >> 20, gpu.uuid);
  }
  for (const std::string& problem :
       EnvironmentProblems(info, config.device == DevicePolicy::kCuda)) {
    spdlog::warn("event=environment_problem problem=\"{}\"", problem);
  }
  if (!info.cuda_usable) {
    spdlog::info("event=cpu_only reason=\"{}\" action=\"every model runs on the CPU\"",
                 info.problem);
  }
}

void LogOperatorLibrary(const OperatorLibrary& library) {
  spdlog::info(
      "event=operator_library_loaded library={} path={} origin=\"{}\" operators={} namespaces={} "
      "init_hook={} load_ms={:.1f}",
      library.path.filename().string(), library.path.string(), library.origin,
      library.operators.size(), absl::StrJoin(library.Namespaces(), ","), library.init_hook,
      library.load_time.count() / 1000.0);
}

}  // namespace

StatusOr<std::vector<std::string>> LoadStartupOperatorLibraries(const ServerConfig& config,
                                                                OperatorLibraries* libraries) {
  std::vector<std::string> notes;
  if (config.torchvision_ops != TorchvisionOps::kOff) {
    const std::filesystem::path bundled = BundledOperatorDirectory() / kTorchvisionOpsFile;
    std::error_code ec;
    if (std::filesystem::exists(bundled, ec)) {
      // Built with the server from the torch wheel's own torchvision: no probe (its start-up
      // cost), and a failure here is a broken installation, which stops the start.
      StatusOr<OperatorLibrary> loaded =
          libraries->LoadTrusted(bundled, "bundled torchvision", /*probe=*/false);
      if (!loaded.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("torchvision's operators: ", loaded.status().message(),
                         " (--torchvision-ops off starts without them)"));
      }
    } else if (config.torchvision_ops == TorchvisionOps::kOn) {
      return absl::FailedPreconditionError(
          absl::StrCat("--torchvision-ops on: this build bundles no torchvision "
                       "operators (no ",
                       bundled.string(), ")"));
    } else {
      notes.push_back(absl::StrCat(
          "torchvision's operators are not bundled with this build (no ", bundled.string(),
          "): models that call torchvision::nms, roi_align and the like will not load"));
    }
  }
  for (const std::string& path : config.operator_libraries) {
    StatusOr<OperatorLibrary> loaded = libraries->LoadTrusted(path, "--operator-library");
    if (!loaded.ok())
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--operator-library: ", loaded.status().message()));
  }
  return notes;
}

StatusOr<std::unique_ptr<Server>> Server::Start(const ServerConfig& config,
                                                const RuntimeInfo& runtime,
                                                OperatorLibraries* libraries,
                                                std::function<void()> on_load_failed) {
  std::unique_ptr<Server> server(new Server());
  LogRuntime(runtime, config);
  server->factory_ = MakeTorchBackendFactory(runtime, libraries);
  VersionLoader::Options loader_options = LoaderOptions(config, &server->liveness_);
  SLUICE_RETURN_IF_ERROR(VersionLoader(server->factory_.get(), loader_options).CheckDevicePolicy());
  if (config.auto_complete_config) server->describer_ = MakePackageDescriber();
  SLUICE_ASSIGN_OR_RETURN(std::vector<RepositoryModel> models,
                          ScanModelRepository(config.model_repository, server->describer_.get()));
  spdlog::info("event=repository path={} models={} model_control_mode={}", config.model_repository,
               models.size(), ModelControlModeName(config.model_control_mode));
  SLUICE_RETURN_IF_ERROR(CheckStartupModels(config, models));
  if (config.client_quotas) {
    SLUICE_ASSIGN_OR_RETURN(server->quotas_, ClientQuotas::Create(config.quotas));
    std::vector<std::string> proxies;
    for (const IpNetwork& proxy : config.quotas.identity.trusted_proxies)
      proxies.push_back(proxy.ToString());
    spdlog::info(
        "event=client_quotas rate={} burst={} in_flight={} own_quotas={} identity_header=\"{}\" "
        "trusted_proxies=\"{}\" max_clients={}",
        config.quotas.quota.rate, config.quotas.quota.burst, config.quotas.quota.max_in_flight,
        config.quotas.clients.size(), config.quotas.identity.header, absl::StrJoin(proxies, ","),
        config.quotas.max_clients);
  }
  SLUICE_RETURN_IF_ERROR(server->StartMetrics(config, runtime));
  if (libraries != nullptr) {
    ServerMetrics* metrics = server->metrics_.get();
    auto loaded = [metrics](const OperatorLibrary& library) {
      LogOperatorLibrary(library);
      if (metrics != nullptr) {
        metrics->AddOperatorLibrary(library.path.filename().string(), library.path.string(),
                                    library.origin, library.operators.size());
      }
    };
    for (const OperatorLibrary& library : libraries->List()) loaded(library);
    libraries->SetListener(loaded);
    server->libraries_ = libraries;
  }
  if (config.allow_load_files) {  // read by StartModelControl
    LoadedFileStore::Options files;
    files.root = !config.load_files_dir.empty() ? std::filesystem::path(config.load_files_dir)
                                                : std::filesystem::temp_directory_path() /
                                                      absl::StrCat("sluice-load-files-", getpid());
    files.disk_bytes = config.load_files_disk_bytes;
    SLUICE_ASSIGN_OR_RETURN(server->load_files_, LoadedFileStore::Create(files));
    spdlog::warn(
        "event=load_files_allowed dir={} max_bytes_per_load={} disk_bytes={} reason=\"loads may "
        "carry "
        "model files, which are code the server runs: trusted clients only\"",
        files.root.string(), config.load_files_max_bytes, files.disk_bytes);
  }
  loader_options.observer = server->metrics_.get();
  if (config.response_cache_bytes > 0) {
    server->response_cache_ = std::make_shared<ResponseCache>(config.response_cache_bytes, nullptr,
                                                              server->metrics_.get());
    loader_options.response_cache = server->response_cache_;
    spdlog::info("event=response_cache cache=local size_bytes={}", config.response_cache_bytes);
  }
  server->StartModelControl(config, std::move(models), loader_options);
  SLUICE_RETURN_IF_ERROR(server->StartTracing(config));
  SLUICE_RETURN_IF_ERROR(server->StartGrpc(config));
  SLUICE_RETURN_IF_ERROR(server->StartHttp(config));
  server->health_->SetStarted();
  server->grpc_->RefreshHealth();

  // Models load (and warm up) on the control thread, so that a shutdown signal during a long
  // warm-up is taken at once: it abandons the warm-up instead of waiting for it.
  Server* self = server.get();
  server->control_->Start([self, on_load_failed = std::move(on_load_failed)](const Status& status) {
    self->grpc_->RefreshHealth();
    if (status.ok()) {
      spdlog::info("event=models_loaded all_ready={} server_ready={}", self->manager_->AllReady(),
                   self->health_->Ready());
    } else {
      spdlog::critical("event=start_failed reason=\"{}\"", status.message());
      self->load_failed_ = true;
      if (on_load_failed) on_load_failed();
    }
    self->loading_ = false;
  });
  return server;
}

VersionLoader::Options Server::LoaderOptions(const ServerConfig& config,
                                             LivenessMonitor* liveness) {
  VersionLoader::Options options;
  options.device_policy = config.device;
  options.max_queue_size = config.max_queue_size;
  options.queued_bytes_budget = std::make_shared<ByteBudget>(config.max_queued_bytes);
  options.liveness = liveness;
  options.cudnn_benchmark = config.cudnn_benchmark;
  options.warmup = config.warmup;
  // With --model-cpus main() has moved this thread onto the front ends' CPUs: the models' CPUs
  // are counted instead of its mask (a cgroup quota still applies).
  const CpuBudget cpus = DetectCpuBudget("/proc/self/cgroup", "/sys/fs/cgroup",
                                         static_cast<int>(config.model_cpus.list.size()));
  options.cpus = cpus.cpus;
  options.cpu_limit = absl::StrCat(cpus.limit, ": ", cpus.detail);
  if (!config.model_cpus.empty()) {
    absl::StrAppend(&options.cpu_limit, " (--model-cpus ",
                    absl::StrJoin(config.model_cpus.list, ","), ")");
  }
  options.model_cpus_split = !config.model_cpus.empty();
  return options;
}

Status Server::StartMetrics(const ServerConfig& config, const RuntimeInfo& runtime) {
  if (!config.allow_metrics) {
    spdlog::info("event=metrics_off reason=\"--allow-metrics false\"");
    return absl::OkStatus();
  }
  metrics_ = std::make_unique<ServerMetrics>(std::make_shared<prometheus::Registry>());
  metrics_->SetBuildInfo(BuildInfoLabels(runtime, config));
  SLUICE_ASSIGN_OR_RETURN(
      metrics_endpoint_,
      MetricsEndpoint::Start(config.metrics_address, config.metrics_port, metrics_->registry()));
  spdlog::info("event=metrics_listening address={} port={} path=/metrics", config.metrics_address,
               metrics_endpoint_->port());
  if (quotas_ != nullptr) {
    quota_metrics_ =
        std::make_shared<ClientQuotaMetrics>([quotas = quotas_] { return quotas->Report(); });
    metrics_endpoint_->Add(quota_metrics_);
  }
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load(NvmlLibraryPath());
  if (!nvml.ok()) {
    spdlog::info("event=gpu_telemetry_off reason=\"{}\"", nvml.status().message());
    return absl::OkStatus();
  }
  GpuTelemetry::Options telemetry_options;
  telemetry_options.interval = std::chrono::milliseconds(config.metrics_interval_ms);
  // GPUs labelled as the instances see them (cuda:N) and only those CUDA shows this process.
  // With --device cpu no instance runs on a GPU: NVML's view, as on a host without CUDA.
  if (config.device != DevicePolicy::kCpu) {
    for (const GpuInfo& gpu : runtime.gpus) telemetry_options.cuda_uuids.push_back(gpu.uuid);
  }
  const char* labels = telemetry_options.cuda_uuids.empty() ? "nvml_index" : "cuda_ordinal";
  gpu_telemetry_ = std::make_unique<GpuTelemetry>(*std::move(nvml), metrics_.get(),
                                                  std::move(telemetry_options));
  spdlog::info("event=gpu_telemetry gpus={} interval_ms={} gpu_label={}", gpu_telemetry_->gpus(),
               config.metrics_interval_ms, labels);
  return absl::OkStatus();
}

void Server::StartModelControl(const ServerConfig& config, std::vector<RepositoryModel> models,
                               const VersionLoader::Options& loader_options) {
  source_ = std::make_unique<DirectoryModelSource>(config.model_repository, load_files_.get(),
                                                   describer_.get());
  ModelManager::Options manager_options;
  manager_options.observer = metrics_.get();
  manager_ = std::make_unique<ModelManager>(std::move(models), manager_options);
  VersionLoader::Options with_lookup = loader_options;
  with_lookup.lookup = manager_.get();  // an ensemble's steps find their models there
  loader_ = std::make_unique<VersionLoader>(factory_.get(), std::move(with_lookup));
  ModelControl::Options control_options;
  control_options.mode = config.model_control_mode;
  control_options.startup_models = config.load_models;
  control_options.accept_load_files = load_files_ != nullptr;
  control_options.max_load_file_bytes = config.load_files_max_bytes;
  control_options.source = source_.get();
  control_options.poll_interval = std::chrono::seconds(config.repository_poll_secs);
  control_options.sequence_drain = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(config.shutdown_grace_seconds));
  auto seconds = [](double value) {
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(value));
  };
  control_options.load_on_demand = config.load_on_demand;
  control_options.observer = metrics_.get();
  control_options.eviction.min_residency = seconds(config.min_residency_secs);
  control_options.load_retry_first = seconds(config.load_retry_secs);
  control_options.load_retry_longest = std::max(seconds(300), control_options.load_retry_first);
  for (const auto& [gpu, fraction] : config.gpu_limits) {
    const uint64_t total = factory_->DeviceMemoryBytes(Device{true, gpu});
    if (total == 0) {
      spdlog::warn(
          "event=memory_budget_ignored device=cuda:{} reason=\"--model-load-gpu-limit names a GPU "
          "this "
          "process does not see\"",
          gpu);
      continue;
    }
    control_options.eviction.budget[Device{true, gpu}.ToString()] =
        static_cast<uint64_t>(static_cast<double>(total) * fraction);
  }
  if (config.host_limit_bytes > 0) control_options.eviction.budget["cpu"] = config.host_limit_bytes;
  for (const auto& [device, bytes] : control_options.eviction.budget) {
    spdlog::info("event=memory_budget device={} bytes={} min_residency_s={}", device, bytes,
                 config.min_residency_secs);
  }
  control_ = std::make_unique<ModelControl>(manager_.get(), loader_.get(), control_options);
  if (config.load_on_demand) {
    OnDemandLoader::Options demand;
    demand.max_wait = seconds(config.load_wait_secs);
    demand.max_waiters = config.max_queue_size;
    demand.observer = metrics_.get();
    on_demand_ = std::make_unique<OnDemandLoader>(control_.get(), demand);
    manager_->SetOnDemand(on_demand_.get());
    spdlog::info("event=load_on_demand wait_s={} retry_s={}", config.load_wait_secs,
                 config.load_retry_secs);
  }
  health_ = std::make_unique<ServerHealth>(
      ServerHealth::Options{config.strict_readiness, &liveness_, manager_.get()});
  if (config.allow_shared_memory) {  // one registry for both front ends
    SharedMemoryManager::Options shm;
    shm.key_prefixes = config.client_shm_keys;
    shared_memory_ = std::make_unique<SharedMemoryManager>(std::move(shm));
    if (config.client_shm_keys.empty()) {
      spdlog::warn(
          "event=client_shm_keys_unset reason=\"--allow-client-shm=true without --client-shm-keys: "
          "every "
          "shared memory registration is refused (PERMISSION_DENIED); name the key prefixes your "
          "clients "
          "use, e.g. --client-shm-keys=/myapp_, or '*' for every key\"");
    } else {
      spdlog::info("event=client_shm_keys prefixes={}", absl::StrJoin(config.client_shm_keys, ","));
    }
  } else {
    spdlog::info(
        "event=shared_memory_off reason=\"client shared memory is off; --allow-client-shm=true "
        "turns it on\"");
    if (!config.client_shm_keys.empty()) {
      spdlog::warn(
          "event=client_shm_keys_ignored reason=\"--client-shm-keys without "
          "--allow-client-shm=true\"");
    }
  }
}

Status Server::StartTracing(const ServerConfig& config) {
  OtlpHttpExporter::Options exporter = config.trace.exporter;
  exporter.observer = metrics_.get();
  SLUICE_ASSIGN_OR_RETURN(span_exporter_, OtlpHttpExporter::Create(std::move(exporter)));
  Tracer::Options tracing;
  tracing.settings = config.trace.settings;
  tracing.sink = span_exporter_.get();
  tracer_ = std::make_unique<Tracer>(std::move(tracing));
  spdlog::info(
      "event=tracing mode=opentelemetry level={} rate={} count={} url={} bsp_max_queue_size={} "
      "bsp_schedule_delay_ms={} bsp_max_export_batch_size={}",
      TraceLevelName(config.trace.settings.level), config.trace.settings.rate,
      config.trace.settings.count, span_exporter_->url().ToString(),
      config.trace.exporter.max_queue_size,
      std::chrono::duration_cast<std::chrono::milliseconds>(config.trace.exporter.schedule_delay)
          .count(),
      config.trace.exporter.max_export_batch_size);
  return absl::OkStatus();
}

Status Server::StartGrpc(const ServerConfig& config) {
  GrpcService::Options options;
  options.tracer = tracer_.get();
  options.server_version = SLUICE_VERSION;
  options.health = health_.get();
  options.restrictions = config.restrictions;
  options.stream_max_in_flight = config.stream_max_in_flight;
  options.coalesce_answers = config.coalesce_answers;
  options.shared_memory = shared_memory_.get();
  options.quotas = quotas_.get();
  for (const ProtocolRestriction& restriction : config.restrictions) {
    for (ProtocolGroup group : restriction.groups) {
      spdlog::info("event=protocol_restricted group={} header={}", ProtocolGroupName(group),
                   restriction.key);
    }
  }
  grpc_service_ = std::make_unique<GrpcService>(manager_.get(), control_.get(), options);
  SLUICE_ASSIGN_OR_RETURN(grpc_, GrpcServer::Start(config.grpc, grpc_service_.get()));
  grpc_service_->SetListeningPorts({grpc_->port()});
  spdlog::info("event=listening address={} port={}", config.grpc.address, grpc_->port());
  GrpcServer* grpc = grpc_.get();
  liveness_.SetListener([grpc] { grpc->RefreshHealth(); });
  control_->SetChangeListener([grpc] { grpc->RefreshHealth(); });
  return absl::OkStatus();
}

Status Server::StartHttp(const ServerConfig& config) {
  if (!config.allow_http) {
    spdlog::info("event=http_off reason=\"--allow-http false\"");
    return absl::OkStatus();
  }
  HttpServerOptions transport = config.http;
  if (config.grpc.tls.enabled || config.grpc.tls.mutual) {
    // The gRPC port's files and reload, read by OpenSSL directly (gRPC's provider is gRPC's).
    TlsServerContext::Options tls;
    tls.certificate_path = config.grpc.tls.server_cert;
    tls.key_path = config.grpc.tls.server_key;
    tls.root_path = config.grpc.tls.root_cert;
    tls.mutual = config.grpc.tls.mutual;
    tls.reload = std::chrono::seconds(config.grpc.tls.reload_secs);
    SLUICE_ASSIGN_OR_RETURN(transport.tls, TlsServerContext::Create(std::move(tls)));
  }
  HttpService::Options options;
  options.tracer = tracer_.get();
  options.server_version = SLUICE_VERSION;
  options.health = health_.get();
  options.restrictions = config.http_restrictions;
  options.shared_memory = shared_memory_.get();
  options.quotas = quotas_.get();
  for (const ProtocolRestriction& restriction : config.http_restrictions) {
    for (ProtocolGroup group : restriction.groups) {
      spdlog::info("event=http_api_restricted group={} header={}", ProtocolGroupName(group),
                   restriction.key);
    }
  }
  http_service_ = std::make_unique<HttpService>(manager_.get(), control_.get(), options);
  HttpService* service = http_service_.get();
  SLUICE_ASSIGN_OR_RETURN(http_, HttpServer::Start(transport, [service](HttpResponder responder) {
                            service->Handle(std::move(responder));
                          }));
  spdlog::info(
      "event=http_listening address={} port={} tls={} max_body_bytes={} max_connections={} "
      "compression_threads={}",
      config.http.address, http_->port(),
      transport.tls == nullptr ? "off" : (config.grpc.tls.mutual ? "mutual" : "on"),
      config.http.max_body_bytes, config.http.max_connections, config.http.compression_threads);
  return absl::OkStatus();
}

Server::~Server() {
  Shutdown(0);
  if (libraries_ != nullptr) libraries_->SetListener(nullptr);
}

void Server::AbandonLoading() { control_->Stop(); }

void Server::BeginDrain() {
  health_->BeginDrain();
  grpc_->RefreshHealth();
}

void Server::Shutdown(int grace_ms) {
  if (shut_down_) return;
  shut_down_ = true;
  liveness_.SetListener(nullptr);
  if (control_) control_->BeginStop();  // no more polls or loads
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  if (http_) http_->StopAccepting();
  if (grpc_) {
    spdlog::info("event=shutdown action=\"refusing new calls, finishing those in flight\"");
    grpc_->Shutdown(grace_ms);
  }
  if (http_) {
    // What the gRPC grace left; HTTP requests answered after it are cut off with the models below.
    const auto left = std::max(std::chrono::steady_clock::duration::zero(),
                               deadline - std::chrono::steady_clock::now());
    if (!http_->WaitIdle(std::chrono::duration_cast<std::chrono::milliseconds>(left))) {
      spdlog::warn("event=shutdown_http_unfinished action=\"stopping the models answers them\"");
    }
  }
  if (control_) {
    control_->SetChangeListener(nullptr);
    control_->Stop();
  }
  if (on_demand_) on_demand_->Stop();  // requests still waiting for a load: UNAVAILABLE
  if (http_) http_->Stop();
}

}  // namespace sluice
