// Builds and runs the gRPC server: the inference service, grpc.health.v1.Health and reflection.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "server/api/inference_service.h"
#include "server/core/status.h"

namespace sluice {

// TLS on the gRPC port, with Triton's flags. Files are PEM.
struct GrpcTlsOptions {
  bool enabled = false;     // --grpc-use-ssl
  bool mutual = false;      // --grpc-use-ssl-mutual (implies enabled): clients must present a
                            // certificate signed by root_cert, or the handshake fails
  std::string server_cert;  // --grpc-server-cert: the server's certificate chain
  std::string server_key;   // --grpc-server-key: its private key
  std::string root_cert;    // --grpc-root-cert: the CA that signs client certificates
};

struct GrpcServerOptions {
  std::string address = "0.0.0.0";            // listen address
  int port = 8001;                             // 0: any free port (see GrpcServer::port)
  int max_message_bytes = 1 << 30;             // request and response limit (gRPC's own is 4 MiB)
  GrpcTlsOptions tls;                          // plaintext unless enabled
};

// The credentials `tls` asks for: insecure when TLS is off. INVALID_ARGUMENT naming the flag when
// a file is missing or not PEM (mutual TLS needs --grpc-root-cert).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const GrpcTlsOptions& tls);

// Health service names, as grpc.health.v1 reports them:
//   ""      and "ready": SERVING when InferenceService::Ready()
//   "live":             SERVING while the process serves at all
class GrpcServer {
 public:
  // UNAVAILABLE when the port cannot be bound; INVALID_ARGUMENT for unusable TLS files.
  // `service` must outlive the server.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                     InferenceService* service);
  ~GrpcServer();

  int port() const { return port_; }

  // Re-reads the service's liveness and readiness into the health service. Thread-safe; does
  // nothing after Shutdown.
  void RefreshHealth();

  // Stops accepting calls, lets calls in flight finish for up to `grace_ms`, then cancels them.
  void Shutdown(int grace_ms);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, InferenceService* service, int port);

  std::mutex mutex_;  // guards server_ (RefreshHealth may run on a worker thread)
  std::unique_ptr<grpc::Server> server_;
  InferenceService* const service_;
  const int port_;
};

}  // namespace sluice
