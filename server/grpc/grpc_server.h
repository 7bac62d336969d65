// Builds and runs the gRPC server: the inference service, grpc.health.v1.Health and reflection.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"

#include "server/core/mutex.h"
#include "server/core/status.h"
#include "server/grpc/grpc_service.h"

namespace sluice {

// TLS on the gRPC port, with Triton's flags. Files are PEM.
struct GrpcTlsOptions {
  bool enabled = false;     // --grpc-use-ssl
  bool mutual = false;      // --grpc-use-ssl-mutual (implies enabled): clients must present a
                            // certificate signed by root_cert, or the handshake fails
  std::string server_cert;  // --grpc-server-cert: the server's certificate chain
  std::string server_key;   // --grpc-server-key: its private key
  std::string root_cert;    // --grpc-root-cert: the CA that signs client certificates
  // --grpc-tls-reload-secs: how often the three files are read again, so that a certificate
  // rotated on disk (cert-manager, a renewed Secret) serves new connections without a restart;
  // connections already open keep theirs. 0: read once at start.
  int reload_secs = 60;
};

// HTTP/2 connection management. A value of 0 leaves gRPC's own default.
struct GrpcConnectionOptions {
  // Close each connection after this long (GOAWAY; the client reconnects, and an L4 load
  // balancer, which balances connections and not calls, picks a replica again). 0: never.
  int max_connection_age_ms = 0;        // --grpc-max-connection-age-ms
  int max_connection_age_grace_ms = 0;  // --grpc-max-connection-age-grace-ms: calls in flight
                                        // on an aged connection get this long (0: unbounded)
  int max_connection_idle_ms = 0;       // --grpc-max-connection-idle-ms: close idle connections
  int keepalive_time_ms = 0;     // --grpc-keepalive-time: server pings this often (gRPC: 2 h)
  int keepalive_timeout_ms = 0;  // --grpc-keepalive-timeout: ping answer deadline (gRPC: 20 s)
  bool keepalive_permit_without_calls = false;  // --grpc-keepalive-permit-without-calls
  int http2_max_pings_without_data = -1;        // --grpc-http2-max-pings-without-data (-1: default)
  int http2_min_recv_ping_interval_without_data_ms =
      0;                            // --grpc-http2-min-recv-ping-interval-without-data
  int http2_max_ping_strikes = -1;  // --grpc-http2-max-ping-strikes (-1: default; 0: unlimited)
};

struct GrpcServerOptions {
  std::string address = "0.0.0.0";  // listen address
  int port = 8001;                  // 0: any free port (see GrpcServer::port)
  int max_message_bytes = 1 << 30;  // request and response limit (gRPC's own is 4 MiB)
  GrpcTlsOptions tls;               // plaintext unless enabled
  GrpcConnectionOptions connections;
};

// The credentials `tls` asks for: insecure when TLS is off. INVALID_ARGUMENT naming the flag when
// a file is missing or not PEM (mutual TLS needs --grpc-root-cert).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const GrpcTlsOptions& tls);

// Health service names, as grpc.health.v1 reports them:
//   ""      and "ready": SERVING when the server is ready (ServerHealth)
//   "live":             SERVING while it is live
class GrpcServer {
 public:
  // UNAVAILABLE when the port cannot be bound; INVALID_ARGUMENT for unusable TLS files.
  // `service` must outlive the server.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                     GrpcService* service);
  ~GrpcServer();

  int port() const { return port_; }

  // Re-reads the server's liveness and readiness into the health service. Thread-safe; does
  // nothing after Shutdown.
  void RefreshHealth() ABSL_LOCKS_EXCLUDED(mutex_);

  // Stops accepting calls, lets calls in flight finish for up to `grace_ms`, then cancels them.
  void Shutdown(int grace_ms) ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, GrpcService* service, int port);

  Mutex mutex_;  // RefreshHealth may run on a worker thread
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mutex_);
  GrpcService* const service_;
  const int port_;
};

}  // namespace sluice
