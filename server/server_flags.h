// sluice-server's command line: every flag, its --help text, and the checks that turn it into a
// validated ServerConfig. Unit-tested (tests/unit/server_flags_test.cc); main() only calls it.
#pragma once

#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "server/os/cpu_budget.h"
#include "server/core/device.h"
#include "server/core/model_spec.h"
#include "server/core/repository_model.h"
#include "server/core/status.h"
#include "server/frontend/client_quotas.h"
#include "server/frontend/restricted_protocols.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"
#include "server/manager/model_control.h"
#include "server/tracing/trace_config.h"

namespace sluice {

// What the server is asked to do. Defaults are the flags' defaults.
// --torchvision-ops: load the bundled torchvision operators when the build has them (kAuto),
// refuse to start without them (kOn), or never load them (kOff).
enum class TorchvisionOps { kAuto, kOn, kOff };

struct ServerConfig {
  std::string model_repository;  // --model-repository (default: the bundled models)
  ModelControlMode model_control_mode = ModelControlMode::kNone;  // --model-control-mode
  std::vector<std::string> load_models;  // --load-model (explicit mode only)
  int repository_poll_secs = 15;         // --repository-poll-secs
  bool allow_load_files = false;         // --allow-load-files (explicit mode only)
  std::string load_files_dir;            // --load-files-dir ("": $TMPDIR/sluice-load-files-<pid>)
  uint64_t load_files_max_bytes = 1ull << 30;  // --load-files-max-bytes (one load)
  uint64_t load_files_disk_bytes = 8ull
                                   << 30;  // --load-files-disk-bytes (every serving load together)
  GrpcServerOptions grpc;                  // --grpc-address, --grpc-port, TLS, connections
  std::vector<ProtocolRestriction> restrictions;  // --grpc-restricted-protocol, parsed and distinct
  bool allow_http = true;  // --allow-http (with gRPC TLS, HTTPS with the same files)
  HttpServerOptions http;  // --http-address, --http-port, limits
  std::vector<ProtocolRestriction> http_restrictions;  // --http-restricted-api, parsed and distinct
  bool allow_metrics = true;                           // --allow-metrics
  std::string metrics_address = "0.0.0.0";             // --metrics-address
  int metrics_port = 8002;                             // --metrics-port (0: any free port)
  int metrics_interval_ms = 2000;                      // --metrics-interval-ms (NVML sampling)
  bool strict_readiness = true;                        // --strict-readiness
  bool auto_complete_config = true;                    // false: --disable-auto-complete-config
  DevicePolicy device = DevicePolicy::kAuto;           // --device
  std::string log_level = "info";                      // --log-level
  size_t max_queue_size = 1024;                        // --max-queue-size (per model version)
  size_t max_queued_bytes = size_t{2} << 30;           // --max-queued-bytes (all queues together)
  uint64_t response_cache_bytes = 0;  // --cache-config local,size=BYTES (0: no response cache)
  TraceConfig trace;              // --trace-config (level OFF: nothing traced until the API says)
  int stream_max_in_flight = 64;  // --grpc-stream-max-in-flight (per ModelStreamInfer stream)
  bool coalesce_answers = true;   // --grpc-coalesce-answers (TCP_CORK around a batch's answers)
  bool allow_shared_memory = false;  // --allow-client-shm (alias --allow-shared-memory)
  std::vector<std::string>
      client_shm_keys;  // --client-shm-keys (empty: no key may be registered; "*": any)
  double shutdown_delay_seconds = 0;                               // --shutdown-delay-seconds
  double shutdown_grace_seconds = 30;                              // --shutdown-grace-seconds
  CudnnBenchmarkMode cudnn_benchmark = CudnnBenchmarkMode::kAuto;  // --cudnn-benchmark
  bool cudnn_deterministic = false;                                // --cudnn-deterministic
  bool allow_tf32 = true;                                          // --allow-tf32
  bool warmup = true;                                              // --warmup
  bool print_env = false;           // --print-env: print the environment and exit
  bool model_threads_first = true;  // --model-threads-first (front ends as SCHED_BATCH)
  // --model-cpus (empty: every thread anywhere). main() replaces a "first:N" or "last:N" with the
  // CPUs it names before Server::Start, which reads only `list`.
  CpuChoice model_cpus;
  // Loading on demand within a memory budget (explicit and poll modes).
  bool load_on_demand = false;                     // --model-load-on-demand
  std::vector<std::pair<int, double>> gpu_limits;  // --model-load-gpu-limit <gpu>:<fraction>
  uint64_t host_limit_bytes = 0;                   // --model-load-host-limit (0: none)
  double min_residency_secs = 10;                  // --model-min-residency-secs
  double load_retry_secs = 10;  // --model-load-retry-secs (first back-off; doubles to 300 s)
  double load_wait_secs = 60;   // --model-load-wait-secs (a request's longest wait)
  // Quotas per client on inference requests (frontend/client_quotas.h).
  bool client_quotas = false;    // on when a --client-quota is given
  ClientQuotas::Options quotas;  // --client-quota, --client-identity-header, --trusted-proxies,
                                 // --client-quota-max-clients, --client-quota-metrics-clients
  // Operator libraries (server/runtime/operator_libraries.h).
  std::vector<std::string> operator_libraries;  // --operator-library, loaded at start-up in order
  std::vector<std::string> operator_library_dirs;  // --operator-library-dir
  // Pinned model code (server/os/file_pinning.h): the digests manifest, and whether every model
  // file and operator library a model names must be pinned in it.
  std::string model_digests;                               // --model-digests
  bool require_model_digests = false;                      // --require-model-digests
  TorchvisionOps torchvision_ops = TorchvisionOps::kAuto;  // --torchvision-ops
};

// Parses and validates `args` (without the program name). INVALID_ARGUMENT with the reason, the
// flag named, for anything CLI11 or the checks refuse (--help and --version too: nothing to
// serve).
StatusOr<ServerConfig> ParseServerFlags(const std::vector<std::string>& args);

// main()'s entry: the config to serve with, or the exit code to return after --help or
// --version (0, printed to stdout) or a refused flag (non-zero, the reason printed to stderr).
std::variant<ServerConfig, int> ParseCommandLine(int argc, const char* const* argv);

// The checks that need the repository: every --load-model name ("*" aside) is one of `models`.
// INVALID_ARGUMENT naming the first unknown one and the repository.
Status CheckStartupModels(const ServerConfig& config, const std::vector<RepositoryModel>& models);

}  // namespace sluice
