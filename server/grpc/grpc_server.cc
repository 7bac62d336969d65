#include "server/grpc/grpc_server.h"

#include <chrono>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "server/os/pem.h"

namespace sluice {

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const GrpcTlsOptions& tls) {
  if (!tls.enabled && !tls.mutual) return grpc::InsecureServerCredentials();
  // Read and checked here in either mode, so that a missing or unreadable file, or a key that is
  // not the certificate's, fails the start with its flag named (gRPC would only refuse to bind,
  // or, watching the files, fail every handshake).
  SLUICE_ASSIGN_OR_RETURN(std::string cert, ReadPemFile(tls.server_cert, "--grpc-server-cert"));
  SLUICE_ASSIGN_OR_RETURN(std::string key, ReadPemFile(tls.server_key, "--grpc-server-key"));
  SLUICE_RETURN_IF_ERROR(CheckKeyPair(cert, key, "--grpc-server-key"));
  std::string root;
  if (tls.mutual) {
    SLUICE_ASSIGN_OR_RETURN(root, ReadPemFile(tls.root_cert,
                                              "--grpc-root-cert (the CA of client certificates, "
                                              "for --grpc-use-ssl-mutual)"));
  }
  const grpc_ssl_client_certificate_request_type request =
      tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  if (tls.reload_secs > 0) {
    // gRPC's watcher reads the files again every reload_secs and serves new handshakes with what
    // it read last. Rotate the pair at once (Kubernetes swaps a Secret's files with one rename of
    // its ..data link).
    auto files = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.server_key, tls.server_cert, tls.mutual ? tls.root_cert : std::string(),
        static_cast<unsigned int>(tls.reload_secs));
    grpc::experimental::TlsServerCredentialsOptions options(files);
    options.watch_identity_key_cert_pairs();
    if (tls.mutual) options.watch_root_certs();
    options.set_cert_request_type(request);
    return grpc::experimental::TlsServerCredentials(options);
  }
  grpc::SslServerCredentialsOptions ssl(request);
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  ssl.pem_root_certs = std::move(root);
  return grpc::SslServerCredentials(ssl);
}

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options,
                                                        GrpcService* service) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                          MakeServerCredentials(options.tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string address = absl::StrCat(options.address, ":", options.port);
  builder.AddListeningPort(address, credentials, &bound_port);
  // Without this, gRPC sets SO_REUSEPORT and a second server on the same port starts "fine" and
  // silently takes half of the traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const GrpcConnectionOptions& c = options.connections;
  auto set = [&builder](const char* name, int value, bool wanted) {
    if (wanted) builder.AddChannelArgument(name, value);
  };
  set(GRPC_ARG_MAX_CONNECTION_AGE_MS, c.max_connection_age_ms, c.max_connection_age_ms > 0);
  set(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, c.max_connection_age_grace_ms,
      c.max_connection_age_grace_ms > 0);
  set(GRPC_ARG_MAX_CONNECTION_IDLE_MS, c.max_connection_idle_ms, c.max_connection_idle_ms > 0);
  set(GRPC_ARG_KEEPALIVE_TIME_MS, c.keepalive_time_ms, c.keepalive_time_ms > 0);
  set(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, c.keepalive_timeout_ms, c.keepalive_timeout_ms > 0);
  set(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1, c.keepalive_permit_without_calls);
  set(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, c.http2_max_pings_without_data,
      c.http2_max_pings_without_data >= 0);
  set(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      c.http2_min_recv_ping_interval_without_data_ms,
      c.http2_min_recv_ping_interval_without_data_ms > 0);
  set(GRPC_ARG_HTTP2_MAX_PING_STRIKES, c.http2_max_ping_strikes, c.http2_max_ping_strikes >= 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (is the port in use? choose another with --grpc-port",
        options.tls.enabled || options.tls.mutual
            ? "; or the server key does not match its certificate"
            : "",
        ")"));
  }
  auto result = std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), service, bound_port));
  result->RefreshHealth();
  return result;
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, GrpcService* service, int port)
    : server_(std::move(server)), service_(service), port_(port) {}

GrpcServer::~GrpcServer() { Shutdown(0); }

void GrpcServer::RefreshHealth() {
  MutexLock lock(&mutex_);
  if (!server_) return;
  const bool ready = service_->Ready();
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("live", service_->Live());
  health->SetServingStatus("", ready);
  health->SetServingStatus("ready", ready);
}

void GrpcServer::Shutdown(int grace_ms) {
  std::unique_ptr<grpc::Server> server;
  {
    MutexLock lock(&mutex_);
    server = std::move(server_);
  }
  if (!server) return;
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server->Wait();
}

}  // namespace sluice
