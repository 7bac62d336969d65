#include "server/metrics/metrics_endpoint.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// Opens and closes a TCP connection to the endpoint's listening socket (a wildcard address is
// reached through loopback). Errors are ignored: the listener may already be closed.
void Knock(const std::string& address, int port) {
  std::string host = address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    const int fd = socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC, entry->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, entry->ai_addr, entry->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, int port, const std::shared_ptr<prometheus::Registry>& registry) {
  const std::string bind = absl::StrCat(address, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One serving thread is plenty for a scrape every few seconds.
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", bind,
                                               " (is the port in use? "
                                               "choose another with --metrics-port): ",
                                               e.what()));
  }
  exposer->RegisterCollectable(registry, "/metrics");
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int bound = ports.empty() ? port : ports.front();
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), address, bound));
}

MetricsEndpoint::~MetricsEndpoint() {
  // prometheus-cpp's exposer stops civetweb (1.15 on Debian 12), whose listening thread reads
  // the stop flag only between polls of its sockets that last up to 2 s: the server's shutdown
  // waited 1.4 s for it on average. A connection ends such a poll. Knocks go on until the
  // exposer is gone, since one that lands before the flag is set is only served (an empty
  // request, closed) and the thread polls again.
  std::atomic<bool> stopped{false};
  std::thread knocker([this, &stopped] {
    while (!stopped.load()) {
      Knock(address_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();
  stopped = true;
  knocker.join();
}

}  // namespace sluice
