#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/client.h"
#include "grpc_service_mock.grpc.pb.h"

namespace sluice {
namespace {

using ::testing::_;
using ::testing::DoAll;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::Return;
using ::testing::SetArgPointee;

class ClientTest : public ::testing::Test {
 protected:
  ClientTest() {
    auto stub = std::make_unique<inference::MockGRPCInferenceServiceStub>();
    stub_ = stub.get();
    client_ = std::make_unique<Client>(std::move(stub), ClientOptions{});
  }
  inference::MockGRPCInferenceServiceStub* stub_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, InferSendsRawInputsAndDecodesOutputs) {
  inference::ModelInferRequest sent;
  inference::ModelInferResponse reply;
  auto* out = reply.add_outputs();
  out->set_name("y");
  out->set_datatype("INT32");
  out->add_shape(2);
  reply.add_raw_output_contents(std::string("\x01\x00\x00\x00\x02\x00\x00\x00", 8));
  EXPECT_CALL(*stub_, ModelInfer(_, _, _))
      .WillOnce(DoAll(Invoke([&](grpc::ClientContext*, const inference::ModelInferRequest& r,
                                 inference::ModelInferResponse*) { sent = r; }),
                      SetArgPointee<2>(reply), Return(grpc::Status::OK)));
  Tensor input{"x", DataType::kFp16, {1, 2}, std::string(4, '\0')};
  Client::InferOptions options;
  options.outputs = {"y"};
  options.version = "2";
  options.id = "id-1";
  options.sequence_id = "77";
  options.sequence_start = true;
  auto outputs = client_->Infer("m", {input}, options);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(sent.model_name(), "m");
  EXPECT_EQ(sent.model_version(), "2");
  EXPECT_EQ(sent.id(), "id-1");
  EXPECT_EQ(sent.parameters().at("sequence_id").uint64_param(), 77u);
  EXPECT_TRUE(sent.parameters().at("sequence_start").bool_param());
  EXPECT_FALSE(sent.parameters().at("sequence_end").bool_param());
  EXPECT_EQ(sent.inputs(0).datatype(), "FP16");
  EXPECT_THAT(sent.inputs(0).shape(), ElementsAre(1, 2));
  EXPECT_EQ(sent.raw_input_contents(0).size(), 4u);
  EXPECT_EQ(sent.outputs(0).name(), "y");
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].dtype, DataType::kInt32);
  EXPECT_THAT((*outputs)[0].shape, ElementsAre(2));
  EXPECT_EQ((*outputs)[0].data.size(), 8u);
}

TEST_F(ClientTest, ServerErrorsKeepCodeAndMessage) {
  EXPECT_CALL(*stub_, ModelMetadata(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown model 'q'")));
  auto metadata = client_->ModelMetadata("q");
  EXPECT_EQ(metadata.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(metadata.status().message(), "unknown model 'q'");
}

TEST_F(ClientTest, MalformedResponsesAreDataLoss) {
  inference::ModelInferResponse reply;
  reply.add_outputs()->set_datatype("FP32");
  EXPECT_CALL(*stub_, ModelInfer(_, _, _))
      .WillOnce(DoAll(SetArgPointee<2>(reply), Return(grpc::Status::OK)));
  EXPECT_EQ(client_->Infer("m", {}).status().code(), absl::StatusCode::kDataLoss);

  reply.add_raw_output_contents("");
  reply.mutable_outputs(0)->set_datatype("WEIRD");
  EXPECT_CALL(*stub_, ModelInfer(_, _, _))
      .WillOnce(DoAll(SetArgPointee<2>(reply), Return(grpc::Status::OK)));
  EXPECT_THAT(client_->Infer("m", {}).status().message(), HasSubstr("unknown datatype 'WEIRD'"));
}

TEST_F(ClientTest, HealthAndIndex) {
  inference::ServerReadyResponse ready;
  ready.set_ready(true);
  EXPECT_CALL(*stub_, ServerReady(_, _, _))
      .WillOnce(DoAll(SetArgPointee<2>(ready), Return(grpc::Status::OK)));
  EXPECT_TRUE(*client_->ServerReady());
  inference::RepositoryIndexRequest sent;
  EXPECT_CALL(*stub_, RepositoryIndex(_, _, _))
      .WillOnce(DoAll(Invoke([&](grpc::ClientContext*, const inference::RepositoryIndexRequest& r,
                                 inference::RepositoryIndexResponse*) { sent = r; }),
                      Return(grpc::Status::OK)));
  EXPECT_TRUE(client_->RepositoryIndex(true).ok());
  EXPECT_TRUE(sent.ready());
}

}  // namespace
}  // namespace sluice
