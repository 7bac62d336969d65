#include "server/server_flags.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include <CLI/CLI.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/os/cpu_budget.h"
#include "server/frontend/shared_memory.h"
#include "server/manager/residency.h"

namespace sluice {
namespace {

// The flags CLI11 reads as text and the checks turn into typed fields.
struct TextFlags {
  std::string model_control_mode = "none";
  std::string device = "auto";
  std::string cudnn_benchmark = "auto";
  std::vector<std::string> restricted_protocols;
  std::vector<std::string> http_restricted_apis;
  std::string allow_http = "true";         // --allow-http: "true" or "false"
  std::vector<std::string> cache_configs;  // --cache-config, each "<cache>,<key>=<value>"
  int64_t response_cache_byte_size = -1;   // --response-cache-byte-size (-1: not given)
  std::vector<std::string> gpu_limits;     // --model-load-gpu-limit, each "<gpu>:<fraction>"
  std::vector<std::string>
      trace_configs;       // --trace-config, each "[opentelemetry,]<setting>=<value>"
  std::string model_cpus;  // --model-cpus: a CPU list, first:N or last:N ("": not given)
  std::string torchvision_ops = "auto";    // --torchvision-ops
  std::vector<std::string> client_quotas;  // --client-quota, each "rate=..[:CLIENT]"
  std::string client_identity_header;      // --client-identity-header
  std::string trusted_proxies;             // --trusted-proxies, "CIDR[,CIDR...]"
};

// The process: version, logging, readiness, shutdown, --print-env.
// Listed under "Server" in --help.
void AddServerFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  app.set_version_flag("--version", SLUICE_VERSION);
  app.add_option("--strict-readiness", config.strict_readiness,
                 "true: ready only when every model in the repository is ready; false: ready once "
                 "the server is up. A broken model never makes the server not live")
      ->capture_default_str()
      ->group("Server");
  app.add_flag("--disable-auto-complete-config{false}", config.auto_complete_config,
               "Do not fill in a model's inputs, outputs, max_batch_size and dynamic_batching from "
               "its .pt2 package when config.pbtxt leaves them out or is missing (Triton's flag)")
      ->group("Server");
  app.add_option("--log-level", config.log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str()
      ->group("Server");
  app.add_option("--shutdown-delay-seconds", config.shutdown_delay_seconds,
                 "On SIGINT/SIGTERM, readiness turns NOT_SERVING at once (liveness stays SERVING) "
                 "and the server keeps serving new calls this long, so that load balancers and "
                 "Kubernetes endpoints stop sending before it stops accepting; a second signal "
                 "cuts the delay short")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Server");
  app.add_option("--shutdown-grace-seconds", config.shutdown_grace_seconds,
                 "After the delay: new calls are refused, and the calls in flight (running and "
                 "queued) have this long to finish before they are cancelled; then the process "
                 "exits 0")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Server");
  app.add_option("--model-threads-first", config.model_threads_first,
                 "Run every thread but the models' workers (gRPC's, HTTP's, control, and the "
                 "dynamic batchers of models without a queue delay, latency target or delaying "
                 "queue policy) as Linux SCHED_BATCH, "
                 "so that a request arriving on a busy CPU does not preempt a forward pass, and a "
                 "batcher woken by a burst's first request does not preempt the thread still "
                 "delivering the rest; false: every thread SCHED_OTHER")
      ->capture_default_str()
      ->group("Server");
  app.add_option(
         "--model-cpus", text.model_cpus,
         "A CPU list (taskset's form: 0-3,8), or first:N / last:N (the N lowest- or "
         "highest-numbered of the CPUs the server may use, for a container whose CPU numbers "
         "are not known in advance), for the models' workers and their LibTorch threads; "
         "every other thread of the server (gRPC, HTTP, batchers, control) runs on the rest "
         "of the CPUs it may use, so a request is read while a forward pass runs. "
         "For CPU models with a latency target (sluice.latency_target_us). Must leave at least "
         "one CPU for the front ends; CPU instances split these CPUs among themselves, and "
         "sluice.run_on_receiving_thread stays off")
      ->check(CLI::Validator(
          [](std::string& value) {
            return value.empty() ? std::string("an empty CPU list") : std::string();
          },
          "CPU list"))
      ->group("Server");
  app.add_flag("--print-env", config.print_env,
               "Print the LibTorch, CUDA, driver, cuDNN and GPU versions this server runs on, and "
               "what is wrong with them, then exit")
      ->group("Server");
}

// The model repository, how models load, where they run and how they queue.
// Listed under "Models" in --help.
void AddModelFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  app.add_option(
         "--model-repository", config.model_repository,
         "Model repository in Triton's layout: <dir>/<model>/config.pbtxt and "
         "<dir>/<model>/<version>/model.pt (platform torch_aoti: model.pt2, or model.cpu.pt2 / "
         "model.cuda.pt2)")
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--model-control-mode", text.model_control_mode,
         "none: load every model at start-up, never change them; poll: also rescan the "
         "repository every --repository-poll-secs and load new, reload changed and unload "
         "removed models; explicit: load only the --load-model models at start-up, the "
         "others with RepositoryModelLoad/Unload (guard those with --grpc-restricted-protocol "
         "model-repository:...). A reload swaps versions without failing requests")
      ->check(CLI::IsMember({"none", "poll", "explicit"}))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--load-model", config.load_models,
                 "With --model-control-mode explicit: a model to load at start-up (repeat it; '*' "
                 "loads all)")
      ->group("Models");
  app.add_option(
         "--allow-load-files", config.allow_load_files,
         "With --model-control-mode explicit: accept model files sent with a load (Triton's "
         "'file:<path>' load parameters, with a 'config'). They are code the server runs (a .pt2 "
         "is a shared library it loads, a TorchScript file arbitrary TorchScript), so only for "
         "trusted clients: guard model-repository with --grpc-restricted-protocol and "
         "--http-restricted-api. Written under --load-files-dir, never the repository")
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--load-files-dir", config.load_files_dir,
         "Where model files sent with loads are written (emptied at start, removed at exit; one "
         "directory per load, removed when that load no longer serves); default: "
         "$TMPDIR/sluice-load-files-<pid>")
      ->group("Models");
  app.add_option("--load-files-max-bytes", config.load_files_max_bytes,
                 "The model files one load may send, in bytes (more is INVALID_ARGUMENT)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option("--load-files-disk-bytes", config.load_files_disk_bytes,
                 "The model files of every load serving at once, in bytes (a load past it is "
                 "RESOURCE_EXHAUSTED)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--operator-library", config.operator_libraries,
         "A shared library of TorchScript/AOTInductor operators (TORCH_LIBRARY) to load at "
         "start-up, "
         "before any model (repeat it). Each is first loaded in a child process; one that fails "
         "there stops the start with the reason. Loaded libraries are never unloaded")
      ->group("Models");
  app.add_option("--operator-library-dir", config.operator_library_dirs,
                 "A directory from which model configurations may name operator libraries "
                 "(sluice.operator_libraries, MODEL_INIT_LIBRARY), beside the model's own "
                 "directory (repeat "
                 "it); a library resolving anywhere else is refused")
      ->check(CLI::ExistingDirectory)
      ->group("Models");
  app.add_option("--model-digests", config.model_digests,
                 "A manifest of SHA-256 digests in sha256sum's format (\"<digest>  <path>\", "
                 "paths relative to the model repository): a model file or operator library it "
                 "lists loads only from a private copy whose bytes have that digest, else the "
                 "load is refused. Keep it outside the repository, where whoever writes models "
                 "cannot write it; it is read again at every load")
      ->check(CLI::ExistingFile)
      ->group("Models");
  app.add_option("--require-model-digests", config.require_model_digests,
                 "Refuse to load any model file or model-named operator library that "
                 "--model-digests does not pin (true/false)")
      ->group("Models");
  app.add_option(
         "--torchvision-ops", text.torchvision_ops,
         "torchvision's operators (nms, roi_align, roi_pool, ps_roi_align, ps_roi_pool, "
         "deform_conv2d; CPU and CUDA) for every model: auto loads them when this build bundles "
         "them (lib/sluice/torchvision_ops.so), on refuses to start without them, off never "
         "loads them")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--repository-poll-secs", config.repository_poll_secs,
                 "With --model-control-mode poll: seconds between repository scans")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option("--device", text.device,
                 "auto: KIND_GPU/KIND_AUTO instances on the GPU when CUDA is usable, else on the "
                 "CPU with a warning; cpu: every instance on the CPU; cuda: fail at start when no "
                 "GPU is usable")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--max-queue-size", config.max_queue_size,
                 "Requests that may wait per model version; beyond it requests get UNAVAILABLE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--cache-config", text.cache_configs,
         "The response cache, in Triton's spelling: local,size=BYTES keeps up to BYTES of answers "
         "(oldest out first; those used since they were kept get a second chance) for the models "
         "whose config.pbtxt says "
         "response_cache { enable: true }; without it no answer is cached. Only the local cache "
         "exists")
      ->group("Models");
  app.add_option("--response-cache-byte-size", text.response_cache_byte_size,
                 "Triton's older spelling of --cache-config local,size=BYTES (0: no cache)")
      ->check(CLI::NonNegativeNumber)
      ->group("Models");
  app.add_option(
         "--max-queued-bytes", config.max_queued_bytes,
         "Input bytes that may wait in all models' queues together (dynamic, sequence and "
         "unbatched alike); beyond it requests get UNAVAILABLE (memory stays bounded at any load)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option("--cudnn-benchmark", text.cudnn_benchmark,
                 "auto: cuDNN benchmark mode for each model whose shape set is finite (fixed "
                 "dims or padding buckets), off for the others; a TorchScript model on a GPU is "
                 "timed with the mode off and on before ready and keeps it only where it is 5 % "
                 "faster. on/off: for every model. A model's sluice.cudnn_benchmark parameter "
                 "overrides it")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--cudnn-deterministic", config.cudnn_deterministic,
                 "Only deterministic cuDNN convolution algorithms (reproducible, often slower)")
      ->capture_default_str()
      ->group("Models");
  app.add_option("--allow-tf32", config.allow_tf32,
                 "Let cuDNN convolutions use TF32 on Ampere and newer GPUs (LibTorch's default; "
                 "faster FP32 with a 10-bit mantissa). Matmuls keep LibTorch's FP32 default")
      ->capture_default_str()
      ->group("Models");
  app.add_option("--warmup", config.warmup,
                 "Run every shape of each model's shape set (and its model_warmup samples) on "
                 "every instance before the model reports ready; false: cold start")
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--model-load-on-demand", config.load_on_demand,
         "With --model-control-mode explicit or poll: load only the --load-model models at "
         "start-up "
         "(pinned: never unloaded for room) and any other repository model when a request first "
         "asks "
         "for it; the request waits (its deadline, at most --model-load-wait-secs). Requests for "
         "one "
         "model share its load; loads run one at a time. A model unloaded with "
         "RepositoryModelUnload "
         "stays unloaded until RepositoryModelLoad. A failed load answers its requests with the "
         "reason "
         "and is not tried again for --model-load-retry-secs (doubling per failure, at most 300 s)")
      ->capture_default_str()
      ->group("Models");
  app.add_option("--model-load-gpu-limit", text.gpu_limits,
                 "<gpu>:<fraction> (Triton's spelling; repeat per GPU): the models on that GPU may "
                 "use this "
                 "fraction of its memory, as measured at each load (device allocator, warm-up peak "
                 "included). A load that would go over it first unloads idle, unpinned models, the "
                 "least recently "
                 "used of those resident for --model-min-residency-secs first; when only busy or "
                 "pinned models "
                 "are left it fails RESOURCE_EXHAUSTED, naming what stays and why. Needs "
                 "--model-control-mode "
                 "explicit or --model-load-on-demand")
      ->group("Models");
  app.add_option(
         "--model-load-host-limit", config.host_limit_bytes,
         "The same budget for host memory, in bytes (the process's resident set as each load grows "
         "it, warm-up peak included; CPU models, and the host side of GPU ones); 0: none")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option("--model-min-residency-secs", config.min_residency_secs,
                 "With a memory budget: a model loaded less than this ago is unloaded for another "
                 "only when no "
                 "older idle model frees enough, and then the youngest last; it orders eviction "
                 "and never makes a "
                 "request fail (sluice_model_evictions_young_total counts such evictions)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option("--model-load-retry-secs", config.load_retry_secs,
                 "With --model-load-on-demand: seconds after a failed load before requests may "
                 "load that model "
                 "again (doubling with each failure in a row, at most 300)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("Models");
  app.add_option(
         "--model-load-wait-secs", config.load_wait_secs,
         "With --model-load-on-demand: the longest a request waits for its model to load, whatever "
         "its own deadline (HTTP requests carry none); then DEADLINE_EXCEEDED")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("Models");
}

// The gRPC front end: listening, TLS, connections, streams, shared memory, restrictions.
// Listed under "gRPC front end" in --help.
void AddGrpcFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  GrpcServerOptions& grpc = config.grpc;
  app.add_option("--grpc-address", grpc.address, "Address to listen on")
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-port", grpc.port,
                 "Port of the gRPC inference and health services; 0 picks a free one (logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-max-message-bytes", grpc.max_message_bytes,
                 "Largest request or response message accepted or sent (gRPC's own default, "
                 "4 MiB, is too small for image batches)")
      ->check(CLI::Range(1 << 20, 2147483647))
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option(
         "--allow-client-shm,--allow-shared-memory", config.allow_shared_memory,
         "Client shared memory, as Triton 26.05+ (--allow-shared-memory is the older name): true "
         "serves the system shared memory extension on gRPC (SystemSharedMemoryRegister, Status, "
         "Unregister) and HTTP (/v2/systemsharedmemory/...), one registry for both; inputs and "
         "outputs in registered regions. Off by default, because a client that may register "
         "regions "
         "reads and writes the objects it names (within --client-shm-keys): register and "
         "unregister calls "
         "(system and CUDA) answer UNIMPLEMENTED, status calls list nothing, and requests naming a "
         "region FAILED_PRECONDITION")
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option_function<std::string>(
         "--client-shm-keys",
         [keys = &config.client_shm_keys](const std::string& text) {
           StatusOr<std::vector<std::string>> prefixes = ParseClientShmKeyPrefixes(text);
           if (!prefixes.ok()) throw CLI::ValidationError(std::string(prefixes.status().message()));
           *keys = *std::move(prefixes);
         },
         "With --allow-client-shm=true: the shared memory keys clients may register, as "
         "comma-separated "
         "prefixes (/myapp_,/client_: keys starting with either), or '*' for every key the "
         "server's user "
         "can open. Not given: no key, every registration is PERMISSION_DENIED (and a warning is "
         "logged "
         "at start-up)")
      ->group("gRPC front end");
  app.add_option(
         "--grpc-stream-max-in-flight", config.stream_max_in_flight,
         "Requests of one ModelStreamInfer stream that may be queued, running or awaiting "
         "their response's write at once; at the bound the server stops reading that stream "
         "until one is answered, so a client that sends faster than it reads cannot make the "
         "server buffer without bound")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option(
         "--grpc-coalesce-answers", config.coalesce_answers,
         "When one execution answers several ModelInfer calls that came over the same TCP "
         "connection (a client, or a load balancer, with many calls in flight on one channel), "
         "hold the connection's writes (TCP_CORK) while they are sent, so that they leave "
         "together instead of one network segment each: less server CPU per request under "
         "load. Answers on their own connection, streams and HTTP are sent as before")
      ->capture_default_str()
      ->group("gRPC front end");
  GrpcConnectionOptions& c = grpc.connections;
  app.add_option("--grpc-max-connection-age-ms", c.max_connection_age_ms,
                 "Close each client connection after this long (the client reconnects): behind an "
                 "L4 load balancer (kube-proxy, cloud LBs), which balances connections and not "
                 "calls, long-lived clients then spread over the replicas. 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-max-connection-age-grace-ms", c.max_connection_age_grace_ms,
                 "How long calls in flight on an aged connection may still take. 0: unbounded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-max-connection-idle-ms", c.max_connection_idle_ms,
                 "Close connections idle this long. 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-keepalive-time", c.keepalive_time_ms,
                 "Milliseconds between the server's keepalive pings. 0: gRPC's default (2 hours)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-keepalive-timeout", c.keepalive_timeout_ms,
                 "Milliseconds to wait for a keepalive ping's answer before closing. 0: gRPC's "
                 "default (20 s)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-keepalive-permit-without-calls", c.keepalive_permit_without_calls,
                 "Allow keepalive pings on connections without calls (both ways)")
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option(
         "--grpc-http2-max-pings-without-data", c.http2_max_pings_without_data,
         "Pings the server sends without data before it must wait for data. -1: gRPC's default")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option(
         "--grpc-http2-min-recv-ping-interval-without-data",
         c.http2_min_recv_ping_interval_without_data_ms,
         "Milliseconds a client must leave between pings without data; faster ones count as "
         "strikes. 0: gRPC's default (5 minutes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option(
         "--grpc-http2-max-ping-strikes", c.http2_max_ping_strikes,
         "Strikes before the server closes the connection (0: unlimited). -1: gRPC's default (2)")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-use-ssl", grpc.tls.enabled,
                 "TLS on the gRPC port, and on the HTTP port (needs --grpc-server-cert and "
                 "--grpc-server-key)")
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-use-ssl-mutual", grpc.tls.mutual,
                 "Mutual TLS: clients must present a certificate signed by --grpc-root-cert "
                 "(implies --grpc-use-ssl)")
      ->capture_default_str()
      ->group("gRPC front end");
  app.add_option("--grpc-server-cert", grpc.tls.server_cert,
                 "PEM certificate chain of the server (TLS)")
      ->group("gRPC front end");
  app.add_option("--grpc-server-key", grpc.tls.server_key, "PEM private key of the server (TLS)")
      ->group("gRPC front end");
  app.add_option("--grpc-root-cert", grpc.tls.root_cert,
                 "PEM CA certificate(s) that client certificates must be signed by (mutual TLS)")
      ->group("gRPC front end");
  app.add_option("--grpc-tls-reload-secs", grpc.tls.reload_secs,
                 "Seconds between reads of the TLS certificate, key and CA files: a certificate "
                 "rotated on disk serves new connections without a restart (0: read once at "
                 "start)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->group("gRPC front end");
  app.add_option(
         "--grpc-restricted-protocol", text.restricted_protocols,
         "<group>[,<group>...]:<header>=<value>: calls of these protocol groups (health, "
         "metadata, inference, model-config, model-repository, statistics, shared-memory, trace) "
         "must carry the "
         "header with that value (UNAUTHENTICATED without it, PERMISSION_DENIED with another "
         "value). Repeatable; grpc.health.v1 stays open")
      ->group("gRPC front end");
}

// The HTTP/REST front end.
// Listed under "HTTP front end" in --help.
void AddHttpFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  HttpServerOptions& http = config.http;
  app.add_option("--allow-http", text.allow_http,
                 "Serve the KServe v2 REST API (Triton's HTTP endpoints, tritonclient.http, curl) "
                 "beside gRPC. With --grpc-use-ssl the HTTP port speaks TLS with the same "
                 "certificate, key, client CA (--grpc-use-ssl-mutual) and reload "
                 "(--grpc-tls-reload-secs), and refuses plaintext")
      ->check(CLI::IsMember({"true", "false"}))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-address", http.address, "Address the HTTP endpoint listens on")
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-port", http.port, "Port of the HTTP endpoint; 0 picks a free one (logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option(
         "--http-max-body-bytes", http.max_body_bytes,
         "Largest HTTP request body, also once decompressed (413 beyond it); at most 4294967295")
      ->check(CLI::Range(size_t{1}, size_t{4294967295}))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-max-connections", http.max_connections,
                 "Open HTTP connections the server keeps; a request on one more gets 503 and its "
                 "connection closes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option(
         "--http-timeout-ms", http.timeout_ms,
         "An HTTP connection that sends or takes nothing for this long is closed (idle keep-alive "
         "connections, bodies that stall)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-header-timeout-ms", http.header_timeout_ms,
                 "A request's line and headers must arrive within this of its first byte, however "
                 "slowly they "
                 "trickle in; past it the server answers 408 and closes the connection")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-max-buffered-bytes", http.max_buffered_bytes,
                 "Request bytes the HTTP front end holds for all connections together (bodies "
                 "being received or "
                 "waiting for their answer, inflated bodies included); a request that would pass "
                 "it gets 503 with "
                 "Retry-After and its connection closes")
      ->check(CLI::Range(size_t{1}, std::numeric_limits<size_t>::max()))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-max-inflate-ratio", http.max_inflate_ratio,
                 "A gzip or deflate request body may inflate to this many times its compressed "
                 "size (and always to "
                 "1 MiB), within --http-max-body-bytes; beyond it 413")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-compression-threads", http.compression_threads,
                 "Threads that inflate compressed request bodies (and parse them) off the event "
                 "loop, and compress "
                 "answers of 64 KiB or more for clients that accept gzip or deflate, so that a "
                 "model's instance does "
                 "not wait for the compression; 0: the event loop inflates and the thread that "
                 "answered (the "
                 "model's worker) compresses")
      ->check(CLI::Range(0, 64))
      ->capture_default_str()
      ->group("HTTP front end");
  app.add_option("--http-restricted-api", text.http_restricted_apis,
                 "<group>[,<group>...]:<header>=<value>: HTTP requests of these API groups (as "
                 "--grpc-restricted-protocol) must carry the header with that value (401 without "
                 "it, 403 with "
                 "another value). Repeatable")
      ->group("HTTP front end");
}

// Prometheus metrics and GPU telemetry.
// Listed under "Metrics" in --help.
void AddMetricsFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  app.add_option("--allow-metrics", config.allow_metrics,
                 "Serve Prometheus metrics at http://<--metrics-address>:<--metrics-port>/metrics")
      ->capture_default_str()
      ->group("Metrics");
  app.add_option("--metrics-address", config.metrics_address,
                 "Address the metrics endpoint listens on")
      ->capture_default_str()
      ->group("Metrics");
  app.add_option("--metrics-port", config.metrics_port,
                 "Port of the Prometheus endpoint; 0 picks a free one (logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str()
      ->group("Metrics");
  app.add_option(
         "--metrics-interval-ms", config.metrics_interval_ms,
         "How often GPU telemetry (NVML: utilisation, memory, power, temperature) is sampled")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str()
      ->group("Metrics");
}

// Request tracing (OpenTelemetry). Listed under "Tracing" in --help.
void AddTracingFlags(CLI::App& app, TextFlags& text) {
  app.add_option(
         "--trace-config", text.trace_configs,
         "Request tracing, as Triton spells it; repeatable. level=OFF|TIMESTAMPS (default OFF), "
         "rate=N (trace one request in N, default 1000; a request carrying a W3C traceparent is "
         "traced "
         "whatever the rate), count=N (traces to take, -1: no limit), mode=opentelemetry (the only "
         "mode). "
         "The exporter (OTLP/HTTP, protobuf, plain HTTP only): "
         "opentelemetry,url=http://host:port/v1/traces "
         "(default http://localhost:4318/v1/traces), opentelemetry,resource=key=value "
         "(repeatable), "
         "opentelemetry,bsp_max_queue_size=N (2048), opentelemetry,bsp_schedule_delay=MS (5000), "
         "opentelemetry,bsp_max_export_batch_size=N (512). Level, rate and count change at run "
         "time "
         "through the trace settings API (guard it with the 'trace' group); the URL does not")
      ->group("Tracing");
}

// Every flag, bound to `config` (or to `text` for those converted after parsing), by group.
// Quotas per client on inference requests, over both front ends (frontend/client_quotas.h).
// Listed under "Client quotas" in --help.
void AddQuotaFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  app.add_option(
         "--client-quota", text.client_quotas,
         "A quota per client on inference requests (gRPC and HTTP): rate=R[,burst=B][,in-flight=N] "
         "for every client, or rate=...[,...]:CLIENT for one (repeatable). R requests/s refill a "
         "bucket of B (default max(1, R)); N caps the requests in flight. A request over either "
         "is refused at once with RESOURCE_EXHAUSTED / 429 and a time to retry after (gRPC: "
         "trailing metadata retry-after and grpc-retry-pushback-ms; HTTP: Retry-After). A client "
         "is the value of --client-identity-header from a --trusted-proxies peer, else its TLS "
         "client certificate's subject (gRPC with mutual TLS), else its IP address")
      ->group("Client quotas");
  app.add_option("--client-identity-header", text.client_identity_header,
                 "A request header naming the client (e.g. x-client-id, set by the ingress); "
                 "believed only from --trusted-proxies")
      ->group("Client quotas");
  app.add_option("--trusted-proxies", text.trusted_proxies,
                 "Peers whose --client-identity-header is believed: addresses or CIDR blocks, "
                 "comma-separated (e.g. 10.0.0.0/8,fd00::/8)")
      ->group("Client quotas");
  app.add_option("--client-quota-max-clients", config.quotas.max_clients,
                 "Clients tracked at once; idle ones are forgotten, and new clients past this "
                 "share one quota")
      ->check(CLI::Range(size_t{1}, size_t{10000000}))
      ->capture_default_str()
      ->group("Client quotas");
  app.add_option("--client-quota-metrics-clients", config.quotas.named_clients,
                 "Clients named in sluice_client_* metrics (the busiest, each named for good "
                 "once it is); the rest are client=\"other\"")
      ->check(CLI::Range(size_t{0}, size_t{1000}))
      ->capture_default_str()
      ->group("Client quotas");
}

// The quota flags into config->quotas (client_quotas stays false without a --client-quota).
Status FinishQuotas(const TextFlags& text, ServerConfig* config) {
  config->client_quotas = !text.client_quotas.empty();
  bool have_default = false;
  for (const std::string& each : text.client_quotas) {
    SLUICE_ASSIGN_OR_RETURN(ClientQuotaRule rule, ParseClientQuota(each));
    if (rule.client.empty()) {
      if (have_default)
        return absl::InvalidArgumentError("--client-quota: the default quota is given twice");
      have_default = true;
      config->quotas.quota = rule.quota;
    } else if (!config->quotas.clients.emplace(rule.client, rule.quota).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--client-quota: client '", rule.client, "' is given twice"));
    }
  }
  ClientIdentityOptions& identity = config->quotas.identity;
  identity.header = absl::AsciiStrToLower(text.client_identity_header);
  if (!identity.header.empty() &&
      identity.header.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_.") !=
          std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--client-identity-header '", text.client_identity_header,
        "': a header name is letters, digits, '-', '_' and '.' (gRPC metadata keys are)"));
  }
  if (!text.trusted_proxies.empty()) {
    StatusOr<std::vector<IpNetwork>> proxies = IpNetwork::ParseList(text.trusted_proxies);
    if (!proxies.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--trusted-proxies: ", proxies.status().message()));
    identity.trusted_proxies = *std::move(proxies);
  }
  if (!identity.header.empty() && identity.trusted_proxies.empty()) {
    return absl::InvalidArgumentError(
        "--client-identity-header needs --trusted-proxies: a header any client can set names "
        "nobody; list the proxies (the ingress) that set it");
  }
  if (!config->client_quotas && (!identity.header.empty() || !identity.trusted_proxies.empty())) {
    return absl::InvalidArgumentError(
        "--client-identity-header and --trusted-proxies name clients for the quotas: give a "
        "--client-quota too");
  }
  return absl::OkStatus();
}

void AddFlags(CLI::App& app, ServerConfig& config, TextFlags& text) {
  AddServerFlags(app, config, text);
  AddModelFlags(app, config, text);
  AddGrpcFlags(app, config, text);
  AddHttpFlags(app, config, text);
  AddMetricsFlags(app, config, text);
  AddTracingFlags(app, text);
  AddQuotaFlags(app, config, text);
}

// --cache-config values (Triton's "<cache>,<key>=<value>", one setting each, repeatable) and the
// older --response-cache-byte-size, into the local cache's size.
Status ParseCacheConfig(const TextFlags& text, ServerConfig* config) {
  bool sized = false;
  for (const std::string& each : text.cache_configs) {
    const size_t comma = each.find(',');
    const std::string cache = each.substr(0, comma);
    if (cache != "local") {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-config ", each, ": cache '", cache,
                       "' is not available; Sluice has the local cache only "
                       "(--cache-config local,size=BYTES)"));
    }
    const std::string setting = comma == std::string::npos ? "" : each.substr(comma + 1);
    const size_t equals = setting.find('=');
    const std::string key = setting.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : setting.substr(equals + 1);
    if (key != "size" || equals == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-config ", each, ": the local cache takes one setting, size=BYTES"));
    }
    uint64_t bytes = 0;
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
        value.size() > 19 || (bytes = std::stoull(value)) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-config ", each,
                       ": size must be a positive number of bytes, found '", value, "'"));
    }
    config->response_cache_bytes = bytes;
    sized = true;
  }
  if (text.response_cache_byte_size >= 0) {
    if (sized) {
      return absl::InvalidArgumentError(
          "--response-cache-byte-size and --cache-config both size the cache: give one");
    }
    config->response_cache_bytes = static_cast<uint64_t>(text.response_cache_byte_size);
  }
  return absl::OkStatus();
}

// The checks across flags, and the conversions of the text flags.
Status Finish(const TextFlags& text, ServerConfig* config) {
  SLUICE_RETURN_IF_ERROR(ParseCacheConfig(text, config));
  SLUICE_ASSIGN_OR_RETURN(config->model_control_mode,
                          ParseModelControlMode(text.model_control_mode));
  SLUICE_ASSIGN_OR_RETURN(config->device, ParseDevicePolicy(text.device));
  StatusOr<CudnnBenchmarkMode> benchmark = ParseCudnnBenchmarkMode(text.cudnn_benchmark);
  if (!benchmark.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--cudnn-benchmark ", benchmark.status().message()));
  config->cudnn_benchmark = *benchmark;
  config->torchvision_ops = text.torchvision_ops == "on"    ? TorchvisionOps::kOn
                            : text.torchvision_ops == "off" ? TorchvisionOps::kOff
                                                            : TorchvisionOps::kAuto;
  if (!config->load_models.empty() && config->model_control_mode != ModelControlMode::kExplicit &&
      !(config->load_on_demand && config->model_control_mode == ModelControlMode::kPoll)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load-model needs --model-control-mode explicit, or poll with "
                     "--model-load-on-demand (in mode ",
                     text.model_control_mode, " every model loads)"));
  }
  if (config->load_on_demand && config->model_control_mode == ModelControlMode::kNone) {
    return absl::InvalidArgumentError(
        "--model-load-on-demand needs --model-control-mode explicit or poll (in mode "
        "none the loaded models never change)");
  }
  config->gpu_limits.clear();
  for (const std::string& each : text.gpu_limits) {
    SLUICE_ASSIGN_OR_RETURN(auto limit, ParseGpuLimit(each));
    const int gpu = std::stoi(limit.first.substr(5));  // "cuda:N"
    for (const auto& [seen, fraction] : config->gpu_limits) {
      if (seen == gpu)
        return absl::InvalidArgumentError(
            absl::StrCat("--model-load-gpu-limit: GPU ", gpu, " given twice"));
    }
    config->gpu_limits.emplace_back(gpu, limit.second);
  }
  if ((!config->gpu_limits.empty() || config->host_limit_bytes > 0) &&
      config->model_control_mode != ModelControlMode::kExplicit && !config->load_on_demand) {
    return absl::InvalidArgumentError(
        "a memory budget (--model-load-gpu-limit, --model-load-host-limit) needs "
        "--model-control-mode explicit, or --model-load-on-demand: otherwise a model "
        "unloaded for room would never load again");
  }
  if (config->allow_load_files && config->model_control_mode != ModelControlMode::kExplicit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--allow-load-files needs --model-control-mode explicit (in mode ",
                     text.model_control_mode, " nothing loads on request)"));
  }
  if (config->require_model_digests && config->model_digests.empty()) {
    return absl::InvalidArgumentError(
        "--require-model-digests needs the digests: give them with --model-digests FILE");
  }
  SLUICE_ASSIGN_OR_RETURN(config->trace, ParseTraceConfig(text.trace_configs));
  SLUICE_RETURN_IF_ERROR(FinishQuotas(text, config));
  config->restrictions.clear();
  for (const std::string& each : text.restricted_protocols) {
    SLUICE_ASSIGN_OR_RETURN(ProtocolRestriction restriction, ParseProtocolRestriction(each));
    config->restrictions.push_back(std::move(restriction));
  }
  SLUICE_RETURN_IF_ERROR(CheckRestrictionsDistinct(config->restrictions));
  config->http_restrictions.clear();
  for (const std::string& each : text.http_restricted_apis) {
    StatusOr<ProtocolRestriction> restriction = ParseProtocolRestriction(each);
    if (!restriction.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-restricted-api: ", restriction.status().message()));
    }
    config->http_restrictions.push_back(*std::move(restriction));
  }
  SLUICE_RETURN_IF_ERROR(
      CheckRestrictionsDistinct(config->http_restrictions, "--http-restricted-api"));
  config->allow_http = text.allow_http == "true";
  if (!text.model_cpus.empty()) {
    StatusOr<CpuChoice> cpus = ParseCpuChoice(text.model_cpus);
    if (!cpus.ok())
      return absl::InvalidArgumentError(absl::StrCat("--model-cpus: ", cpus.status().message()));
    config->model_cpus = *std::move(cpus);
  }
  return absl::OkStatus();
}

ServerConfig Defaults() {
  ServerConfig config;
  config.model_repository = SLUICE_DEFAULT_MODEL_REPOSITORY;
  config.grpc.port = 8001;
  config.http.port = 8000;
  return config;
}

constexpr char kDescription[] =
    "sluice-server: PyTorch inference (TorchScript and AOTInductor .pt2 packages) over the KServe "
    "v2 / Triton gRPC "
    "and REST protocols";

}  // namespace

StatusOr<ServerConfig> ParseServerFlags(const std::vector<std::string>& args) {
  CLI::App app{kDescription};
  ServerConfig config = Defaults();
  TextFlags text;
  AddFlags(app, config, text);
  std::vector<std::string> reversed(args.rbegin(),
                                    args.rend());  // CLI11 parses a vector from its back
  try {
    app.parse(reversed);
  } catch (const CLI::Success&) {
    return absl::InvalidArgumentError(
        "--help and --version print and exit: there is nothing to serve");
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(error.what());
  }
  SLUICE_RETURN_IF_ERROR(Finish(text, &config));
  return config;
}

std::variant<ServerConfig, int> ParseCommandLine(int argc, const char* const* argv) {
  CLI::App app{kDescription};
  ServerConfig config = Defaults();
  TextFlags text;
  AddFlags(app, config, text);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);  // prints --help, --version or the error
  }
  if (Status status = Finish(text, &config); !status.ok()) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n",
                 std::string(status.message()).c_str());
    return 2;
  }
  return config;
}

Status CheckStartupModels(const ServerConfig& config, const std::vector<RepositoryModel>& models) {
  for (const std::string& name : config.load_models) {
    const bool known =
        name == "*" || std::any_of(models.begin(), models.end(), [&](const RepositoryModel& model) {
          return model.name == name;
        });
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("--load-model ", name, ": the repository ",
                                                     config.model_repository,
                                                     " has no such model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
