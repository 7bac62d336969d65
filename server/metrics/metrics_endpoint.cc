#include "server/metrics/metrics_endpoint.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace sluice {

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, int port, const std::shared_ptr<prometheus::Registry>& registry) {
  const std::string bind = absl::StrCat(address, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One serving thread is plenty for a scrape every few seconds.
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", bind, " (is the port in use? "
                                               "choose another with --metrics-port): ", e.what()));
  }
  exposer->RegisterCollectable(registry, "/metrics");
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int bound = ports.empty() ? port : ports.front();
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), bound));
}

}  // namespace sluice
