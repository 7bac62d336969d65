#include "client/client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/os/pem.h"

namespace sluice {
namespace {

Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& url, ClientOptions options) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls.target_name.empty())
      arguments.SetSslTargetNameOverride(options.tls.target_name);
    if (!options.tls.root_cert.empty()) {
      SLUICE_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                              ReadPemFile(options.tls.root_cert, "--root-cert"));
    }
    if (options.tls.client_cert.empty() != options.tls.client_key.empty()) {
      return absl::InvalidArgumentError("--client-cert and --client-key go together");
    }
    if (!options.tls.client_cert.empty()) {
      SLUICE_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                              ReadPemFile(options.tls.client_cert, "--client-cert"));
      SLUICE_ASSIGN_OR_RETURN(ssl.pem_private_key,
                              ReadPemFile(options.tls.client_key, "--client-key"));
    }
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateCustomChannel(url, credentials, arguments);
  return std::make_unique<Client>(inference::GRPCInferenceService::NewStub(channel), options);
}

Client::Client(std::unique_ptr<inference::GRPCInferenceService::StubInterface> stub,
               ClientOptions options)
    : stub_(std::move(stub)), options_(options) {}

void Client::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() + options_.timeout);
}

StatusOr<bool> Client::ServerLive() {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ServerLiveResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ServerLive(&context, {}, &response)));
  return response.live();
}

StatusOr<bool> Client::ServerReady() {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ServerReadyResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ServerReady(&context, {}, &response)));
  return response.ready();
}

StatusOr<bool> Client::ModelReady(const std::string& model, const std::string& version) {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ModelReadyRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelReadyResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ModelReady(&context, request, &response)));
  return response.ready();
}

StatusOr<inference::ServerMetadataResponse> Client::ServerMetadata() {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ServerMetadataResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ServerMetadata(&context, {}, &response)));
  return response;
}

StatusOr<inference::ModelMetadataResponse> Client::ModelMetadata(const std::string& model,
                                                                 const std::string& version) {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ModelMetadataRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelMetadataResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ModelMetadata(&context, request, &response)));
  return response;
}

StatusOr<inference::ModelConfig> Client::ModelConfig(const std::string& model,
                                                     const std::string& version) {
  grpc::ClientContext context;
  Prepare(&context);
  inference::ModelConfigRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelConfigResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ModelConfig(&context, request, &response)));
  return response.config();
}

StatusOr<inference::RepositoryIndexResponse> Client::RepositoryIndex(bool ready_only) {
  grpc::ClientContext context;
  Prepare(&context);
  inference::RepositoryIndexRequest request;
  request.set_ready(ready_only);
  inference::RepositoryIndexResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->RepositoryIndex(&context, request, &response)));
  return response;
}

StatusOr<std::vector<Tensor>> Client::Infer(const std::string& model,
                                            const std::vector<Tensor>& inputs,
                                            const InferOptions& options) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  request.set_model_version(options.version);
  request.set_id(options.id);
  if (!options.sequence_id.empty()) {
    auto& parameters = *request.mutable_parameters();
    uint64_t number = 0;
    if (absl::SimpleAtoi(options.sequence_id, &number)) {
      parameters["sequence_id"].set_uint64_param(number);
    } else {
      parameters["sequence_id"].set_string_param(options.sequence_id);
    }
    parameters["sequence_start"].set_bool_param(options.sequence_start);
    parameters["sequence_end"].set_bool_param(options.sequence_end);
  }
  for (const Tensor& tensor : inputs) {
    auto* input = request.add_inputs();
    input->set_name(tensor.name);
    input->set_datatype(std::string(DataTypeName(tensor.dtype)));
    for (int64_t dim : tensor.shape) input->add_shape(dim);
    request.add_raw_input_contents(tensor.data);
  }
  for (const std::string& name : options.outputs) request.add_outputs()->set_name(name);

  grpc::ClientContext context;
  Prepare(&context);
  inference::ModelInferResponse response;
  SLUICE_RETURN_IF_ERROR(FromGrpc(stub_->ModelInfer(&context, request, &response)));
  if (response.raw_output_contents_size() != response.outputs_size()) {
    return absl::DataLossError(absl::StrCat("server sent ", response.outputs_size(),
                                            " outputs but ", response.raw_output_contents_size(),
                                            " raw_output_contents entries"));
  }
  std::vector<Tensor> result;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    Tensor tensor;
    tensor.name = output.name();
    const std::optional<DataType> dtype = ParseDataTypeName(output.datatype());
    if (!dtype) {
      return absl::DataLossError(absl::StrCat("output '", output.name(), "' has unknown datatype '",
                                              output.datatype(), "'"));
    }
    tensor.dtype = *dtype;
    tensor.shape.assign(output.shape().begin(), output.shape().end());
    tensor.data = std::move(*response.mutable_raw_output_contents(i));
    result.push_back(std::move(tensor));
  }
  return result;
}

}  // namespace sluice
