// Which requests are traced, with Triton's trace settings (level, rate, count) for the server and
// per model, changed at run time through the trace settings API (gRPC TraceSetting, HTTP
// /v2/[models/{m}/]trace/setting), and where their spans go.
//
// Sampling, as in Triton: at level TIMESTAMPS, one request in every `rate` starts a trace, until
// `count` traces have started (-1: no limit). Once the count is down to 0 nothing more is sampled
// until the count is set again. A request that carries a W3C trace context (traceparent) is
// traced whatever the rate and the count, as a child of the caller's span, as long as the level is
// not OFF and the caller's sampled flag is set (a caller that does not record its trace gets no
// spans from Sluice either: OpenTelemetry's parent-based sampling).
//
// A model with settings of its own keeps its own rate counter and its own count of traces left:
// that count starts from the model's effective count when its settings are made, and again
// whenever its count is set or cleared, and later changes to the server's count do not reach it.
// Its level and rate, where it set none, follow the server's.
//
// Cost: with every level OFF (the default) Start is one atomic load and returns null.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/mutex.h"
#include "server/core/request_trace.h"
#include "server/core/status.h"

namespace sluice {

// Triton's trace levels. TENSORS (Triton's tensor dumps) is refused: Sluice records timing spans.
enum class TraceLevel { kOff, kTimestamps };
const char* TraceLevelName(TraceLevel level);  // "OFF", "TIMESTAMPS"
// One level's name (--trace-config level=, each value of the settings API's trace_level);
// INVALID_ARGUMENT saying why for TENSORS and for anything unknown.
StatusOr<TraceLevel> ParseTraceLevel(absl::string_view name);
// A whole decimal integer >= `minimum` (the settings' and --trace-config's numbers); nullopt for
// anything else (empty, signs or spaces around it, out of range).
std::optional<int64_t> ParseTraceInteger(absl::string_view text, int64_t minimum);

struct TraceSettings {
  TraceLevel level = TraceLevel::kOff;  // Triton's default
  int64_t rate = 1000;                  // trace one request in `rate` (>= 1)
  int64_t count = -1;                   // traces left to start; -1: no limit
};

// The trace settings API's view: key -> values, as both protocols carry them (trace_level is a
// list, the others one value each). Keys: trace_level, trace_rate, trace_count, log_frequency,
// trace_mode. In an update, an empty value list clears the key (a model's falls back to the
// server's; the server's returns to its start-up value).
using TraceSettingsMap = std::map<std::string, std::vector<std::string>>;

class Tracer {
 public:
  struct Options {
    TraceSettings settings;             // the server's, from --trace-config
    SpanSink* sink = nullptr;           // required; outlives the tracer
    const TimeSource* clock = nullptr;  // null: the steady clock
  };
  explicit Tracer(Options options);

  // Whether any level is on (server or model): false means Start returns null at once.
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // A trace for a request to `model` that arrived through `protocol`, or null when it is not
  // sampled. `header(name)` is what the call carries for a lower-case header name ("" when
  // absent); read only when tracing is active. `span_name` names the request span.
  std::shared_ptr<RequestTrace> Start(const std::string& model,
                                      absl::FunctionRef<absl::string_view(const char*)> header,
                                      std::string span_name) ABSL_LOCKS_EXCLUDED(mutex_);

  // The settings API: `model` empty for the server's. Update applies `update` (all or nothing;
  // INVALID_ARGUMENT naming the key and value that are wrong) and returns the settings after it.
  TraceSettingsMap Get(const std::string& model) const ABSL_LOCKS_EXCLUDED(mutex_);
  StatusOr<TraceSettingsMap> Update(const std::string& model, const TraceSettingsMap& update)
      ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  // What a model set for itself; the rest follows the server's settings.
  struct ModelSettings {
    std::optional<TraceLevel> level;
    std::optional<int64_t> rate;
    std::optional<int64_t> count;
    uint64_t seen = 0;       // requests since its settings were made or its rate changed
    int64_t remaining = -1;  // traces left
  };
  TraceSettings Effective(const ModelSettings* model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  TraceSettingsMap ToMap(const TraceSettings& settings) const;
  void Recount() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);  // active_

  const Options options_;
  const Duration unix_offset_;
  std::atomic<bool> active_{false};
  mutable Mutex mutex_;
  TraceSettings global_ ABSL_GUARDED_BY(mutex_);
  uint64_t global_seen_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t global_remaining_ ABSL_GUARDED_BY(mutex_) = -1;
  std::map<std::string, ModelSettings> models_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
