// Sluice's Prometheus metrics: per model version request counts, failures by reason, latency
// and batch-size histograms, model state, load and warm-up, the cuDNN benchmark decision, the
// build/runtime versions, and GPU telemetry. Everything is recorded into the registry this class
// is given (no global registry); MetricsEndpoint serves it.
//
// Our own metrics carry units (`_seconds`, `_bytes`, `_total`). Where a metric means what one of
// Triton's means it is also exported under Triton's name and units (`nv_inference_request_success`,
// `nv_inference_queue_duration_us`, `nv_gpu_utilization`, ...), so existing Triton dashboards and
// `perf_analyzer --collect-metrics` work unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"

#include "server/core/mutex.h"
#include "server/manager/model_events.h"
#include "server/manager/response_cache_events.h"
#include "server/tracing/otlp_exporter.h"

namespace sluice {

// Latency buckets in seconds: 50 us to 60 s, so that sub-millisecond requests and multi-second
// ones both resolve in histogram_quantile.
const std::vector<double>& LatencyBucketsSeconds();
// Batch-size buckets: 1, 2, 3, 4, 6, 8, 12, 16, ... 1024.
const std::vector<double>& BatchSizeBuckets();

// One GPU's telemetry sample (see GpuTelemetry). An empty value is one NVML could not give (the
// query is missing, not supported on this GPU, or failed): its series is absent, never 0.
struct GpuSample {
  int index = 0;  // the `gpu` label: CUDA's ordinal (cuda:N), or NVML's index without CUDA's view
  std::string uuid;  // "GPU-..." as nvidia-smi prints it
  std::string name;
  std::optional<double> utilization;  // 0..1, share of the last sample period a kernel ran
  std::optional<double> memory_used_bytes;
  std::optional<double> memory_total_bytes;
  std::optional<double> power_watts;
  std::optional<double> power_limit_watts;
  std::optional<double> temperature_celsius;
  std::optional<double> energy_joules;  // since the driver loaded
};

class ServerMetrics final : public ModelObserver,
                            public ResponseCacheObserver,
                            public TraceExportObserver {
 public:
  explicit ServerMetrics(std::shared_ptr<prometheus::Registry> registry);
  ~ServerMetrics() override;

  // ModelObserver.
  std::shared_ptr<StatsSink> SinkFor(const std::string& model, int64_t version) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void OnState(const std::string& model, int64_t version, ModelState state) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void OnReady(const ModelTuning& tuning, Duration load_time) override ABSL_LOCKS_EXCLUDED(mutex_);
  void OnModelLoad(const std::string& model, const char* trigger, bool ok) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void OnEviction(const std::string& model, bool young) override ABSL_LOCKS_EXCLUDED(mutex_);
  void OnColdStart(const std::string& model, Duration waited) override ABSL_LOCKS_EXCLUDED(mutex_);
  void OnVersionMemory(const std::string& model, int64_t version,
                       const std::map<std::string, uint64_t>& memory) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void OnBudget(const std::map<std::string, uint64_t>& budget,
                const std::map<std::string, uint64_t>& resident) override
      ABSL_LOCKS_EXCLUDED(mutex_);

  // ResponseCacheObserver: the sluice_response_cache_* series (created with the cache).
  void OnResponseCacheChanged(const ResponseCacheStats& stats) override ABSL_LOCKS_EXCLUDED(mutex_);

  // TraceExportObserver: sluice_trace_spans_exported_total,
  // sluice_trace_spans_dropped_total{reason} (lock-free: the series exist from the start).
  void OnSpansExported(uint64_t spans) override;
  void OnSpansDropped(SpanDropReason reason, uint64_t spans) override;

  // sluice_build_info{...} 1: the environment report's versions as labels.
  void SetBuildInfo(const std::map<std::string, std::string>& labels) ABSL_LOCKS_EXCLUDED(mutex_);
  // sluice_operator_library_operators{library,path,origin}: an operator library was loaded, and
  // registered `operators` operators (libraries are never unloaded).
  void AddOperatorLibrary(const std::string& library, const std::string& path,
                          const std::string& origin, size_t operators) ABSL_LOCKS_EXCLUDED(mutex_);
  // Replaces the GPU series with `samples`: each GPU's series for each value it has. A GPU or a
  // value missing from `samples` loses its series (an empty vector exports no GPU series).
  void SetGpus(const std::vector<GpuSample>& samples) ABSL_LOCKS_EXCLUDED(mutex_);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  struct Families;  // the metric families, defined in server_metrics.cc

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  Mutex mutex_;
  // The label children created after start-up (state, GPUs) and the GPU bookkeeping.
  std::unique_ptr<Families> families_ ABSL_PT_GUARDED_BY(mutex_);
  // Made in the constructor and never changed: Increment is thread-safe.
  prometheus::Counter* spans_exported_ = nullptr;
  std::array<prometheus::Counter*, std::size(kAllSpanDropReasons)>
      spans_dropped_{};  // by SpanDropReason
  // The auto batch size series of each (model, version), replaced when it loads again.
  std::map<std::pair<std::string, int64_t>, std::vector<prometheus::Gauge*>> auto_batch_series_
      ABSL_GUARDED_BY(mutex_);
  // The cuDNN benchmark decision series of each (model, version) (one, labelled with its reason),
  // replaced when it loads again.
  std::map<std::pair<std::string, int64_t>, std::vector<prometheus::Gauge*>> cudnn_decision_series_
      ABSL_GUARDED_BY(mutex_);
  // The cuDNN benchmark speedup series of each (model, version), replaced when it loads again.
  std::map<std::pair<std::string, int64_t>, std::vector<prometheus::Gauge*>> cudnn_series_
      ABSL_GUARDED_BY(mutex_);
  // The memory series of each (model, version), removed when it goes.
  std::map<std::pair<std::string, int64_t>, std::vector<prometheus::Gauge*>> memory_series_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
