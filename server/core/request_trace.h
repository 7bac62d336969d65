// One request's trace, protocol-free and exporter-free: the W3C trace context it continues, the
// moments each stage stamps on it, and the spans it becomes when it is answered. Tracing that is
// off costs a null pointer: a request carries a RequestTrace only when it was sampled
// (server/tracing/tracer.h decides), and every stage checks the pointer before stamping.
//
// The spans of one traced request (times from the server's steady clock, exported as Unix time):
//   <request>  SERVER  the caller's span as parent; from the front end handing the request to the
//                      inference path until its answer was handed back to the transport
//     queue    INTERNAL  admitted to the model's queue .. its batch started
//     compute  INTERNAL  its batch started .. the forward pass ended (input assembly included);
//                        linked to the batch span
//     output   INTERNAL  the forward pass ended .. the answer was handed to the transport
//                        (output copies and response serialisation)
// An ensemble's request has one more level: each step is a request of its own to the step's model,
// traced as an INTERNAL span "ensemble step N" under the ensemble's request span (StartChild),
// with its own queue, compute and output spans under it.
// And one span per executed batch that holds a traced request:
//   batch      INTERNAL  a root of its own trace, linked to the request span of every traced
//                        request in it, with the batch's size, padding, instance and device.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "absl/base/thread_annotations.h"

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/core/status.h"

namespace sluice {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// A W3C trace context (https://www.w3.org/TR/trace-context/): a trace, a span in it, the sampled
// flag and the vendors' tracestate, passed on untouched.
struct SpanContext {
  TraceId trace_id{};
  SpanId span_id{};
  uint8_t flags = 0;  // bit 0: sampled (kSampledFlag)
  std::string trace_state;
};
inline constexpr uint8_t kSampledFlag = 1;

// A `traceparent` header's context: version 00's four fields (a later version's first four), the
// trace and span ids not all zero, lower-case hex. nullopt for anything else: the W3C rule is to
// ignore a malformed traceparent (and its tracestate) and start a new trace. `tracestate` is kept
// when it is at most 512 characters, else dropped.
std::optional<SpanContext> ParseTraceparent(absl::string_view traceparent,
                                            absl::string_view tracestate);
// "00-<trace id>-<span id>-<flags>".
std::string FormatTraceparent(const SpanContext& context);
std::string HexOf(absl::Span<const uint8_t> bytes);

// Random, never all-zero ids (a per-thread generator seeded from the system's entropy).
TraceId NewTraceId();
SpanId NewSpanId();

// A finished span, as exporters take it.
struct SpanAttribute {
  std::string key;
  std::variant<std::string, int64_t, double, bool> value;
};
struct SpanLink {
  TraceId trace_id{};
  SpanId span_id{};
  std::string trace_state;
  uint8_t flags = 0;
};
enum class SpanKind { kInternal = 1, kServer = 2 };
struct SpanData {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  // all zero: a root span
  std::string trace_state;
  uint8_t flags = 1;
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  int64_t start_unix_ns = 0;
  int64_t end_unix_ns = 0;
  std::vector<SpanAttribute> attributes;
  std::vector<SpanLink> links;
  bool error = false;  // OTLP status ERROR with `status_message`; else UNSET
  std::string status_message;
};

// Where finished spans go (an OTLP exporter, a test's list). Thread-safe; Export never blocks on
// I/O: it runs on the request path.
class SpanSink {
 public:
  virtual ~SpanSink() = default;
  virtual void Export(SpanData span) = 0;
};

// One sampled request's trace. The stages stamp it as the request moves (front end, scheduler,
// worker, completion). Thread-safe: usually each stage runs after the one before handed the
// request on, but a request may be answered while its run goes on (the response cache's single
// flight answers a first request that times out while the shared run is still queued), so the
// stamps and End take a lock, and stamps after End are ignored. End exports its spans, once.
class RequestTrace {
 public:
  // `parent`: the caller's context (its span becomes the request span's parent), or nullopt for a
  // new trace. `unix_offset`: Unix time minus steady time, to export steady time points as Unix
  // nanoseconds. `name`: the request span's name ("inference.GRPCInferenceService/ModelInfer").
  // `kind`: the request span's (SERVER for a caller's request).
  RequestTrace(SpanSink* sink, Duration unix_offset, std::optional<SpanContext> parent,
               std::string name, TimePoint received, SpanKind kind = SpanKind::kServer);

  // A request this request makes of another model (an ensemble's step): its own trace, whose
  // request span is an INTERNAL child of this one's, named `name`, from `at`; the stages stamp it
  // like any request's, and whoever answers it Ends it.
  std::shared_ptr<RequestTrace> StartChild(std::string name, TimePoint at) const;

  // Fixed at construction.
  const TraceId& trace_id() const { return trace_id_; }
  const SpanId& span_id() const { return span_id_; }  // the request span's
  const std::optional<SpanContext>& parent() const { return parent_; }
  SpanSink* sink() const { return sink_; }
  Duration unix_offset() const { return unix_offset_; }

  // Attributes of the request span (model, version, protocol, request id, priority, ...).
  void AddAttribute(std::string key, std::variant<std::string, int64_t, double, bool> value)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // The model version's device ("cuda:0", "cpu", "cuda:0,cuda:1 x4"), for the batch span.
  void SetDevice(std::string device) ABSL_LOCKS_EXCLUDED(mutex_);
  std::string device() const ABSL_LOCKS_EXCLUDED(mutex_);

  // The scheduler's stamps: admitted to the queue; its batch started, the forward pass ended and
  // the outputs were delivered, in the batch span `batch`.
  void Queued(TimePoint at) ABSL_LOCKS_EXCLUDED(mutex_);
  void Ran(TimePoint started, TimePoint computed, const SpanContext& batch)
      ABSL_LOCKS_EXCLUDED(mutex_);

  // The answer was handed to the transport at `at`: exports the request span and the stage spans
  // it reached, with `status` (an error marks the request span ERROR with its message). Once.
  void End(const Status& status, TimePoint at) ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  int64_t UnixNs(TimePoint at) const;
  SpanData Child(const char* name, TimePoint start, TimePoint end) const;

  SpanSink* const sink_;
  const Duration unix_offset_;
  const std::optional<SpanContext> parent_;
  const std::string name_;
  const TimePoint received_;
  const SpanKind kind_;
  const TraceId trace_id_;
  const SpanId span_id_;
  mutable Mutex mutex_;
  std::vector<SpanAttribute> attributes_ ABSL_GUARDED_BY(mutex_);
  std::string device_ ABSL_GUARDED_BY(mutex_);
  TimePoint queued_ ABSL_GUARDED_BY(mutex_){}, started_ ABSL_GUARDED_BY(mutex_){},
      computed_ ABSL_GUARDED_BY(mutex_){};
  std::optional<SpanContext> batch_ ABSL_GUARDED_BY(mutex_);
  bool ended_ ABSL_GUARDED_BY(mutex_) = false;
};

// What an executed batch holding traced requests was.
struct BatchTraceInfo {
  std::string model;
  int64_t version = 0;
  int64_t requests = 0;     // callers' requests in it
  int64_t rows = 0;         // rows the callers sent
  int64_t padded_rows = 0;  // rows the model saw
  size_t instance = 0;
  TimePoint started{}, computed{}, delivered{};
  Status status;
};

// Exports one batch span (a new trace, linked to each of `traced`'s request spans) through the
// first trace's sink, and stamps each trace with its run (Ran). `traced` must not be empty.
void TraceBatch(absl::Span<RequestTrace* const> traced, const BatchTraceInfo& info);

}  // namespace sluice
