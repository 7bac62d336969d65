#include "server/tracing/otlp_exporter.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include <google/protobuf/arena.h>

#include "otlp_trace.pb.h"
#include "server/core/logging.h"

namespace sluice {
namespace {

constexpr Duration kFailureLogInterval = std::chrono::seconds(60);
constexpr int kAbandonCheckMs = 100;  // how often a waiting post looks at `abandon`

size_t Utf8SequenceLength(absl::string_view text, size_t at);  // below

bool IsValidUtf8(absl::string_view text) {
  for (size_t at = 0; at < text.size();) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {
      ++at;
    } else if (const size_t length = Utf8SequenceLength(text, at); length > 0) {
      at += length;
    } else {
      return false;
    }
  }
  return true;
}

// Sets a proto3 string field through `set` with `text` as it is when it is valid UTF-8 (the usual
// case: no copy beyond the field's own), else with ValidUtf8's replacement.
template <typename Set>
void SetUtf8(const std::string& text, Set set) {
  if (IsValidUtf8(text)) {
    set(text);
  } else {
    set(ValidUtf8(text));
  }
}

void SetValue(const std::variant<std::string, int64_t, double, bool>& value, otlp::AnyValue* out) {
  if (const auto* text = std::get_if<std::string>(&value)) {
    SetUtf8(*text, [&](const std::string& valid) { out->set_string_value(valid); });
  } else if (const auto* number = std::get_if<int64_t>(&value)) {
    out->set_int_value(*number);
  } else if (const auto* real = std::get_if<double>(&value)) {
    out->set_double_value(*real);
  } else {
    out->set_bool_value(std::get<bool>(value));
  }
}

std::string Bytes(absl::Span<const uint8_t> id) { return std::string(id.begin(), id.end()); }

// A file descriptor closed with its scope.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  const int fd_;
};

int MillisecondsLeft(TimePoint deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, left));
}

// Waits for `events` on `fd` until `deadline`, looking at `abandon` (may be null) every 100 ms;
// false when the time ran out, the wait was abandoned or poll failed.
bool WaitFor(int fd, short events, TimePoint deadline, const std::atomic<bool>* abandon) {
  for (;;) {
    if (abandon != nullptr && abandon->load()) return false;
    const int left = MillisecondsLeft(deadline);
    pollfd entry{fd, events, 0};
    const int ready = poll(&entry, 1, abandon != nullptr ? std::min(left, kAbandonCheckMs) : left);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
    if (ready == 0 && Clock::now() >= deadline) return false;
  }
}

Status Resolve(const OtlpUrl& url, ResolvedAddresses* resolved) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (int error = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", url.host, ": ", gai_strerror(error)));
  }
  resolved->addresses.clear();
  for (addrinfo* each = found; each != nullptr; each = each->ai_next) {
    resolved->addresses.push_back(
        {each->ai_family,
         std::string(reinterpret_cast<const char*>(each->ai_addr), each->ai_addrlen)});
  }
  freeaddrinfo(found);
  return absl::OkStatus();
}

StatusOr<int> Connect(const OtlpUrl& url, const ResolvedAddresses& resolved, TimePoint deadline,
                      const std::atomic<bool>* abandon) {
  std::string last = "no address";
  for (const ResolvedAddresses::Address& each : resolved.addresses) {
    const int fd = socket(each.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const auto* address = reinterpret_cast<const sockaddr*>(each.bytes.data());
    if (connect(fd, address, static_cast<socklen_t>(each.bytes.size())) == 0 ||
        (errno == EINPROGRESS && WaitFor(fd, POLLOUT, deadline, abandon))) {
      int error = 0;
      socklen_t length = sizeof(error);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0) return fd;
      last = std::strerror(error);
    } else {
      last = errno == EINPROGRESS ? "timed out" : std::strerror(errno);
    }
    close(fd);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", url.host, ":", url.port, ": ", last));
}

// The length of the UTF-8 sequence at `text[at]`, or 0 when it is not a valid one (overlong
// forms, surrogates and code points past U+10FFFF included).
size_t Utf8SequenceLength(absl::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

const char* SpanDropReasonName(SpanDropReason reason) {
  switch (reason) {
    case SpanDropReason::kQueueFull:
      return "queue_full";
    case SpanDropReason::kExportFailed:
      return "export_failed";
    case SpanDropReason::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

std::string ValidUtf8(absl::string_view text) {
  size_t at = 0;
  while (at < text.size() && static_cast<unsigned char>(text[at]) < 0x80) ++at;
  if (at == text.size()) return std::string(text);  // ASCII: the usual case
  std::string valid(text.substr(0, at));
  while (at < text.size()) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {
      valid.push_back(text[at++]);
    } else if (const size_t length = Utf8SequenceLength(text, at); length > 0) {
      valid.append(text.data() + at, length);
      at += length;
    } else {
      valid.append("\xEF\xBF\xBD");  // U+FFFD for the byte that starts no valid sequence
      ++at;
    }
  }
  return valid;
}

std::string OtlpUrl::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat("http://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port, path);
}

StatusOr<OtlpUrl> ParseOtlpUrl(const std::string& url) {
  auto bad = [&url](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("OpenTelemetry url '", url, "' ", why,
                                                   " (expected http://host[:port]/path, e.g. ",
                                                   kDefaultOtlpUrl, ")"));
  };
  if (absl::StartsWithIgnoreCase(url, "https://")) {
    return bad(
        "uses https: Sluice exports spans over plain HTTP; run an OpenTelemetry collector beside "
        "the server "
        "(localhost or a sidecar) and let it forward over TLS");
  }
  if (!absl::StartsWithIgnoreCase(url, "http://")) return bad("is not an http:// URL");
  absl::string_view rest = absl::string_view(url).substr(7);
  OtlpUrl parsed;
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  if (slash != absl::string_view::npos) parsed.path = std::string(rest.substr(slash));
  if (authority.find('@') != absl::string_view::npos) return bad("carries credentials");
  absl::string_view port;
  if (absl::StartsWith(authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return bad("has an unclosed '['");
    parsed.host = std::string(authority.substr(1, close - 1));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("has something after the IPv6 address");
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    parsed.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
    if (parsed.host.find(':') != std::string::npos)
      return bad("has an IPv6 address without brackets ([::1])");
  }
  if (parsed.host.empty()) return bad("has no host");
  if (!port.empty() || authority.find(':') != absl::string_view::npos) {
    int value = 0;
    const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || error != std::errc() || end != port.data() + port.size() || value < 1 ||
        value > 65535) {
      return bad("has a port that is not 1-65535");
    }
    parsed.port = value;
  }
  return parsed;
}

std::string EncodeExportRequest(const std::vector<std::pair<std::string, std::string>>& resource,
                                absl::Span<const SpanData> spans) {
  // On an arena: the message is thousands of small objects (a span's attributes), built once and
  // thrown away; freeing them one by one cost more than building them.
  google::protobuf::Arena arena;
  auto* request = google::protobuf::Arena::CreateMessage<otlp::ExportTraceServiceRequest>(&arena);
  otlp::ResourceSpans* resource_spans = request->add_resource_spans();
  for (const auto& [key, value] : resource) {
    otlp::KeyValue* attribute = resource_spans->mutable_resource()->add_attributes();
    SetUtf8(key, [&](const std::string& valid) { attribute->set_key(valid); });
    SetUtf8(value,
            [&](const std::string& valid) { attribute->mutable_value()->set_string_value(valid); });
  }
  otlp::ScopeSpans* scope = resource_spans->add_scope_spans();
  scope->mutable_scope()->set_name("sluice");
  scope->mutable_scope()->set_version(SLUICE_VERSION);
  scope->mutable_spans()->Reserve(static_cast<int>(spans.size()));
  for (const SpanData& span : spans) {
    otlp::Span* out = scope->add_spans();
    out->set_trace_id(Bytes(span.trace_id));
    out->set_span_id(Bytes(span.span_id));
    if (span.parent_span_id != SpanId{}) out->set_parent_span_id(Bytes(span.parent_span_id));
    SetUtf8(span.trace_state, [&](const std::string& valid) { out->set_trace_state(valid); });
    // Bits 0-7: the W3C trace flags; bit 8: the parent's "is remote" is known, bit 9: it is.
    uint32_t flags = span.flags;
    if (span.parent_span_id != SpanId{}) flags |= span.kind == SpanKind::kServer ? 0x300u : 0x100u;
    out->set_flags(flags);
    SetUtf8(span.name, [&](const std::string& valid) { out->set_name(valid); });
    out->set_kind(span.kind == SpanKind::kServer ? otlp::Span::SPAN_KIND_SERVER
                                                 : otlp::Span::SPAN_KIND_INTERNAL);
    out->set_start_time_unix_nano(static_cast<uint64_t>(span.start_unix_ns));
    out->set_end_time_unix_nano(static_cast<uint64_t>(span.end_unix_ns));
    for (const SpanAttribute& attribute : span.attributes) {
      otlp::KeyValue* kv = out->add_attributes();
      SetUtf8(attribute.key, [&](const std::string& valid) { kv->set_key(valid); });
      SetValue(attribute.value, kv->mutable_value());
    }
    for (const SpanLink& link : span.links) {
      otlp::Span::Link* to = out->add_links();
      to->set_trace_id(Bytes(link.trace_id));
      to->set_span_id(Bytes(link.span_id));
      SetUtf8(link.trace_state, [&](const std::string& valid) { to->set_trace_state(valid); });
      to->set_flags(link.flags | 0x100u);  // not remote: both ends are Sluice's
    }
    if (span.error) {
      out->mutable_status()->set_code(otlp::Status::STATUS_CODE_ERROR);
      SetUtf8(span.status_message,
              [&](const std::string& valid) { out->mutable_status()->set_message(valid); });
    }
  }
  return request->SerializeAsString();
}

Status PostOtlp(const OtlpUrl& url, const std::string& body, Duration timeout,
                const std::atomic<bool>* abandon, ResolvedAddresses* resolved) {
  ResolvedAddresses once;
  ResolvedAddresses& addresses = resolved != nullptr ? *resolved : once;
  if (addresses.addresses.empty()) SLUICE_RETURN_IF_ERROR(Resolve(url, &addresses));
  const TimePoint deadline = Clock::now() + timeout;
  StatusOr<int> connected = Connect(url, addresses, deadline, abandon);
  if (!connected.ok()) {
    addresses.addresses.clear();  // looked up again next time: the collector may have moved
    return connected.status();
  }
  Socket socket(*connected);
  const int fd = socket.fd();
  const bool v6 = url.host.find(':') != std::string::npos;
  const std::string head = absl::StrCat(
      "POST ", url.path, " HTTP/1.1\r\nHost: ", v6 ? "[" : "", url.host, v6 ? "]" : "", ":",
      url.port, "\r\nContent-Type: application/x-protobuf\r\nContent-Length: ", body.size(),
      "\r\nUser-Agent: sluice/" SLUICE_VERSION "\r\nConnection: close\r\n\r\n");
  for (const std::string* part : {&head, &body}) {
    size_t sent = 0;
    while (sent < part->size()) {
      const ssize_t wrote = send(fd, part->data() + sent, part->size() - sent, MSG_NOSIGNAL);
      if (wrote > 0) {
        sent += static_cast<size_t>(wrote);
      } else if (wrote < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!WaitFor(fd, POLLOUT, deadline, abandon))
          return absl::UnavailableError("timed out sending to the collector");
      } else {
        return absl::UnavailableError(
            absl::StrCat("sending to the collector failed: ", std::strerror(errno)));
      }
    }
  }
  std::string answer;
  while (answer.find("\r\n") == std::string::npos && answer.size() < 1024) {
    if (!WaitFor(fd, POLLIN, deadline, abandon)) {
      return absl::UnavailableError("timed out waiting for the collector's answer");
    }
    char buffer[512];
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got > 0) {
      answer.append(buffer, static_cast<size_t>(got));
    } else if (got == 0) {
      break;
    } else if (errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("reading the collector's answer failed: ", std::strerror(errno)));
    }
  }
  const std::string line = answer.substr(0, answer.find("\r\n"));
  // "HTTP/1.1 200 OK"
  const size_t space = line.find(' ');
  if (!absl::StartsWith(line, "HTTP/") || space == std::string::npos || line.size() < space + 4) {
    return absl::UnavailableError(
        absl::StrCat("the collector's answer is not HTTP: '", line.substr(0, 80), "'"));
  }
  if (line[space + 1] != '2') {
    return absl::UnavailableError(
        absl::StrCat("the collector answered '", line.substr(space + 1, 80), "'"));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<OtlpHttpExporter>> OtlpHttpExporter::Create(Options options) {
  SLUICE_ASSIGN_OR_RETURN(OtlpUrl url, ParseOtlpUrl(options.url));
  if (options.max_queue_size < 1 || options.max_export_batch_size < 1) {
    return absl::InvalidArgumentError(
        "bsp_max_queue_size and bsp_max_export_batch_size must be at least 1");
  }
  if (options.max_export_batch_size > options.max_queue_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bsp_max_export_batch_size (", options.max_export_batch_size,
                     ") must not exceed bsp_max_queue_size (", options.max_queue_size, ")"));
  }
  if (options.schedule_delay <= Duration::zero() || options.schedule_delay > kMaxScheduleDelay) {
    return absl::InvalidArgumentError("bsp_schedule_delay must be 1 ms to one day");
  }
  const bool named =
      std::any_of(options.resource.begin(), options.resource.end(),
                  [](const auto& attribute) { return attribute.first == "service.name"; });
  if (!named) options.resource.insert(options.resource.begin(), {"service.name", "sluice"});
  return std::unique_ptr<OtlpHttpExporter>(
      new OtlpHttpExporter(std::move(options), std::move(url)));
}

OtlpHttpExporter::OtlpHttpExporter(Options options, OtlpUrl url)
    : options_(std::move(options)), url_(std::move(url)), thread_([this] { Loop(); }) {}

OtlpHttpExporter::~OtlpHttpExporter() {
  Stop();
  {
    MutexLock lock(&mutex_);
    while (!finished_ && Clock::now() < stop_by_) done_.WaitFor(&mutex_, stop_by_ - Clock::now());
  }
  abandon_.store(true);  // a post still going gives up within 100 ms
  if (thread_.joinable()) thread_.join();
}

void OtlpHttpExporter::Export(SpanData span) {
  SpanDropReason reason = SpanDropReason::kShutdown;
  {
    MutexLock lock(&mutex_);
    if (!stopping_ && queue_.size() < options_.max_queue_size) {
      queue_.push_back(std::move(span));
      if (queue_.size() == options_.max_export_batch_size) wake_.Signal();
      return;
    }
    if (!stopping_) reason = SpanDropReason::kQueueFull;
  }
  Drop(reason, 1);
}

void OtlpHttpExporter::Stop(Duration timeout) {
  MutexLock lock(&mutex_);
  if (stopping_) return;
  stopping_ = true;
  stop_by_ = Clock::now() + timeout;
  wake_.SignalAll();
}

void OtlpHttpExporter::Drop(SpanDropReason reason, uint64_t spans) {
  dropped_ += spans;
  if (options_.observer != nullptr) options_.observer->OnSpansDropped(reason, spans);
}

void OtlpHttpExporter::Send(std::vector<SpanData> spans, Duration timeout) {
  const Status sent =
      PostOtlp(url_, EncodeExportRequest(options_.resource, spans), timeout, &abandon_, &resolved_);
  if (!sent.ok())
    resolved_.addresses.clear();  // looked up again next time: the collector may have moved
  if (sent.ok()) {
    exported_ += spans.size();
    if (options_.observer != nullptr) options_.observer->OnSpansExported(spans.size());
    return;
  }
  Drop(abandon_.load() ? SpanDropReason::kShutdown : SpanDropReason::kExportFailed, spans.size());
  // One line a minute at most: a collector that is down should not flood the log.
  const TimePoint now = Clock::now();
  if (last_failure_log_ == TimePoint{} || now - last_failure_log_ >= kFailureLogInterval) {
    last_failure_log_ = now;
    spdlog::warn("event=trace_export_failed url={} spans={} dropped_total={} reason=\"{}\"",
                 url_.ToString(), spans.size(), dropped_.load(), sent.message());
  }
}

void OtlpHttpExporter::Loop() {
  MutexLock lock(&mutex_);
  TimePoint next = Clock::now() + options_.schedule_delay;
  for (;;) {
    while (!stopping_ && queue_.size() < options_.max_export_batch_size && Clock::now() < next) {
      wake_.WaitFor(&mutex_, next - Clock::now());
    }
    const bool last = stopping_;
    const bool due = last || Clock::now() >= next;
    // Full batches at once; a partial one when the delay has passed (or at the end).
    while (queue_.size() >= options_.max_export_batch_size || (due && !queue_.empty())) {
      const size_t take = std::min(queue_.size(), options_.max_export_batch_size);
      std::vector<SpanData> batch(
          std::make_move_iterator(queue_.begin()),
          std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(take)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(take));
      const Duration timeout = last ? std::min(options_.export_timeout, stop_by_ - Clock::now())
                                    : options_.export_timeout;
      lock.Unlock();
      if (timeout <= Duration::zero() || abandon_.load()) {
        Drop(SpanDropReason::kShutdown, batch.size());  // stopping, and out of time
      } else {
        Send(std::move(batch), timeout);
      }
      lock.Lock();
    }
    if (last) {
      finished_ = true;
      done_.SignalAll();
      return;
    }
    if (due) next = Clock::now() + options_.schedule_delay;
  }
}

}  // namespace sluice
