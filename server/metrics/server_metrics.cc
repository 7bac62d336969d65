#include "server/metrics/server_metrics.h"

#include <algorithm>
#include <mutex>

#include <prometheus/counter.h>

namespace sluice {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
double Micros(Duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Triton's failure reasons (nv_inference_request_failure{reason}).
const char* TritonReason(FailureReason reason) {
  switch (reason) {
    case FailureReason::kRejected:
    case FailureReason::kTimeout:
      return "REJECTED";  // Triton: rejected, or timed out in the scheduler
    case FailureReason::kCancelled:
      return "CANCELED";
    case FailureReason::kModelError:
      return "BACKEND";
    case FailureReason::kInvalidInput:
      return "OTHER";
  }
  return "OTHER";
}

}  // namespace

const std::vector<double>& LatencyBucketsSeconds() {
  static const std::vector<double> buckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30,   60};
  return buckets;
}

const std::vector<double>& BatchSizeBuckets() {
  static const std::vector<double> buckets = {1,  2,  3,  4,  6,   8,   12,  16,  24,
                                              32, 48, 64, 96, 128, 256, 512, 1024};
  return buckets;
}

struct ServerMetrics::Families {
  explicit Families(prometheus::Registry& r)
      : succeeded(prometheus::BuildCounter()
                      .Name("sluice_requests_succeeded_total")
                      .Help("Inference requests answered with outputs")
                      .Register(r)),
        failed(prometheus::BuildCounter()
                   .Name("sluice_requests_failed_total")
                   .Help("Inference requests answered with an error, by reason: rejected (not "
                         "admitted), timeout, cancelled, invalid_input, model_error")
                   .Register(r)),
        inferences(prometheus::BuildCounter()
                       .Name("sluice_inferences_total")
                       .Help("Rows answered (a request of batch size 4 counts 4)")
                       .Register(r)),
        executions(prometheus::BuildCounter()
                       .Name("sluice_executions_total")
                       .Help("Forward passes; inferences / executions is the average batch size")
                       .Register(r)),
        batch_phase_seconds(
            prometheus::BuildCounter()
                .Name("sluice_batch_phase_seconds_total")
                .Help(
                    "Where each instance's batch cycles went, by phase: idle, assembly, execute "
                    "(to_device, forward and to_host within it, as the device saw them), scatter, "
                    "complete; and, outside the cycle, assembly_ahead, the assembly of batches "
                    "staged ahead while the batch before them ran, and complete_behind, the "
                    "completion of batches while the batch staged behind them ran")
                .Register(r)),
        batch_rows(prometheus::BuildCounter()
                       .Name("sluice_batch_rows_total")
                       .Help("Rows the model ran, by kind: real (the callers') and padding")
                       .Register(r)),
        batches_staged_ahead(
            prometheus::BuildCounter()
                .Name("sluice_batches_staged_ahead_total")
                .Help("Batches assembled while the instance ran the batch before them "
                      "(sluice.stage_ahead), so that they started the moment it ended")
                .Register(r)),
        pending(prometheus::BuildGauge()
                    .Name("sluice_pending_requests")
                    .Help("Requests admitted to a queue and not answered yet")
                    .Register(r)),
        sequences_active(
            prometheus::BuildGauge()
                .Name("sluice_sequences_active")
                .Help("Stateful models: sequences started and not finished (bound to a slot or "
                      "waiting for one)")
                .Register(r)),
        sequences_finished(
            prometheus::BuildCounter()
                .Name("sluice_sequences_total")
                .Help("Stateful models: sequences that finished, by outcome: ended (sequence_end "
                      "ran), idle_expired, dropped (its start expired while queued or failed), cut "
                      "(unload, "
                      "reload or shutdown)")
                .Register(r)),
        latency_refusals(
            prometheus::BuildCounter()
                .Name("sluice_latency_refusals_total")
                .Help("Latency target models (sluice.latency_target_us): requests refused without "
                      "running because they could not be answered in time, by reason (target, or "
                      "deadline: the client's or the queue timeout) and when (arrival, queued)")
                .Register(r)),
        graph_captures(
            prometheus::BuildCounter()
                .Name("sluice_cuda_graph_captures_total")
                .Help("CUDA graph models (optimization.cuda.graphs): input shapes captured into a "
                      "graph, "
                      "over all instances (at warm-up, or on a shape's third batch in serving)")
                .Register(r)),
        trace_spans_exported(prometheus::BuildCounter()
                                 .Name("sluice_trace_spans_exported_total")
                                 .Help("Request tracing: spans the OTLP collector accepted")
                                 .Register(r)),
        trace_spans_dropped(
            prometheus::BuildCounter()
                .Name("sluice_trace_spans_dropped_total")
                .Help(
                    "Request tracing: spans not exported, by reason: queue_full (more spans waited "
                    "than bsp_max_queue_size: the collector is slow or down), export_failed (the "
                    "collector could not be reached or refused them), shutdown (finished after the "
                    "exporter stopped, or still queued when its 2 s at shutdown ran out)")
                .Register(r)),
        graph_replays(prometheus::BuildCounter()
                          .Name("sluice_cuda_graph_replays_total")
                          .Help("CUDA graph models: forward passes of served batches that replayed "
                                "a graph (the rest of "
                                "sluice_executions_total ran eagerly)")
                          .Register(r)),
        ensemble_copied_bytes(
            prometheus::BuildCounter()
                .Name("sluice_ensemble_copied_bytes_total")
                .Help("Ensembles: bytes of tensors copied between the steps of the requests "
                      "answered, by where: device (within the memory the tensors live in: "
                      "gathering several requests' rows into one batch, keeping a CUDA graph's "
                      "output), host (between a device and host memory). Zero for tensors that "
                      "stay where the step before made them")
                .Register(r)),
        batch_oldest_wait_seconds(
            prometheus::BuildHistogram()
                .Name("sluice_batch_oldest_wait_seconds")
                .Help("Latency target models: how long the oldest request of each batch had "
                      "waited when the batch formed (the wait the batcher chose)")
                .Register(r)),
        priority_queue_seconds(
            prometheus::BuildHistogram()
                .Name("sluice_priority_queue_duration_seconds")
                .Help("Models with priority_levels: how long requests of each level waited "
                      "before their batch started")
                .Register(r)),
        priority_refused(
            prometheus::BuildCounter()
                .Name("sluice_priority_refused_total")
                .Help("Models with priority_levels: requests of each level that left the queue "
                      "without running, by reason (rejected: a cap at arrival; timeout; cancelled; "
                      "rejected also when the version stopped)")
                .Register(r)),
        batch_cost_ratio(
            prometheus::BuildHistogram()
                .Name("sluice_batch_cost_ratio")
                .Help("Latency target models: each batch's execution time divided by what the "
                      "cost model predicted for it (1: exact; the error of the cost model)")
                .Register(r)),
        state(prometheus::BuildGauge()
                  .Name("sluice_model_state")
                  .Help("1 for the version's current state (LOADING, READY, UNAVAILABLE)")
                  .Register(r)),
        load_seconds(prometheus::BuildGauge()
                         .Name("sluice_model_load_seconds")
                         .Help("How long the version took to load, warm-up included")
                         .Register(r)),
        warmup_seconds(prometheus::BuildGauge()
                           .Name("sluice_model_warmup_seconds")
                           .Help("How long the version's warm-up took")
                           .Register(r)),
        warmup_pairs(prometheus::BuildGauge()
                         .Name("sluice_model_warmup_pairs")
                         .Help("(instance, shape) pairs the warm-up ran")
                         .Register(r)),
        shapes(prometheus::BuildGauge()
                   .Name("sluice_model_shapes")
                   .Help("Shapes in the version's shape set; 0 when the set is open-ended")
                   .Register(r)),
        cudnn_benchmark(
            prometheus::BuildGauge()
                .Name("sluice_model_cudnn_benchmark")
                .Help("1 when cuDNN benchmark mode is on for the version, with the reason")
                .Register(r)),
        cudnn_speedup(
            prometheus::BuildGauge()
                .Name("sluice_model_cudnn_benchmark_speedup")
                .Help("Under the auto rule on a GPU: a shape's median forward time with cuDNN "
                      "benchmark mode off divided by that with it on (above 1: the mode helps), "
                      "as measured before the version reported ready")
                .Register(r)),
        auto_batch_rows(
            prometheus::BuildGauge()
                .Name("sluice_model_auto_batch_rows_per_second")
                .Help("Rows per second warm-up measured at each batch size the batcher forms "
                      "(sluice.auto_batch_sizes); sizes it does not form have no series")
                .Register(r)),
        request_seconds(
            prometheus::BuildHistogram()
                .Name("sluice_request_duration_seconds")
                .Help("Time in the server per successful request, from admission to answer")
                .Register(r)),
        queue_seconds(prometheus::BuildHistogram()
                          .Name("sluice_queue_duration_seconds")
                          .Help("Time a successful request waited in its queue")
                          .Register(r)),
        input_seconds(prometheus::BuildHistogram()
                          .Name("sluice_compute_input_duration_seconds")
                          .Help("Input preparation per forward pass (batch assembly)")
                          .Register(r)),
        infer_seconds(prometheus::BuildHistogram()
                          .Name("sluice_compute_infer_duration_seconds")
                          .Help("Forward pass time, host to device copies included")
                          .Register(r)),
        output_seconds(prometheus::BuildHistogram()
                           .Name("sluice_compute_output_duration_seconds")
                           .Help("Output preparation per forward pass (splitting the batch)")
                           .Register(r)),
        batch_size(prometheus::BuildHistogram()
                       .Name("sluice_batch_size")
                       .Help("Rows per forward pass, padding included")
                       .Register(r)),
        build_info(prometheus::BuildGauge()
                       .Name("sluice_build_info")
                       .Help("1, with the versions Sluice runs on as labels")
                       .Register(r)),
        operator_library(
            prometheus::BuildGauge()
                .Name("sluice_operator_library_operators")
                .Help("Operators each loaded operator library registered (labels: library, path, "
                      "origin)")
                .Register(r)),
        gpu_utilization(prometheus::BuildGauge()
                            .Name("sluice_gpu_utilization_ratio")
                            .Help("Share of the last sample period a kernel ran on the GPU (0-1)")
                            .Register(r)),
        gpu_memory_used(prometheus::BuildGauge()
                            .Name("sluice_gpu_memory_used_bytes")
                            .Help("GPU memory used")
                            .Register(r)),
        gpu_memory_total(prometheus::BuildGauge()
                             .Name("sluice_gpu_memory_total_bytes")
                             .Help("GPU memory")
                             .Register(r)),
        gpu_power(prometheus::BuildGauge()
                      .Name("sluice_gpu_power_watts")
                      .Help("GPU power draw")
                      .Register(r)),
        gpu_temperature(prometheus::BuildGauge()
                            .Name("sluice_gpu_temperature_celsius")
                            .Help("GPU temperature")
                            .Register(r)),
        // Triton's names and units.
        nv_success(prometheus::BuildCounter()
                       .Name("nv_inference_request_success")
                       .Help("Number of successful inference requests, all batch sizes")
                       .Register(r)),
        nv_failure(prometheus::BuildCounter()
                       .Name("nv_inference_request_failure")
                       .Help("Number of failed inference requests, all batch sizes")
                       .Register(r)),
        nv_count(prometheus::BuildCounter()
                     .Name("nv_inference_count")
                     .Help("Number of inferences performed (a batch of n counts n)")
                     .Register(r)),
        nv_exec_count(prometheus::BuildCounter()
                          .Name("nv_inference_exec_count")
                          .Help("Number of model executions performed")
                          .Register(r)),
        nv_request_us(prometheus::BuildCounter()
                          .Name("nv_inference_request_duration_us")
                          .Help("Cumulative inference request duration in microseconds")
                          .Register(r)),
        nv_queue_us(prometheus::BuildCounter()
                        .Name("nv_inference_queue_duration_us")
                        .Help("Cumulative inference queuing duration in microseconds")
                        .Register(r)),
        nv_input_us(prometheus::BuildCounter()
                        .Name("nv_inference_compute_input_duration_us")
                        .Help("Cumulative compute input duration in microseconds")
                        .Register(r)),
        nv_infer_us(prometheus::BuildCounter()
                        .Name("nv_inference_compute_infer_duration_us")
                        .Help("Cumulative compute inference duration in microseconds")
                        .Register(r)),
        nv_output_us(prometheus::BuildCounter()
                         .Name("nv_inference_compute_output_duration_us")
                         .Help("Cumulative compute output duration in microseconds")
                         .Register(r)),
        nv_pending(prometheus::BuildGauge()
                       .Name("nv_inference_pending_request_count")
                       .Help("Instantaneous number of pending requests awaiting execution")
                       .Register(r)),
        nv_gpu_utilization(prometheus::BuildGauge()
                               .Name("nv_gpu_utilization")
                               .Help("GPU utilization rate [0.0 - 1.0)")
                               .Register(r)),
        nv_gpu_memory_total(prometheus::BuildGauge()
                                .Name("nv_gpu_memory_total_bytes")
                                .Help("GPU total memory, in bytes")
                                .Register(r)),
        nv_gpu_memory_used(prometheus::BuildGauge()
                               .Name("nv_gpu_memory_used_bytes")
                               .Help("GPU used memory, in bytes")
                               .Register(r)),
        nv_gpu_power(prometheus::BuildGauge()
                         .Name("nv_gpu_power_usage")
                         .Help("GPU power usage in watts")
                         .Register(r)),
        nv_gpu_power_limit(prometheus::BuildGauge()
                               .Name("nv_gpu_power_limit")
                               .Help("GPU power management limit in watts")
                               .Register(r)),
        nv_energy(prometheus::BuildCounter()
                      .Name("nv_energy_consumption")
                      .Help("GPU energy consumption in joules since the server started")
                      .Register(r)),
        nv_cache_hits(prometheus::BuildCounter()
                          .Name("nv_cache_num_hits_per_model")
                          .Help("Number of response cache hits per model")
                          .Register(r)),
        shared_answers(
            prometheus::BuildCounter()
                .Name("sluice_cache_shared_answers_total")
                .Help("Requests of a response cache model answered with the run of an identical "
                      "request that was queued or running when they came (single flight)")
                .Register(r)),
        nv_cache_misses(prometheus::BuildCounter()
                            .Name("nv_cache_num_misses_per_model")
                            .Help("Number of response cache misses per model")
                            .Register(r)),
        nv_cache_hit_us(prometheus::BuildCounter()
                            .Name("nv_cache_hit_duration_per_model")
                            .Help("Cumulative time requests spend retrieving a cached response per "
                                  "model on cache "
                                  "hits (microseconds)")
                            .Register(r)),
        nv_cache_miss_us(
            prometheus::BuildCounter()
                .Name("nv_cache_miss_duration_per_model")
                .Help("Cumulative time requests spend looking up and inserting responses into the "
                      "cache on a cache miss (microseconds)")
                .Register(r)),
        cache_bytes(prometheus::BuildGauge()
                        .Name("sluice_response_cache_bytes")
                        .Help("Memory the response cache has mapped for its entries")
                        .Register(r)),
        cache_used_bytes(prometheus::BuildGauge()
                             .Name("sluice_response_cache_used_bytes")
                             .Help("What the live entries (keys, outputs, headers) take of it")
                             .Register(r)),
        cache_limit_bytes(prometheus::BuildGauge()
                              .Name("sluice_response_cache_limit_bytes")
                              .Help("The response cache's bound (--cache-config local,size=BYTES)")
                              .Register(r)),
        cache_entries(prometheus::BuildGauge()
                          .Name("sluice_response_cache_entries")
                          .Help("Answers the response cache holds")
                          .Register(r)),
        cache_insertions(prometheus::BuildCounter()
                             .Name("sluice_response_cache_insertions_total")
                             .Help("Answers kept by the response cache")
                             .Register(r)),
        cache_evictions(prometheus::BuildCounter()
                            .Name("sluice_response_cache_evictions_total")
                            .Help("Answers dropped, least recently used first, to make room")
                            .Register(r)),
        cache_too_large(prometheus::BuildCounter()
                            .Name("sluice_response_cache_too_large_total")
                            .Help("Answers not kept because one alone exceeds the cache's bound")
                            .Register(r)),
        model_loads(
            prometheus::BuildCounter()
                .Name("sluice_model_loads_total")
                .Help("Model loads by trigger (startup, explicit, poll, on_demand) and result (ok, "
                      "failed)")
                .Register(r)),
        model_evictions(
            prometheus::BuildCounter()
                .Name("sluice_model_evictions_total")
                .Help("Models unloaded to make room within the memory budget for another "
                      "(--model-load-gpu-limit, --model-load-host-limit)")
                .Register(r)),
        model_evictions_young(
            prometheus::BuildCounter()
                .Name("sluice_model_evictions_young_total")
                .Help("Of sluice_model_evictions_total, models unloaded before "
                      "--model-min-residency-secs because no older idle model could make the "
                      "room: steadily rising, the budget is too small for the models in use")
                .Register(r)),
        cold_start_seconds(
            prometheus::BuildHistogram()
                .Name("sluice_model_cold_start_seconds")
                .Help("--model-load-on-demand: from the arrival of a request that waited for "
                      "its model to load to its answer")
                .Register(r)),
        model_memory(
            prometheus::BuildGauge()
                .Name("sluice_model_memory_bytes")
                .Help("Memory a ready version took at load, warm-up peak included, per device "
                      "(cpu: resident set; cuda:N: device allocator)")
                .Register(r)),
        memory_budget(prometheus::BuildGauge()
                          .Name("sluice_model_memory_budget_bytes")
                          .Help("The models' memory budget per device")
                          .Register(r)),
        memory_resident(
            prometheus::BuildGauge()
                .Name("sluice_model_memory_resident_bytes")
                .Help("What the ready models took at load, together, per budgeted device")
                .Register(r)) {}

  Family<Counter>& succeeded;
  Family<Counter>& failed;
  Family<Counter>& inferences;
  Family<Counter>& executions;
  Family<Counter>& batch_phase_seconds;
  Family<Counter>& batch_rows;
  Family<Counter>& batches_staged_ahead;
  Family<Gauge>& pending;
  Family<Gauge>& sequences_active;
  Family<Counter>& sequences_finished;
  Family<Counter>& latency_refusals;
  Family<Counter>& graph_captures;
  Family<Counter>& trace_spans_exported;
  Family<Counter>& trace_spans_dropped;
  Family<Counter>& graph_replays;
  Family<Counter>& ensemble_copied_bytes;
  Family<Histogram>& batch_oldest_wait_seconds;
  Family<Histogram>& priority_queue_seconds;
  Family<Counter>& priority_refused;
  Family<Histogram>& batch_cost_ratio;
  Family<Gauge>& state;
  Family<Gauge>& load_seconds;
  Family<Gauge>& warmup_seconds;
  Family<Gauge>& warmup_pairs;
  Family<Gauge>& shapes;
  Family<Gauge>& cudnn_benchmark;
  Family<Gauge>& cudnn_speedup;
  Family<Gauge>& auto_batch_rows;
  Family<Histogram>& request_seconds;
  Family<Histogram>& queue_seconds;
  Family<Histogram>& input_seconds;
  Family<Histogram>& infer_seconds;
  Family<Histogram>& output_seconds;
  Family<Histogram>& batch_size;
  Family<Gauge>& build_info;
  Family<Gauge>& operator_library;
  Family<Gauge>& gpu_utilization;
  Family<Gauge>& gpu_memory_used;
  Family<Gauge>& gpu_memory_total;
  Family<Gauge>& gpu_power;
  Family<Gauge>& gpu_temperature;
  Family<Counter>& nv_success;
  Family<Counter>& nv_failure;
  Family<Counter>& nv_count;
  Family<Counter>& nv_exec_count;
  Family<Counter>& nv_request_us;
  Family<Counter>& nv_queue_us;
  Family<Counter>& nv_input_us;
  Family<Counter>& nv_infer_us;
  Family<Counter>& nv_output_us;
  Family<Gauge>& nv_pending;
  Family<Gauge>& nv_gpu_utilization;
  Family<Gauge>& nv_gpu_memory_total;
  Family<Gauge>& nv_gpu_memory_used;
  Family<Gauge>& nv_gpu_power;
  Family<Gauge>& nv_gpu_power_limit;
  Family<Counter>& nv_energy;
  Family<Counter>& nv_cache_hits;
  Family<Counter>& shared_answers;
  Family<Counter>& nv_cache_misses;
  Family<Counter>& nv_cache_hit_us;
  Family<Counter>& nv_cache_miss_us;
  Family<Gauge>& cache_bytes;
  Family<Gauge>& cache_used_bytes;
  Family<Gauge>& cache_limit_bytes;
  Family<Gauge>& cache_entries;
  Family<Counter>& cache_insertions;
  Family<Counter>& cache_evictions;
  Family<Counter>& cache_too_large;
  Family<Counter>& model_loads;
  Family<Counter>& model_evictions;
  Family<Counter>& model_evictions_young;
  Family<Histogram>& cold_start_seconds;
  Family<Gauge>& model_memory;
  Family<Gauge>& memory_budget;
  Family<Gauge>& memory_resident;
  ResponseCacheStats cache_seen;  // the counters' values at the last OnResponseCacheChanged
  struct CacheSeries {
    Gauge* bytes = nullptr;
    Gauge* used_bytes = nullptr;
    Gauge* limit_bytes = nullptr;
    Gauge* entries = nullptr;
    Counter* insertions = nullptr;
    Counter* evictions = nullptr;
    Counter* too_large = nullptr;
  } cache_series;                             // created with the cache's first change
  std::map<std::string, double> energy_seen;  // per GPU uuid: the last NVML energy reading (J)
  std::vector<std::pair<Family<Gauge>*, Gauge*>> gpu_series;  // the GPU gauges of the last SetGpus
  std::vector<Counter*> energy_series;  // the energy counters of the last SetGpus
};

namespace {

// The series of one model version, created once when it starts loading. Recording is lock-free
// apart from prometheus-cpp's per-histogram mutex.
class ModelMetrics final : public StatsSink {
 public:
  ModelMetrics(ServerMetrics::Families& f, const Labels& labels)
      : families_(f),
        labels_(labels),
        executions_(f.executions.Add(labels)),
        pending_(f.pending.Add(labels)),
        input_seconds_(f.input_seconds.Add(labels, LatencyBucketsSeconds())),
        infer_seconds_(f.infer_seconds.Add(labels, LatencyBucketsSeconds())),
        output_seconds_(f.output_seconds.Add(labels, LatencyBucketsSeconds())),
        batch_size_(f.batch_size.Add(labels, BatchSizeBuckets())),
        nv_success_(f.nv_success.Add(labels)),
        nv_count_(f.nv_count.Add(labels)),
        nv_exec_count_(f.nv_exec_count.Add(labels)),
        nv_request_us_(f.nv_request_us.Add(labels)),
        nv_queue_us_(f.nv_queue_us.Add(labels)),
        nv_input_us_(f.nv_input_us.Add(labels)),
        nv_infer_us_(f.nv_infer_us.Add(labels)),
        nv_output_us_(f.nv_output_us.Add(labels)),
        nv_pending_(f.nv_pending.Add(labels)) {
    // Every reason and protocol exists from the start (at 0), so rate() and dashboards see the
    // series. The per-request sluice_* series carry the front end as `protocol`; Triton's nv_*
    // series keep Triton's labels.
    for (Protocol protocol : kAllProtocols) {
      Labels with_protocol = labels;
      with_protocol["protocol"] = ProtocolName(protocol);
      PerProtocol& series = per_protocol_[static_cast<int>(protocol)];
      series.succeeded = &f.succeeded.Add(with_protocol);
      series.inferences = &f.inferences.Add(with_protocol);
      series.request_seconds = &f.request_seconds.Add(with_protocol, LatencyBucketsSeconds());
      series.queue_seconds = &f.queue_seconds.Add(with_protocol, LatencyBucketsSeconds());
      for (FailureReason reason : kAllFailureReasons) {
        with_protocol["reason"] = FailureReasonName(reason);
        series.failed[static_cast<int>(reason)] = &f.failed.Add(with_protocol);
      }
    }
    for (FailureReason reason : kAllFailureReasons) {
      Labels with_reason = labels;
      with_reason["reason"] = TritonReason(reason);
      nv_failure_[static_cast<int>(reason)] = &f.nv_failure.Add(with_reason);
    }
  }

  // sluice_pending_requests: admitted and not answered (waiting or running).
  // nv_inference_pending_request_count (Triton's meaning): admitted and not running yet.
  void OnAdmitted() override {
    pending_.Increment();
    nv_pending_.Increment();
  }

  void OnStarted(int64_t requests) override {
    nv_pending_.Decrement(static_cast<double>(requests));
  }

  void OnPhases(const BatchPhases& phases) override {
    std::call_once(phases_once_, [this] {
      for (size_t i = 0; i < kPhases; ++i) {
        Labels with_phase = labels_;
        with_phase["phase"] = kPhaseNames[i];
        phase_seconds_[i] = &families_.batch_phase_seconds.Add(with_phase);
      }
      Labels real = labels_, padding = labels_;
      real["kind"] = "real";
      padding["kind"] = "padding";
      real_rows_ = &families_.batch_rows.Add(real);
      padding_rows_ = &families_.batch_rows.Add(padding);
      staged_ahead_ = &families_.batches_staged_ahead.Add(labels_);
    });
    const Duration host[] = {phases.idle, phases.assembly, phases.execute, phases.scatter,
                             phases.complete};
    for (size_t i = 0; i < std::size(host); ++i) phase_seconds_[i]->Increment(Seconds(host[i]));
    if (phases.device) {
      phase_seconds_[5]->Increment(Seconds(phases.device->to_device));
      phase_seconds_[6]->Increment(Seconds(phases.device->forward));
      phase_seconds_[7]->Increment(Seconds(phases.device->to_host));
    }
    if (phases.staged_ahead) {
      phase_seconds_[8]->Increment(Seconds(phases.assembly_ahead));
      staged_ahead_->Increment();
    }
    phase_seconds_[9]->Increment(Seconds(phases.complete_behind));
    real_rows_->Increment(static_cast<double>(phases.rows));
    padding_rows_->Increment(static_cast<double>(phases.padded_rows - phases.rows));
  }

  void OnExecution(int64_t batch_rows, Duration input, Duration infer, Duration output) override {
    executions_.Increment();
    nv_exec_count_.Increment();
    batch_size_.Observe(static_cast<double>(batch_rows));
    input_seconds_.Observe(Seconds(input));
    infer_seconds_.Observe(Seconds(infer));
    output_seconds_.Observe(Seconds(output));
  }

  void OnSuccess(int64_t rows, Duration queue, Duration input, Duration infer, Duration output,
                 Duration total, Protocol protocol) override {
    const PerProtocol& series = per_protocol_[static_cast<int>(protocol)];
    pending_.Decrement();
    series.succeeded->Increment();
    nv_success_.Increment();
    series.inferences->Increment(static_cast<double>(rows));
    nv_count_.Increment(static_cast<double>(rows));
    series.request_seconds->Observe(Seconds(total));
    series.queue_seconds->Observe(Seconds(queue));
    // Triton charges each request of a batch with the batch's compute times.
    nv_request_us_.Increment(Micros(total));
    nv_queue_us_.Increment(Micros(queue));
    nv_input_us_.Increment(Micros(input));
    nv_infer_us_.Increment(Micros(infer));
    nv_output_us_.Increment(Micros(output));
  }

  void OnFailure(FailureReason reason, Duration total, bool was_admitted, bool ran,
                 Protocol protocol) override {
    if (was_admitted) pending_.Decrement();
    if (was_admitted && !ran) nv_pending_.Decrement();
    per_protocol_[static_cast<int>(protocol)].failed[static_cast<int>(reason)]->Increment();
    nv_failure_[static_cast<int>(reason)]->Increment();
  }

  void OnEarlyRefusal(EarlyRefusal reason, bool queued) override {
    if (reason == EarlyRefusal::kNone) return;
    Target().refusals[reason == EarlyRefusal::kTarget ? 0 : 1][queued ? 1 : 0]->Increment();
  }

  void OnGraphRun(ModelBackend::GraphRun run) override {
    std::call_once(graphs_once_, [this] {
      graph_captures_ = &families_.graph_captures.Add(labels_);
      graph_replays_ = &families_.graph_replays.Add(labels_);
    });
    (run == ModelBackend::GraphRun::kReplayed ? graph_replays_ : graph_captures_)->Increment();
  }

  void OnEnsembleCopies(uint64_t on_device, uint64_t through_host) override {
    std::call_once(copies_once_, [this] {
      prometheus::Labels device = labels_, host = labels_;
      device["path"] = "device";
      host["path"] = "host";
      copied_on_device_ = &families_.ensemble_copied_bytes.Add(device);
      copied_through_host_ = &families_.ensemble_copied_bytes.Add(host);
    });
    copied_on_device_->Increment(static_cast<double>(on_device));
    copied_through_host_->Increment(static_cast<double>(through_host));
  }

  void OnBatchCost(Duration oldest_wait, std::optional<Duration> predicted,
                   Duration measured) override {
    const TargetSeries& series = Target();
    series.oldest_wait->Observe(Seconds(oldest_wait));
    if (predicted && *predicted > Duration::zero())
      series.cost_ratio->Observe(Seconds(measured) / Seconds(*predicted));
  }

  // A hit is a success that did not run (Triton: no inference count, no compute time).
  void OnCacheHit(Duration took, Protocol protocol) override {
    const PerProtocol& series = per_protocol_[static_cast<int>(protocol)];
    series.succeeded->Increment();
    series.request_seconds->Observe(Seconds(took));
    nv_success_.Increment();
    nv_request_us_.Increment(Micros(took));
    const CacheSeries& cache = Cache();
    cache.hits->Increment();
    cache.hit_us->Increment(Micros(took));
  }
  void OnSharedAnswer(Duration waited, Protocol protocol) override {
    const PerProtocol& series = per_protocol_[static_cast<int>(protocol)];
    series.succeeded->Increment();
    series.request_seconds->Observe(Seconds(waited));
    series.queue_seconds->Observe(Seconds(waited));
    nv_success_.Increment();
    nv_request_us_.Increment(Micros(waited));
    nv_queue_us_.Increment(Micros(waited));
    Cache().shared->Increment();
  }
  void OnCacheMiss(Duration took) override {
    const CacheSeries& cache = Cache();
    cache.misses->Increment();
    cache.miss_us->Increment(Micros(took));
  }

  void OnPriorityQueued(int level, Duration queued) override {
    Priority(level).queue_seconds->Observe(Seconds(queued));
  }
  void OnPriorityRefused(int level, FailureReason reason) override {
    Priority(level).refused[static_cast<int>(reason)]->Increment();
  }

  void OnSequenceStarted() override { Sequences().active->Increment(); }
  void OnSequenceFinished(SequenceOutcome outcome) override {
    const SequenceSeries& series = Sequences();
    series.active->Decrement();
    series.finished[static_cast<int>(outcome)]->Increment();
  }

 private:
  struct SequenceSeries {
    Gauge* active = nullptr;
    Counter* finished[std::size(kAllSequenceOutcomes)] = {};
  };
  // Created with the first sequence event, so that models without sequences export none of them
  // (prometheus-cpp's Family::Add is thread-safe).
  const SequenceSeries& Sequences() {
    std::call_once(sequences_once_, [this] {
      sequences_.active = &families_.sequences_active.Add(labels_);
      for (SequenceOutcome outcome : kAllSequenceOutcomes) {
        Labels with_outcome = labels_;
        with_outcome["outcome"] = SequenceOutcomeName(outcome);
        sequences_.finished[static_cast<int>(outcome)] =
            &families_.sequences_finished.Add(with_outcome);
      }
    });
    return sequences_;
  }

  struct CacheSeries {
    Counter* hits = nullptr;
    Counter* misses = nullptr;
    Counter* hit_us = nullptr;
    Counter* miss_us = nullptr;
    Counter* shared = nullptr;
  };
  // Created with the first cache event, so that models without a cache export none.
  const CacheSeries& Cache() {
    std::call_once(cache_once_, [this] {
      cache_.hits = &families_.nv_cache_hits.Add(labels_);
      cache_.misses = &families_.nv_cache_misses.Add(labels_);
      cache_.hit_us = &families_.nv_cache_hit_us.Add(labels_);
      cache_.miss_us = &families_.nv_cache_miss_us.Add(labels_);
      cache_.shared = &families_.shared_answers.Add(labels_);
    });
    return cache_;
  }

  struct TargetSeries {
    Counter* refusals[2][2] = {};  // [target, deadline][arrival, queued]
    Histogram* oldest_wait = nullptr;
    Histogram* cost_ratio = nullptr;
  };
  // Created with the first latency-target event, so that models without a target export none.
  const TargetSeries& Target() {
    std::call_once(target_once_, [this] {
      const char* reasons[] = {"target", "deadline"};
      const char* whens[] = {"arrival", "queued"};
      for (int reason = 0; reason < 2; ++reason) {
        for (int when = 0; when < 2; ++when) {
          Labels with = labels_;
          with["reason"] = reasons[reason];
          with["when"] = whens[when];
          target_.refusals[reason][when] = &families_.latency_refusals.Add(with);
        }
      }
      target_.oldest_wait =
          &families_.batch_oldest_wait_seconds.Add(labels_, LatencyBucketsSeconds());
      target_.cost_ratio = &families_.batch_cost_ratio.Add(labels_, CostRatioBuckets());
    });
    return target_;
  }
  struct PrioritySeries {
    std::once_flag once;
    Histogram* queue_seconds = nullptr;
    Counter* refused[std::size(kAllFailureReasons)] = {};
  };
  // A level's series, created with its first event (every reason at once, at 0).
  const PrioritySeries& Priority(int level) {
    PrioritySeries& series = priority_[std::clamp(level, 1, kMaxPriorityLevels) - 1];
    std::call_once(series.once, [&] {
      Labels with = labels_;
      with["level"] = std::to_string(level);
      series.queue_seconds = &families_.priority_queue_seconds.Add(with, LatencyBucketsSeconds());
      for (FailureReason reason : kAllFailureReasons) {
        with["reason"] = FailureReasonName(reason);
        series.refused[static_cast<int>(reason)] = &families_.priority_refused.Add(with);
      }
    });
    return series;
  }

  static const std::vector<double>& CostRatioBuckets() {
    static const std::vector<double> buckets = {0.25, 0.5,  0.67, 0.8, 0.9, 1.0,
                                                1.1,  1.25, 1.5,  2,   4};
    return buckets;
  }

  ServerMetrics::Families& families_;
  const Labels labels_;
  std::once_flag sequences_once_;
  SequenceSeries sequences_;
  std::once_flag target_once_;
  TargetSeries target_;
  // Created with the first graph event, so that models without graphs export none.
  std::once_flag graphs_once_;
  Counter* graph_captures_ = nullptr;
  Counter* graph_replays_ = nullptr;
  std::once_flag copies_once_;
  Counter* copied_on_device_ = nullptr;
  Counter* copied_through_host_ = nullptr;
  std::once_flag cache_once_;
  CacheSeries cache_;
  PrioritySeries priority_[kMaxPriorityLevels];
  struct PerProtocol {
    Counter* succeeded = nullptr;
    Counter* failed[std::size(kAllFailureReasons)] = {};
    Counter* inferences = nullptr;
    Histogram* request_seconds = nullptr;
    Histogram* queue_seconds = nullptr;
  };
  PerProtocol per_protocol_[std::size(kAllProtocols)];
  Counter& executions_;
  // The batch cycle's series, made at the first batch (sluice_batch_phase_seconds_total in
  // kPhaseNames order, sluice_batch_rows_total).
  static constexpr size_t kPhases = 10;
  static constexpr const char* kPhaseNames[kPhases] = {
      "idle",      "assembly", "execute", "scatter",        "complete",
      "to_device", "forward",  "to_host", "assembly_ahead", "complete_behind"};
  std::once_flag phases_once_;
  std::array<Counter*, kPhases> phase_seconds_{};
  Counter* real_rows_ = nullptr;
  Counter* staged_ahead_ = nullptr;
  Counter* padding_rows_ = nullptr;
  Gauge& pending_;
  Histogram& input_seconds_;
  Histogram& infer_seconds_;
  Histogram& output_seconds_;
  Histogram& batch_size_;
  Counter& nv_success_;
  Counter* nv_failure_[std::size(kAllFailureReasons)] = {};
  Counter& nv_count_;
  Counter& nv_exec_count_;
  Counter& nv_request_us_;
  Counter& nv_queue_us_;
  Counter& nv_input_us_;
  Counter& nv_infer_us_;
  Counter& nv_output_us_;
  Gauge& nv_pending_;
};

Labels VersionLabels(const std::string& model, int64_t version) {
  return {{"model", model}, {"version", std::to_string(version)}};
}

// A version's series of `family` that one more label tells apart (a batch size, a shape, a
// device), replaced as a whole when the version reports them again: `*series` holds the gauges
// made last time; each of `values` becomes `base` + {key: its label} set to its value.
void ReplaceSeries(Family<Gauge>& family, std::vector<Gauge*>* series, const Labels& base,
                   const std::string& key,
                   const std::vector<std::pair<std::string, double>>& values) {
  for (Gauge* old : *series) family.Remove(old);
  series->clear();
  for (const auto& [label, value] : values) {
    Labels labels = base;
    labels[key] = label;
    Gauge& gauge = family.Add(labels);
    gauge.Set(value);
    series->push_back(&gauge);
  }
}

}  // namespace

ServerMetrics::ServerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)), families_(std::make_unique<Families>(*registry_)) {
  // At zero from the start, so that a rate() over them is defined before the first span.
  spans_exported_ = &families_->trace_spans_exported.Add({});
  for (SpanDropReason reason : kAllSpanDropReasons) {
    spans_dropped_[static_cast<size_t>(reason)] =
        &families_->trace_spans_dropped.Add({{"reason", SpanDropReasonName(reason)}});
  }
}

void ServerMetrics::OnSpansExported(uint64_t spans) {
  spans_exported_->Increment(static_cast<double>(spans));
}

void ServerMetrics::OnSpansDropped(SpanDropReason reason, uint64_t spans) {
  spans_dropped_[static_cast<size_t>(reason)]->Increment(static_cast<double>(spans));
}

ServerMetrics::~ServerMetrics() = default;

std::shared_ptr<StatsSink> ServerMetrics::SinkFor(const std::string& model, int64_t version) {
  MutexLock lock(&mutex_);
  return std::make_shared<ModelMetrics>(*families_, VersionLabels(model, version));
}

void ServerMetrics::OnState(const std::string& model, int64_t version, ModelState state) {
  MutexLock lock(&mutex_);
  for (ModelState each : {ModelState::kLoading, ModelState::kReady, ModelState::kUnavailable}) {
    Labels labels = VersionLabels(model, version);
    labels["state"] = ModelStateName(each);
    families_->state.Add(labels).Set(each == state ? 1 : 0);
  }
}

void ServerMetrics::OnReady(const ModelTuning& tuning, Duration load_time) {
  MutexLock lock(&mutex_);
  const Labels labels = VersionLabels(tuning.name, tuning.version);
  families_->load_seconds.Add(labels).Set(Seconds(load_time));
  families_->warmup_seconds.Add(labels).Set(Seconds(tuning.warmup_time));
  families_->warmup_pairs.Add(labels).Set(static_cast<double>(tuning.warmup.size()));
  families_->shapes.Add(labels).Set(tuning.shapes_finite ? static_cast<double>(tuning.shape_count)
                                                         : 0);
  // One decision series per version: a reload with another reason replaces it.
  ReplaceSeries(families_->cudnn_benchmark, &cudnn_decision_series_[{tuning.name, tuning.version}],
                labels, "reason", {{tuning.cudnn_reason, tuning.cudnn_benchmark ? 1.0 : 0.0}});
  std::vector<std::pair<std::string, double>> speedups;
  for (const CudnnShapeTiming& shape : tuning.cudnn_timings) {
    if (shape.on.count() > 0) speedups.emplace_back(shape.label, shape.speedup());
  }
  ReplaceSeries(families_->cudnn_speedup, &cudnn_series_[{tuning.name, tuning.version}], labels,
                "shape", speedups);
  std::vector<std::pair<std::string, double>> rates;
  for (const BatchSizeRate& rate : tuning.batch_sizes.rates) {
    if (rate.kept) rates.emplace_back(std::to_string(rate.batch_size), rate.rows_per_second);
  }
  ReplaceSeries(families_->auto_batch_rows, &auto_batch_series_[{tuning.name, tuning.version}],
                labels, "batch_size", rates);
}

void ServerMetrics::OnModelLoad(const std::string& model, const char* trigger, bool ok) {
  MutexLock lock(&mutex_);
  families_->model_loads
      .Add({{"model", model}, {"trigger", trigger}, {"result", ok ? "ok" : "failed"}})
      .Increment();
}

void ServerMetrics::OnEviction(const std::string& model, bool young) {
  MutexLock lock(&mutex_);
  families_->model_evictions.Add({{"model", model}}).Increment();
  if (young) families_->model_evictions_young.Add({{"model", model}}).Increment();
}

void ServerMetrics::OnColdStart(const std::string& model, Duration waited) {
  MutexLock lock(&mutex_);
  families_->cold_start_seconds.Add({{"model", model}}, LatencyBucketsSeconds())
      .Observe(Seconds(waited));
}

void ServerMetrics::OnVersionMemory(const std::string& model, int64_t version,
                                    const std::map<std::string, uint64_t>& memory) {
  MutexLock lock(&mutex_);
  std::vector<std::pair<std::string, double>> bytes_by_device;
  for (const auto& [device, bytes] : memory) {
    bytes_by_device.emplace_back(device, static_cast<double>(bytes));
  }
  std::vector<Gauge*>& series = memory_series_[{model, version}];
  ReplaceSeries(families_->model_memory, &series, VersionLabels(model, version), "device",
                bytes_by_device);
  if (series.empty()) memory_series_.erase({model, version});
}

void ServerMetrics::OnBudget(const std::map<std::string, uint64_t>& budget,
                             const std::map<std::string, uint64_t>& resident) {
  MutexLock lock(&mutex_);
  for (const auto& [device, bytes] : budget) {
    families_->memory_budget.Add({{"device", device}}).Set(static_cast<double>(bytes));
    auto used = resident.find(device);
    families_->memory_resident.Add({{"device", device}})
        .Set(used == resident.end() ? 0 : static_cast<double>(used->second));
  }
}

void ServerMetrics::OnResponseCacheChanged(const ResponseCacheStats& stats) {
  MutexLock lock(&mutex_);
  Families& f = *families_;
  if (f.cache_series.bytes == nullptr) {  // the first change: the cache's series from now on
    f.cache_series = {&f.cache_bytes.Add({}),       &f.cache_used_bytes.Add({}),
                      &f.cache_limit_bytes.Add({}), &f.cache_entries.Add({}),
                      &f.cache_insertions.Add({}),  &f.cache_evictions.Add({}),
                      &f.cache_too_large.Add({})};
  }
  const Families::CacheSeries& series = f.cache_series;
  series.bytes->Set(static_cast<double>(stats.bytes));
  series.used_bytes->Set(static_cast<double>(stats.entry_bytes));
  series.limit_bytes->Set(static_cast<double>(stats.byte_limit));
  series.entries->Set(static_cast<double>(stats.entries));
  // The cache counts from its start; the counters add what changed since the last call.
  series.insertions->Increment(static_cast<double>(stats.insertions - f.cache_seen.insertions));
  series.evictions->Increment(static_cast<double>(stats.evictions - f.cache_seen.evictions));
  series.too_large->Increment(static_cast<double>(stats.too_large - f.cache_seen.too_large));
  f.cache_seen = stats;
}

void ServerMetrics::SetBuildInfo(const std::map<std::string, std::string>& labels) {
  MutexLock lock(&mutex_);
  families_->build_info.Add(Labels(labels.begin(), labels.end())).Set(1);
}

void ServerMetrics::AddOperatorLibrary(const std::string& library, const std::string& path,
                                       const std::string& origin, size_t operators) {
  MutexLock lock(&mutex_);
  families_->operator_library.Add({{"library", library}, {"path", path}, {"origin", origin}})
      .Set(static_cast<double>(operators));
}

void ServerMetrics::SetGpus(const std::vector<GpuSample>& samples) {
  MutexLock lock(&mutex_);
  Families& f = *families_;
  // Series of GPUs or values that disappeared are removed; the others are set again (Add returns
  // the existing series for the same labels).
  std::vector<std::pair<Family<Gauge>*, Gauge*>> keep;
  std::vector<Counter*> energy_kept;
  std::map<std::string, double> energy_seen;
  auto set = [&](Family<Gauge>& family, const Labels& labels, const std::optional<double>& value) {
    if (!value.has_value()) return;
    Gauge& gauge = family.Add(labels);
    gauge.Set(*value);
    keep.emplace_back(&family, &gauge);
  };
  for (const GpuSample& gpu : samples) {
    const Labels nv = {{"gpu_uuid", gpu.uuid}};
    const Labels ours = {
        {"gpu", std::to_string(gpu.index)}, {"gpu_uuid", gpu.uuid}, {"name", gpu.name}};
    set(f.nv_gpu_utilization, nv, gpu.utilization);
    set(f.nv_gpu_memory_total, nv, gpu.memory_total_bytes);
    set(f.nv_gpu_memory_used, nv, gpu.memory_used_bytes);
    set(f.nv_gpu_power, nv, gpu.power_watts);
    set(f.nv_gpu_power_limit, nv, gpu.power_limit_watts);
    // NVML counts energy since the driver loaded; Triton's counter counts since the server
    // started: the first reading is the baseline, later ones add their difference. A GPU whose
    // reading goes away loses its counter and starts again from a new baseline.
    if (gpu.energy_joules.has_value()) {
      Counter& energy = f.nv_energy.Add(nv);
      auto seen = f.energy_seen.find(gpu.uuid);
      if (seen != f.energy_seen.end() && *gpu.energy_joules > seen->second) {
        energy.Increment(*gpu.energy_joules - seen->second);
      }
      energy_seen[gpu.uuid] = *gpu.energy_joules;
      energy_kept.push_back(&energy);
    }
    set(f.gpu_utilization, ours, gpu.utilization);
    set(f.gpu_memory_used, ours, gpu.memory_used_bytes);
    set(f.gpu_memory_total, ours, gpu.memory_total_bytes);
    set(f.gpu_power, ours, gpu.power_watts);
    set(f.gpu_temperature, ours, gpu.temperature_celsius);
  }
  for (const auto& old : f.gpu_series) {
    if (std::find(keep.begin(), keep.end(), old) == keep.end()) old.first->Remove(old.second);
  }
  for (Counter* old : f.energy_series) {
    if (std::find(energy_kept.begin(), energy_kept.end(), old) == energy_kept.end())
      f.nv_energy.Remove(old);
  }
  f.gpu_series = std::move(keep);
  f.energy_series = std::move(energy_kept);
  f.energy_seen = std::move(energy_seen);
}

}  // namespace sluice
