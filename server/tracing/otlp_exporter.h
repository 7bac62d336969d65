// Spans out over OTLP/HTTP (https://opentelemetry.io/docs/specs/otlp/): protobuf-encoded
// ExportTraceServiceRequest bodies POSTed to a collector's /v1/traces, in batches, from one
// background thread, as OpenTelemetry's batch span processor does (its bsp_* bounds, with their
// defaults). The request path only appends to a bounded queue: a slow or absent collector never
// makes a request wait; spans that do not fit, or whose export fails, are dropped and counted.
// Plain HTTP only: run the collector beside the server (localhost, a sidecar, a node agent).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/core/request_trace.h"
#include "server/core/status.h"

namespace sluice {

inline constexpr char kDefaultOtlpUrl[] = "http://localhost:4318/v1/traces";  // Triton's default too

// Why spans were not exported.
enum class SpanDropReason { kQueueFull, kExportFailed };
const char* SpanDropReasonName(SpanDropReason reason);  // "queue_full", "export_failed"

// Told of every export outcome (the Prometheus metrics). Thread-safe and cheap.
class TraceExportObserver {
 public:
  virtual ~TraceExportObserver() = default;
  virtual void OnSpansExported(uint64_t spans) = 0;
  virtual void OnSpansDropped(SpanDropReason reason, uint64_t spans) = 0;
};

// "http://host[:port][/path]": host a name, an IPv4 address or a bracketed IPv6 one; port 80 by
// default; path "/" by default.
struct OtlpUrl {
  std::string host;
  int port = 80;
  std::string path = "/";
  std::string ToString() const;
};
// INVALID_ARGUMENT for anything else, https:// included (say why: plain HTTP only).
StatusOr<OtlpUrl> ParseOtlpUrl(const std::string& url);

// The body of one export: `resource`'s attributes, one instrumentation scope ("sluice"), `spans`.
std::string EncodeExportRequest(const std::vector<std::pair<std::string, std::string>>& resource,
                                absl::Span<const SpanData> spans);

// One POST of `body` (application/x-protobuf) to `url`, on a new connection, within `timeout`
// (connecting, sending and reading the status line). OK on a 2xx answer; UNAVAILABLE naming the
// failure (the connection, the time, or the collector's status line).
Status PostOtlp(const OtlpUrl& url, const std::string& body, Duration timeout);

class OtlpHttpExporter final : public SpanSink {
 public:
  struct Options {
    std::string url = kDefaultOtlpUrl;
    // Resource attributes (key, value); service.name=sluice is added unless given.
    std::vector<std::pair<std::string, std::string>> resource;
    size_t max_queue_size = 2048;        // bsp_max_queue_size: spans waiting; beyond it they are dropped
    Duration schedule_delay = std::chrono::milliseconds(5000);  // bsp_schedule_delay: the longest a span waits
    size_t max_export_batch_size = 512;  // bsp_max_export_batch_size: spans per POST (<= max_queue_size)
    Duration export_timeout = std::chrono::seconds(10);  // one POST, connection included
    TraceExportObserver* observer = nullptr;  // may be null; outlives the exporter
  };

  // INVALID_ARGUMENT for a bad URL or bounds. Starts the export thread.
  static StatusOr<std::unique_ptr<OtlpHttpExporter>> Create(Options options);
  // Stop, then joins the thread.
  ~OtlpHttpExporter() override;

  // Queues `span` (drops it, counted, when max_queue_size spans wait). Never blocks on the
  // network. A full batch wakes the export thread at once; otherwise it exports every
  // schedule_delay.
  void Export(SpanData span) override ABSL_LOCKS_EXCLUDED(mutex_);
  // Exports what waits now (for up to `timeout`), then stops taking spans. Idempotent.
  void Stop(Duration timeout = std::chrono::seconds(2)) ABSL_LOCKS_EXCLUDED(mutex_);

  uint64_t exported() const { return exported_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  const OtlpUrl& url() const { return url_; }

 private:
  OtlpHttpExporter(Options options, OtlpUrl url);
  void Loop() ABSL_LOCKS_EXCLUDED(mutex_);
  void Send(std::vector<SpanData> spans, Duration timeout);
  void Drop(SpanDropReason reason, uint64_t spans);

  const Options options_;
  const OtlpUrl url_;
  std::atomic<uint64_t> exported_{0}, dropped_{0};
  Mutex mutex_;
  CondVar wake_;
  std::deque<SpanData> queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  TimePoint stop_by_ ABSL_GUARDED_BY(mutex_){};
  TimePoint last_failure_log_{};  // the export thread's
  std::thread thread_;
};

}  // namespace sluice
