// The /metrics endpoint (server/metrics/metrics_endpoint.h) over loopback: it serves the registry,
// a taken port is a clear error, and a stopped endpoint frees its port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/metrics/client_quota_metrics.h"
#include "server/metrics/metrics_endpoint.h"
#include "tests/unit/metrics_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;)
    response.append(buffer, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST_F(MetricsTest, EndpointServesTheRegistryAndATakenPortIsAClearError) {
  metrics_.OnState("m", 1, ModelState::kReady);
  auto endpoint = MetricsEndpoint::Start("127.0.0.1", 0, registry_);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  const std::string response = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr(R"(sluice_model_state{model="m",state="READY",version="1"} 1)"));
  auto second = MetricsEndpoint::Start("127.0.0.1", (*endpoint)->port(), registry_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics-port"));
}

// The destructor returns with the port closed, on a loopback and on a wildcard address (reached
// through loopback by the knocks that end civetweb's poll), and a new endpoint can take the port.
TEST_F(MetricsTest, AStoppedEndpointClosesItsPortAndFreesIt) {
  for (const char* address : {"127.0.0.1", "0.0.0.0"}) {
    SCOPED_TRACE(address);
    auto endpoint = MetricsEndpoint::Start(address, 0, registry_);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    const int port = (*endpoint)->port();
    EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("200 OK"));
    endpoint->reset();
    EXPECT_EQ(HttpGet(port, "/metrics"), "");
    auto again = MetricsEndpoint::Start(address, port, registry_);
    EXPECT_TRUE(again.ok()) << again.status();
  }
}

// Served beside the registry (the client quotas' series are built at each scrape).
TEST_F(MetricsTest, AnAddedCollectableIsAskedAtEachScrapeWhileItLives) {
  auto endpoint =
      MetricsEndpoint::Start("127.0.0.1", 0, std::make_shared<prometheus::Registry>()).value();
  std::atomic<int> reports{0};
  auto metrics = std::make_shared<ClientQuotaMetrics>([&reports] {
    ++reports;
    ClientQuotaReport report;
    report.tracked = 12;
    return report;
  });
  endpoint->Add(metrics);
  EXPECT_THAT(HttpGet(endpoint->port(), "/metrics"), HasSubstr("sluice_client_quota_clients 12"));
  EXPECT_THAT(HttpGet(endpoint->port(), "/metrics"), HasSubstr("sluice_client_quota_clients 12"));
  EXPECT_EQ(reports.load(), 2);
  metrics.reset();  // gone: the endpoint serves the rest without it
  EXPECT_THAT(HttpGet(endpoint->port(), "/metrics"), Not(HasSubstr("sluice_client_quota_clients")));
}

}  // namespace
}  // namespace sluice
