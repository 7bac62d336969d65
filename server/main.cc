// sluice-server: serves the TorchScript models of a Triton-layout model repository over the
// KServe v2 / Triton gRPC protocol.
#include <atomic>
#include <chrono>
#include <ctime>
#include <csignal>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <string>
#include <algorithm>
#include <thread>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include "server/core/logging.h"

#include "server/api/grpc_server.h"
#include "server/api/inference_service.h"
#include "server/core/device.h"
#include "server/manager/model_manager.h"
#include "server/metrics/gpu_telemetry.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/server_metrics.h"
#include "server/repository/model_repository.h"
#include "server/runtime/torch_backend.h"

namespace {

struct Flags {
  std::string model_repository = SLUICE_DEFAULT_MODEL_REPOSITORY;
  std::string grpc_address = "0.0.0.0";
  int grpc_port = 8001;
  bool allow_metrics = true;
  std::string metrics_address = "0.0.0.0";
  int metrics_port = 8002;
  int metrics_interval_ms = 2000;
  bool strict_readiness = true;
  int grpc_max_message_bytes = 1 << 30;
  std::string device = "auto";
  std::string log_level = "info";
  size_t max_queue_size = 1024;
  size_t max_queued_bytes = size_t{2} << 30;
  double shutdown_delay_seconds = 0;
  double shutdown_grace_seconds = 30;
  std::string cudnn_benchmark = "auto";
  bool cudnn_deterministic = false;
  bool allow_tf32 = true;
  bool warmup = true;
  bool print_env = false;
  sluice::GrpcTlsOptions tls;
  sluice::GrpcConnectionOptions connections;
  std::vector<std::string> restricted_protocols;
  std::string model_control_mode = "none";
  std::vector<std::string> load_models;
  int repository_poll_secs = 15;
};

void AddFlags(CLI::App& app, Flags& flags) {
  app.add_option("--model-repository", flags.model_repository,
                 "Model repository in Triton's layout: <dir>/<model>/config.pbtxt and "
                 "<dir>/<model>/<version>/model.pt")
      ->capture_default_str();
  app.add_option("--model-control-mode", flags.model_control_mode,
                 "none: load every model at start-up, never change them; poll: also rescan the "
                 "repository every --repository-poll-secs and load new, reload changed and unload "
                 "removed models; explicit: load only the --load-model models at start-up, the "
                 "others with RepositoryModelLoad/Unload (guard those with --grpc-restricted-protocol "
                 "model-repository:...). A reload swaps versions without failing requests")
      ->check(CLI::IsMember({"none", "poll", "explicit"}))
      ->capture_default_str();
  app.add_option("--load-model", flags.load_models,
                 "With --model-control-mode explicit: a model to load at start-up (repeat it; '*' "
                 "loads all)");
  app.add_option("--repository-poll-secs", flags.repository_poll_secs,
                 "With --model-control-mode poll: seconds between repository scans")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--grpc-address", flags.grpc_address, "Address to listen on")->capture_default_str();
  app.add_option("--grpc-port", flags.grpc_port,
                 "Port of the gRPC inference and health services; 0 picks a free one (logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--allow-metrics", flags.allow_metrics,
                 "Serve Prometheus metrics at http://<--metrics-address>:<--metrics-port>/metrics")
      ->capture_default_str();
  app.add_option("--metrics-address", flags.metrics_address, "Address the metrics endpoint listens on")
      ->capture_default_str();
  app.add_option("--metrics-port", flags.metrics_port,
                 "Port of the Prometheus endpoint; 0 picks a free one (logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--metrics-interval-ms", flags.metrics_interval_ms,
                 "How often GPU telemetry (NVML: utilisation, memory, power, temperature) is sampled")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  app.add_option("--strict-readiness", flags.strict_readiness,
                 "true: ready only when every model in the repository is ready; false: ready once "
                 "the server is up. A broken model never makes the server not live")
      ->capture_default_str();
  app.add_option("--grpc-max-message-bytes", flags.grpc_max_message_bytes,
                 "Largest request or response message accepted or sent (gRPC's own default, "
                 "4 MiB, is too small for image batches)")
      ->check(CLI::Range(1 << 20, 2147483647))
      ->capture_default_str();
  app.add_option("--device", flags.device,
                 "auto: KIND_GPU/KIND_AUTO instances on the GPU when CUDA is usable, else on the "
                 "CPU with a warning; cpu: every instance on the CPU; cuda: fail at start when no "
                 "GPU is usable")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  app.add_option("--max-queue-size", flags.max_queue_size,
                 "Requests that may wait per model version; beyond it requests get UNAVAILABLE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queued-bytes", flags.max_queued_bytes,
                 "Input bytes that may wait in all dynamic-batching queues together; beyond it "
                 "requests get UNAVAILABLE (memory stays bounded at any load)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shutdown-delay-seconds", flags.shutdown_delay_seconds,
                 "On SIGINT/SIGTERM, readiness turns NOT_SERVING at once (liveness stays SERVING) "
                 "and the server keeps serving new calls this long, so that load balancers and "
                 "Kubernetes endpoints stop sending before it stops accepting; a second signal "
                 "cuts the delay short")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--shutdown-grace-seconds", flags.shutdown_grace_seconds,
                 "After the delay: new calls are refused, and the calls in flight (running and "
                 "queued) have this long to finish before they are cancelled; then the process "
                 "exits 0")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--cudnn-benchmark", flags.cudnn_benchmark,
                 "auto: cuDNN benchmark mode on for each model whose shape set is finite (fixed "
                 "dims or padding buckets), off for the others; on/off: for every model. A model's "
                 "sluice.cudnn_benchmark parameter overrides it")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--cudnn-deterministic", flags.cudnn_deterministic,
                 "Only deterministic cuDNN convolution algorithms (reproducible, often slower)")
      ->capture_default_str();
  app.add_option("--allow-tf32", flags.allow_tf32,
                 "Let cuDNN convolutions use TF32 on Ampere and newer GPUs (LibTorch's default; "
                 "faster FP32 with a 10-bit mantissa). Matmuls keep LibTorch's FP32 default")
      ->capture_default_str();
  app.add_option("--warmup", flags.warmup,
                 "Run every shape of each model's shape set (and its model_warmup samples) on "
                 "every instance before the model reports ready; false: cold start")
      ->capture_default_str();
  sluice::GrpcConnectionOptions& c = flags.connections;
  app.add_option("--grpc-max-connection-age-ms", c.max_connection_age_ms,
                 "Close each client connection after this long (the client reconnects): behind an "
                 "L4 load balancer (kube-proxy, cloud LBs), which balances connections and not "
                 "calls, long-lived clients then spread over the replicas. 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-max-connection-age-grace-ms", c.max_connection_age_grace_ms,
                 "How long calls in flight on an aged connection may still take. 0: unbounded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-max-connection-idle-ms", c.max_connection_idle_ms,
                 "Close connections idle this long. 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-keepalive-time", c.keepalive_time_ms,
                 "Milliseconds between the server's keepalive pings. 0: gRPC's default (2 hours)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-keepalive-timeout", c.keepalive_timeout_ms,
                 "Milliseconds to wait for a keepalive ping's answer before closing. 0: gRPC's default (20 s)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-keepalive-permit-without-calls", c.keepalive_permit_without_calls,
                 "Allow keepalive pings on connections without calls (both ways)")
      ->capture_default_str();
  app.add_option("--grpc-http2-max-pings-without-data", c.http2_max_pings_without_data,
                 "Pings the server sends without data before it must wait for data. -1: gRPC's default")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  app.add_option("--grpc-http2-min-recv-ping-interval-without-data", c.http2_min_recv_ping_interval_without_data_ms,
                 "Milliseconds a client must leave between pings without data; faster ones count as "
                 "strikes. 0: gRPC's default (5 minutes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-http2-max-ping-strikes", c.http2_max_ping_strikes,
                 "Strikes before the server closes the connection (0: unlimited). -1: gRPC's default (2)")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  app.add_option("--grpc-use-ssl", flags.tls.enabled,
                 "TLS on the gRPC port (needs --grpc-server-cert and --grpc-server-key)")
      ->capture_default_str();
  app.add_option("--grpc-use-ssl-mutual", flags.tls.mutual,
                 "Mutual TLS: clients must present a certificate signed by --grpc-root-cert "
                 "(implies --grpc-use-ssl)")
      ->capture_default_str();
  app.add_option("--grpc-server-cert", flags.tls.server_cert, "PEM certificate chain of the server (TLS)");
  app.add_option("--grpc-server-key", flags.tls.server_key, "PEM private key of the server (TLS)");
  app.add_option("--grpc-root-cert", flags.tls.root_cert,
                 "PEM CA certificate(s) that client certificates must be signed by (mutual TLS)");
  app.add_option("--grpc-restricted-protocol", flags.restricted_protocols,
                 "<group>[,<group>...]:<header>=<value>: calls of these protocol groups (health, "
                 "metadata, inference, model-config, model-repository, statistics) must carry the "
                 "header with that value (UNAUTHENTICATED without it, PERMISSION_DENIED with another "
                 "value). Repeatable; grpc.health.v1 stays open");
  app.add_flag("--print-env", flags.print_env,
               "Print the LibTorch, CUDA, driver, cuDNN and GPU versions this server runs on, and "
               "what is wrong with them, then exit");
}

// The environment report's versions, as labels of sluice_build_info.
std::map<std::string, std::string> BuildInfoLabels(const sluice::RuntimeInfo& info, const Flags& flags) {
  auto or_none = [](const std::string& value) { return value.empty() ? std::string("none") : value; };
  return {{"sluice", SLUICE_VERSION},
          {"libtorch", info.torch_version},
          {"cuda_built_with", or_none(info.cuda_build_version)},
          {"cuda_runtime", or_none(info.cuda_runtime_version)},
          {"driver", info.driver_found ? or_none(info.driver_version) : "none"},
          {"driver_cuda", or_none(info.driver_cuda_version)},
          {"cudnn_compiled", or_none(info.cudnn_version)},
          {"cudnn_loaded", or_none(info.cudnn_loaded_version)},
          {"gpus", std::to_string(info.cuda_device_count)},
          {"cudnn_benchmark", flags.cudnn_benchmark},
          {"cudnn_deterministic", flags.cudnn_deterministic ? "true" : "false"},
          {"allow_tf32", flags.allow_tf32 ? "true" : "false"}};
}

sluice::CudnnBenchmarkMode ParseBenchmarkMode(const std::string& mode) {
  if (mode == "on") return sluice::CudnnBenchmarkMode::kOn;
  if (mode == "off") return sluice::CudnnBenchmarkMode::kOff;
  return sluice::CudnnBenchmarkMode::kAuto;
}

void LogRuntime(const sluice::RuntimeInfo& info, const Flags& flags, bool gpu_required) {
  auto or_dash = [](const std::string& value) { return value.empty() ? std::string("-") : value; };
  spdlog::info("event=runtime sluice={} libtorch={} cuda_built_with={} cuda_runtime={} driver={} "
               "driver_cuda={} cudnn_compiled={} cudnn_loaded={} gpus={} cudnn_benchmark={} "
               "cudnn_deterministic={} allow_tf32={} intra_op_threads={} inter_op_threads={}",
               SLUICE_VERSION, info.torch_version, or_dash(info.cuda_build_version),
               or_dash(info.cuda_runtime_version), info.driver_found ? or_dash(info.driver_version) : "none",
               or_dash(info.driver_cuda_version), or_dash(info.cudnn_version),
               or_dash(info.cudnn_loaded_version), info.cuda_device_count, flags.cudnn_benchmark,
               info.cudnn_deterministic, info.cudnn_allow_tf32, info.intra_op_threads, info.inter_op_threads);
  for (const sluice::GpuInfo& gpu : info.gpus) {
    spdlog::info("event=gpu index={} name=\"{}\" compute_capability={}.{} memory_mib={} uuid={}", gpu.index,
                 gpu.name, gpu.major, gpu.minor, gpu.memory_bytes >> 20, gpu.uuid);
  }
  for (const std::string& problem : sluice::EnvironmentProblems(info, gpu_required)) {
    spdlog::warn("event=environment_problem problem=\"{}\"", problem);
  }
  if (!info.cuda_usable) {
    spdlog::info("event=cpu_only reason=\"{}\" action=\"every model runs on the CPU\"", info.problem);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice-server: TorchScript inference over the KServe v2 / Triton gRPC protocol"};
  app.set_version_flag("--version", SLUICE_VERSION);
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);

  // Signals are taken synchronously by the main thread (sigwait below); block them before any
  // thread starts (CUDA and cuDNN start threads as soon as the probe touches a GPU), so that
  // every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const sluice::DevicePolicy device_policy = *sluice::ParseDevicePolicy(flags.device);
  const bool gpu_required = device_policy == sluice::DevicePolicy::kCuda;
  sluice::CudnnSettings cudnn;
  cudnn.benchmark = flags.cudnn_benchmark == "on";
  cudnn.deterministic = flags.cudnn_deterministic;
  cudnn.allow_tf32 = flags.allow_tf32;
  sluice::ConfigureCudnn(cudnn);
  // With --device cpu no GPU is touched (a probe holds memory on every GPU it runs on).
  const sluice::RuntimeInfo runtime = sluice::ProbeRuntime(device_policy != sluice::DevicePolicy::kCpu);
  if (flags.print_env) {
    std::fputs(sluice::FormatEnvironment(runtime, flags.cudnn_benchmark, device_policy).c_str(), stdout);
    return EXIT_SUCCESS;
  }

  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  spdlog::set_level(spdlog::level::from_str(flags.log_level));

  LogRuntime(runtime, flags, gpu_required);
  std::unique_ptr<sluice::BackendFactory> factory = sluice::MakeTorchBackendFactory(runtime);
  if (device_policy == sluice::DevicePolicy::kCuda && !factory->CudaUsable()) {
    spdlog::critical("event=start_failed reason=\"{}\"",
                     sluice::DecideDevice(device_policy, sluice::InstanceKind::kGpu, false).status().message());
    return EXIT_FAILURE;
  }

  auto models = sluice::ScanModelRepository(flags.model_repository);
  if (!models.ok()) {
    spdlog::critical("event=start_failed reason=\"{}\"", models.status().message());
    return EXIT_FAILURE;
  }
  const sluice::ModelControlMode control_mode = *sluice::ParseModelControlMode(flags.model_control_mode);
  spdlog::info("event=repository path={} models={} model_control_mode={}", flags.model_repository,
               models->size(), flags.model_control_mode);
  if (!flags.load_models.empty() && control_mode != sluice::ModelControlMode::kExplicit) {
    spdlog::critical("event=start_failed reason=\"--load-model needs --model-control-mode explicit (in mode "
                     "{} every model loads)\"", flags.model_control_mode);
    return EXIT_FAILURE;
  }
  for (const std::string& name : flags.load_models) {
    const bool known = name == "*" || std::any_of(models->begin(), models->end(),
                                                  [&](const sluice::RepositoryModel& m) { return m.name == name; });
    if (!known) {
      spdlog::critical("event=start_failed reason=\"--load-model {}: the repository {} has no such model\"",
                       name, flags.model_repository);
      return EXIT_FAILURE;
    }
  }
  const sluice::DirectoryModelSource source(flags.model_repository);

  sluice::LivenessMonitor liveness;
  sluice::ModelManager::Options manager_options;
  manager_options.device_policy = device_policy;
  manager_options.max_queue_size = flags.max_queue_size;
  manager_options.queued_bytes_budget = std::make_shared<sluice::ByteBudget>(flags.max_queued_bytes);
  manager_options.liveness = &liveness;
  manager_options.cudnn_benchmark = ParseBenchmarkMode(flags.cudnn_benchmark);
  // Metrics: one registry, handed to what records; served before the models load, so that a
  // dashboard sees models go from LOADING to READY.
  std::unique_ptr<sluice::ServerMetrics> metrics;
  std::unique_ptr<sluice::MetricsEndpoint> metrics_endpoint;
  std::unique_ptr<sluice::GpuTelemetry> gpu_telemetry;
  if (flags.allow_metrics) {
    metrics = std::make_unique<sluice::ServerMetrics>(std::make_shared<prometheus::Registry>());
    metrics->SetBuildInfo(BuildInfoLabels(runtime, flags));
    auto endpoint = sluice::MetricsEndpoint::Start(flags.metrics_address, flags.metrics_port, metrics->registry());
    if (!endpoint.ok()) {
      spdlog::critical("event=start_failed reason=\"{}\"", endpoint.status().message());
      return EXIT_FAILURE;
    }
    metrics_endpoint = *std::move(endpoint);
    spdlog::info("event=metrics_listening address={} port={} path=/metrics", flags.metrics_address,
                 metrics_endpoint->port());
    auto nvml = sluice::Nvml::Load(sluice::NvmlLibraryPath());
    if (nvml.ok()) {
      gpu_telemetry = std::make_unique<sluice::GpuTelemetry>(
          *std::move(nvml), metrics.get(), std::chrono::milliseconds(flags.metrics_interval_ms));
      spdlog::info("event=gpu_telemetry gpus={} interval_ms={}", gpu_telemetry->gpus(), flags.metrics_interval_ms);
    } else {
      spdlog::info("event=gpu_telemetry_off reason=\"{}\"", nvml.status().message());
    }
    manager_options.observer = metrics.get();
  } else {
    spdlog::info("event=metrics_off reason=\"--allow-metrics false\"");
  }
  manager_options.warmup = flags.warmup;
  manager_options.control_mode = control_mode;
  manager_options.startup_models = flags.load_models;
  manager_options.source = &source;
  sluice::ModelManager manager(*std::move(models), factory.get(), manager_options);

  sluice::InferenceService::Options service_options;
  service_options.server_version = SLUICE_VERSION;
  service_options.readiness.strict = flags.strict_readiness;
  service_options.liveness = &liveness;
  for (const std::string& text : flags.restricted_protocols) {
    auto restriction = sluice::ParseProtocolRestriction(text);
    if (!restriction.ok()) {
      spdlog::critical("event=start_failed reason=\"{}\"", restriction.status().message());
      return EXIT_FAILURE;
    }
    service_options.restrictions.push_back(*std::move(restriction));
  }
  if (sluice::Status distinct = sluice::CheckRestrictionsDistinct(service_options.restrictions); !distinct.ok()) {
    spdlog::critical("event=start_failed reason=\"{}\"", distinct.message());
    return EXIT_FAILURE;
  }
  for (const sluice::ProtocolRestriction& restriction : service_options.restrictions) {
    for (sluice::ProtocolGroup group : restriction.groups) {
      spdlog::info("event=protocol_restricted group={} header={}", sluice::ProtocolGroupName(group), restriction.key);
    }
  }
  sluice::InferenceService service(&manager, service_options);

  sluice::GrpcServerOptions server_options;
  server_options.address = flags.grpc_address;
  server_options.port = flags.grpc_port;
  server_options.max_message_bytes = flags.grpc_max_message_bytes;
  server_options.tls = flags.tls;
  server_options.connections = flags.connections;
  auto server = sluice::GrpcServer::Start(server_options, &service);
  if (!server.ok()) {
    spdlog::critical("event=start_failed reason=\"{}\"", server.status().message());
    return EXIT_FAILURE;
  }
  spdlog::info("event=listening address={} port={}", flags.grpc_address, (*server)->port());
  liveness.SetListener([server = server->get()] { server->RefreshHealth(); });
  manager.SetChangeListener([server = server->get()] { server->RefreshHealth(); });

  // Live from here on; ready once the models are (or at once without strict readiness).
  service.SetStarted();
  (*server)->RefreshHealth();
  // Models load (and warm up) on their own thread, so that a shutdown signal during a long
  // warm-up is taken at once: it abandons the warm-up instead of waiting for it.
  sluice::Status loaded;
  std::atomic<bool> loading{true};
  std::atomic<bool> load_failed{false};
  std::unique_ptr<sluice::RepositoryPoller> poller;
  std::thread loader([&] {
    loaded = manager.LoadAll();
    (*server)->RefreshHealth();
    if (loaded.ok()) {
      spdlog::info("event=models_loaded all_ready={} server_ready={}", manager.AllReady(), service.Ready());
      if (control_mode == sluice::ModelControlMode::kPoll) {
        poller = std::make_unique<sluice::RepositoryPoller>(&manager, std::chrono::seconds(flags.repository_poll_secs));
        spdlog::info("event=repository_polling interval_s={}", flags.repository_poll_secs);
      }
    } else {
      spdlog::critical("event=start_failed reason=\"{}\"", loaded.message());
      load_failed = true;
      kill(getpid(), SIGTERM);  // wakes the sigwait below
    }
    loading = false;
  });

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  if (loading && !load_failed) {
    spdlog::info("event=shutdown_during_load signal={} action=\"abandoning the models still loading\"",
                 strsignal(signal_number));
    manager.Stop();
  }
  loader.join();
  liveness.SetListener(nullptr);
  if (!loaded.ok()) {
    manager.SetChangeListener(nullptr);
    (*server)->Shutdown(0);
    return EXIT_FAILURE;
  }
  // Drain: not ready at once (probes and load balancers stop sending), still serving for the
  // delay, then no new calls and the ones in flight finish within the grace period.
  service.BeginDrain();
  (*server)->RefreshHealth();
  spdlog::info("event=draining signal={} delay_s={} grace_s={}", strsignal(signal_number),
               flags.shutdown_delay_seconds, flags.shutdown_grace_seconds);
  if (flags.shutdown_delay_seconds > 0) {
    const auto delay = std::chrono::duration<double>(flags.shutdown_delay_seconds);
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count();
    timespec timeout{static_cast<time_t>(nanos / 1000000000), static_cast<long>(nanos % 1000000000)};
    if (sigtimedwait(&signals, nullptr, &timeout) > 0) {
      spdlog::info("event=drain_delay_cut reason=\"second signal\"");
    }
  }
  if (poller) poller->Stop();
  spdlog::info("event=shutdown action=\"refusing new calls, finishing those in flight\"");
  (*server)->Shutdown(static_cast<int>(flags.shutdown_grace_seconds * 1000));
  manager.SetChangeListener(nullptr);
  manager.Stop();
  spdlog::info("event=stopped");
  return EXIT_SUCCESS;
}
