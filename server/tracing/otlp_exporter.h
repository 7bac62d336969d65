// Spans out over OTLP/HTTP (https://opentelemetry.io/docs/specs/otlp/): protobuf-encoded
// ExportTraceServiceRequest bodies POSTed to a collector's /v1/traces, in batches, from one
// background thread, as OpenTelemetry's batch span processor does (its bsp_* bounds, with their
// defaults). The request path only appends to a bounded queue: a slow or absent collector never
// makes a request wait; spans that do not fit, or whose export fails, are dropped and counted.
// Plain HTTP only: run the collector beside the server (localhost, a sidecar, a node agent).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/core/request_trace.h"
#include "server/core/status.h"

namespace sluice {

inline constexpr char kDefaultOtlpUrl[] =
    "http://localhost:4318/v1/traces";                                 // Triton's default too
inline constexpr Duration kMaxScheduleDelay = std::chrono::hours(24);  // bsp_schedule_delay's bound

// Why spans were not exported.
enum class SpanDropReason {
  kQueueFull,     // more than max_queue_size spans waited (the collector is slow or down)
  kExportFailed,  // the POST failed (no connection, a timeout, the collector refused them)
  kShutdown,      // finished after the exporter stopped, or still queued when its time ran out
};
inline constexpr SpanDropReason kAllSpanDropReasons[] = {
    SpanDropReason::kQueueFull, SpanDropReason::kExportFailed, SpanDropReason::kShutdown};
const char* SpanDropReasonName(SpanDropReason reason);  // "queue_full", "export_failed", "shutdown"

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
// Strings that are not valid UTF-8 (a model name a client percent-encoded, say) have each bad
// byte replaced by U+FFFD: proto3 strings must be UTF-8, and strict decoders reject a whole body
// for one bad string.
std::string EncodeExportRequest(const std::vector<std::pair<std::string, std::string>>& resource,
                                absl::Span<const SpanData> spans);
// `text` as valid UTF-8 (itself when it already is).
std::string ValidUtf8(absl::string_view text);

// Addresses a host resolved to, kept between posts so that each post does not look the host up
// again (PostOtlp looks it up again after a failed connection; the exporter after any failed
// post).
struct ResolvedAddresses {
  struct Address {
    int family = 0;
    std::string bytes;  // the sockaddr
  };
  std::vector<Address> addresses;
};

// One POST of `body` (application/x-protobuf) to `url`, on a new connection, within `timeout`
// (connecting, sending and reading the status line; not the host's lookup). OK on a 2xx answer;
// UNAVAILABLE naming the failure (the connection, the time, or the collector's status line).
// `abandon` (may be null): checked every 100 ms while waiting; set, the post gives up.
// `resolved` (may be null): where the host's addresses are kept between posts.
Status PostOtlp(const OtlpUrl& url, const std::string& body, Duration timeout,
                const std::atomic<bool>* abandon = nullptr, ResolvedAddresses* resolved = nullptr);

class OtlpHttpExporter final : public SpanSink {
 public:
  struct Options {
    std::string url = kDefaultOtlpUrl;
    // Resource attributes (key, value); service.name=sluice is added unless given.
    std::vector<std::pair<std::string, std::string>> resource;
    size_t max_queue_size = 2048;  // bsp_max_queue_size: spans waiting; beyond it they are dropped
    Duration schedule_delay =
        std::chrono::milliseconds(5000);  // bsp_schedule_delay: the longest a span waits
    size_t max_export_batch_size =
        512;  // bsp_max_export_batch_size: spans per POST (<= max_queue_size)
    Duration export_timeout = std::chrono::seconds(10);  // one POST, connection included
    TraceExportObserver* observer = nullptr;             // may be null; outlives the exporter
  };

  // INVALID_ARGUMENT for a bad URL or bounds. Starts the export thread.
  static StatusOr<std::unique_ptr<OtlpHttpExporter>> Create(Options options);
  // Stop, then waits for the export thread's last posts until Stop's time is up; a post still
  // going then is abandoned (within 100 ms, unless it is in the host's name lookup, which cannot be
  // interrupted), and what is left is dropped (counted as shutdown).
  ~OtlpHttpExporter() override;

  // Queues `span` (drops it, counted, when max_queue_size spans wait or after Stop). Never blocks
  // on the network. A full batch wakes the export thread at once; otherwise it exports every
  // schedule_delay.
  void Export(SpanData span) override ABSL_LOCKS_EXCLUDED(mutex_);
  // Stops taking spans and tells the export thread to post what waits now, for up to `timeout`
  // (the destructor enforces it). Returns at once. Idempotent.
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
  std::atomic<bool> abandon_{false};  // the destructor's: a post still going gives up
  Mutex mutex_;
  CondVar wake_;  // the export thread's: a full batch, or stop
  CondVar done_;  // the destructor's: the export thread finished
  std::deque<SpanData> queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  TimePoint stop_by_ ABSL_GUARDED_BY(mutex_){};
  // The export thread's own.
  TimePoint last_failure_log_{};
  ResolvedAddresses resolved_;
  std::thread thread_;
};

}  // namespace sluice
