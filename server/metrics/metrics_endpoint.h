// Serves a Prometheus registry over HTTP (prometheus-cpp's pull exposer) at /metrics.
#pragma once

#include <memory>
#include <string>

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "server/core/status.h"

namespace sluice {

class MetricsEndpoint {
 public:
  // Listens on address:port (port 0: a free one). UNAVAILABLE when the port cannot be bound.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, int port, const std::shared_ptr<prometheus::Registry>& registry);
  int port() const { return port_; }
  // Serves `collectable`'s series beside the registry's (skipped once it is gone).
  void Add(const std::weak_ptr<prometheus::Collectable>& collectable) {
    exposer_->RegisterCollectable(collectable, "/metrics");
  }

  // Stops serving; returns once the exposer's threads are gone (within milliseconds: see the
  // definition).
  ~MetricsEndpoint();

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, std::string address, int port)
      : exposer_(std::move(exposer)), address_(std::move(address)), port_(port) {}
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;  // as given to Start
  int port_;
};

}  // namespace sluice
