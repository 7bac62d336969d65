// HTTP inference (POST /v2/models/{m}/infer) through the real HttpService behind a real
// HttpServer on loopback, with a fake model lookup whose models run on fake backends: the answers
// a REST client sees, and that a refusal counts in the model's statistics as over gRPC.
#include "server/http/http_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/unit/fakes.h"
#include "tests/unit/handle_factory.h"
#include "tests/unit/http_client.h"

namespace sluice {
namespace {

using testing::Client;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Post;
using testing::Reply;
using namespace std::chrono_literals;

const char kBody[] =
    R"({"id": "r-1", "inputs": [{"name": "x", "shape": [1, 3], "datatype": "INT32", "data": [4, 5, 6]}]})";

class HttpServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lookup_.models["echo"] =
        testing::MakeEchoModel("echo", std::make_unique<testing::EchoBackend>(), &clock_,
                               /*with_sum=*/false, /*max_queue=*/8);
    auto gated = std::make_unique<testing::FakeBackend>();
    gated_ = gated.get();
    lookup_.models["gated"] =
        testing::MakeEchoModel("gated", std::move(gated), &clock_);  // one may wait
    HttpService::Options options;
    options.lookup = &lookup_;
    options.tracer = &tracer_;
    service_ = std::make_unique<HttpService>(&manager_, /*control=*/nullptr, options);
    HttpServerOptions server_options;
    server_options.address = "127.0.0.1";
    server_options.port = 0;
    auto server = HttpServer::Start(server_options, [this](HttpResponder responder) {
      service_->Handle(std::move(responder));
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    gated_->OpenGate();
    server_->Stop();
    for (auto& [name, model] : lookup_.models) model->Stop();
  }

  Reply Infer(const std::string& model, const std::string& body, const std::string& headers = "") {
    Client client(server_->port());
    client.Send(Post("/v2/models/" + model + "/infer", body, headers));
    return client.Read();
  }
  uint64_t Failures(const std::string& model) {
    return lookup_.models[model]->Statistics().fail.count;
  }

  SteadyTimeSource clock_;
  testing::SpanRecorder spans_;
  Tracer tracer_{
      Tracer::Options{TraceSettings{}, &spans_, nullptr}};  // level OFF until a test says
  ModelManager manager_{{}, {}};
  testing::FakeLookup lookup_;
  testing::FakeBackend* gated_ = nullptr;
  std::unique_ptr<HttpService> service_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServiceTest, JsonInferenceAnswersWithTheModelVersionIdAndOutputs) {
  const Reply reply = Infer("echo", kBody);
  ASSERT_EQ(reply.code, 200) << reply.body;
  EXPECT_THAT(reply.headers, HasSubstr("content-type: application/json"));
  EXPECT_THAT(reply.body, HasSubstr(R"("model_name":"echo")"));
  EXPECT_THAT(reply.body, HasSubstr(R"("model_version":"1")"));
  EXPECT_THAT(reply.body, HasSubstr(R"("id":"r-1")"));
  EXPECT_THAT(reply.body,
              HasSubstr(R"("name":"y","datatype":"INT32","shape":[1,3],"data":[4,5,6])"));
  EXPECT_EQ(lookup_.models["echo"]->Statistics().success.count, 1u);
}

// As Triton: a client's Accept-Encoding compresses the inference answer and nothing else (not a
// refusal, not health, not statistics), which clients that send the header without inflating
// other answers (tritonclient.http.aio) rely on.
TEST_F(HttpServiceTest, OnlyInferenceAnswersAreCompressed) {
  const std::string gzip = "Accept-Encoding: gzip, deflate\r\n";
  const Reply answer = Infer("echo", kBody, gzip);
  ASSERT_EQ(answer.code, 200);
  EXPECT_THAT(answer.headers, HasSubstr("content-encoding: gzip"));
  EXPECT_THAT(answer.body.substr(0, 2), "\x1f\x8b");
  const Reply refused = Infer("nonexistent", kBody, gzip);
  EXPECT_EQ(refused.code, 404);
  EXPECT_THAT(refused.headers, Not(HasSubstr("content-encoding")));
  EXPECT_THAT(refused.body, HasSubstr("nonexistent"));
  for (const char* path : {"/v2/health/live", "/v2/health/ready", "/v2/models/stats", "/v2"}) {
    Client client(server_->port());
    client.Send(testing::Get(path, gzip));
    const Reply reply = client.Read();
    EXPECT_EQ(reply.code, 200) << path << " " << reply.body;
    EXPECT_THAT(reply.headers, Not(HasSubstr("content-encoding"))) << path;
  }
}

// The status codes are Triton's (tritonclient reads only those); the bodies are what KServe's REST
// client reads.
TEST_F(HttpServiceTest, TraceSettingsTurnTracingOnAndATracedRequestContinuesTheCallersTrace) {
  auto send = [&](const std::string& method, const std::string& path,
                  const std::string& body = "") {
    Client client(server_->port());
    client.Send(method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body);
    return client.Read();
  };
  Reply got = send("GET", "/v2/trace/setting");
  EXPECT_EQ(got.code, 200);
  EXPECT_THAT(got.body, HasSubstr(R"("trace_level":["OFF"])"));
  EXPECT_EQ(send("GET", "/v2/trace/settings").code, 404);
  EXPECT_EQ(send("GET", "/v2/models/echo/versions/1/trace/setting").code, 404);
  Reply bad = send("POST", "/v2/trace/setting", R"({"trace_rate": "0"})");
  EXPECT_EQ(bad.code, 400);
  EXPECT_THAT(bad.body, HasSubstr("trace_rate"));
  EXPECT_EQ(send("GET", "/v2/models/nowhere/trace/setting").code, 404);  // the repository lacks it

  // Untraced while the level is OFF.
  const std::string parent =
      "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n";
  EXPECT_EQ(Infer("echo", kBody, parent).code, 200);
  Reply on =
      send("POST", "/v2/trace/setting", R"({"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"})");
  EXPECT_EQ(on.code, 200);
  EXPECT_THAT(on.body, HasSubstr(R"("trace_rate":"1000")"));
  EXPECT_EQ(Infer("echo", kBody, parent).code, 200);
  // The spans are exported once the answer has been handed over: wait for them.
  ASSERT_TRUE(spans_.AwaitSpans(5));
  ASSERT_EQ(spans_.spans().size(), 5u);  // request, queue, compute, output, and its batch's
  const SpanData request = spans_.Named("POST /v2/models/{model}/infer");
  EXPECT_EQ(HexOf(request.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(HexOf(request.parent_span_id), "00f067aa0ba902b7");
  EXPECT_EQ(spans_.Named("compute").parent_span_id, request.span_id);
  ASSERT_EQ(spans_.Named("batch").links.size(), 1u);
  EXPECT_EQ(spans_.Named("batch").links[0].span_id, request.span_id);
}

TEST_F(HttpServiceTest, HealthAnswersCarryKServesBodies) {
  for (const auto& [path, body] :
       {std::pair<std::string, std::string>{"/v2/health/live", R"({"live":true})"},
        {"/v2/health/ready", R"({"ready":true})"}}) {
    Client client(server_->port());
    client.Send(testing::Get(path));
    const Reply reply = client.Read();
    EXPECT_EQ(reply.code, 200) << path;
    EXPECT_THAT(reply.headers, HasSubstr("content-type: application/json")) << path;
    EXPECT_EQ(reply.body, body) << path;
  }
}

TEST_F(HttpServiceTest, ABinaryOutputComesAfterTheJsonHeader) {
  const Reply reply = Infer(
      "echo", R"({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}],
                                       "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})");
  ASSERT_EQ(reply.code, 200) << reply.body;
  EXPECT_THAT(reply.headers, HasSubstr("content-type: application/octet-stream"));
  const size_t at = reply.headers.find("inference-header-content-length: ");
  ASSERT_NE(at, std::string::npos);
  const size_t json_length = std::stoul(reply.headers.substr(at + 33));
  ASSERT_EQ(reply.body.size(), json_length + 8);
  EXPECT_THAT(reply.body.substr(0, json_length), HasSubstr(R"("binary_data_size":8)"));
  EXPECT_EQ(reply.body.substr(json_length), std::string("\1\0\0\0\2\0\0\0", 8));
}

TEST_F(HttpServiceTest, RefusalsGetTheirHttpCodeAndCountAsTheModelsRejections) {
  EXPECT_EQ(Infer("nope", kBody).code, 404);
  EXPECT_EQ(Infer("loading", kBody).code, 503);
  struct Case {
    std::string body, headers, words;
  };
  const std::vector<Case> cases = {
      {kBody, "Inference-Header-Content-Length: lots\r\n",
       "Inference-Header-Content-Length 'lots' is not a byte count"},
      {R"({"inputs": [], "parameters": {"timeout": -1}})", "",
       "'timeout' must be a non-negative integer"},
      {"not json", "", ""},
      // The model's own check (ModelHandle::Submit), after decoding.
      {R"({"inputs": [{"name": "z", "shape": [1, 1], "datatype": "INT32", "data": [1]}]})", "",
       "'z'"},
  };
  uint64_t failures = 0;
  for (const Case& each : cases) {
    const Reply reply = Infer("echo", each.body, each.headers);
    EXPECT_EQ(reply.code, 400) << each.body;
    EXPECT_THAT(reply.body, HasSubstr(R"({"error":")")) << each.body;
    EXPECT_THAT(reply.body, HasSubstr(each.words)) << each.body;
    EXPECT_EQ(Failures("echo"), ++failures) << each.body;
  }
  EXPECT_EQ(Infer("echo", kBody).code, 200);  // and it keeps serving
}

TEST_F(HttpServiceTest, AFullQueueIs503AndAClientThatLeavesIsCancelledWithoutRunning) {
  gated_->CloseGate();
  Client running(server_->port());
  running.Send(Post("/v2/models/gated/infer", kBody));
  gated_->WaitStarted(1);
  uint64_t before = 0;  // failures before the queued client leaves
  {
    Client queued(server_->port());
    queued.Send(Post("/v2/models/gated/infer", kBody));
    // The queue holds one request: wait until it is that one (held in flight from before its
    // submission, on the one HTTP thread, which handles the next request only after submitting
    // it), then a third is refused. A probe sent earlier could take the queue's place itself.
    ModelHandle& gated = *lookup_.models["gated"];
    testing::Eventually([&] { return gated.in_flight() >= 2; });
    ASSERT_EQ(gated.in_flight(), 2);
    const Reply refused = Infer("gated", kBody);
    EXPECT_EQ(refused.code, 503);
    EXPECT_THAT(refused.body, HasSubstr("max_queue_size"));
    // Counted before the refusal was sent; read while the queued client is still connected (once
    // it goes away its cancellation may be counted at once).
    before = Failures("gated");
    queued.Abort();  // the queued client goes away (a reset: a FIN alone could be a half-close)
  }
  testing::Eventually([&] { return Failures("gated") != before; });
  EXPECT_EQ(Failures("gated"), before + 1);  // answered CANCELLED while the instance is still busy
  EXPECT_EQ(gated_->started(), 1);
  gated_->OpenGate();
  EXPECT_EQ(running.Read().code, 200);
  EXPECT_EQ(gated_->started(), 1);  // the cancelled one never ran
}

}  // namespace
}  // namespace sluice
