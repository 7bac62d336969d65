#include "server/core/request_trace.h"

#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace sluice {
namespace {

constexpr size_t kMaxTraceStateLength = 512;  // W3C: vendors may drop a longer tracestate

bool IsLowerHex(absl::string_view text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

int HexValue(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

template <size_t N>
bool ParseHexId(absl::string_view text, std::array<uint8_t, N>* id) {
  if (text.size() != 2 * N || !IsLowerHex(text)) return false;
  bool nonzero = false;
  for (size_t i = 0; i < N; ++i) {
    (*id)[i] = static_cast<uint8_t>(HexValue(text[2 * i]) * 16 + HexValue(text[2 * i + 1]));
    nonzero |= (*id)[i] != 0;
  }
  return nonzero;
}

std::mt19937_64& Generator() {
  thread_local std::mt19937_64 generator([] {
    std::random_device entropy;
    std::seed_seq seed{
        entropy(), entropy(), entropy(), entropy(),
        static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id()))};
    return std::mt19937_64(seed);
  }());
  return generator;
}

// A steady-clock time point as Unix nanoseconds, `unix_offset` being Unix time minus steady time.
int64_t UnixNanos(TimePoint at, Duration unix_offset) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch() + unix_offset)
      .count();
}

template <size_t N>
std::array<uint8_t, N> NewId() {
  std::array<uint8_t, N> id{};
  bool nonzero = false;
  while (!nonzero) {
    for (size_t i = 0; i < N; i += 8) {
      const uint64_t bits = Generator()();
      for (size_t j = 0; j < 8 && i + j < N; ++j) {
        id[i + j] = static_cast<uint8_t>(bits >> (8 * j));
        nonzero |= id[i + j] != 0;
      }
    }
  }
  return id;
}

}  // namespace

std::optional<SpanContext> ParseTraceparent(absl::string_view traceparent,
                                            absl::string_view tracestate) {
  traceparent = absl::StripAsciiWhitespace(traceparent);
  const std::vector<absl::string_view> fields = absl::StrSplit(traceparent, '-');
  if (fields.size() < 4 || fields[0].size() != 2 || !IsLowerHex(fields[0]) || fields[0] == "ff")
    return std::nullopt;
  // Version 00 has exactly four fields; a later version may append more, and its first four are
  // read.
  if (fields[0] == "00" && fields.size() != 4) return std::nullopt;
  SpanContext context;
  if (!ParseHexId(fields[1], &context.trace_id) || !ParseHexId(fields[2], &context.span_id))
    return std::nullopt;
  if (fields[3].size() != 2 || !IsLowerHex(fields[3])) return std::nullopt;
  context.flags = static_cast<uint8_t>(HexValue(fields[3][0]) * 16 + HexValue(fields[3][1]));
  tracestate = absl::StripAsciiWhitespace(tracestate);
  if (tracestate.size() <= kMaxTraceStateLength) context.trace_state = std::string(tracestate);
  return context;
}

std::string HexOf(absl::Span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes.size());
  for (uint8_t byte : bytes) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

std::string FormatTraceparent(const SpanContext& context) {
  const uint8_t flags[1] = {context.flags};
  return "00-" + HexOf(context.trace_id) + "-" + HexOf(context.span_id) + "-" + HexOf(flags);
}

TraceId NewTraceId() { return NewId<16>(); }
SpanId NewSpanId() { return NewId<8>(); }

RequestTrace::RequestTrace(SpanSink* sink, Duration unix_offset, std::optional<SpanContext> parent,
                           std::string name, TimePoint received, SpanKind kind)
    : sink_(sink),
      unix_offset_(unix_offset),
      parent_(std::move(parent)),
      name_(std::move(name)),
      received_(received),
      kind_(kind),
      trace_id_(parent_ ? parent_->trace_id : NewTraceId()),
      span_id_(NewSpanId()) {}

std::shared_ptr<RequestTrace> RequestTrace::StartChild(std::string name, TimePoint at) const {
  SpanContext context;
  context.trace_id = trace_id_;
  context.span_id = span_id_;
  context.flags = kSampledFlag;
  if (parent_) context.trace_state = parent_->trace_state;
  return std::make_shared<RequestTrace>(sink_, unix_offset_, std::move(context), std::move(name),
                                        at, SpanKind::kInternal);
}

void RequestTrace::AddAttribute(std::string key,
                                std::variant<std::string, int64_t, double, bool> value) {
  MutexLock lock(&mutex_);
  attributes_.push_back({std::move(key), std::move(value)});
}

void RequestTrace::SetDevice(std::string device) {
  MutexLock lock(&mutex_);
  device_ = std::move(device);
}

std::string RequestTrace::device() const {
  MutexLock lock(&mutex_);
  return device_;
}

void RequestTrace::Queued(TimePoint at) {
  MutexLock lock(&mutex_);
  if (!ended_) queued_ = at;
}

void RequestTrace::Ran(TimePoint started, TimePoint computed, const SpanContext& batch) {
  MutexLock lock(&mutex_);
  if (ended_) return;
  started_ = started;
  computed_ = computed;
  batch_ = batch;
}

int64_t RequestTrace::UnixNs(TimePoint at) const { return UnixNanos(at, unix_offset_); }

SpanData RequestTrace::Child(const char* name, TimePoint start, TimePoint end) const {
  SpanData span;
  span.trace_id = trace_id_;
  span.span_id = NewSpanId();
  span.parent_span_id = span_id_;
  if (parent_) span.trace_state = parent_->trace_state;
  span.name = name;
  span.start_unix_ns = UnixNs(start);
  span.end_unix_ns = UnixNs(std::max(start, end));
  return span;
}

void RequestTrace::End(const Status& status, TimePoint at) {
  MutexLock lock(&mutex_);
  if (ended_) return;
  ended_ = true;
  // The stages it reached, each ending where the next began.
  if (queued_ != TimePoint{}) {
    sink_->Export(Child("queue", queued_, started_ != TimePoint{} ? started_ : at));
  }
  if (started_ != TimePoint{}) {
    SpanData compute = Child("compute", started_, computed_);
    if (batch_) compute.links.push_back({batch_->trace_id, batch_->span_id, "", batch_->flags});
    sink_->Export(std::move(compute));
    sink_->Export(Child("output", computed_, at));
  }
  SpanData request;
  request.trace_id = trace_id_;
  request.span_id = span_id_;
  if (parent_) {
    request.parent_span_id = parent_->span_id;
    request.trace_state = parent_->trace_state;
  }
  request.name = name_;
  request.kind = kind_;
  request.start_unix_ns = UnixNs(received_);
  request.end_unix_ns = UnixNs(std::max(received_, at));
  request.attributes = std::move(attributes_);
  request.attributes.push_back(
      {"sluice.status", std::string(absl::StatusCodeToString(status.code()))});
  if (!status.ok()) {
    request.error = true;
    request.status_message = std::string(status.message());
  }
  sink_->Export(std::move(request));
}

void TraceBatch(absl::Span<RequestTrace* const> traced, const BatchTraceInfo& info) {
  const RequestTrace& first = *traced.front();
  SpanData span;
  span.trace_id = NewTraceId();
  span.span_id = NewSpanId();
  span.name = "batch";
  span.start_unix_ns = UnixNanos(info.started, first.unix_offset());
  span.end_unix_ns = UnixNanos(std::max(info.started, info.delivered), first.unix_offset());
  span.attributes = {{"sluice.model", info.model},
                     {"sluice.model_version", info.version},
                     {"sluice.batch.requests", info.requests},
                     {"sluice.batch.traced_requests", static_cast<int64_t>(traced.size())},
                     {"sluice.batch.rows", info.rows},
                     {"sluice.batch.padded_rows", info.padded_rows},
                     {"sluice.batch.padding_rows", info.padded_rows - info.rows},
                     {"sluice.instance", static_cast<int64_t>(info.instance)},
                     {"sluice.device", first.device()}};
  if (!info.status.ok()) {
    span.error = true;
    span.status_message = std::string(info.status.message());
  }
  const SpanContext batch{span.trace_id, span.span_id, 1, ""};
  for (RequestTrace* trace : traced) {
    span.links.push_back({trace->trace_id(), trace->span_id(),
                          trace->parent() ? trace->parent()->trace_state : "", 1});
    trace->Ran(info.started, info.computed, batch);
  }
  first.sink()->Export(std::move(span));
}

}  // namespace sluice
