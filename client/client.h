// sluice::Client: a small C++ client for any KServe v2 / Triton gRPC server (Sluice or Triton).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "server/core/status.h"
#include "server/core/tensor.h"

namespace sluice {

// TLS to the server. Files are PEM.
struct ClientTlsOptions {
  bool enabled = false;
  std::string root_cert;  // CA the server's certificate must be signed by; empty: the system's CAs
  std::string client_cert;  // for mutual TLS: this client's certificate chain ...
  std::string client_key;   // ... and its private key (both or neither)
  // The name the server's certificate must carry, when it is not the host of the URL (a probe
  // inside a pod connects to 127.0.0.1 while the certificate names the Service). Empty: the host.
  std::string target_name;
};

struct ClientOptions {
  std::chrono::milliseconds timeout{30000};  // per call deadline
  int max_message_bytes = 1 << 30;           // per message, both directions
  ClientTlsOptions tls;                      // plaintext unless enabled
};

// Thread-safe (gRPC stubs are). Every call returns the server's status with its message.
class Client {
 public:
  // Connects (lazily) to "host:port", with TLS when options.tls says so. INVALID_ARGUMENT when a
  // TLS file cannot be read (connection errors come with the first call).
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& url,
                                                   ClientOptions options = {});
  // Uses the given stub: tests inject a mock here.
  Client(std::unique_ptr<inference::GRPCInferenceService::StubInterface> stub,
         ClientOptions options);

  StatusOr<bool> ServerLive();
  StatusOr<bool> ServerReady();
  StatusOr<bool> ModelReady(const std::string& model, const std::string& version = "");
  StatusOr<inference::ServerMetadataResponse> ServerMetadata();
  StatusOr<inference::ModelMetadataResponse> ModelMetadata(const std::string& model,
                                                           const std::string& version = "");
  StatusOr<inference::ModelConfig> ModelConfig(const std::string& model,
                                               const std::string& version = "");
  StatusOr<inference::RepositoryIndexResponse> RepositoryIndex(bool ready_only = false);

  // What an inference call asks for besides its inputs.
  struct InferOptions {
    std::vector<std::string> outputs;  // empty: every output of the model
    std::string version;               // empty: the newest ready version
    std::string id;                    // request id, echoed back
    // Stateful models: Triton's sequence_id (a number when it is all digits, else a string;
    // empty: none), sequence_start and sequence_end parameters.
    std::string sequence_id;
    bool sequence_start = false;
    bool sequence_end = false;
  };

  // Sends `inputs` as raw_input_contents; outputs come back as owning tensors.
  StatusOr<std::vector<Tensor>> Infer(const std::string& model, const std::vector<Tensor>& inputs,
                                      const InferOptions& options);
  StatusOr<std::vector<Tensor>> Infer(const std::string& model, const std::vector<Tensor>& inputs) {
    return Infer(model, inputs, InferOptions{});
  }

 private:
  void Prepare(grpc::ClientContext* context) const;

  std::unique_ptr<inference::GRPCInferenceService::StubInterface> stub_;
  const ClientOptions options_;
};

}  // namespace sluice
