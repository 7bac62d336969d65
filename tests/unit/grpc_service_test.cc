// The real ModelInfer handler behind a real gRPC server on loopback, with a fake model lookup
// whose models run on fake backends: every outcome a caller can see.
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "server/grpc/grpc_service.h"
#include "tests/unit/fakes.h"
#include "tests/unit/handle_factory.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

inference::ModelInferRequest Request(const std::string& model, std::vector<int32_t> values,
                                     const std::string& id = "") {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  request.set_id(id);
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("INT32");
  input->add_shape(1);
  input->add_shape(static_cast<int64_t>(values.size()));
  request.add_raw_input_contents(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return request;
}

class GrpcServiceTest : public ::testing::Test {
 protected:
  static constexpr int kStreamBound = 2;  // requests in flight per ModelStreamInfer stream

  void SetUp() override {
    auto echo = std::make_unique<testing::EchoBackend>(/*with_sum=*/true);
    auto gated = std::make_unique<testing::FakeBackend>();
    gated_ = gated.get();
    lookup_.models["echo"] =
        testing::MakeEchoModel("echo", std::move(echo), &clock_, /*with_sum=*/true);
    lookup_.models["gated"] = testing::MakeEchoModel("gated", std::move(gated), &clock_);
    lookup_.models["roomy"] = testing::MakeEchoModel(
        "roomy", std::make_unique<testing::EchoBackend>(/*with_sum=*/true), &clock_,
        /*with_sum=*/true, /*max_queue=*/64);
    auto roomy_gated = std::make_unique<testing::FakeBackend>();
    roomy_gated_ = roomy_gated.get();
    lookup_.models["roomy_gated"] =
        testing::MakeEchoModel("roomy_gated", std::move(roomy_gated), &clock_, false, 64);
    auto batching_gated = echo_.Backend();  // echoes x as y, batches included
    batching_gated_ = batching_gated.get();
    lookup_.models["batching_gated"] =
        testing::MakeEchoModel("batching_gated", std::move(batching_gated), &clock_, false, 64);
    GrpcService::Options options;
    options.lookup = &lookup_;
    options.stream_max_in_flight = kStreamBound;
    service_ = std::make_unique<GrpcService>(&manager_, /*control=*/nullptr, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
    stub_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    gated_->OpenGate();
    roomy_gated_->OpenGate();
    batching_gated_->OpenGate();
    server_->Shutdown();
    for (auto& [name, model] : lookup_.models) model->Stop();
  }

  grpc::Status Infer(const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 30s);
    return stub_->ModelInfer(&context, request, response);
  }

  // Sends `request` without waiting; the answer comes through the returned future.
  std::future<grpc::Status> Start(const inference::ModelInferRequest& request,
                                  grpc::ClientContext* context) {
    auto done = std::make_shared<std::promise<grpc::Status>>();
    auto response = std::make_shared<inference::ModelInferResponse>();
    auto sent = std::make_shared<inference::ModelInferRequest>(request);
    stub_->async()->ModelInfer(
        context, sent.get(), response.get(),
        [done, response, sent](grpc::Status status) { done->set_value(status); });
    return done->get_future();
  }

  // Holds one request in the gated model; returns its answer.
  std::future<grpc::Status> HoldOne(grpc::ClientContext* context) {
    const int before = gated_->started();
    gated_->CloseGate();
    auto running = Start(Request("gated", {1}), context);
    gated_->WaitStarted(before + 1);
    return running;
  }

  // Waits (bounded) until `model` has counted `failures` failed requests.
  void WaitForFailures(const std::string& model, uint64_t failures) {
    testing::Eventually([&] { return lookup_.models[model]->Statistics().fail.count >= failures; });
  }

  SteadyTimeSource clock_;
  ModelManager manager_{{}, {}};
  testing::FakeLookup lookup_;
  testing::FakeBackend* gated_ = nullptr;
  testing::FakeBackend* roomy_gated_ = nullptr;  // like gated_, with room for 64 waiting requests
  testing::ThreadNotingEcho echo_;
  testing::FakeBackend* batching_gated_ = nullptr;  // like roomy_gated_, echoing x (batches too)
  std::unique_ptr<GrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(GrpcServiceTest, OkWritesTheRequestedOutputsIntoTheResponse) {
  inference::ModelInferRequest request = Request("echo", {3, 4, 5}, "req-7");
  inference::ModelInferResponse response;
  grpc::Status status = Infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_name(), "echo");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "req-7");
  ASSERT_EQ(response.outputs_size(), 2);  // none named: every output, in config order
  EXPECT_EQ(response.outputs(0).name(), "y");
  EXPECT_EQ(response.outputs(0).datatype(), "INT32");
  EXPECT_THAT(response.outputs(0).shape(), ::testing::ElementsAre(1, 3));
  EXPECT_EQ(response.raw_output_contents(0), request.raw_input_contents(0));
  EXPECT_EQ(response.outputs(1).name(), "sum");

  request.add_outputs()->set_name("sum");
  inference::ModelInferResponse only_sum;
  ASSERT_TRUE(Infer(request, &only_sum).ok());
  ASSERT_EQ(only_sum.outputs_size(), 1);
  ASSERT_EQ(only_sum.raw_output_contents_size(), 1);
  EXPECT_EQ(only_sum.outputs(0).name(), "sum");
  EXPECT_EQ(only_sum.raw_output_contents(0).size(), 8u);
}

// Calls on one channel share one TCP connection: when one execution answers several of them,
// the connection is held (TCP_CORK) while their answers are written, and each caller still gets
// its own answer.
TEST_F(GrpcServiceTest, AnswersOfOneBatchOnOneConnectionAreWrittenWhileItIsHeld) {
  batching_gated_->CloseGate();
  grpc::ClientContext first_context;
  auto first = Start(Request("batching_gated", {100, 100}), &first_context);
  batching_gated_->WaitStarted(1);
  constexpr int kQueued = 4;
  grpc::ClientContext contexts[kQueued];
  std::vector<std::future<grpc::Status>> answers;
  std::vector<std::shared_ptr<inference::ModelInferResponse>> responses;
  for (int i = 0; i < kQueued; ++i) {
    auto response = std::make_shared<inference::ModelInferResponse>();
    auto request =
        std::make_shared<inference::ModelInferRequest>(Request("batching_gated", {i, i}));
    auto done = std::make_shared<std::promise<grpc::Status>>();
    answers.push_back(done->get_future());
    responses.push_back(response);
    stub_->async()->ModelInfer(
        &contexts[i], request.get(), response.get(),
        [done, response, request](grpc::Status status) { done->set_value(status); });
  }
  ASSERT_TRUE(testing::Eventually(
      [&] { return lookup_.models["batching_gated"]->in_flight() == 1 + kQueued; }));
  EXPECT_EQ(service_->connections().holds(), 0);
  batching_gated_->OpenGate();
  ASSERT_TRUE(first.get().ok());
  for (int i = 0; i < kQueued; ++i) {
    const grpc::Status status = answers[static_cast<size_t>(i)].get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    const std::string& bytes = responses[static_cast<size_t>(i)]->raw_output_contents(0);
    ASSERT_EQ(bytes.size(), 8u);
    int32_t values[2];
    std::memcpy(values, bytes.data(), 8);
    EXPECT_EQ(values[0], i);  // its own row of the batch
    EXPECT_EQ(values[1], i);
  }
  // The first alone, then the four as one batch (or, should the gate open while the last one
  // is between its model lookup and its queue, as two).
  EXPECT_LE(batching_gated_->executed(), 3);
  EXPECT_GE(service_->connections().holds(), 1);
}

TEST_F(GrpcServiceTest, UnknownAndNotReadyModels) {
  inference::ModelInferResponse response;
  grpc::Status status = Infer(Request("nope", {1}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("Request for unknown model: 'nope' is not found"));
  status = Infer(Request("loading", {1}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("still loading"));
}

TEST_F(GrpcServiceTest, InvalidRequestsAreRejectedAndCounted) {
  inference::ModelInferRequest bad_type = Request("echo", {1});
  bad_type.mutable_inputs(0)->set_datatype("FOO");
  inference::ModelInferResponse response;
  grpc::Status status = Infer(bad_type, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("datatype 'FOO'"));

  inference::ModelInferRequest bad_name = Request("echo", {1});
  bad_name.mutable_inputs(0)->set_name("z");
  status = Infer(bad_name, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(lookup_.models["echo"]->Statistics().fail.count, 2u);
  EXPECT_TRUE(Infer(Request("echo", {1}), &response).ok());  // and the model serves on
}

TEST_F(GrpcServiceTest, AFullQueueIsUnavailable) {
  grpc::ClientContext running_context, second_context, third_context;
  auto running = HoldOne(&running_context);
  // The queue holds one request: of two more, whichever comes second is refused at once.
  auto second = Start(Request("gated", {2}), &second_context);
  auto third = Start(Request("gated", {3}), &third_context);
  std::future<grpc::Status>* refused = nullptr;
  for (int i = 0; i < 10000 && refused == nullptr; ++i) {
    if (second.wait_for(1ms) == std::future_status::ready) refused = &second;
    if (third.wait_for(0ms) == std::future_status::ready) refused = &third;
  }
  ASSERT_NE(refused, nullptr);
  const grpc::Status status = refused->get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("requests waiting (its max_queue_size)"));
  gated_->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_TRUE((refused == &second ? third : second).get().ok());
}

TEST_F(GrpcServiceTest, TheRequestsOwnTimeoutExpiresItInTheQueue) {
  grpc::ClientContext running_context;
  auto running = HoldOne(&running_context);
  inference::ModelInferRequest quick = Request("gated", {2});
  (*quick.mutable_parameters())["timeout"].set_int64_param(1000);  // 1 ms
  inference::ModelInferResponse response;
  grpc::Status status = Infer(quick, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("did not run"));
  const int executed = gated_->executed();
  gated_->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(gated_->executed(), executed + 1);  // only the held request ran
}

TEST_F(GrpcServiceTest, ACancelledCallIsAnsweredWithoutRunning) {
  grpc::ClientContext running_context, cancelled_context;
  auto running = HoldOne(&running_context);
  auto cancelled = Start(Request("gated", {2}), &cancelled_context);
  // Let the request reach the queue before the caller gives up.
  testing::Eventually([&] { return lookup_.models["gated"]->in_flight() >= 2; });
  cancelled_context.TryCancel();
  EXPECT_EQ(cancelled.get().error_code(), grpc::StatusCode::CANCELLED);
  // The server answers it CANCELLED from the queue (a failure), while the model is still held.
  WaitForFailures("gated", 1);
  EXPECT_EQ(lookup_.models["gated"]->Statistics().fail.count, 1u);
  const int executed = gated_->executed();
  gated_->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(gated_->executed(), executed + 1);
  // Every reference the handler took is given back once its call is answered.
  testing::Eventually([&] { return lookup_.models["gated"]->in_flight() <= 0; });
  EXPECT_EQ(lookup_.models["gated"]->in_flight(), 0);
}

TEST_F(GrpcServiceTest, StreamAnswersEveryRequestByIdAndABadOneAlone) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  auto stream = stub_->ModelStreamInfer(&context);
  std::map<std::string, std::string> sent;
  for (int i = 0; i < 20; ++i) {
    inference::ModelInferRequest request = Request("roomy", {i, i + 1}, std::to_string(i));
    sent[request.id()] = request.raw_input_contents(0);
    ASSERT_TRUE(stream->Write(request));
    if (i == 7) {
      ASSERT_TRUE(stream->Write(Request("nope", {1}, "bad")));
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  inference::ModelStreamInferResponse response;
  std::map<std::string, std::string> answered;
  std::string error;
  while (stream->Read(&response)) {
    if (!response.error_message().empty()) {
      EXPECT_EQ(response.infer_response().id(), "bad");
      error = response.error_message();
      continue;
    }
    ASSERT_EQ(response.infer_response().raw_output_contents_size(), 2);
    answered[response.infer_response().id()] = response.infer_response().raw_output_contents(0);
  }
  EXPECT_TRUE(stream->Finish().ok());  // the client half-closed and every answer was written
  EXPECT_EQ(answered, sent);
  EXPECT_THAT(error, HasSubstr("Request for unknown model: 'nope' is not found"));
}

TEST_F(GrpcServiceTest, StreamStopsReadingAtItsInFlightBound) {
  // Five requests written to a model that holds everything it is given: the server reads two
  // (the stream's bound), so the model sees two, and the other three wait unread in the
  // transport until one is answered: at no time are more than two in flight.
  roomy_gated_->CloseGate();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  auto stream = stub_->ModelStreamInfer(&context);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(stream->Write(Request("roomy_gated", {i}, std::to_string(i))));
  ModelHandle& model = *lookup_.models["roomy_gated"];
  testing::Eventually([&] { return model.in_flight() >= kStreamBound; });
  roomy_gated_->OpenGate();
  ASSERT_TRUE(stream->WritesDone());
  inference::ModelStreamInferResponse response;
  std::set<std::string> answered;
  // (The fake's one-row output fails batches of two: only the count and ids matter here.)
  while (stream->Read(&response)) answered.insert(response.infer_response().id());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answered, (std::set<std::string>{"0", "1", "2", "3", "4"}));
  EXPECT_EQ(model.peak_in_flight(), kStreamBound);
}

TEST_F(GrpcServiceTest, AStreamThatEndsCancelsItsQueuedRequests) {
  grpc::ClientContext held_context;
  auto running = HoldOne(&held_context);  // the gated model's one instance is busy
  const uint64_t failures = lookup_.models["gated"]->Statistics().fail.count;
  const int executed = gated_->executed();
  {
    grpc::ClientContext context;
    auto stream = stub_->ModelStreamInfer(&context);
    ASSERT_TRUE(stream->Write(Request("gated", {2}, "queued")));
    testing::Eventually([&] { return lookup_.models["gated"]->in_flight() >= 2; });
    ASSERT_EQ(lookup_.models["gated"]->in_flight(), 2);
    context.TryCancel();
    inference::ModelStreamInferResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  WaitForFailures("gated", failures + 1);  // answered CANCELLED from the queue, not run
  EXPECT_EQ(lookup_.models["gated"]->Statistics().fail.count, failures + 1);
  gated_->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(gated_->executed(), executed + 1);
  testing::Eventually([&] { return lookup_.models["gated"]->in_flight() <= 0; });
  EXPECT_EQ(lookup_.models["gated"]->in_flight(), 0);
}

TEST_F(GrpcServiceTest, BytesThatAreNoRequestAreInvalidAndTheServerServesOn) {
  // The handler parses the request bytes itself (a raw method): bytes that are no
  // ModelInferRequest get INVALID_ARGUMENT with the reason, not gRPC's bare UNIMPLEMENTED.
  grpc::GenericStub generic(channel_);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 30s);
    const std::string garbage = "\xff\xff\xff\xff not a ModelInferRequest";
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, "/inference.GRPCInferenceService/ModelInfer", grpc::StubOptions(),
                      &request, &response,
                      [&done](grpc::Status status) { done.set_value(status); });
    const grpc::Status status = done.get_future().get();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("not a valid inference.ModelInferRequest"));
  }
  inference::ModelInferResponse response;
  EXPECT_TRUE(Infer(Request("echo", {1}), &response).ok());
}

TEST_F(GrpcServiceTest, ShutdownCancelsQueuedCallsAfterItsGraceAndWaitsForRunningOnes) {
  grpc::ClientContext running_context, queued_context;
  auto running = HoldOne(&running_context);
  auto queued = Start(Request("gated", {2}), &queued_context);
  testing::Eventually([&] { return lookup_.models["gated"]->in_flight() >= 2; });
  const int executed = gated_->executed();
  auto stopped = std::async(std::launch::async, [this] {
    server_->Shutdown(std::chrono::system_clock::now() + 50ms);
    server_->Wait();
  });
  // After the grace the queued call is cancelled and answered without running; the running one
  // keeps the shutdown waiting until its model answers it.
  EXPECT_NE(queued.get().error_code(), grpc::StatusCode::OK);
  WaitForFailures("gated", 1);
  EXPECT_EQ(lookup_.models["gated"]->Statistics().fail.count, 1u);
  EXPECT_EQ(stopped.wait_for(100ms), std::future_status::timeout);
  gated_->OpenGate();
  ASSERT_EQ(stopped.wait_for(30s), std::future_status::ready);
  EXPECT_NE(running.get().error_code(), grpc::StatusCode::OK);  // cancelled at the caller's end
  EXPECT_EQ(gated_->executed(), executed + 1);
  EXPECT_EQ(lookup_.models["gated"]->in_flight(), 0);
}

}  // namespace
}  // namespace sluice
