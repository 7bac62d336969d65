// Recording into the Prometheus registry (server/metrics/server_metrics.h: counts, failure
// reasons, histograms, states). The NVML poller and the /metrics endpoint have their own files.
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/model_stats.h"
#include "server/manager/response_cache.h"
#include "server/metrics/server_metrics.h"
#include "tests/unit/metrics_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

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

TEST_F(MetricsTest, EnsembleCopiesByPathOnlyForEnsembles) {
  ModelStats plain(metrics_.SinkFor("plain", 1));
  plain.RecordAdmitted();
  ModelStats stats(metrics_.SinkFor("pipeline", 1));
  stats.RecordEnsembleCopies(0, 0);  // a request whose tensors stayed put: the series exist at 0
  stats.RecordEnsembleCopies(4096, 0);
  stats.RecordEnsembleCopies(1024, 512);
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(
      Value(text,
            R"(sluice_ensemble_copied_bytes_total{model="pipeline",path="device",version="1"})"),
      5120);
  EXPECT_EQ(
      Value(text,
            R"(sluice_ensemble_copied_bytes_total{model="pipeline",path="host",version="1"})"),
      512);
  EXPECT_THAT(text, Not(HasSubstr(R"(sluice_ensemble_copied_bytes_total{model="plain")")));
  EXPECT_EQ(stats.Snapshot().copied_on_device_bytes, 5120u);
  EXPECT_EQ(stats.Snapshot().copied_through_host_bytes, 512u);
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
  phases.device.reset();       // a pass the backend did not measure adds no device time
  phases.staged_ahead = true;  // ...and one assembled while the one before it ran
  phases.assembly_ahead = 3ms;
  phases.complete_behind = 2ms;  // ...and completed while the one after it ran
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
  EXPECT_DOUBLE_EQ(seconds("assembly_ahead"), 0.003);
  EXPECT_DOUBLE_EQ(seconds("complete_behind"), 0.002);
  EXPECT_EQ(Value(text, R"(sluice_batches_staged_ahead_total{model="m",version="1"})"), 1);
  EXPECT_EQ(Value(text, R"(sluice_batch_rows_total{kind="real",model="m",version="1"})"), 6);
  EXPECT_EQ(Value(text, R"(sluice_batch_rows_total{kind="padding",model="m",version="1"})"), 2);
  const BatchPhaseTotals totals = stats.Snapshot().phases;
  EXPECT_EQ(totals.batches, 2u);
  EXPECT_EQ(totals.measured_on_device, 1u);
  EXPECT_EQ(totals.forward, 4ms);
  EXPECT_EQ(totals.staged_ahead, 1u);
  EXPECT_EQ(totals.assembly_ahead, 3ms);
  EXPECT_EQ(totals.complete_behind, 2ms);
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

TEST_F(MetricsTest, CudnnSpeedupsPerMeasuredShapeReplacedOnReload) {
  ModelTuning tuning;
  tuning.name = "m";
  tuning.version = 1;
  tuning.cudnn_timings = {{"batch=1", 1, 1000us, 800us}, {"batch=4", 4, 3000us, 4000us}};
  metrics_.OnReady(tuning, 1s);
  std::string text = Exposition(*registry_);
  EXPECT_DOUBLE_EQ(
      Value(text, R"(sluice_model_cudnn_benchmark_speedup{model="m",shape="batch=1",version="1"})"),
      1.25);
  EXPECT_DOUBLE_EQ(
      Value(text, R"(sluice_model_cudnn_benchmark_speedup{model="m",shape="batch=4",version="1"})"),
      0.75);
  // Loaded again, unmeasured (say, with --cudnn-benchmark on): no speedup series is left.
  tuning.cudnn_timings.clear();
  metrics_.OnReady(tuning, 1s);
  text = Exposition(*registry_);
  EXPECT_EQ(text.find("sluice_model_cudnn_benchmark_speedup{"), std::string::npos);
}

TEST_F(MetricsTest, TheCudnnDecisionIsOneSeriesPerVersionReplacedOnReload) {
  ModelTuning tuning;
  tuning.name = "m";
  tuning.version = 1;
  tuning.cudnn_benchmark = true;
  tuning.cudnn_reason = "measured: on is faster";
  metrics_.OnReady(tuning, 1s);
  tuning.cudnn_benchmark = false;
  tuning.cudnn_reason = "set off for this model";
  metrics_.OnReady(tuning, 1s);
  const std::string text = Exposition(*registry_);
  EXPECT_EQ(text.find("measured: on is faster"), std::string::npos);
  EXPECT_EQ(
      Value(
          text,
          R"(sluice_model_cudnn_benchmark{model="m",reason="set off for this model",version="1"})"),
      0);
}

}  // namespace
}  // namespace sluice
