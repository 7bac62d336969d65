// The gRPC server (server/grpc/grpc_server.h) on loopback: it binds a free port, a taken port and
// unusable TLS files are clear errors naming the flag, the grpc.health.v1 service reports the
// server's liveness and readiness under "", "ready" and "live" as RefreshHealth reads them, and
// Shutdown closes the port.
#include "server/grpc/grpc_server.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "server/core/liveness.h"
#include "server/frontend/server_health.h"
#include "server/manager/model_manager.h"
#include "tests/unit/handle_factory.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// grpc.health.v1.HealthCheckResponse.ServingStatus, as the wire carries it.
enum class Serving { kUnknown = 0, kServing = 1, kNotServing = 2, kNoSuchService = -1 };

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcService::Options options;
    options.health = &health_;
    options.lookup = &lookup_;
    service_ = std::make_unique<GrpcService>(&manager_, /*control=*/nullptr, options);
  }

  StatusOr<std::unique_ptr<GrpcServer>> Start(int port = 0) {
    GrpcServerOptions options;
    options.address = "127.0.0.1";
    options.port = port;
    return GrpcServer::Start(options, service_.get());
  }

  // Asks grpc.health.v1.Health/Check about `name` (the request and answer encoded by hand: one
  // string field, one enum field), kNoSuchService when the server answers NOT_FOUND.
  static Serving Check(int port, const std::string& name) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                       grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    std::string bytes;
    if (!name.empty()) bytes = std::string("\x0a", 1) + static_cast<char>(name.size()) + name;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&done](grpc::Status status) { done.set_value(status); });
    const grpc::Status status = done.get_future().get();
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) return Serving::kNoSuchService;
    EXPECT_TRUE(status.ok()) << status.error_message();
    grpc::Slice answer;
    if (!response.TrySingleSlice(&answer).ok() || answer.size() < 2) return Serving::kUnknown;
    EXPECT_EQ(answer.begin()[0], 0x08);  // field 1, varint
    return static_cast<Serving>(answer.begin()[1]);
  }

  LivenessMonitor liveness_;
  ServerHealth health_{{/*strict=*/false, &liveness_, nullptr}};
  ModelManager manager_{{}, {}};
  testing::FakeLookup lookup_;
  std::unique_ptr<GrpcService> service_;
};

TEST_F(GrpcServerTest, HealthFollowsReadinessAndLivenessAsRefreshed) {
  auto server = Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  // Not started yet: live, not ready.
  EXPECT_EQ(Check(port, ""), Serving::kNotServing);
  EXPECT_EQ(Check(port, "ready"), Serving::kNotServing);
  EXPECT_EQ(Check(port, "live"), Serving::kServing);
  EXPECT_EQ(Check(port, "inference.GRPCInferenceService"), Serving::kNoSuchService);

  health_.SetStarted();
  EXPECT_EQ(Check(port, "ready"), Serving::kNotServing);  // not re-read yet
  (*server)->RefreshHealth();
  EXPECT_EQ(Check(port, ""), Serving::kServing);
  EXPECT_EQ(Check(port, "ready"), Serving::kServing);

  liveness_.ReportFatal(absl::InternalError("illegal memory access"));
  (*server)->RefreshHealth();
  EXPECT_EQ(Check(port, "live"), Serving::kNotServing);
  EXPECT_EQ(Check(port, "ready"), Serving::kNotServing);
}

TEST_F(GrpcServerTest, ATakenPortNamesTheFlagAndShutdownFreesIt) {
  auto first = Start();
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  auto second = Start(port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--grpc-port"));
  EXPECT_THAT(second.status().message(), Not(HasSubstr("server key")));  // plaintext

  (*first)->Shutdown(/*grace_ms=*/0);
  (*first)->RefreshHealth();  // after Shutdown: does nothing
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  EXPECT_FALSE(channel->WaitForConnected(std::chrono::system_clock::now() + 200ms));
  auto again = Start(port);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A self-signed EC certificate and its key (made once with openssl; nothing checks its dates),
// and a key of another pair.
constexpr char kCertificate[] = R"(-----BEGIN CERTIFICATE-----
MIIBiDCCAS2gAwIBAgIUD1Cy7fV87GgRHcCSVe8RshfRcg4wCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNc2x1aWNlLXRlc3QtYTAgFw0yNjEyMDYyMDMxMTRaGA8yMTI2
MTExMjIwMzExNFowGDEWMBQGA1UEAwwNc2x1aWNlLXRlc3QtYTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABOyXuE0ie0Cmx/GCK6xMLJWD66WejDM48MUkD+FxO4Cz
UkxHnggtndTKMF7wA2n6Xj7W/LfGwjzLqlsnqhCugGWjUzBRMB0GA1UdDgQWBBSF
XjOs/mhaL1/QiF3aq4XQXNiJRTAfBgNVHSMEGDAWgBSFXjOs/mhaL1/QiF3aq4XQ
XNiJRTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQCjnYyfjqGj
c3s+r/PDArESRvhFJxpKGGR1pnS2qFP8iwIhAL8x7abWpNtZ8R8+lmqYPeISfTqz
Zy54ESIOpuUxhKa4
-----END CERTIFICATE-----
)";
constexpr char kKey[] = R"(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgfg68xX7NqoRVMh6e
jYUUGfDBVZIX/4lsPGDikE6lVAChRANCAATsl7hNIntApsfxgiusTCyVg+ulnowz
OPDFJA/hcTuAs1JMR54ILZ3UyjBe8ANp+l4+1vy3xsI8y6pbJ6oQroBl
-----END PRIVATE KEY-----
)";
constexpr char kOtherKey[] = R"(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgFR/iIKNQj9aYDn/N
/ZeRLXlC+B4siufy0ICc/nBtV4ShRANCAATFD6bJxlZOqKNHRLfJmb6XtdM3/TfF
IXj8kDvpsx0xeC6nbbl9rWb+G6c+XGLLhwDBX2lsWEIOCcuxP9DiOYZJ
-----END PRIVATE KEY-----
)";

TEST(ServerCredentialsTest, PlaintextUnlessEnabledAndEachMissingFileNamesItsFlag) {
  EXPECT_TRUE(MakeServerCredentials(GrpcTlsOptions{}).ok());

  const std::filesystem::path directory =
      std::filesystem::path(::testing::TempDir()) / "grpc_server_test_tls";
  std::filesystem::create_directories(directory);
  auto write = [&](const std::string& name, const char* text) {
    const std::string path = (directory / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const std::string cert = write("cert.pem", kCertificate);
  const std::string key = write("key.pem", kKey);
  const std::string other_key = write("other.pem", kOtherKey);
  const std::string not_pem = write("key.txt", "not a key");

  for (int reload : {0, 60}) {  // read once, or watched
    GrpcTlsOptions tls;
    tls.enabled = true;
    tls.reload_secs = reload;
    tls.server_cert = (directory / "absent.pem").string();
    tls.server_key = key;
    auto credentials = MakeServerCredentials(tls);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(), HasSubstr("--grpc-server-cert"));

    tls.server_cert = cert;
    tls.server_key = not_pem;
    credentials = MakeServerCredentials(tls);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(), HasSubstr("--grpc-server-key"));

    // A key of another certificate would fail every handshake: refused at start.
    tls.server_key = other_key;
    credentials = MakeServerCredentials(tls);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(),
                HasSubstr("--grpc-server-key: the private key is not the certificate's"));
    tls.server_key = key;
    EXPECT_TRUE(MakeServerCredentials(tls).ok()) << reload;

    // Mutual TLS implies TLS and needs the CA of client certificates.
    tls.enabled = false;
    tls.mutual = true;
    credentials = MakeServerCredentials(tls);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(credentials.status().message(), HasSubstr("--grpc-root-cert"));
    tls.root_cert = cert;
    EXPECT_TRUE(MakeServerCredentials(tls).ok()) << reload;
  }
}

}  // namespace
}  // namespace sluice
