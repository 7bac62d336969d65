// Recording into the Prometheus registry (server/metrics/server_metrics.h: counts, failure
// reasons, histograms, states), the NVML poller against a fake libnvidia-ml (gpu_telemetry.h), and
// the /metrics endpoint (metrics_endpoint.h). The poller's and the endpoint's tests stay here: they
// use this file's MetricsTest fixture and exposition helpers, which no shared test header holds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "server/batching/model_stats.h"
#include "server/metrics/gpu_telemetry.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/metrics/server_metrics.h"
#include "server/manager/response_cache.h"

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
  EXPECT_EQ(
      Value(Exposition(*registry_), R"(nv_inference_pending_request_count{model="m",version="1"})"),
      0);
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
    return Value(text, std::string(R"(sluice_requests_failed_total{model="m",protocol=")") +
                           protocol + R"(",reason=")" + reason + R"(",version="1"})");
  };
  EXPECT_EQ(failed("timeout", "grpc"), 1);
  EXPECT_EQ(failed("cancelled", "http"), 1);
  EXPECT_EQ(failed("cancelled", "grpc"), 0);
  EXPECT_EQ(failed("model_error", "grpc"), 1);
  EXPECT_EQ(failed("rejected", "grpc"), 1);
  EXPECT_EQ(failed("invalid_input", "grpc"), 1);
  EXPECT_EQ(failed("invalid_input", "http"), 1);
  auto nv_failed = [&](const char* reason) {
    return Value(text, std::string(R"(nv_inference_request_failure{model="m",reason=")") + reason +
                           R"(",version="1"})");
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
  auto per_protocol = [&](const std::string& name, const std::string& protocol,
                          const std::string& le) {
    return Value(text, name + R"(_bucket{model="m",protocol=")" + protocol +
                           R"(",version="1",le=")" + le + R"("})");
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
  EXPECT_EQ(
      Value(text, R"(sluice_sequences_total{model="acc",outcome="idle_expired",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="dropped",version="2"})"), 0);
  EXPECT_EQ(Value(text, R"(sluice_sequences_total{model="acc",outcome="cut",version="2"})"), 1);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_sequences_active{model="plain")")));
}

TEST_F(MetricsTest, LatencyTargetRefusalsWaitsAndCostErrorsOnlyForModelsWithATarget) {
  ModelStats plain(metrics_.SinkFor("plain", 1));
  plain.RecordAdmitted();
  ModelStats stats(metrics_.SinkFor("fast", 3));
  stats.RecordEarlyRefusal(EarlyRefusal::kTarget, /*queued=*/false);
  stats.RecordEarlyRefusal(EarlyRefusal::kTarget, /*queued=*/false);
  stats.RecordEarlyRefusal(EarlyRefusal::kDeadline, /*queued=*/true);
  stats.RecordEarlyRefusal(EarlyRefusal::kNone, /*queued=*/true);  // not a refusal: ignored
  stats.RecordBatchCost(std::chrono::microseconds(300), std::chrono::microseconds(1000),
                        std::chrono::microseconds(1200));
  stats.RecordBatchCost(std::chrono::microseconds(40), std::nullopt,
                        std::chrono::microseconds(500));  // no prediction
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_latency_refusals_total{model="fast",reason="target",version="3",when="arrival"})"),
      2);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_latency_refusals_total{model="fast",reason="target",version="3",when="queued"})"),
      0);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_latency_refusals_total{model="fast",reason="deadline",version="3",when="queued"})"),
      1);
  EXPECT_EQ(Value(text, R"(sluice_batch_oldest_wait_seconds_count{model="fast",version="3"})"), 2);
  EXPECT_EQ(
      Value(text,
            R"(sluice_batch_oldest_wait_seconds_bucket{model="fast",version="3",le="0.00025"})"),
      1);
  EXPECT_EQ(Value(text, R"(sluice_batch_cost_ratio_count{model="fast",version="3"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_batch_cost_ratio_bucket{model="fast",version="3",le="1.1"})"), 0);
  EXPECT_EQ(Value(text, R"(sluice_batch_cost_ratio_bucket{model="fast",version="3",le="1.25"})"),
            1);
  const ModelStatsSnapshot snapshot = stats.Snapshot();
  EXPECT_EQ(snapshot.refused_for_target, 2u);
  EXPECT_EQ(snapshot.refused_for_deadline, 1u);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_latency_refusals_total{model="plain")")));
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_batch_cost_ratio_count{model="plain")")));
}

TEST_F(MetricsTest, CudaGraphCapturesAndReplaysOnlyForModelsWithGraphs) {
  ModelStats plain(metrics_.SinkFor("plain", 1));
  plain.RecordGraphRun(ModelBackend::GraphRun::kNone);  // an eager pass: no series
  ModelStats stats(metrics_.SinkFor("graphed", 2));
  stats.RecordGraphRun(ModelBackend::GraphRun::kCaptured);
  stats.RecordGraphRun(ModelBackend::GraphRun::kCaptured);
  for (int i = 0; i < 5; ++i) stats.RecordGraphRun(ModelBackend::GraphRun::kReplayed);
  stats.RecordGraphRun(ModelBackend::GraphRun::kNone);
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_cuda_graph_captures_total{model="graphed",version="2"})"), 2);
  EXPECT_EQ(Value(text, R"(sluice_cuda_graph_replays_total{model="graphed",version="2"})"), 5);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_cuda_graph_replays_total{model="plain")")));
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_cuda_graph_captures_total{model="plain")")));
}

TEST_F(MetricsTest, BatchCyclesByPhaseAndRowsByKind) {
  ModelStats stats(metrics_.SinkFor("m", 1));
  EXPECT_THAT(Exposition(*registry_),
              Not(HasSubstr("sluice_batch_phase_seconds_total{")));  // from the first batch
  BatchPhases phases;
  phases.idle = 5ms;
  phases.assembly = 1ms;
  phases.execute = 8ms;
  phases.device = DevicePhases{2ms, 4ms, 1ms};
  phases.scatter = 2ms;
  phases.complete = 1ms;
  phases.rows = 3;
  phases.padded_rows = 4;
  stats.RecordPhases(phases);
  phases.device.reset();  // a pass the backend did not measure adds no device time
  stats.RecordPhases(phases);
  const std::string text = Exposition(*registry_);
  auto seconds = [&](const char* phase) {
    return Value(text, std::string(R"(sluice_batch_phase_seconds_total{model="m",phase=")") +
                           phase + R"(",version="1"})");
  };
  EXPECT_DOUBLE_EQ(seconds("idle"), 0.010);
  EXPECT_DOUBLE_EQ(seconds("assembly"), 0.002);
  EXPECT_DOUBLE_EQ(seconds("execute"), 0.016);
  EXPECT_DOUBLE_EQ(seconds("to_device"), 0.002);
  EXPECT_DOUBLE_EQ(seconds("forward"), 0.004);
  EXPECT_DOUBLE_EQ(seconds("to_host"), 0.001);
  EXPECT_DOUBLE_EQ(seconds("scatter"), 0.004);
  EXPECT_DOUBLE_EQ(seconds("complete"), 0.002);
  EXPECT_EQ(Value(text, R"(sluice_batch_rows_total{kind="real",model="m",version="1"})"), 6);
  EXPECT_EQ(Value(text, R"(sluice_batch_rows_total{kind="padding",model="m",version="1"})"), 2);
  const BatchPhaseTotals totals = stats.Snapshot().phases;
  EXPECT_EQ(totals.batches, 2u);
  EXPECT_EQ(totals.measured_on_device, 1u);
  EXPECT_EQ(totals.forward, 4ms);
}

TEST_F(MetricsTest, PriorityLevelsQueueTimesAndRefusalsOnlyForLevelsSeen) {
  ModelStats stats(metrics_.SinkFor("ranked", 1));
  stats.RecordPriorityQueued(1, std::chrono::microseconds(200));
  stats.RecordPriorityQueued(1, std::chrono::microseconds(90000));
  stats.RecordPriorityQueued(3, std::chrono::microseconds(40));
  stats.RecordPriorityRefused(3, absl::UnavailableError("level 3 is full"));
  stats.RecordPriorityRefused(3, absl::DeadlineExceededError("timed out"));
  stats.RecordPriorityRefused(3, absl::DeadlineExceededError("timed out"));
  stats.RecordPriorityQueued(0, std::chrono::microseconds(10));  // no levels: nothing
  stats.RecordPriorityRefused(0, absl::UnavailableError("full"));
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_queue_duration_seconds_count{level="1",model="ranked",version="1"})"),
      2);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_queue_duration_seconds_bucket{level="1",model="ranked",version="1",le="0.00025"})"),
      1);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_queue_duration_seconds_count{level="3",model="ranked",version="1"})"),
      1);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_refused_total{level="3",model="ranked",reason="rejected",version="1"})"),
      1);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_refused_total{level="3",model="ranked",reason="timeout",version="1"})"),
      2);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_priority_refused_total{level="1",model="ranked",reason="timeout",version="1"})"),
      0);
  EXPECT_THAT(text, Not(HasSubstr(R"(level="2")")));
  EXPECT_THAT(text, Not(HasSubstr(R"(level="0")")));
}

// Triton's per-model cache series (microseconds, as Triton) and Sluice's cache-wide ones. A hit
// is a success that ran nothing: counted in requests and durations, not in inferences.
TEST_F(MetricsTest, EvictionsCountAndYoungOnesAlsoApart) {
  metrics_.OnEviction("old", /*young=*/false);
  metrics_.OnEviction("young", /*young=*/true);
  metrics_.OnEviction("young", /*young=*/true);
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_model_evictions_total{model="old"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_model_evictions_total{model="young"})"), 2);
  EXPECT_EQ(Value(text, R"(sluice_model_evictions_young_total{model="young"})"), 2);
  EXPECT_EQ(Value(text, R"(sluice_model_evictions_young_total{model="old"})"), -1);
}

TEST_F(MetricsTest, ResponseCacheHitsMissesAndTheCacheItself) {
  ModelStats plain(metrics_.SinkFor("plain", 1));
  plain.RecordAdmitted();
  ModelStats stats(metrics_.SinkFor("cached", 2));
  stats.RecordCacheHit(std::chrono::microseconds(30), Protocol::kGrpc);
  stats.RecordCacheHit(std::chrono::microseconds(50), Protocol::kHttp);
  stats.RecordCacheMiss(std::chrono::microseconds(7));
  std::string text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(nv_cache_num_hits_per_model{model="cached",version="2"})"), 2);
  EXPECT_EQ(Value(text, R"(nv_cache_hit_duration_per_model{model="cached",version="2"})"), 80);
  EXPECT_EQ(Value(text, R"(nv_cache_num_misses_per_model{model="cached",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(nv_cache_miss_duration_per_model{model="cached",version="2"})"), 7);
  EXPECT_EQ(Value(text, R"(nv_inference_request_success{model="cached",version="2"})"), 2);
  EXPECT_EQ(Value(text, R"(nv_inference_request_duration_us{model="cached",version="2"})"), 80);
  EXPECT_EQ(Value(text, R"(nv_inference_count{model="cached",version="2"})"), 0);
  EXPECT_EQ(
      Value(text, R"(sluice_requests_succeeded_total{model="cached",protocol="http",version="2"})"),
      1);
  EXPECT_EQ(Value(text, R"(sluice_pending_requests{model="cached",version="2"})"),
            0);  // never queued
  EXPECT_THAT(text, Not(HasSubstr(R"(nv_cache_num_hits_per_model{model="plain")")));
  EXPECT_THAT(text, Not(HasSubstr("sluice_response_cache_bytes")));  // no cache yet
  const ModelStatsSnapshot snapshot = stats.Snapshot();
  EXPECT_EQ(snapshot.cache_hit.count, 2u);
  EXPECT_EQ(snapshot.cache_hit.ns, 80000u);
  EXPECT_EQ(snapshot.cache_miss.count, 1u);
  EXPECT_EQ(snapshot.success.count, 2u);
  EXPECT_EQ(snapshot.inference_count, 0u);

  // A shared answer (single flight): a success whose wait is queue time, neither hit nor miss.
  stats.RecordSharedAnswer(std::chrono::microseconds(20), Protocol::kGrpc);
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, R"(sluice_cache_shared_answers_total{model="cached",version="2"})"), 1);
  EXPECT_EQ(Value(text, R"(nv_inference_request_success{model="cached",version="2"})"), 3);
  EXPECT_EQ(Value(text, R"(nv_inference_queue_duration_us{model="cached",version="2"})"), 20);
  EXPECT_EQ(Value(text, R"(nv_cache_num_hits_per_model{model="cached",version="2"})"), 2);
  EXPECT_EQ(Value(text, R"(sluice_pending_requests{model="cached",version="2"})"), 0);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_cache_shared_answers_total{model="plain")")));
  const ModelStatsSnapshot shared = stats.Snapshot();
  EXPECT_EQ(shared.success.count, 3u);
  EXPECT_EQ(shared.queue.ns, 20000u);
  EXPECT_EQ(shared.cache_hit.count, 2u);
  EXPECT_EQ(shared.cache_miss.count, 1u);

  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ResponseCache cache(16 * page, nullptr, &metrics_);  // sixteen one-page segments
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, "sluice_response_cache_limit_bytes"), 16 * page);
  EXPECT_EQ(Value(text, "sluice_response_cache_bytes"), 0);
  const uint64_t space = cache.OpenNamespace();
  const std::string half_page(page / 2, 'a');
  const Shape shape = {static_cast<int64_t>(half_page.size())};
  InferRequest request;
  for (int i = 0; i < 40; ++i) {  // one entry a page: 16 stay
    request.inputs.clear();
    request.AddOwnedInput("x", DataType::kInt8, {1}, std::string(1, static_cast<char>(i)));
    cache.Insert(cache.MakeKey(space, request), {{"y", DataType::kInt8, shape, half_page}});
  }
  const std::string huge(17 * page, 'h');
  const Shape huge_shape = {static_cast<int64_t>(huge.size())};
  cache.Insert(cache.MakeKey(space, request), {{"y", DataType::kInt8, huge_shape, huge}});
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, "sluice_response_cache_entries"),
            static_cast<double>(cache.Stats().entries));
  EXPECT_EQ(Value(text, "sluice_response_cache_bytes"), 16 * page);
  EXPECT_EQ(Value(text, "sluice_response_cache_used_bytes"),
            static_cast<double>(cache.Stats().entry_bytes));
  EXPECT_EQ(Value(text, "sluice_response_cache_insertions_total"), 40);
  EXPECT_EQ(Value(text, "sluice_response_cache_evictions_total"), 40 - cache.Stats().entries);
  EXPECT_EQ(Value(text, "sluice_response_cache_too_large_total"), 1);
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
  EXPECT_EQ(
      Value(
          text,
          R"x(sluice_model_cudnn_benchmark{model="m",reason="fixed shapes (4 in the set)",version="2"})x"),
      1);
  EXPECT_EQ(Value(text, R"(sluice_build_info{cudnn_loaded="9.19.0",libtorch="2.11.0"})"), 1);
  EXPECT_EQ(
      Value(text,
            R"(sluice_model_auto_batch_rows_per_second{batch_size="1",model="m",version="2"})"),
      1000);
  EXPECT_EQ(
      Value(text,
            R"(sluice_model_auto_batch_rows_per_second{batch_size="4",model="m",version="2"})"),
      3000);
  EXPECT_EQ(text.find(R"(sluice_model_auto_batch_rows_per_second{batch_size="2")"),
            std::string::npos);
  // Loaded again with another choice: the old sizes' series go.
  tuning.batch_sizes.rates = {{1, 1100, true}, {2, 2000, true}, {4, 1500, false}};
  metrics_.OnReady(tuning, 2s);
  text = Exposition(*registry_);
  EXPECT_EQ(
      Value(text,
            R"(sluice_model_auto_batch_rows_per_second{batch_size="2",model="m",version="2"})"),
      2000);
  EXPECT_EQ(text.find(R"(sluice_model_auto_batch_rows_per_second{batch_size="4")"),
            std::string::npos);
}

// Sets an environment variable for its scope: the fake NVML reads its switches at every call.
// Change them only while no GpuTelemetry thread is running (getenv and setenv race).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { Set(value); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void Set(const char* value) { setenv(name_, value, 1); }

 private:
  const char* name_;
};

std::string FakeUuid(int index) {
  return "GPU-fa4e0000-0000-4000-8000-00000000000" + std::to_string(index);
}
// Triton's labels, and ours, of fake GPU `nvml_index` exported as `gpu`.
std::string NvLabels(int nvml_index) { return R"({gpu_uuid=")" + FakeUuid(nvml_index) + R"("})"; }
std::string OurLabels(int gpu, int nvml_index) {
  return R"({gpu=")" + std::to_string(gpu) + R"(",gpu_uuid=")" + FakeUuid(nvml_index) +
         R"(",name="Fake GPU )" + std::to_string(nvml_index) + R"("})";
}

constexpr double kGiB = 1 << 30;

TEST_F(MetricsTest, FakeNvmlFeedsTheGpuSeriesAndGoneGpusDisappear) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_THAT((*nvml)->missing(), ::testing::IsEmpty());
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[1].uuid, "GPU-fa4e0000-0000-4000-8000-000000000001");
  EXPECT_DOUBLE_EQ((*samples)[1].utilization.value_or(-1), 0.47);
  EXPECT_DOUBLE_EQ((*samples)[0].power_watts.value_or(-1), 123.456);
  metrics_.SetGpus(*samples);
  std::string text = Exposition(*registry_);
  const std::string gpu0 = NvLabels(0);
  const std::string gpu1 = NvLabels(1);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_total_bytes" + gpu0), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + gpu1), 4.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_usage" + gpu0), 123.456);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + gpu0), 700);
  EXPECT_DOUBLE_EQ(
      Value(
          text,
          R"(sluice_gpu_temperature_celsius{gpu="1",gpu_uuid="GPU-fa4e0000-0000-4000-8000-000000000001",name="Fake GPU 1"})"),
      56);

  // Energy is a counter from the first reading on (the fake's reading does not change).
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu0), 0);
  // The poller samples on its own; a GPU that goes away loses its series.
  gpus.Set("1");
  {
    GpuTelemetry::Options options;
    options.interval = 100ms;
    GpuTelemetry telemetry(*std::move(nvml), &metrics_, options);
    EXPECT_EQ(telemetry.gpus(), 1);
    text = Exposition(*registry_);
  }  // the poller thread is gone before the environment changes again
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_EQ(Value(text, "nv_gpu_utilization" + gpu1), -1);
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu1), -1);
}

TEST_F(MetricsTest, UnsupportedUtilizationDropsOnlyItsSeriesUntilSupportedAgain) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  ScopedEnv errors("FAKE_NVML_ERRORS", "");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto publish = [&] {
    auto samples = (*nvml)->Sample();
    ASSERT_TRUE(samples.ok()) << samples.status();
    ASSERT_EQ(samples->size(), 2u);
    metrics_.SetGpus(*samples);
  };
  publish();
  std::string text = Exposition(*registry_);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);

  // GPU 1 answers NOT_SUPPORTED (as a MIG-enabled GPU does): its utilisation goes, not to 0.
  errors.Set("utilization@1=3");
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_FALSE((*samples)[1].utilization.has_value());
  EXPECT_TRUE((*samples)[1].memory_used_bytes.has_value());
  publish();
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), -1);
  EXPECT_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), -1);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(0)), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(0, 0)), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_usage" + NvLabels(1)), 124.456);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + NvLabels(1)), 4 * kGiB);
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(1, 1)), 56);

  errors.Set("");
  publish();
  text = Exposition(*registry_);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);
}

TEST_F(MetricsTest, AFailedQueryLeavesItsSeriesOutAndAGpuWithoutUuidIsLeftOut) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "3");
  // 15: GPU_IS_LOST; 999: a code this Sluice does not know.
  ScopedEnv errors("FAKE_NVML_ERRORS", "power=15,temperature@1=999,energy=3,uuid@2=15");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);  // GPU 2 has no UUID to label it with
  metrics_.SetGpus(*samples);
  const std::string text = Exposition(*registry_);
  EXPECT_THAT(text, Not(HasSubstr("nv_gpu_power_usage{")));
  EXPECT_THAT(text, Not(HasSubstr("sluice_gpu_power_watts{")));
  EXPECT_THAT(text, Not(HasSubstr("nv_energy_consumption{")));
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(2))));
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(1, 1)), -1);
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(0, 0)), 55);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + NvLabels(1)), 700);
}

TEST_F(MetricsTest, MemoryComesFromTheV2QueryAndFallsBackToV1) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "1");
  ScopedEnv errors("FAKE_NVML_ERRORS", "");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto used = [&]() -> double {
    auto samples = (*nvml)->Sample();
    if (!samples.ok() || samples->size() != 1) return -2;
    EXPECT_EQ((*samples)[0].memory_total_bytes.has_value(),
              (*samples)[0].memory_used_bytes.has_value());
    return (*samples)[0].memory_used_bytes.value_or(-1);
  };
  // v2 (the fake checks the struct's version field) leaves the driver's 512 MiB out; v1 counts it.
  EXPECT_EQ(used(), 3 * kGiB);
  errors.Set("memory_v2=3");  // NOT_SUPPORTED
  EXPECT_EQ(used(), 3.5 * kGiB);
  errors.Set("memory_v2=13");  // FUNCTION_NOT_FOUND
  EXPECT_EQ(used(), 3.5 * kGiB);
  errors.Set("memory_v2=15");  // GPU_IS_LOST: no fallback, no value
  EXPECT_EQ(used(), -1);
  errors.Set("memory_v2=3,memory=3");
  EXPECT_EQ(used(), -1);
}

TEST_F(MetricsTest, ALibraryLackingOptionalEntryPointsStillLoadsAndARequiredOneIsNamed) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML_PARTIAL);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_THAT((*nvml)->missing(),
              ::testing::ElementsAre("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetPowerUsage"));
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_FALSE((*samples)[0].power_watts.has_value());
  EXPECT_EQ((*samples)[0].memory_used_bytes.value_or(-1), 3.5 * kGiB);  // v1
  metrics_.SetGpus(*samples);
  const std::string text = Exposition(*registry_);
  EXPECT_THAT(text, Not(HasSubstr("nv_gpu_power_usage{")));
  EXPECT_THAT(text, Not(HasSubstr("sluice_gpu_power_watts{")));
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + NvLabels(0)), 700);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + NvLabels(0)), 3.5 * kGiB);

  auto no_uuid = Nvml::Load(SLUICE_FAKE_NVML_NO_UUID);
  EXPECT_EQ(no_uuid.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(no_uuid.status().message(), HasSubstr("lacks nvmlDeviceGetUUID"));
}

TEST(InCudaOrderTest, CudaUuidsReorderFilterAndRenumberTheGpus) {
  std::vector<GpuSample> samples(3);
  for (int i = 0; i < 3; ++i) {
    samples[i].index = i;
    samples[i].uuid = FakeUuid(i);
  }
  auto uuids_and_indexes = [](const std::vector<GpuSample>& gpus) {
    std::vector<std::pair<std::string, int>> out;
    for (const GpuSample& gpu : gpus) out.emplace_back(gpu.uuid, gpu.index);
    return out;
  };
  using Pairs = std::vector<std::pair<std::string, int>>;
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {})),
            (Pairs{{FakeUuid(0), 0}, {FakeUuid(1), 1}, {FakeUuid(2), 2}}));
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {FakeUuid(1)})), (Pairs{{FakeUuid(1), 0}}));
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {FakeUuid(2), FakeUuid(0)})),
            (Pairs{{FakeUuid(2), 0}, {FakeUuid(0), 1}}));
  // A MIG instance matches no whole GPU: skipped, and the next device keeps its own ordinal.
  EXPECT_EQ(uuids_and_indexes(
                InCudaOrder(samples, {"MIG-0a1b2c3d-0000-4000-8000-000000000000", FakeUuid(0)})),
            (Pairs{{FakeUuid(0), 1}}));
}

TEST_F(MetricsTest, TelemetryExportsOnlyCudaVisibleGpusUnderCudaOrdinals) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "3");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  GpuTelemetry::Options options;
  options.interval = 1h;
  options.cuda_uuids = {FakeUuid(1)};  // CUDA_VISIBLE_DEVICES=1: NVML's GPU 1 is cuda:0
  std::string text;
  {
    GpuTelemetry telemetry(*std::move(nvml), &metrics_, options);
    EXPECT_EQ(telemetry.gpus(), 1);
    text = Exposition(*registry_);
  }
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(0, 1)), 56);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(0))));
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(2))));
  EXPECT_THAT(text, Not(HasSubstr(R"(gpu="1")")));
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
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;)
    response.append(buffer, static_cast<size_t>(n));
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

// The destructor returns with the port closed, on a loopback and on a wildcard address (reached
// through loopback by the knocks that end civetweb's poll), and a new endpoint can take the port.
TEST_F(MetricsTest, AStoppedEndpointClosesItsPortAndFreesIt) {
  for (const char* address : {"127.0.0.1", "0.0.0.0"}) {
    SCOPED_TRACE(address);
    auto endpoint = MetricsEndpoint::Start(address, 0, registry_);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    const int port = (*endpoint)->port();
    EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("200 OK"));
    endpoint->reset();
    EXPECT_EQ(HttpGet(port, "/metrics"), "");
    auto again = MetricsEndpoint::Start(address, port, registry_);
    EXPECT_TRUE(again.ok()) << again.status();
  }
}

}  // namespace
}  // namespace sluice
