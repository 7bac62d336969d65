// Server (server/server.cc): the start order (repository, metrics, model control, gRPC, HTTP),
// which a refusal shows (when two steps would fail, the earlier one's error comes back), what a
// failed start leaves behind (nothing listening), the drain, and the shutdown that closes every
// port. A real server on loopback with an empty repository: no model, no LibTorch work.
#include "server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"
#include "tests/unit/http_client.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

bool Accepts(int port) { return testing::Client(port).connected(); }

// The status code of GET `path` on the HTTP port; 0 when nothing answered.
int HttpStatus(int port, const std::string& path) {
  testing::Client client(port);
  if (!client.connected()) return 0;
  client.Send(testing::Get(path));
  return client.Read().code;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repository_ = std::filesystem::path(::testing::TempDir()) /
                  ("server_test_" + std::to_string(getpid()) + "_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(repository_);
    std::filesystem::create_directories(repository_);
  }
  void TearDown() override { std::filesystem::remove_all(repository_); }

  // The flags with loopback addresses and the given ports (0: any free one) added.
  ServerConfig Config(int grpc_port, int http_port, int metrics_port,
                      std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--model-repository", repository_.string(),         "--grpc-address",    "127.0.0.1",
        "--grpc-port",        std::to_string(grpc_port),    "--http-address",    "127.0.0.1",
        "--http-port",        std::to_string(http_port),    "--metrics-address", "127.0.0.1",
        "--metrics-port",     std::to_string(metrics_port), "--device",          "cpu"};
    args.insert(args.end(), extra.begin(), extra.end());
    StatusOr<ServerConfig> config = ParseServerFlags(args);
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? *config : ServerConfig{};
  }

  StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config) {
    return Server::Start(config, RuntimeInfo{}, nullptr, [] {});
  }

  std::filesystem::path repository_;
};

TEST_F(ServerTest, StartsOnAnEmptyRepositoryAndShutdownClosesEveryPort) {
  auto server = Start(Config(0, 0, 0));
  ASSERT_TRUE(server.ok()) << server.status();
  const int grpc_port = (*server)->grpc_port();
  const int http_port = (*server)->http_port();
  const int metrics_port = (*server)->metrics_port();
  EXPECT_GT(grpc_port, 0);
  EXPECT_GT(http_port, 0);
  EXPECT_GT(metrics_port, 0);
  EXPECT_TRUE(Accepts(grpc_port));
  EXPECT_TRUE(Accepts(metrics_port));
  ASSERT_TRUE(testing::Eventually([&] { return !(*server)->loading(); }));
  EXPECT_FALSE((*server)->load_failed());
  EXPECT_EQ(HttpStatus(http_port, "/v2/health/live"), 200);
  EXPECT_EQ(HttpStatus(http_port, "/v2/health/ready"), 200);

  (*server)->Shutdown(1000);
  EXPECT_FALSE(Accepts(grpc_port));
  EXPECT_FALSE(Accepts(http_port));
  (*server)->Shutdown(1000);  // idempotent; the destructor calls it a third time
  server->reset();
  EXPECT_FALSE(Accepts(metrics_port));
}

TEST_F(ServerTest, BeginDrainTakesReadinessAwayButKeepsLivenessAndServing) {
  auto server = Start(Config(0, 0, 0));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(testing::Eventually([&] { return !(*server)->loading(); }));
  (*server)->BeginDrain();
  const int http_port = (*server)->http_port();
  EXPECT_EQ(HttpStatus(http_port, "/v2/health/ready"), 400);
  EXPECT_EQ(HttpStatus(http_port, "/v2/health/live"), 200);
  EXPECT_NE(HttpStatus(http_port, "/v2/models/absent/ready"), 0);  // still answering requests
  EXPECT_TRUE(Accepts((*server)->grpc_port()));
}

// Each step's refusal, with every later step's port also taken: the earliest step's error comes
// back, so the steps run in the documented order, and no port the server opened stays open.
TEST_F(ServerTest, StartStepsRunInOrderAndAFailedStartLeavesNothingListening) {
  testing::TakenPort metrics;
  testing::TakenPort grpc;
  testing::TakenPort http;

  // The repository comes first: nothing listens before it is scanned.
  ServerConfig missing = Config(grpc.port(), http.port(), metrics.port());
  missing.model_repository = (repository_ / "absent").string();
  auto refused = Start(missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("absent"));

  // Then --load-model against the repository.
  refused = Start(Config(grpc.port(), http.port(), metrics.port(),
                         {"--model-control-mode", "explicit", "--load-model", "unknown_model"}));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("unknown_model"));

  // Then metrics, then gRPC, then HTTP.
  refused = Start(Config(grpc.port(), http.port(), metrics.port()));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("metrics"));

  metrics.Release();
  refused = Start(Config(grpc.port(), http.port(), metrics.port()));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--grpc-port"));
  EXPECT_FALSE(Accepts(metrics.port())) << "the metrics endpoint outlived a failed start";

  grpc.Release();
  refused = Start(Config(grpc.port(), http.port(), metrics.port()));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("HTTP"));
  EXPECT_FALSE(Accepts(metrics.port())) << "the metrics endpoint outlived a failed start";
  EXPECT_FALSE(Accepts(grpc.port())) << "the gRPC listener outlived a failed start";

  http.Release();
  auto started = Start(Config(grpc.port(), http.port(), metrics.port()));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ((*started)->grpc_port(), grpc.port());
  EXPECT_EQ((*started)->http_port(), http.port());
}

}  // namespace
}  // namespace sluice
