// sluice-server: serves the TorchScript models of a Triton-layout model repository over the
// KServe v2 / Triton gRPC protocol. main() parses the command line (server_flags.h), probes the
// runtime, loads the operator libraries every model gets, starts the Server (server.h) and turns
// signals into its drain and shutdown; run as an operator library's probe, it is that and nothing
// else.
#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

#include "server/os/cpu_budget.h"
#include "server/core/logging.h"
#include "server/os/threads.h"
#include "server/runtime/operator_libraries.h"
#include "server/runtime/torch_backend.h"
#include "server/server.h"
#include "server/server_flags.h"

namespace {

// Every HTTP keep-alive connection holds a file descriptor, and a container's soft limit is often
// 1024 while its hard limit is far higher: take the hard limit.
void RaiseOpenFilesLimit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return;
  if (files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  spdlog::info("event=open_files_limit limit={}", static_cast<unsigned long long>(files.rlim_cur));
}

// --model-cpus: the front ends' CPUs for this thread and every thread started after it, the
// models' CPUs recorded for their workers (thread_name.h). Call it before any thread starts.
// The split for the log ("models=0 front_ends=1"), or why it is refused.
// `choice` becomes the models' CPU list (a "first:N" or "last:N" resolved against the mask).
struct ModelCpuSplit {
  std::string log;
  // Non-empty when the mask holds more CPUs than the cgroup quota lets the process use: a shared
  // pool (a Kubernetes pod without dedicated CPUs), where other processes, and other replicas
  // given the same --model-cpus, run on the models' CPUs too.
  std::string shared;
};
absl::StatusOr<ModelCpuSplit> SplitModelCpus(sluice::CpuChoice& choice) {
  std::optional<std::vector<int>> allowed = sluice::AllowedCpus();
  if (!allowed) {
    return absl::InternalError(
        absl::StrCat("cannot read the CPUs this process may use: ", strerror(errno)));
  }
  ModelCpuSplit result;
  // This thread's mask is still the whole of `allowed` here.
  result.shared = sluice::SharedCpusWarning(sluice::DetectCpuBudget(), allowed->size());
  absl::StatusOr<std::vector<int>> model_cpus = sluice::ChooseCpus(choice, *allowed);
  if (!model_cpus.ok()) return model_cpus.status();
  choice = sluice::CpuChoice{*model_cpus};
  absl::StatusOr<sluice::CpuSplit> split = sluice::SplitCpus(choice.list, *allowed);
  if (!split.ok()) return split.status();
  if (!sluice::KeepThreadsFromHereOn(split->front_ends)) {
    return absl::InternalError(
        absl::StrCat("the kernel refused the front ends' CPUs: ", strerror(errno)));
  }
  sluice::SetModelWorkerCpus(split->model);
  result.log = absl::StrCat("models=", absl::StrJoin(split->model, ","),
                            " front_ends=", absl::StrJoin(split->front_ends, ","));
  return result;
}

// SIGINT and SIGTERM, blocked so that main's thread takes them synchronously (sigwait). Call it
// before any thread starts (CUDA and cuDNN start threads as soon as the probe touches a GPU), so
// that every thread inherits the mask.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// --print-env: the environment report with the operator libraries and their problems. Exit
// status 0, or 1 when a start-up library failed.
int PrintEnvironment(const sluice::ServerConfig& config, const sluice::RuntimeInfo& runtime,
                     const sluice::OperatorLibraries& libraries,
                     const absl::StatusOr<std::vector<std::string>>& library_notes) {
  std::string libraries_report = sluice::FormatOperatorLibraries(libraries.List());
  if (!library_notes.ok()) {
    absl::StrAppend(&libraries_report, "problem: ", library_notes.status().message(), "\n");
  }
  for (const std::string& note : library_notes.value_or(std::vector<std::string>{})) {
    absl::StrAppend(&libraries_report, "problem: ", note, "\n");
  }
  std::fputs(
      sluice::FormatEnvironment(runtime, sluice::CudnnBenchmarkModeName(config.cudnn_benchmark),
                                config.device, libraries_report)
          .c_str(),
      stdout);
  return library_notes.ok() ? EXIT_SUCCESS : EXIT_FAILURE;
}

// The process's set-up as the log's first lines: the open files limit (raised), the CPU split,
// the thread policy (`batch_policy`: SCHED_BATCH was taken, else why not in `batch_errno`).
void LogProcessSetup(const sluice::ServerConfig& config, const ModelCpuSplit& cpu_split,
                     bool batch_policy, int batch_errno) {
  RaiseOpenFilesLimit();
  if (!cpu_split.log.empty()) spdlog::info("event=cpu_split {}", cpu_split.log);
  if (!cpu_split.shared.empty()) {
    spdlog::warn("event=model_cpus_shared reason=\"{}\"", cpu_split.shared);
  }
  if (!config.model_threads_first) return;
  if (batch_policy) {
    spdlog::info(
        "event=thread_policy front_ends=SCHED_BATCH workers=SCHED_OTHER batchers=\"SCHED_BATCH; "
        "SCHED_OTHER with a queue delay, latency target or delaying queue policy, and for "
        "sequences\"");
  } else {
    spdlog::warn("event=thread_policy_refused reason=\"{}\" action=\"every thread SCHED_OTHER\"",
                 strerror(batch_errno));
  }
}

// From the first shutdown signal to the end: models still loading are abandoned, readiness goes
// at once, the server serves on for --shutdown-delay-seconds (a second signal cuts it short),
// then the calls in flight have --shutdown-grace-seconds. The exit status.
int ServeUntilSignalled(sluice::Server& server, const sluice::ServerConfig& config,
                        sigset_t* signals) {
  int signal_number = 0;
  sigwait(signals, &signal_number);
  if (server.load_failed()) {
    server.Shutdown(0);
    return EXIT_FAILURE;
  }
  if (server.loading()) {
    spdlog::info(
        "event=shutdown_during_load signal={} action=\"abandoning the models still loading\"",
        strsignal(signal_number));
    server.AbandonLoading();
    // Abandoning can race a start-up failure that was already on its way.
    if (server.load_failed()) {
      server.Shutdown(0);
      return EXIT_FAILURE;
    }
  }
  // Drain: not ready at once (probes and load balancers stop sending), still serving for the
  // delay, then no new calls and the ones in flight finish within the grace period.
  server.BeginDrain();
  spdlog::info("event=draining signal={} delay_s={} grace_s={}", strsignal(signal_number),
               config.shutdown_delay_seconds, config.shutdown_grace_seconds);
  if (config.shutdown_delay_seconds > 0) {
    const auto nanos = static_cast<long long>(config.shutdown_delay_seconds * 1e9);
    timespec timeout{static_cast<time_t>(nanos / 1000000000),
                     static_cast<long>(nanos % 1000000000)};
    if (sigtimedwait(signals, nullptr, &timeout) > 0) {
      spdlog::info("event=drain_delay_cut reason=\"second signal\"");
    }
  }
  server.Shutdown(static_cast<int>(config.shutdown_grace_seconds * 1000));
  spdlog::info("event=stopped");
  return EXIT_SUCCESS;
}

}  // namespace

int main(int argc, char** argv) {
  // The child side of an operator library's probe (server/runtime/operator_libraries.h): load it
  // after the libraries the server has, say what it registered, exit.
  if (argc >= 2 && std::string(argv[1]) == sluice::kProbeArgument) {
    return sluice::RunOperatorLibraryProbe(argc, argv);
  }
  // gRPC's locks are absl::Mutex. Debian builds Abseil without NDEBUG, which leaves absl's
  // deadlock detection on: every lock and unlock updates a global lock-order graph, about 7 % of
  // a trivial request's CPU (docs/design/request-path-costs.md). Sluice's own locks are std::mutex,
  // checked by clang's thread-safety analysis and ThreadSanitizer instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::variant<sluice::ServerConfig, int> parsed = sluice::ParseCommandLine(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  sluice::ServerConfig& config = std::get<sluice::ServerConfig>(parsed);

  // Before any thread starts: every thread started from here on inherits it (thread_name.h).
  ModelCpuSplit cpu_split;  // for the log, once it is configured
  if (!config.model_cpus.empty()) {
    absl::StatusOr<ModelCpuSplit> split = SplitModelCpus(config.model_cpus);
    if (!split.ok()) {
      std::fprintf(stderr, "--model-cpus: %s\n", std::string(split.status().message()).c_str());
      return EXIT_FAILURE;
    }
    cpu_split = *std::move(split);
  }
  const bool batch_policy = config.model_threads_first && sluice::RunThreadsFromHereAsBatch();
  const int batch_errno = errno;
  sigset_t signals = BlockShutdownSignals();
  // A client that goes away while an answer is written must not kill the server: the write fails
  // with EPIPE instead (gRPC and the HTTP transport send with MSG_NOSIGNAL; this covers any other
  // write to a socket).
  std::signal(SIGPIPE, SIG_IGN);

  sluice::ConfigureCudnn({config.cudnn_benchmark == sluice::CudnnBenchmarkMode::kOn,
                          config.cudnn_deterministic, config.allow_tf32});
  // With --device cpu no GPU is touched (a probe holds memory on every GPU it runs on).
  const sluice::RuntimeInfo runtime =
      sluice::ProbeRuntime(config.device != sluice::DevicePolicy::kCpu);
  // Every model's operator libraries, loaded before the server starts (and before --print-env,
  // which lists them). Never unloaded: this outlives the server.
  // --model-digests: model files and the libraries models name load from checked copies in a
  // private directory of this process's, removed at exit.
  std::unique_ptr<sluice::ModelPinning> pinning;
  if (!config.model_digests.empty()) {
    sluice::ModelPinning::Options pin;
    pin.manifest = config.model_digests;
    pin.repository = config.model_repository;
    pin.require = config.require_model_digests;
    std::error_code ec;
    pin.directory =
        std::filesystem::temp_directory_path(ec) / ("sluice-pinned-" + std::to_string(getpid()));
    absl::StatusOr<std::unique_ptr<sluice::ModelPinning>> made =
        sluice::ModelPinning::Create(std::move(pin));
    if (!made.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(made.status().message()).c_str());
      return EXIT_FAILURE;
    }
    pinning = *std::move(made);
  }
  sluice::OperatorLibraries::Options library_options;
  library_options.allowed_dirs.assign(config.operator_library_dirs.begin(),
                                      config.operator_library_dirs.end());
  library_options.pinning = pinning.get();
  sluice::OperatorLibraries libraries(library_options);
  const absl::StatusOr<std::vector<std::string>> library_notes =
      sluice::LoadStartupOperatorLibraries(config, &libraries);
  if (config.print_env) return PrintEnvironment(config, runtime, libraries, library_notes);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  LogProcessSetup(config, cpu_split, batch_policy, batch_errno);
  if (!library_notes.ok()) {
    spdlog::critical("event=start_failed reason=\"{}\"", library_notes.status().message());
    return EXIT_FAILURE;
  }
  for (const std::string& note : *library_notes) {
    spdlog::warn("event=operator_libraries problem=\"{}\"", note);
  }

  // A start-up load that fails for every model wakes the sigwait below.
  auto server = sluice::Server::Start(config, runtime, &libraries, [] { kill(getpid(), SIGTERM); });
  if (!server.ok()) {
    spdlog::critical("event=start_failed reason=\"{}\"", server.status().message());
    return EXIT_FAILURE;
  }
  return ServeUntilSignalled(**server, config, &signals);
}
