#include "server/server_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(ServerFlagsTest, DefaultsAreTheDocumentedOnes) {
  auto config = ParseServerFlags({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->model_repository.empty());
  EXPECT_EQ(config->grpc.port, 8001);
  EXPECT_EQ(config->grpc.address, "0.0.0.0");
  EXPECT_EQ(config->metrics_port, 8002);
  EXPECT_EQ(config->device, DevicePolicy::kAuto);
  EXPECT_EQ(config->cudnn_benchmark, CudnnBenchmarkMode::kAuto);
  EXPECT_EQ(config->model_control_mode, ModelControlMode::kNone);
  EXPECT_TRUE(config->restrictions.empty());
  EXPECT_TRUE(config->strict_readiness);
  EXPECT_TRUE(config->warmup);
  EXPECT_EQ(config->shutdown_grace_seconds, 30);
  EXPECT_FALSE(config->allow_shared_memory);  // client shared memory off, as Triton 26.05+
  EXPECT_EQ(config->http.compression_threads, 2);
  EXPECT_FALSE(config->allow_load_files);  // model files sent with loads: refused unless asked for
  EXPECT_EQ(config->load_files_max_bytes, 1ull << 30);
  EXPECT_EQ(config->load_files_disk_bytes, 8ull << 30);
  EXPECT_EQ(config->response_cache_bytes, 0u);  // no response cache unless asked for
  EXPECT_TRUE(config->coalesce_answers);
  EXPECT_EQ(config->torchvision_ops,
            TorchvisionOps::kAuto);  // the bundled torchvision operators, when there
  EXPECT_TRUE(config->operator_libraries.empty());
  EXPECT_TRUE(config->operator_library_dirs.empty());
  EXPECT_TRUE(config->auto_complete_config);  // on, as Triton's
}

TEST(ServerFlagsTest, AutoCompleteConfigTurnsOffWithTritonsFlag) {
  auto config = ParseServerFlags({"--disable-auto-complete-config"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->auto_complete_config);
}

TEST(ServerFlagsTest, OperatorLibraries) {
  auto config =
      ParseServerFlags({"--operator-library", "/opt/ops/liba.so", "--operator-library", "libb.so",
                        "--operator-library-dir", "/tmp", "--torchvision-ops", "off"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->operator_libraries, (std::vector<std::string>{"/opt/ops/liba.so", "libb.so"}));
  EXPECT_EQ(config->operator_library_dirs, (std::vector<std::string>{"/tmp"}));
  EXPECT_EQ(config->torchvision_ops, TorchvisionOps::kOff);
  EXPECT_EQ(ParseServerFlags({"--torchvision-ops", "on"})->torchvision_ops, TorchvisionOps::kOn);
  EXPECT_FALSE(ParseServerFlags({"--torchvision-ops", "sometimes"}).ok());
  auto missing = ParseServerFlags({"--operator-library-dir", "/nonexistent/ops"});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--operator-library-dir"));
}

// Triton's spellings: --cache-config local,size=BYTES (either form of the flag) and the older
// --response-cache-byte-size; anything else is refused with what to write instead.
TEST(ServerFlagsTest, ResponseCacheConfig) {
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{{"--cache-config", "local,size=1048576"},
                                             {"--cache-config=local,size=1048576"},
                                             {"--response-cache-byte-size", "1048576"}}) {
    auto config = ParseServerFlags(flags);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->response_cache_bytes, 1048576u) << flags[0];
  }
  auto off = ParseServerFlags({"--response-cache-byte-size", "0"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->response_cache_bytes, 0u);
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& each : std::vector<Case>{
           {{"--cache-config", "redis,host=localhost"},
            "cache 'redis' is not available; Sluice has the local cache only"},
           {{"--cache-config", "local,size=0"},
            "size must be a positive number of bytes, found '0'"},
           {{"--cache-config", "local,size=1MB"}, "found '1MB'"},
           {{"--cache-config", "local,size=99999999999999999999"}, "found '99999999999999999999'"},
           {{"--cache-config", "local"}, "the local cache takes one setting, size=BYTES"},
           {{"--cache-config", "local,bytes=10"}, "the local cache takes one setting, size=BYTES"},
           {{"--cache-config", "local,size=10", "--response-cache-byte-size", "10"},
            "both size the cache"},
       }) {
    auto config = ParseServerFlags(each.flags);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << each.flags[1];
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(each.message)) << each.flags[1];
  }
}

TEST(ServerFlagsTest, LoadFilesOnlyInExplicitMode) {
  auto config = ParseServerFlags({"--model-control-mode", "explicit", "--allow-load-files", "true",
                                  "--load-files-dir", "/var/sluice/files", "--load-files-max-bytes",
                                  "1000", "--load-files-disk-bytes", "5000"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->allow_load_files);
  EXPECT_EQ(config->load_files_dir, "/var/sluice/files");
  EXPECT_EQ(config->load_files_max_bytes, 1000u);
  EXPECT_EQ(config->load_files_disk_bytes, 5000u);
  auto polling = ParseServerFlags({"--model-control-mode", "poll", "--allow-load-files", "true"});
  EXPECT_THAT(std::string(polling.status().message()),
              HasSubstr("--allow-load-files needs --model-control-mode explicit"));
}

// Pinned model code: the manifest must exist; requiring digests needs one.
TEST(ServerFlagsTest, ModelDigestsAndRequiringThem) {
  const std::string manifest = ::testing::TempDir() + "/sluice-flags-digests";
  { std::ofstream(manifest) << "# none yet\n"; }
  auto config = ParseServerFlags({"--model-digests", manifest, "--require-model-digests", "true"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_digests, manifest);
  EXPECT_TRUE(config->require_model_digests);
  EXPECT_FALSE(ParseServerFlags({})->require_model_digests);
  EXPECT_THAT(std::string(ParseServerFlags({"--require-model-digests", "true"}).status().message()),
              HasSubstr("--require-model-digests needs the digests"));
  EXPECT_FALSE(ParseServerFlags({"--model-digests", manifest + ".missing"}).ok());
}

// Triton's name and form (--allow-client-shm=true) and the older --allow-shared-memory.
TEST(ServerFlagsTest, ClientQuotasAndWhoAClientIs) {
  auto off = ParseServerFlags({});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->client_quotas);
  EXPECT_EQ(off->quotas.max_clients, 10000u);
  EXPECT_EQ(off->quotas.named_clients, 10u);

  auto on =
      ParseServerFlags({"--client-quota", "rate=50,burst=100,in-flight=8", "--client-quota",
                        "rate=500:CN=batch,O=Acme", "--client-identity-header", "X-Client-Id",
                        "--trusted-proxies", "10.0.0.0/8,fd00::/8", "--client-quota-max-clients",
                        "50", "--client-quota-metrics-clients", "3"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->client_quotas);
  EXPECT_EQ(on->quotas.quota.rate, 50);
  EXPECT_EQ(on->quotas.quota.burst, 100);
  EXPECT_EQ(on->quotas.quota.max_in_flight, 8);
  ASSERT_EQ(on->quotas.clients.count("CN=batch,O=Acme"), 1u);
  EXPECT_EQ(on->quotas.clients.at("CN=batch,O=Acme").rate, 500);
  EXPECT_EQ(on->quotas.identity.header, "x-client-id");  // gRPC metadata keys are lower case
  ASSERT_EQ(on->quotas.identity.trusted_proxies.size(), 2u);
  EXPECT_EQ(on->quotas.identity.trusted_proxies[1].ToString(), "fd00::/8");
  EXPECT_EQ(on->quotas.max_clients, 50u);
  EXPECT_EQ(on->quotas.named_clients, 3u);

  const struct {
    std::vector<std::string> args;
    const char* says;
  } refused[] = {
      {{"--client-quota", "rate=1", "--client-quota", "rate=2"}, "default quota is given twice"},
      {{"--client-quota", "rate=1:a", "--client-quota", "rate=2:a"}, "client 'a' is given twice"},
      {{"--client-quota", "speed=1"}, "unknown setting 'speed'"},
      {{"--client-quota", "rate=1", "--client-identity-header", "x-id"}, "needs --trusted-proxies"},
      {{"--client-quota", "rate=1", "--client-identity-header", "x id", "--trusted-proxies",
        "10.0.0.1"},
       "a header name is"},
      {{"--client-quota", "rate=1", "--trusted-proxies", "10.0.0.0/99"}, "--trusted-proxies:"},
      {{"--trusted-proxies", "10.0.0.1"}, "give a --client-quota too"},
      {{"--client-quota", "rate=1", "--client-quota-max-clients", "0"},
       "--client-quota-max-clients"},
  };
  for (const auto& each : refused) {
    auto parsed = ParseServerFlags(each.args);
    ASSERT_FALSE(parsed.ok()) << each.says;
    EXPECT_NE(parsed.status().message().find(each.says), std::string::npos)
        << parsed.status().message();
  }
}

TEST(ServerFlagsTest, ClientSharedMemoryFlagAndItsOlderName) {
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{{"--allow-client-shm=true"},
                                             {"--allow-client-shm", "true"},
                                             {"--allow-shared-memory", "true"}}) {
    auto config = ParseServerFlags(flags);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(config->allow_shared_memory) << flags[0];
  }
  auto off = ParseServerFlags({"--allow-shared-memory", "false"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->allow_shared_memory);
  EXPECT_TRUE(
      off->client_shm_keys.empty());  // no key may be registered until the operator names some
}

TEST(ServerFlagsTest, ClientSharedMemoryKeysAreCommaSeparatedPrefixes) {
  auto two = ParseServerFlags({"--allow-client-shm=true", "--client-shm-keys=/sluice_,/client_"});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->client_shm_keys, (std::vector<std::string>{"/sluice_", "/client_"}));
  auto every = ParseServerFlags({"--allow-client-shm=true", "--client-shm-keys", "*"});
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_EQ(every->client_shm_keys, (std::vector<std::string>{"*"}));
  for (const char* bad : {"sluice_", "/a/b", "/a,,/b", ""}) {
    auto refused =
        ParseServerFlags({"--allow-client-shm=true", std::string("--client-shm-keys=") + bad});
    EXPECT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--client-shm-keys: ")) << bad;
  }
}

TEST(ServerFlagsTest, CoalescingAnswersCanBeTurnedOff) {
  auto off = ParseServerFlags({"--grpc-coalesce-answers", "false"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->coalesce_answers);
  EXPECT_FALSE(ParseServerFlags({"--grpc-coalesce-answers", "sometimes"}).ok());
}

TEST(ServerFlagsTest, EveryKindOfFlagReachesTheConfig) {
  auto config = ParseServerFlags({"--model-repository",
                                  "/models",
                                  "--model-control-mode",
                                  "explicit",
                                  "--load-model",
                                  "a",
                                  "--load-model",
                                  "b",
                                  "--grpc-port",
                                  "0",
                                  "--grpc-address",
                                  "127.0.0.1",
                                  "--device",
                                  "cpu",
                                  "--cudnn-benchmark",
                                  "off",
                                  "--grpc-restricted-protocol",
                                  "model-repository,statistics:admin-key=s3cret",
                                  "--grpc-restricted-protocol",
                                  "inference:tenant=x",
                                  "--max-queued-bytes",
                                  "1024",
                                  "--shutdown-delay-seconds",
                                  "2.5",
                                  "--grpc-max-connection-age-ms",
                                  "60000",
                                  "--grpc-use-ssl",
                                  "true",
                                  "--warmup",
                                  "false",
                                  "--print-env"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_repository, "/models");
  EXPECT_EQ(config->model_control_mode, ModelControlMode::kExplicit);
  EXPECT_THAT(config->load_models, ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(config->grpc.port, 0);
  EXPECT_EQ(config->grpc.address, "127.0.0.1");
  EXPECT_EQ(config->device, DevicePolicy::kCpu);
  EXPECT_EQ(config->cudnn_benchmark, CudnnBenchmarkMode::kOff);
  ASSERT_EQ(config->restrictions.size(), 2u);
  EXPECT_EQ(config->restrictions[0].key, "admin-key");
  EXPECT_EQ(config->restrictions[0].groups.size(), 2u);
  EXPECT_EQ(config->max_queued_bytes, 1024u);
  EXPECT_DOUBLE_EQ(config->shutdown_delay_seconds, 2.5);
  EXPECT_EQ(config->grpc.connections.max_connection_age_ms, 60000);
  EXPECT_TRUE(config->grpc.tls.enabled);
  EXPECT_FALSE(config->warmup);
  EXPECT_TRUE(config->print_env);
}

// Each refusal names what was wrong.
TEST(ServerFlagsTest, RefusesBadFlagsWithTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--device", "tpu"}, "--device"},
      {{"--cudnn-benchmark", "sometimes"}, "--cudnn-benchmark"},
      {{"--model-control-mode", "manual"}, "--model-control-mode"},
      {{"--log-level", "loud"}, "--log-level"},
      {{"--grpc-port", "70000"}, "--grpc-port"},
      {{"--metrics-port", "-1"}, "--metrics-port"},
      {{"--metrics-interval-ms", "5"}, "--metrics-interval-ms"},
      {{"--grpc-max-message-bytes", "100"}, "--grpc-max-message-bytes"},
      {{"--max-queue-size", "0"}, "--max-queue-size"},
      {{"--repository-poll-secs", "0"}, "--repository-poll-secs"},
      {{"--shutdown-grace-seconds", "-3"}, "--shutdown-grace-seconds"},
      {{"--grpc-http2-max-ping-strikes", "-2"}, "--grpc-http2-max-ping-strikes"},
      {{"--strict-readiness", "maybe"}, "--strict-readiness"},
      {{"--model-cpus", "1-x"},
       "--model-cpus: \"1-x\" in the CPU list \"1-x\" is not a CPU number"},
      {{"--model-cpus", ""}, "--model-cpus"},
      {{"--model-cpus", "last:0"},
       "--model-cpus: \"last:0\" is not last:N with N a number of CPUs from 1 to 1024"},
      {{"--model-cpus", "first:two"}, "--model-cpus: \"first:two\" is not first:N"},
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"--load-model", "a"},
       "--load-model needs --model-control-mode explicit, or poll with --model-load-on-demand (in "
       "mode none every model loads)"},
      {{"--model-control-mode", "poll", "--load-model", "a"},
       "or poll with --model-load-on-demand"},
      {{"--model-load-on-demand", "true"},
       "--model-load-on-demand needs --model-control-mode explicit or poll"},
      {{"--model-control-mode", "explicit", "--model-load-gpu-limit", "0:1.5"},
       "expected <gpu>:<fraction>"},
      {{"--model-control-mode", "explicit", "--model-load-gpu-limit", "x:0.5"},
       "expected <gpu>:<fraction>"},
      {{"--model-control-mode", "explicit", "--model-load-gpu-limit", "0"},
       "expected <gpu>:<fraction>"},
      {{"--model-control-mode", "explicit", "--model-load-gpu-limit", "0:0.5",
        "--model-load-gpu-limit", "0:0.6"},
       "GPU 0 given twice"},
      {{"--model-load-host-limit", "1000"}, "would never load again"},
      {{"--model-control-mode", "poll", "--model-load-gpu-limit", "0:0.5"},
       "would never load again"},
      {{"--model-control-mode", "explicit", "--model-load-wait-secs", "0"},
       "--model-load-wait-secs"},
      {{"--model-control-mode", "poll", "--load-model", "a"}, "in mode poll"},
      {{"--grpc-restricted-protocol", "logging:key=value"}, "logging"},
      {{"--grpc-restricted-protocol", "inference"}, "inference"},
      {{"--grpc-restricted-protocol", "inference:a=1", "--grpc-restricted-protocol",
        "inference:b=2"},
       "inference"},
      {{"--help"}, "help"},
  };
  for (const auto& [args, words] : cases) {
    auto config = ParseServerFlags(args);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
    EXPECT_THAT(config.status().message(), HasSubstr(words)) << args[0];
  }
}

TEST(ServerFlagsTest, LoadOnDemandAndMemoryBudget) {
  auto defaults = ParseServerFlags({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->load_on_demand);
  EXPECT_TRUE(defaults->gpu_limits.empty());
  EXPECT_EQ(defaults->host_limit_bytes, 0u);
  EXPECT_EQ(defaults->min_residency_secs, 10);
  EXPECT_EQ(defaults->load_retry_secs, 10);
  EXPECT_EQ(defaults->load_wait_secs, 60);
  auto config = ParseServerFlags({"--model-control-mode", "poll", "--model-load-on-demand", "true",
                                  "--load-model", "a", "--model-load-gpu-limit", "1:0.25",
                                  "--model-load-gpu-limit", "0:1", "--model-load-host-limit",
                                  "1048576", "--model-min-residency-secs", "0.5",
                                  "--model-load-retry-secs", "2", "--model-load-wait-secs", "5"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->load_on_demand);
  ASSERT_EQ(config->gpu_limits.size(), 2u);
  EXPECT_EQ(config->gpu_limits[0], std::make_pair(1, 0.25));
  EXPECT_EQ(config->gpu_limits[1], std::make_pair(0, 1.0));
  EXPECT_EQ(config->host_limit_bytes, 1048576u);
  EXPECT_EQ(config->min_residency_secs, 0.5);
  EXPECT_EQ(config->load_retry_secs, 2);
  EXPECT_EQ(config->load_wait_secs, 5);
  EXPECT_EQ(config->load_models, std::vector<std::string>{"a"});
}

TEST(ServerFlagsTest, TraceConfigFlags) {
  auto config =
      ParseServerFlags({"--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                        "--trace-config", "opentelemetry,url=http://127.0.0.1:4318/v1/traces"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->trace.settings.level, TraceLevel::kTimestamps);
  EXPECT_EQ(config->trace.settings.rate, 1);
  EXPECT_EQ(config->trace.exporter.url, "http://127.0.0.1:4318/v1/traces");
  auto off = ParseServerFlags({});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->trace.settings.level, TraceLevel::kOff);
  auto refused =
      ParseServerFlags({"--trace-config", "opentelemetry,url=https://collector/v1/traces"});
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("plain HTTP"));
}

TEST(ServerFlagsTest, HttpEndpointFlags) {
  auto defaults = ParseServerFlags({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->allow_http);
  EXPECT_TRUE(defaults->model_threads_first);
  EXPECT_FALSE(ParseServerFlags({"--model-threads-first", "false"})->model_threads_first);
  EXPECT_TRUE(defaults->model_cpus.empty());
  EXPECT_EQ(ParseServerFlags({"--model-cpus", "2,0-1"})->model_cpus.list,
            (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ParseServerFlags({"--model-cpus", "last:3"})->model_cpus.last, 3);
  EXPECT_EQ(ParseServerFlags({"--model-cpus", "first:1"})->model_cpus.first, 1);
  EXPECT_EQ(defaults->http.port, 8000);
  EXPECT_EQ(defaults->http.address, "0.0.0.0");
  EXPECT_EQ(defaults->http.max_body_bytes, size_t{1} << 30);

  auto config =
      ParseServerFlags({"--http-port", "0", "--http-address", "127.0.0.1", "--http-max-body-bytes",
                        "4096", "--http-max-connections", "10", "--http-timeout-ms", "250",
                        "--http-restricted-api", "model-config:admin-key=s3cret"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->http.port, 0);
  EXPECT_EQ(config->http.address, "127.0.0.1");
  EXPECT_EQ(config->http.max_body_bytes, 4096u);
  EXPECT_EQ(config->http.max_connections, 10);
  EXPECT_EQ(config->http.timeout_ms, 250);
  ASSERT_EQ(config->http_restrictions.size(), 1u);
  EXPECT_EQ(config->http_restrictions[0].key, "admin-key");
  EXPECT_TRUE(config->restrictions.empty());  // the gRPC ones are separate

  // TLS on gRPC is TLS on HTTP too (Server::StartHttp): the port stays open.
  auto tls = ParseServerFlags({"--grpc-use-ssl", "true"});
  ASSERT_TRUE(tls.ok());
  EXPECT_TRUE(tls->allow_http);
  auto off = ParseServerFlags({"--allow-http", "false"});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->allow_http);

  for (const auto& [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--allow-http", "maybe"}, "--allow-http"},
           {{"--http-port", "70000"}, "--http-port"},
           {{"--http-max-body-bytes", "0"}, "--http-max-body-bytes"},
           {{"--http-restricted-api", "logging:k=v"},
            "--http-restricted-api: unknown protocol group"},
           {{"--http-restricted-api", "health:a=b", "--http-restricted-api", "health:c=d"},
            "restricted twice (--http-restricted-api)"},
       }) {
    auto refused = ParseServerFlags(args);
    ASSERT_FALSE(refused.ok()) << args[0];
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(words));
  }
}

TEST(ServerFlagsTest, StartupModelsMustBeInTheRepository) {
  auto config = ParseServerFlags({"--model-repository", "/models", "--model-control-mode",
                                  "explicit", "--load-model", "a", "--load-model", "nope"});
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<RepositoryModel> models(2);
  models[0].name = "a";
  models[1].name = "b";
  Status status = CheckStartupModels(*config, models);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("--load-model nope: the repository /models has no such model"));
  config->load_models = {"*"};
  EXPECT_TRUE(CheckStartupModels(*config, models).ok());
  config->load_models = {"b", "a"};
  EXPECT_TRUE(CheckStartupModels(*config, models).ok());
}

TEST(ServerFlagsTest, CommandLineExitCodes) {
  const char* version[] = {"sluice-server", "--version"};
  testing::internal::CaptureStdout();
  auto parsed = ParseCommandLine(2, version);
  EXPECT_THAT(testing::internal::GetCapturedStdout(), HasSubstr("."));
  ASSERT_TRUE(std::holds_alternative<int>(parsed));
  EXPECT_EQ(std::get<int>(parsed), 0);

  const char* bad[] = {"sluice-server", "--load-model", "a"};
  testing::internal::CaptureStderr();
  parsed = ParseCommandLine(3, bad);
  EXPECT_THAT(testing::internal::GetCapturedStderr(),
              HasSubstr("--load-model needs --model-control-mode explicit"));
  ASSERT_TRUE(std::holds_alternative<int>(parsed));
  EXPECT_NE(std::get<int>(parsed), 0);

  const char* good[] = {"sluice-server", "--grpc-port", "0"};
  parsed = ParseCommandLine(3, good);
  ASSERT_TRUE(std::holds_alternative<ServerConfig>(parsed));
  EXPECT_EQ(std::get<ServerConfig>(parsed).grpc.port, 0);
}

}  // namespace
}  // namespace sluice
