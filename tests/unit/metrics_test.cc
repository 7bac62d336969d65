// Recording into the Prometheus registry (counts, failure reasons, histograms, states), the
// NVML poller against a fake libnvidia-ml, and the /metrics endpoint.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "server/batching/model_stats.h"
#include "server/metrics/gpu_telemetry.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/server_metrics.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string Exposition(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The value of one series ("name{labels}" exactly as exposed), or -1 when it is absent.
double Value(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

class MetricsTest : public ::testing::Test {
 protected:
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics_{registry_};
};

TEST(FailureReasonTest, FromStatusCodes) {
  EXPECT_EQ(FailureReasonOf(absl::UnavailableError("queue full")), FailureReason::kRejected);
  EXPECT_EQ(FailureReasonOf(absl::DeadlineExceededError("")), FailureReason::kTimeout);
  EXPECT_EQ(FailureReasonOf(absl::CancelledError("")), FailureReason::kCancelled);
  EXPECT_EQ(FailureReasonOf(absl::InvalidArgumentError("")), FailureReason::kInvalidInput);
  EXPECT_EQ(FailureReasonOf(absl::InternalError("")), FailureReason::kModelError);
  EXPECT_EQ(FailureReasonOf(absl::ResourceExhaustedError("")), FailureReason::kModelError);
  EXPECT_STREQ(FailureReasonName(FailureReason::kInvalidInput), "invalid_input");
}

TEST_F(MetricsTest, RequestsFailuresAndBatchesAreCountedExactly) {
  ModelStats stats(metrics_.SinkFor("m", 1));
  // Two requests of 3 and 1 rows, admitted, run as one batch of 4, answered OK.
  stats.RecordAdmitted();
  stats.RecordAdmitted();
  stats.RecordStarted(2);
  stats.RecordExecution(4, 20us, 3ms, 10us);
  stats.RecordSuccess(3, 200us, 20us, 3ms, 10us, 3400us, Protocol::kGrpc);
  stats.RecordSuccess(1, 300us, 20us, 3ms, 10us, 3500us, Protocol::kHttp);
  // One of each failure: admitted ones (timeout, cancelled, model error) and rejected ones.
  for (int i = 0; i < 3; ++i) stats.RecordAdmitted();
  const std::string pending_text = Exposition(*registry_);
  EXPECT_EQ(Value(pending_text, R"(sluice_pending_requests{model="m",version="1"})"), 3);
  EXPECT_EQ(Value(pending_text, R"(nv_inference_pending_request_count{model="m",version="1"})"), 3);
  stats.RecordFailure(2s, absl::DeadlineExceededError("late"), /*ran=*/false, Protocol::kGrpc);
  stats.RecordFailure(1ms, absl::CancelledError("gone"), /*ran=*/false, Protocol::kHttp);
  EXPECT_EQ(Value(Exposition(*registry_), R"(sluice_pending_requests{model="m",version="1"})"), 1);
  stats.RecordStarted(1);  // Triton's pending count drops when the request starts running
  EXPECT_EQ(Value(Exposition(*registry_), R"(nv_inference_pending_request_count{model="m",version="1"})"), 0);
  EXPECT_EQ(Value(Exposition(*registry_), R"(sluice_pending_requests{model="m",version="1"})"), 1);
  stats.RecordFailure(4ms, absl::InternalError("boom"), /*ran=*/true, Protocol::kGrpc);
  stats.RecordRejected(absl::UnavailableError("queue full"), Protocol::kGrpc);
  stats.RecordRejected(absl::InvalidArgumentError("bad shape"), Protocol::kHttp);
  stats.RecordRejected(absl::InvalidArgumentError("bad dtype"), Protocol::kGrpc);

  const std::string text = Exposition(*registry_);
  const std::string labels = R"({model="m",version="1"})";
  // The per-request sluice_* series are split by front end; Triton's are not.
  const std::string grpc = R"({model="m",protocol="grpc",version="1"})";
  const std::string http = R"({model="m",protocol="http",version="1"})";
  EXPECT_EQ(Value(text, "sluice_requests_succeeded_total" + grpc), 1);
  EXPECT_EQ(Value(text, "sluice_requests_succeeded_total" + http), 1);
  EXPECT_EQ(Value(text, "nv_inference_request_success" + labels), 2);
  EXPECT_EQ(Value(text, "sluice_inferences_total" + grpc), 3);
  EXPECT_EQ(Value(text, "sluice_inferences_total" + http), 1);
  EXPECT_EQ(Value(text, "nv_inference_count" + labels), 4);
  EXPECT_EQ(Value(text, "sluice_executions_total" + labels), 1);
  EXPECT_EQ(Value(text, "nv_inference_exec_count" + labels), 1);
  EXPECT_EQ(Value(text, "sluice_pending_requests" + labels), 0);
  EXPECT_EQ(Value(text, "nv_inference_pending_request_count" + labels), 0);
  auto failed = [&](const char* reason, const char* protocol) {
    return Value(text, std::string(R"(sluice_requests_failed_total{model="m",protocol=")") + protocol +
                           R"(",reason=")" + reason + R"(",version="1"})");
  };
  EXPECT_EQ(failed("timeout", "grpc"), 1);
  EXPECT_EQ(failed("cancelled", "http"), 1);
  EXPECT_EQ(failed("cancelled", "grpc"), 0);
  EXPECT_EQ(failed("model_error", "grpc"), 1);
  EXPECT_EQ(failed("rejected", "grpc"), 1);
  EXPECT_EQ(failed("invalid_input", "grpc"), 1);
  EXPECT_EQ(failed("invalid_input", "http"), 1);
  auto nv_failed = [&](const char* reason) {
    return Value(text, std::string(R"(nv_inference_request_failure{model="m",reason=")") + reason + R"(",version="1"})");
  };
  EXPECT_EQ(nv_failed("REJECTED"), 2);  // Triton counts queue timeouts as rejections
  EXPECT_EQ(nv_failed("CANCELED"), 1);
  EXPECT_EQ(nv_failed("BACKEND"), 1);
  EXPECT_EQ(nv_failed("OTHER"), 2);  // invalid input
  // Triton's cumulative microseconds: queue 200 + 300, infer charged to both requests.
  EXPECT_EQ(Value(text, "nv_inference_queue_duration_us" + labels), 500);
  EXPECT_EQ(Value(text, "nv_inference_compute_infer_duration_us" + labels), 6000);
  EXPECT_EQ(Value(text, "nv_inference_request_duration_us" + labels), 6900);

  // Histograms: end to end 3.4 and 3.5 ms land in (2.5 ms, 5 ms]; queue 0.2 and 0.3 ms in
  // (0.1, 0.25] and (0.25, 0.5]; the batch of 4 in (3, 4].
  auto bucket = [&](const std::string& name, const std::string& le) {
    return Value(text, name + R"(_bucket{model="m",version="1",le=")" + le + R"("})");
  };
  auto per_protocol = [&](const std::string& name, const std::string& protocol, const std::string& le) {
    return Value(text, name + R"(_bucket{model="m",protocol=")" + protocol + R"(",version="1",le=")" + le + R"("})");
  };
  EXPECT_EQ(per_protocol("sluice_request_duration_seconds", "grpc", "0.0025"), 0);
  EXPECT_EQ(per_protocol("sluice_request_duration_seconds", "grpc", "0.005"), 1);
  EXPECT_EQ(per_protocol("sluice_request_duration_seconds", "http", "0.005"), 1);
  EXPECT_EQ(per_protocol("sluice_request_duration_seconds", "http", "+Inf"), 1);
  EXPECT_NEAR(Value(text, "sluice_request_duration_seconds_sum" + grpc), 0.0034, 1e-12);
  EXPECT_EQ(per_protocol("sluice_queue_duration_seconds", "grpc", "0.0001"), 0);
  EXPECT_EQ(per_protocol("sluice_queue_duration_seconds", "grpc", "0.00025"), 1);
  EXPECT_EQ(per_protocol("sluice_queue_duration_seconds", "http", "0.00025"), 0);
  EXPECT_EQ(per_protocol("sluice_queue_duration_seconds", "http", "0.0005"), 1);
  EXPECT_EQ(bucket("sluice_compute_infer_duration_seconds", "0.0025"), 0);
  EXPECT_EQ(bucket("sluice_compute_infer_duration_seconds", "0.005"), 1);
  EXPECT_EQ(bucket("sluice_batch_size", "3"), 0);
  EXPECT_EQ(bucket("sluice_batch_size", "4"), 1);
  EXPECT_EQ(Value(text, "sluice_batch_size_count" + labels), 1);
}

TEST_F(MetricsTest, SequencesAreCountedByOutcomeAndOnlyForModelsThatHaveThem) {
  ModelStats stateless(metrics_.SinkFor("plain", 1));
  stateless.RecordAdmitted();
  ModelStats stats(metrics_.SinkFor("acc", 2));
  for (int i = 0; i < 4; ++i) stats.RecordSequenceStarted();
  stats.RecordSequenceFinished(SequenceOutcome::kEnded);
  stats.RecordSequenceFinished(SequenceOutcome::kIdleExpired);
  stats.RecordSequenceFinished(SequenceOutcome::kCut);
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_sequences_active{model="acc",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="ended",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="idle_expired",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="dropped",version="2"})"), 0);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="cut",version="2"})"), 1);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_sequences_active{model="plain")")));
}

TEST_F(MetricsTest, BucketsResolveSubMillisecondAndMultiSecondTimes) {
  const std::vector<double>& buckets = LatencyBucketsSeconds();
  EXPECT_LE(buckets.front(), 0.0001);
  EXPECT_GE(buckets.back(), 30);
  EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
  int below_ms = 0;
  for (double b : buckets) below_ms += b < 0.001 ? 1 : 0;
  EXPECT_GE(below_ms, 4);
}

TEST_F(MetricsTest, StatesTuningAndBuildInfo) {
  metrics_.OnState("m", 2, ModelState::kLoading);
  std::string text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_model_state{model="m",state="LOADING",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_model_state{model="m",state="READY",version="2"})"), 0);
  ModelTuning tuning;
  tuning.name = "m";
  tuning.version = 2;
  tuning.cudnn_benchmark = true;
  tuning.cudnn_reason = "fixed shapes (4 in the set)";
  tuning.shapes_finite = true;
  tuning.shape_count = 4;
  tuning.warmup.resize(8);
  tuning.warmup_time = 1500ms;
  tuning.batch_sizes.measured = true;
  tuning.batch_sizes.sizes = {1, 4};
  tuning.batch_sizes.rates = {{1, 1000, true}, {2, 800, false}, {4, 3000, true}};
  metrics_.OnReady(tuning, 2s);
  metrics_.OnState("m", 2, ModelState::kReady);
  metrics_.SetBuildInfo({{"libtorch", "2.11.0"}, {"cudnn_loaded", "9.19.0"}});
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_model_state{model="m",state="LOADING",version="2"})"), 0);
  EXPECT_EQ(Value(text, R"(sluice_model_state{model="m",state="READY",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_model_load_seconds{model="m",version="2"})"), 2);
  EXPECT_EQ(Value(text, R"(sluice_model_warmup_seconds{model="m",version="2"})"), 1.5);
  EXPECT_EQ(Value(text, R"(sluice_model_warmup_pairs{model="m",version="2"})"), 8);
  EXPECT_EQ(Value(text, R"(sluice_model_shapes{model="m",version="2"})"), 4);
  EXPECT_EQ(Value(text, R"x(sluice_model_cudnn_benchmark{model="m",reason="fixed shapes (4 in the set)",version="2"})x"), 1);
  EXPECT_EQ(Value(text, R"(sluice_build_info{cudnn_loaded="9.19.0",libtorch="2.11.0"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_model_auto_batch_rows_per_second{batch_size="1",model="m",version="2"})"), 1000);
  EXPECT_EQ(Value(text, R"(sluice_model_auto_batch_rows_per_second{batch_size="4",model="m",version="2"})"), 3000);
  EXPECT_EQ(text.find(R"(sluice_model_auto_batch_rows_per_second{batch_size="2")"), std::string::npos);
  // Loaded again with another choice: the old sizes' series go.
  tuning.batch_sizes.rates = {{1, 1100, true}, {2, 2000, true}, {4, 1500, false}};
  metrics_.OnReady(tuning, 2s);
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_model_auto_batch_rows_per_second{batch_size="2",model="m",version="2"})"), 2000);
  EXPECT_EQ(text.find(R"(sluice_model_auto_batch_rows_per_second{batch_size="4")"), std::string::npos);
}

TEST_F(MetricsTest, FakeNvmlFeedsTheGpuSeriesAndGoneGpusDisappear) {
  setenv("FAKE_NVML_GPUS", "2", 1);
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[1].uuid, "GPU-fa4e0000-0000-4000-8000-000000000001");
  EXPECT_DOUBLE_EQ((*samples)[1].utilization, 0.47);
  EXPECT_DOUBLE_EQ((*samples)[0].power_watts, 123.456);
  metrics_.SetGpus(*samples);
  std::string text = Exposition(*registry_);
  const std::string gpu0 = R"({gpu_uuid="GPU-fa4e0000-0000-4000-8000-000000000000"})";
  const std::string gpu1 = R"({gpu_uuid="GPU-fa4e0000-0000-4000-8000-000000000001"})";
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_total_bytes" + gpu0), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + gpu1), 4.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_usage" + gpu0), 123.456);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + gpu0), 700);
  EXPECT_DOUBLE_EQ(Value(text, R"(sluice_gpu_temperature_celsius{gpu="1",gpu_uuid="GPU-fa4e0000-0000-4000-8000-000000000001",name="Fake GPU 1"})"), 56);

  // Energy is a counter from the first reading on (the fake's reading does not change).
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu0), 0);
  // The poller samples on its own; a GPU that goes away loses its series.
  setenv("FAKE_NVML_GPUS", "1", 1);
  {
    GpuTelemetry telemetry(*std::move(nvml), &metrics_, 100ms);
    EXPECT_EQ(telemetry.gpus(), 1);
    text = Exposition(*registry_);
  }  // the poller thread is gone before the environment changes again
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_EQ(Value(text, "nv_gpu_utilization" + gpu1), -1);
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu1), -1);
  unsetenv("FAKE_NVML_GPUS");
}

TEST_F(MetricsTest, NoNvmlMeansNoGpuSeriesAndAReason) {
  auto nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("cannot load /nonexistent/libnvidia-ml.so.1"));
  EXPECT_THAT(Exposition(*registry_), Not(HasSubstr("nv_gpu_utilization{")));
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST_F(MetricsTest, EndpointServesTheRegistryAndATakenPortIsAClearError) {
  metrics_.OnState("m", 1, ModelState::kReady);
  auto endpoint = MetricsEndpoint::Start("127.0.0.1", 0, registry_);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  const std::string response = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr(R"(sluice_model_state{model="m",state="READY",version="1"} 1)"));
  auto second = MetricsEndpoint::Start("127.0.0.1", (*endpoint)->port(), registry_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics-port"));
}

}  // namespace
}  // namespace sluice
