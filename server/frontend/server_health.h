// The server's own health, as every front end reports it (gRPC ServerLive/ServerReady and the
// grpc.health.v1 service, HTTP /v2/health/live and /v2/health/ready). Owned by the server, read by
// the front ends. Thread-safe.
//   live   no fatal device error has been reported (LivenessMonitor)
//   ready  live, started (every front end listens), not draining, and with --strict-readiness
//          every model ready
#pragma once

#include <atomic>

#include "server/core/liveness.h"
#include "server/manager/model_manager.h"

namespace sluice {

class ServerHealth {
 public:
  struct Options {
    bool strict = true;  // --strict-readiness: ready only when every model is
    const LivenessMonitor* liveness = nullptr;  // null: always live
    const ModelManager* models = nullptr;       // for `strict`; null: no model to wait for
  };
  // What Options point to outlives the health.
  explicit ServerHealth(Options options) : options_(options) {}

  // Every front end listens (models may still be loading). Until then never ready.
  void SetStarted() { started_ = true; }
  // The server is shutting down: from now on never ready (liveness is unchanged), so that load
  // balancers stop sending while calls are still served. Irreversible.
  void BeginDrain() { draining_ = true; }

  bool Live() const { return options_.liveness == nullptr || options_.liveness->live(); }
  bool Ready() const;

 private:
  const Options options_;
  std::atomic<bool> started_{false};
  std::atomic<bool> draining_{false};
};

}  // namespace sluice
