#include "server/http/http_server.h"

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/functional/any_invocable.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "server/core/logging.h"
#include "server/core/mutex.h"
#include "server/os/threads.h"
#include "server/os/tls_server_context.h"
#include "server/http/http_codec.h"
#include "server/http/http_compression.h"
#include "server/http/http_request_reader.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

// Answers at least this large that the client wants compressed go to the compression threads:
// from here the hand-off (a thread wake-up, tens of microseconds) is under 3 % of the deflate
// it moves (about 2 ms per 64 KiB of float bytes at level 6).
constexpr size_t kCompressOffThreadBytes = 64 << 10;

size_t BodyLength(const HttpResponse& response) {
  size_t length = 0;
  for (const std::string& segment : response.body) length += segment.size();
  return length;
}

// Compresses `response` in the encoding the client accepts, when the response may be compressed.
void Encode(int accept_encoding, HttpResponse& response) {
  const size_t length = BodyLength(response);
  // zlib counts in 32 bits: bodies past 1 GiB go out as they are.
  if (!response.compress || accept_encoding == kIdentity || length == 0 ||
      length > (size_t{1} << 30))
    return;
  std::string compressed = Deflate(response.body, accept_encoding);
  response.body.clear();
  response.body.push_back(std::move(compressed));
  response.headers.emplace_back("Content-Encoding", accept_encoding == kGzip ? "gzip" : "deflate");
}

const char* ReasonPhrase(int code) {
  switch (code) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return code < 400 ? "OK" : code < 500 ? "Bad Request" : "Internal Server Error";
  }
}

// The Date header's value (RFC 9110 IMF-fixdate), made once a second. Loop thread only.
const std::string& HttpDate() {
  static thread_local std::time_t made = 0;
  static thread_local std::string date;
  const std::time_t now = std::time(nullptr);
  if (now != made) {
    std::tm utc{};
    gmtime_r(&now, &utc);
    char text[64];
    const size_t length = std::strftime(text, sizeof(text), "%a, %d %b %Y %H:%M:%S GMT", &utc);
    date.assign(text, length);
    made = now;
  }
  return date;
}

// At most one warning a second for refusals a hostile client can repeat at will (each refusal is
// also logged at debug level); the ones left out are counted into the next.
class RefusalLog {
 public:
  void Warn(absl::string_view event, absl::string_view detail) {
    const Clock::time_point now = Clock::now();
    if (now - last_ < std::chrono::seconds(1)) {
      ++suppressed_;
      spdlog::debug("event={} {}", event, detail);
      return;
    }
    spdlog::warn("event={} {} similar_refusals_not_logged={}", event, detail, suppressed_);
    suppressed_ = 0;
    last_ = now;
  }

 private:
  Clock::time_point last_{};
  int64_t suppressed_ = 0;
};

// A connection answered and shut for writing lingers, reading and discarding what the client
// still sends (an upload refused midway), so that the client reads the answer instead of a reset:
// until the client closes, is silent this long, or at most kLingerTotal. Discarding costs no
// memory; the connection keeps its place against the connection limit meanwhile.
constexpr auto kLingerTotal = std::chrono::seconds(30);
constexpr auto kLingerSilence = std::chrono::seconds(2);
// Reads of a lingering connection per turn of the loop (a fast sender must not hold the loop).
constexpr int kLingerReadsPerTurn = 16;
// Bytes read from a socket at a time (one buffer for the loop).
constexpr size_t kReadBytes = 256 << 10;
// Compressed bodies may always inflate to this, whatever the ratio.
constexpr size_t kInflateFloorBytes = 1 << 20;

}  // namespace

// The event loop's state, shared by the server and every exchange (an exchange answered after
// the server stopped still finds its mutex).
struct HttpExchange::Loop : std::enable_shared_from_this<HttpExchange::Loop> {
  HttpServerOptions options;
  HttpHandler handler;
  event_base* base = nullptr;
  evconnlistener* listener = nullptr;
  event* wake = nullptr;
  std::thread thread;

  Mutex mutex;
  CondVar idle;
  bool stopping ABSL_GUARDED_BY(mutex) = false;         // Stop asked the loop to end
  bool draining = false;                                // loop thread only: StopAccepting ran
  bool listener_closed ABSL_GUARDED_BY(mutex) = false;  // StopAccepting's close ran on the loop
  event* flush_check = nullptr;                         // while stopping: are the answers written?
  Clock::time_point flush_deadline;
  bool stopped ABSL_GUARDED_BY(mutex) = false;  // the loop has ended
  int64_t in_flight ABSL_GUARDED_BY(mutex) = 0;
  std::deque<std::pair<std::unique_ptr<HttpExchange>, HttpResponse>> answered
      ABSL_GUARDED_BY(mutex);

  // Request bytes held (bodies received and inflated), against options.max_buffered_bytes; any
  // thread (codec threads charge what they inflate).
  std::atomic<size_t> buffered{0};
  bool Charge(size_t bytes) {
    size_t now = buffered.load(std::memory_order_relaxed);
    do {
      if (bytes > options.max_buffered_bytes || now > options.max_buffered_bytes - bytes)
        return false;
    } while (!buffered.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
    return true;
  }
  void Release(size_t bytes) { buffered.fetch_sub(bytes, std::memory_order_relaxed); }

  // Loop thread only: every accepted connection, counted or lingering.
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections;
  size_t counted = 0;                       // connections against max_connections
  std::atomic<size_t> open_connections{0};  // `counted`, for other threads
  size_t refused_lingering = 0;             // connections refused at accept, still lingering
  std::vector<char> read_buffer = std::vector<char>(kReadBytes);
  RefusalLog refusals;

  static thread_local const Loop* current;  // the loop this thread runs, if any

  // The codec threads (options.compression_threads of them, started by Start and stopped by Stop
  // before the loop): compressed request bodies are inflated and handed to the handler here, and
  // large answers the client wants compressed are deflated here, so that neither the event loop
  // nor the thread that answered (a model's worker) spends its time in zlib.
  Mutex codec_mutex;
  CondVar codec_work;
  bool codec_stopping ABSL_GUARDED_BY(codec_mutex) = false;
  std::deque<absl::AnyInvocable<void() &&>> codec_tasks ABSL_GUARDED_BY(codec_mutex);
  std::vector<std::thread> codec_threads;  // Start and Stop only
  std::atomic<int64_t> compressed_off_thread{0};

  ~Loop() {
    if (flush_check != nullptr) event_free(flush_check);
    if (wake != nullptr) event_free(wake);
    if (listener != nullptr) evconnlistener_free(listener);
    if (base != nullptr) event_base_free(base);
  }

  void Accept(evutil_socket_t fd, std::optional<IpAddress> peer);
  // Reads what the socket has while the connection reads requests.
  void Readable(Connection* connection);
  // Feeds `data` to the connection's reader: refuses, answers 100 Continue, or dispatches.
  void Consume(Connection* connection, absl::string_view data);
  void Dispatch(Connection* connection);
  // Hands `exchange` (its body inflated first when it is compressed) to the handler.
  void Handle(std::unique_ptr<HttpExchange> exchange);
  // Writes what is queued; once all is written, goes on as the connection's phase says.
  void Flush(Connection* connection);
  // TLS connections: SSL_read into read_buffer (the recv of plaintext ones: bytes, 0 at the
  // client's goodbye, -1 with errno EAGAIN to wait or another errno when it failed, or
  // kPlaintextOnTls), and the writing half of Flush.
  ssize_t TlsRead(Connection* connection);
  static constexpr ssize_t kPlaintextOnTls = -2;  // TlsRead: a plaintext request arrived
  // A reading TLS connection whose bytes OpenSSL has taken from the socket already (no socket
  // event will tell of them) gets a turn of its own.
  void ReadHeldTlsBytes(Connection* connection);
  void TlsFlush(Connection* connection);
  void Written(Connection* connection);
  // The client's end, seen while its request is handled: a reset cancels, a FIN does not.
  void PeerClosed(Connection* connection);
  void Timer(Connection* connection);
  void ArmTimer(Connection* connection);
  // Answers a request no exchange was made for (framing errors, limits) and closes after it.
  void Refuse(Connection* connection, int code, absl::string_view message,
              std::vector<std::pair<std::string, std::string>> headers = {});
  // Frees the connection at once (its socket closed); an exchange waiting on it is cancelled
  // when `reset`, else only detached.
  void Close(Connection* connection, bool reset);
  // Closes the connection from the loop's next turn (callers up the stack still hold it); the
  // request waiting on it is detached (and cancelled when `reset`) now.
  void Fail(Connection* connection, bool reset);
  // Forgets the request waiting on the connection, cancelling it when `reset`.
  void Detach(Connection* connection, bool reset);
  // When the connection's timer should next act; nothing while its request is handled.
  std::optional<Clock::time_point> Deadline(const Connection* connection) const;
  // Writes `response` to the exchange's connection and ends the exchange. Loop thread.
  void Send(std::unique_ptr<HttpExchange> exchange, HttpResponse response);
  // An answer from any thread: sent now on the loop thread, else queued for it (dropped once the
  // loop has stopped).
  void Post(std::unique_ptr<HttpExchange> exchange, HttpResponse response);
  // Forgets the answered exchange and frees it.
  void End(std::unique_ptr<HttpExchange> exchange);
  // Stop's last step on the loop: ends it once every answer has been written to its socket, or
  // after a second. Loop thread.
  void FinishWriting();
  // Queues `task` for the codec threads; false (and leaves `task`) when there are none, or they
  // have stopped.
  bool QueueCodec(absl::AnyInvocable<void() &&>& task);
  void CodecLoop();
  // Runs what is queued, then ends the codec threads.
  void StopCodecs();
};

thread_local const HttpExchange::Loop* HttpExchange::Loop::current = nullptr;

// One accepted socket. Loop thread only.
struct HttpExchange::Connection {
  enum class Phase {
    kReading,    // reading a request (or waiting for the next one on a keep-alive connection)
    kHandling,   // a request is with the handler; nothing is read (pipelined bytes wait)
    kAnswering,  // writing an answer; reading resumes once it is written
    kClosing,    // writing a last answer; the connection closes (lingering) once it is written
    kLingering,  // answered and shut for writing; reading and discarding until the client closes
  };
  Loop* loop = nullptr;
  evutil_socket_t fd = -1;
  bool counted = true;  // against max_connections (false: refused at accept)
  Phase phase = Phase::kReading;
  event* readable = nullptr;  // EV_READ, while reading or lingering
  event* writable = nullptr;  // EV_WRITE, while output waits for room
  event* peer_closed =
      nullptr;  // EV_READ once, while handling: the client's FIN, RST or more bytes
  event* timer = nullptr;
  HttpRequestReader reader;
  std::optional<IpAddress> peer;       // the client's address (nullopt: not an IP socket)
  SSL* ssl = nullptr;                  // TLS (HttpServerOptions::tls); null: plaintext
  bool write_wants_read = false;       // a TLS write waits for the client's bytes (a handshake)
  bool read_wants_write = false;       // a TLS read waits for room to write (a handshake)
  std::optional<std::string> subject;  // the client certificate's subject, once asked
  std::string pipelined;            // bytes after a complete request, read before it was answered
  size_t charged = 0;               // of the request being read, against the loop's budget
  HttpExchange* waiting = nullptr;  // the request with the handler; its responder owns it
  bool keep_alive = true;
  bool peer_eof = false;  // the client will send nothing more
  bool http10 = false;    // the request being answered is HTTP/1.0
  bool dead = false;      // failed: closed (and its request cancelled when `reset`) by the timer
  bool reset = false;
  std::deque<std::string> out;       // to write, in order
  size_t out_offset = 0;             // of out.front(), already written
  Clock::time_point activity;        // the last byte read or written
  Clock::time_point head_started{};  // the first byte of the request being read (epoch: none)
  Clock::time_point linger_started{};

  ~Connection() {
    for (event* each : {readable, writable, peer_closed, timer}) {
      if (each != nullptr) event_free(each);
    }
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) close(fd);
  }
};

HttpExchange::HttpExchange(std::shared_ptr<Loop> loop) : loop_(std::move(loop)) {}

HttpExchange::~HttpExchange() {
  if (charged_ > 0) loop_->Release(charged_);
}

const char* HttpExchange::Header(const char* name) const {
  for (const auto& [key, value] : headers_) {
    if (absl::EqualsIgnoreCase(key, name)) return value.c_str();
  }
  return nullptr;
}

void HttpExchange::OnCancel(std::function<void()> on_cancel) {
  MutexLock lock(&cancel_mutex_);
  on_cancel_ = std::move(on_cancel);
}

HttpResponder& HttpResponder::operator=(HttpResponder&& other) noexcept {
  if (this != &other) {
    if (exchange_) Respond(HttpResponse{500, {}, {}});
    exchange_ = std::move(other.exchange_);
  }
  return *this;
}

HttpResponder::~HttpResponder() {
  if (!exchange_) return;
  spdlog::error(
      "event=http_unanswered path={} reason=\"a handler dropped the request without answering\"",
      exchange_->path_);
  HttpResponse response;
  response.code = 500;
  response.headers.emplace_back("Content-Type", "application/json");
  response.body.push_back(
      ErrorJson("the server dropped this request without an answer (a bug); retry it"));
  Respond(std::move(response));
}

void HttpResponder::Respond(HttpResponse response) {
  std::shared_ptr<HttpExchange::Loop> loop =
      exchange_->loop_;  // the exchange may be gone when Post returns
  const int accept_encoding = exchange_->accept_encoding_;
  if (response.compress && accept_encoding != kIdentity &&
      BodyLength(response) >= kCompressOffThreadBytes && loop->options.compression_threads > 0) {
    HttpExchange::Loop* raw = loop.get();
    absl::AnyInvocable<void()&&> task = [raw, exchange = std::move(exchange_),
                                         response = std::move(response),
                                         accept_encoding]() mutable {
      Encode(accept_encoding, response);
      raw->compressed_off_thread.fetch_add(1, std::memory_order_relaxed);
      raw->Post(std::move(exchange), std::move(response));
    };
    if (!loop->QueueCodec(task))
      std::move(task)();  // the codec threads have stopped: compressed here
    return;
  }
  Encode(accept_encoding, response);
  loop->Post(std::move(exchange_), std::move(response));
}

bool HttpExchange::Loop::QueueCodec(absl::AnyInvocable<void() &&>& task) {
  MutexLock lock(&codec_mutex);
  if (options.compression_threads == 0 || codec_stopping) return false;
  codec_tasks.push_back(std::move(task));
  codec_work.Signal();
  return true;
}

void HttpExchange::Loop::CodecLoop() {
  NameThisThread("sluice-http-zip");
  MutexLock lock(&codec_mutex);
  for (;;) {
    while (!codec_stopping && codec_tasks.empty()) codec_work.Wait(&codec_mutex);
    if (codec_tasks.empty()) return;  // stopping, and nothing left
    absl::AnyInvocable<void()&&> task = std::move(codec_tasks.front());
    codec_tasks.pop_front();
    lock.Unlock();
    std::move(task)();
    lock.Lock();
  }
}

void HttpExchange::Loop::StopCodecs() {
  {
    MutexLock lock(&codec_mutex);
    codec_stopping = true;
    codec_work.SignalAll();
  }
  for (std::thread& thread : codec_threads) thread.join();
  codec_threads.clear();
}

void HttpExchange::Loop::Accept(evutil_socket_t fd, std::optional<IpAddress> peer) {
  auto entry = std::make_unique<Connection>();
  Connection* connection = entry.get();
  connection->loop = this;
  connection->fd = fd;
  connection->peer = peer;
  if (options.tls != nullptr) {
    connection->ssl = options.tls->NewConnection();
    if (connection->ssl == nullptr || SSL_set_fd(connection->ssl, fd) != 1) {
      spdlog::warn("event=http_tls_refused reason=\"cannot make a TLS session\"");
      return;  // the connection (and its socket) goes with `entry`
    }
  }
  connection->activity = Clock::now();
  connection->reader = HttpRequestReader(HttpReaderLimits{64 << 10, 128, options.max_body_bytes});
  // Answers go out at once: with Nagle's algorithm on, the last part of an answer larger than a
  // segment waits for the client's (delayed, up to 40 ms) acknowledgement of the rest.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  connection->timer = event_new(
      base, -1, 0,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<Connection*>(arg);
        self->loop->Timer(self);
      },
      connection);
  connection->readable = event_new(
      base, fd, EV_READ | EV_PERSIST,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<Connection*>(arg);
        self->loop->Readable(self);
      },
      connection);
  connection->writable = event_new(
      base, fd, EV_WRITE | EV_PERSIST,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<Connection*>(arg);
        self->loop->Flush(self);
      },
      connection);
  // While a request is handled: the socket turning readable means pipelined bytes, the client's
  // FIN, or a reset (epoll reports a reset as readable, not as EV_CLOSED); PeerClosed peeks.
  connection->peer_closed = event_new(
      base, fd, EV_READ | EV_CLOSED,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<Connection*>(arg);
        self->loop->PeerClosed(self);
      },
      connection);
  // The first request's head is due within the header deadline of the accept: a connection that
  // never sends a byte holds its place no longer than one that trickles.
  connection->head_started = connection->activity;
  connections.emplace(connection, std::move(entry));
  if (counted >= static_cast<size_t>(options.max_connections)) {
    // Every accepted socket counts, also one that never sends a byte; those past the limit get the
    // 503 straight away. Refusals lingering are bounded too: past as many again, closed at once.
    connection->counted = false;
    refusals.Warn("http_connection_refused",
                  absl::StrCat("open=", counted, " limit=", options.max_connections));
    if (refused_lingering >= static_cast<size_t>(options.max_connections)) {
      connections.erase(connection);  // closed at once; never counted, so not through Close
      return;
    }
    ++refused_lingering;
    Refuse(connection, 503,
           absl::StrCat("the server has ", counted,
                        " HTTP connections open, its limit (--http-max-connections); retry later"),
           {{"Retry-After", "1"}});
    return;
  }
  ++counted;
  open_connections.store(counted, std::memory_order_relaxed);
  event_add(connection->readable, nullptr);
  ArmTimer(connection);
}

void HttpExchange::Loop::Readable(Connection* connection) {
  int reads = 0;
  if (connection->dead) return;
  if (connection->write_wants_read) {
    // A TLS answer waited for the client's handshake bytes: write on.
    connection->write_wants_read = false;
    if (connection->phase != Connection::Phase::kReading &&
        connection->phase != Connection::Phase::kLingering)
      event_del(connection->readable);
    Flush(connection);
    return;
  }
  if (connection->phase == Connection::Phase::kReading && !connection->pipelined.empty()) {
    // Sent behind the request just answered: read first, in order.
    const std::string pipelined = std::move(connection->pipelined);
    connection->pipelined.clear();
    Consume(connection, pipelined);
    ReadHeldTlsBytes(connection);
    return;
  }
  while (connection->phase == Connection::Phase::kReading ||
         connection->phase == Connection::Phase::kLingering) {
    const ssize_t got =
        connection->ssl != nullptr && connection->phase == Connection::Phase::kReading
            ? TlsRead(connection)
            : recv(connection->fd, read_buffer.data(), read_buffer.size(), 0);
    if (got == kPlaintextOnTls) {
      // A plaintext request on the TLS port: told so in plaintext, then closed as any refusal
      // (its answer written, the rest of what it sends read and dropped).
      SSL_free(connection->ssl);
      connection->ssl = nullptr;
      Refuse(connection, 400, "this port speaks HTTPS: send the request over TLS (https://)");
      return;
    }
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      Close(connection, /*reset=*/true);
      return;
    }
    if (got == 0) {
      // The client sends nothing more: between requests, or while lingering, that is its goodbye;
      // in the middle of a request, it gave up on it.
      if (connection->phase == Connection::Phase::kReading && connection->reader.started()) {
        spdlog::debug("event=http_request_abandoned reason=\"the client closed mid-request\"");
      }
      Close(connection, /*reset=*/false);
      return;
    }
    connection->activity = Clock::now();
    if (connection->phase == Connection::Phase::kLingering) {
      if (++reads < kLingerReadsPerTurn) continue;  // discarded
      return;  // the rest on the next turn, after the other connections'
    }
    Consume(connection, absl::string_view(read_buffer.data(), static_cast<size_t>(got)));
    // A full buffer: more may be waiting, but give the other connections their turn.
    ReadHeldTlsBytes(connection);
    return;
  }
}

void HttpExchange::Loop::ReadHeldTlsBytes(Connection* connection) {
  if (!connection->dead && connection->ssl != nullptr &&
      connection->phase == Connection::Phase::kReading && SSL_has_pending(connection->ssl))
    event_active(connection->readable, EV_READ, 0);
}

ssize_t HttpExchange::Loop::TlsRead(Connection* connection) {
  ERR_clear_error();
  const int got =
      SSL_read(connection->ssl, read_buffer.data(), static_cast<int>(read_buffer.size()));
  if (got > 0) return got;
  switch (SSL_get_error(connection->ssl, got)) {
    case SSL_ERROR_WANT_READ:
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_WANT_WRITE:
      connection->read_wants_write = true;
      event_add(connection->writable, nullptr);
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_ZERO_RETURN:
      return 0;  // close_notify: the client's goodbye
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        // The socket's own failure (a reset), as a plaintext connection's recv reports it.
        if (errno == 0) errno = ECONNRESET;
        return -1;
      }
      break;
    default:
      break;
  }
  const unsigned long error = ERR_peek_error();
  if (ERR_GET_REASON(error) == SSL_R_HTTP_REQUEST) {
    ERR_clear_error();
    return kPlaintextOnTls;
  }
  refusals.Warn("http_tls_refused", absl::StrCat("reason=\"", OpenSslErrors(), "\""));
  errno = ECONNRESET;
  return -1;
}

void HttpExchange::Loop::TlsFlush(Connection* connection) {
  if (connection->read_wants_write) {
    // A TLS read waited for room to write its handshake: read on, on the loop's next turn.
    connection->read_wants_write = false;
    event_active(connection->readable, EV_READ, 0);
  }
  while (!connection->out.empty()) {
    std::string& front = connection->out.front();
    const size_t rest = front.size() - connection->out_offset;
    if (rest == 0) {
      connection->out.pop_front();
      connection->out_offset = 0;
      continue;
    }
    ERR_clear_error();
    const int wrote = SSL_write(connection->ssl, front.data() + connection->out_offset,
                                static_cast<int>(std::min<size_t>(rest, 1 << 30)));
    if (wrote > 0) {
      connection->activity = Clock::now();
      connection->out_offset += static_cast<size_t>(wrote);
      continue;
    }
    const int error = SSL_get_error(connection->ssl, wrote);
    if (error == SSL_ERROR_WANT_WRITE) {
      event_add(connection->writable, nullptr);
      return;
    }
    if (error == SSL_ERROR_WANT_READ) {
      connection->write_wants_read = true;
      event_del(connection->writable);  // the client's bytes, not room, let it go on
      event_add(connection->readable, nullptr);
      return;
    }
    ERR_clear_error();
    Fail(connection, /*reset=*/true);  // the client is gone, or its handshake failed
    return;
  }
  connection->write_wants_read = false;
  event_del(connection->writable);
  Written(connection);
}

void HttpExchange::Loop::Consume(Connection* connection, absl::string_view data) {
  HttpRequestReader& reader = connection->reader;
  if (connection->head_started == Clock::time_point{} && !data.empty()) {
    connection->head_started = Clock::now();
    ArmTimer(connection);
  }
  while (connection->phase == Connection::Phase::kReading) {
    const size_t before = reader.body().size();
    const HttpRequestReader::Step step = reader.Feed(data);
    data.remove_prefix(step.consumed);
    const size_t grown = reader.body().size() - before;
    if (grown > 0) {
      if (!Charge(grown)) {
        refusals.Warn("http_budget_refused",
                      absl::StrCat("buffered=", buffered.load(std::memory_order_relaxed),
                                   " limit=", options.max_buffered_bytes));
        Refuse(connection, 503,
               absl::StrCat("the server holds ", options.max_buffered_bytes,
                            " bytes of HTTP requests already, its limit "
                            "(--http-max-buffered-bytes); retry later"),
               {{"Retry-After", "1"}});
        return;
      }
      connection->charged += grown;
    }
    switch (step.event) {
      case HttpRequestReader::Event::kNeedMore:
        return;
      case HttpRequestReader::Event::kError:
        refusals.Warn("http_request_refused", absl::StrCat("code=", reader.error_code(),
                                                           " reason=\"", reader.error(), "\""));
        Refuse(connection, reader.error_code(), reader.error());
        return;
      case HttpRequestReader::Event::kHead: {
        ArmTimer(connection);  // from here the body's silence counts, not the head's deadline
        const HttpRequestHead& head = reader.head();
        if (head.content_length >
            options.max_buffered_bytes -
                std::min(options.max_buffered_bytes, buffered.load(std::memory_order_relaxed))) {
          refusals.Warn("http_budget_refused",
                        absl::StrCat("declared=", head.content_length,
                                     " buffered=", buffered.load(std::memory_order_relaxed),
                                     " limit=", options.max_buffered_bytes));
          Refuse(connection, 503,
                 absl::StrCat(
                     "the server cannot hold this request's ", head.content_length,
                     " bytes beside those it holds now (--http-max-buffered-bytes); retry later"),
                 {{"Retry-After", "1"}});
          return;
        }
        if (head.content_length > 0) {
          // Admitted: one allocation for the whole body (untouched pages cost nothing yet).
          try {
            reader.ReserveBody(static_cast<size_t>(head.content_length));
          } catch (const std::bad_alloc&) {
            Refuse(connection, 503,
                   absl::StrCat("the server cannot allocate this request's ", head.content_length,
                                " bytes now; retry later"),
                   {{"Retry-After", "1"}});
            return;
          }
        }
        if (head.expect_continue && head.minor_version == 1) {
          connection->out.emplace_back("HTTP/1.1 100 Continue\r\n\r\n");
          Flush(connection);
          if (connection->dead) return;
        }
        continue;
      }
      case HttpRequestReader::Event::kComplete:
        connection->pipelined.assign(data.data(), data.size());
        Dispatch(connection);
        return;
    }
  }
}

void HttpExchange::Loop::Dispatch(Connection* connection) {
  HttpRequestReader& reader = connection->reader;
  const HttpRequestHead& head = reader.head();
  std::unique_ptr<HttpExchange> exchange(new HttpExchange(shared_from_this()));
  exchange->connection_ = connection;
  exchange->peer_ = connection->peer;
  if (connection->ssl != nullptr) {
    if (!connection->subject) connection->subject = PeerCertificateSubject(connection->ssl);
    exchange->certificate_subject_ = *connection->subject;
  }
  exchange->method_ = head.method;
  exchange->head_only_ = head.method == "HEAD";
  absl::string_view target = head.target;
  exchange->path_ = std::string(target.substr(0, target.find('?')));
  exchange->headers_ = head.headers;
  exchange->received_ = reader.TakeBody();
  exchange->body_ = exchange->received_;
  exchange->charged_ = connection->charged;
  connection->charged = 0;
  exchange->accept_encoding_ = ChooseEncoding(exchange->Header("Accept-Encoding"));
  connection->keep_alive = head.keep_alive && !draining;
  connection->http10 = head.minor_version == 0;
  reader.Reset();
  connection->head_started = Clock::time_point{};
  connection->phase = Connection::Phase::kHandling;
  connection->waiting = exchange.get();
  event_del(connection->readable);
  event_del(connection->timer);
  if (!connection->peer_eof) event_add(connection->peer_closed, nullptr);
  {
    MutexLock lock(&mutex);
    ++in_flight;
  }
  Handle(std::move(exchange));
}

void HttpExchange::Loop::Handle(std::unique_ptr<HttpExchange> exchange) {
  const char* coding = exchange->Header("Content-Encoding");
  const std::string name =
      coding == nullptr ? "" : absl::AsciiStrToLower(absl::StripAsciiWhitespace(coding));
  if (name.empty() || name == "identity") {
    handler(HttpResponder(std::move(exchange)));
    return;
  }
  auto refuse = [](std::unique_ptr<HttpExchange> refused, int code, absl::string_view message) {
    HttpResponse response;
    response.code = code;
    response.headers.emplace_back("Content-Type", "application/json");
    if (code == 503) response.headers.emplace_back("Retry-After", "1");
    response.body.push_back(ErrorJson(message));
    HttpResponder(std::move(refused)).Respond(std::move(response));
  };
  if (name != "gzip" && name != "x-gzip" && name != "deflate") {
    refuse(std::move(exchange), 415,
           absl::StrCat("Content-Encoding '", coding,
                        "' is not supported; send gzip, deflate or identity"));
    return;
  }
  // Inflated (bounded by the body limit, the ratio and the budget) and handled off the loop.
  absl::AnyInvocable<void()&&> task = [this, exchange = std::move(exchange), refuse]() mutable {
    HttpExchange& held = *exchange;
    const size_t by_ratio = std::max(
        kInflateFloorBytes, held.received_.size() * static_cast<size_t>(options.max_inflate_ratio));
    const size_t limit = std::min(options.max_body_bytes, by_ratio);
    const std::string reason =
        limit == options.max_body_bytes
            ? "--http-max-body-bytes"
            : absl::StrCat(options.max_inflate_ratio,
                           " times its compressed size, --http-max-inflate-ratio");
    bool budget_refused = false;
    size_t inflate_charged =
        0;  // the largest output charged so far (a raw-deflate retry starts over)
    Status inflated = Inflate(
        held.received_, limit, reason,
        [&](size_t total) -> Status {
          if (total <= inflate_charged) return absl::OkStatus();
          if (Charge(total - inflate_charged)) {
            held.charged_ += total - inflate_charged;
            inflate_charged = total;
            return absl::OkStatus();
          }
          budget_refused = true;
          return absl::ResourceExhaustedError(
              absl::StrCat("the server holds ", options.max_buffered_bytes,
                           " bytes of HTTP requests already, its limit "
                           "(--http-max-buffered-bytes); retry later"));
        },
        &held.inflated_);
    // The compressed bytes are done with: their share of the budget goes back now.
    const size_t give_back = std::min(held.charged_, held.received_.size());
    std::string().swap(held.received_);
    held.charged_ -= give_back;
    Release(give_back);
    if (!inflated.ok()) {
      if (budget_refused) {
        refuse(std::move(exchange), 503, inflated.message());
      } else {
        refuse(std::move(exchange), absl::IsResourceExhausted(inflated) ? 413 : 400,
               inflated.message());
      }
      return;
    }
    // The inflated body's allocation may be larger than its bytes; the budget keeps what it
    // charged until the exchange ends.
    held.body_ = held.inflated_;
    handler(HttpResponder(std::move(exchange)));
  };
  if (!QueueCodec(task)) std::move(task)();
}

void HttpExchange::Loop::Flush(Connection* connection) {
  if (connection->dead) return;
  if (connection->ssl != nullptr) {
    TlsFlush(connection);
    return;
  }
  while (!connection->out.empty()) {
    iovec pieces[64];
    int count = 0;
    for (auto it = connection->out.begin(); it != connection->out.end() && count < 64;
         ++it, ++count) {
      const size_t skip = count == 0 ? connection->out_offset : 0;
      pieces[count].iov_base = it->data() + skip;
      pieces[count].iov_len = it->size() - skip;
    }
    msghdr message{};
    message.msg_iov = pieces;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t wrote = sendmsg(connection->fd, &message, MSG_NOSIGNAL);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        event_add(connection->writable, nullptr);
        return;
      }
      Fail(connection, /*reset=*/true);  // the client is gone
      return;
    }
    connection->activity = Clock::now();
    size_t left = static_cast<size_t>(wrote);
    while (left > 0) {
      std::string& front = connection->out.front();
      const size_t rest = front.size() - connection->out_offset;
      if (left < rest) {
        connection->out_offset += left;
        break;
      }
      left -= rest;
      connection->out.pop_front();
      connection->out_offset = 0;
    }
  }
  event_del(connection->writable);
  Written(connection);
}

void HttpExchange::Loop::Written(Connection* connection) {
  switch (connection->phase) {
    case Connection::Phase::kAnswering:
      connection->phase = Connection::Phase::kReading;
      event_add(connection->readable, nullptr);
      ArmTimer(connection);
      // Bytes already read behind the answered request: from the loop's next turn, not from
      // inside this (which may be inside a handler).
      if (!connection->pipelined.empty()) {
        event_active(connection->readable, EV_READ, 0);
      } else {
        ReadHeldTlsBytes(connection);
      }
      return;
    case Connection::Phase::kClosing:
      // The answer is out; what the client still sends is read and dropped until it closes (or
      // for kLingerTotal), so that it reads the answer instead of a reset mid-upload.
      if (connection->ssl != nullptr) (void)SSL_shutdown(connection->ssl);  // close_notify
      ERR_clear_error();
      shutdown(connection->fd, SHUT_WR);
      connection->phase = Connection::Phase::kLingering;
      connection->linger_started = Clock::now();
      event_add(connection->readable, nullptr);
      ArmTimer(connection);
      return;
    default:
      return;  // a 100 Continue went out; the request goes on
  }
}

void HttpExchange::Loop::PeerClosed(Connection* connection) {
  char byte = 0;
  const ssize_t got = recv(connection->fd, &byte, 1, MSG_PEEK);
  if (got > 0) return;  // pipelined bytes: read once the answer is out (the watch has ended)
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    event_add(connection->peer_closed, nullptr);  // nothing after all: watch on
    return;
  }
  if (got < 0) {
    // A reset: the client is gone, and so is the reason to answer.
    Close(connection, /*reset=*/true);
    return;
  }
  // A FIN: the client sends nothing more, but may well read (HTTP/1.0 style, `nc -N`). It gets
  // its answer, and the connection closes after it.
  connection->peer_eof = true;
}

std::optional<Clock::time_point> HttpExchange::Loop::Deadline(const Connection* connection) const {
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  switch (connection->phase) {
    case Connection::Phase::kReading: {
      Clock::time_point deadline = connection->activity + timeout;
      if (connection->head_started != Clock::time_point{} && !connection->reader.in_body()) {
        deadline = std::min(deadline, connection->head_started +
                                          std::chrono::milliseconds(options.header_timeout_ms));
      }
      return deadline;
    }
    case Connection::Phase::kHandling:
      return std::nullopt;
    case Connection::Phase::kAnswering:
    case Connection::Phase::kClosing:
      return connection->activity + timeout;
    case Connection::Phase::kLingering:
      return std::min(connection->linger_started + kLingerTotal,
                      connection->activity + kLingerSilence);
  }
  return std::nullopt;
}

void HttpExchange::Loop::ArmTimer(Connection* connection) {
  const std::optional<Clock::time_point> deadline = Deadline(connection);
  if (!deadline) {
    event_del(connection->timer);
    return;
  }
  const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(
      std::max(Clock::duration::zero(), *deadline - Clock::now()));
  const timeval after{static_cast<time_t>(wait.count() / 1000000),
                      static_cast<suseconds_t>(wait.count() % 1000000)};
  event_add(connection->timer, &after);
}

void HttpExchange::Loop::Timer(Connection* connection) {
  if (connection->dead) {
    Close(connection, connection->reset);
    return;
  }
  const std::optional<Clock::time_point> deadline = Deadline(connection);
  if (!deadline) return;
  if (Clock::now() < *deadline) {
    ArmTimer(connection);  // activity since it was armed moved the deadline on
    return;
  }
  switch (connection->phase) {
    case Connection::Phase::kReading:
      if (connection->reader.started() && !connection->reader.in_body()) {
        refusals.Warn("http_header_timeout",
                      absl::StrCat("timeout_ms=", options.header_timeout_ms));
        Refuse(connection, 408,
               absl::StrCat("the request line and headers did not arrive within ",
                            options.header_timeout_ms,
                            " ms of the request's first byte (--http-header-timeout-ms)"));
      } else if (connection->reader.in_body()) {
        Refuse(connection, 408,
               absl::StrCat("the request body stalled for ", options.timeout_ms,
                            " ms (--http-timeout-ms)"));
      } else {
        // Idle: a keep-alive connection between requests, or one that never sent a byte within
        // the header deadline.
        refusals.Warn("http_idle_closed", absl::StrCat("silent_ms=", options.timeout_ms));
        Close(connection, /*reset=*/false);
      }
      return;
    case Connection::Phase::kAnswering:
    case Connection::Phase::kClosing:
    case Connection::Phase::kLingering:
      Close(connection, /*reset=*/false);  // the client reads nothing, or lingered long enough
      return;
    case Connection::Phase::kHandling:
      return;
  }
}

void HttpExchange::Loop::Refuse(Connection* connection, int code, absl::string_view message,
                                std::vector<std::pair<std::string, std::string>> headers) {
  if (connection->ssl != nullptr && !SSL_is_init_finished(connection->ssl)) {
    // No TLS session to answer in (a client past the connection limit, or one that never
    // finished its handshake within the header deadline): closed at once.
    Fail(connection, /*reset=*/false);
    return;
  }
  const std::string body = ErrorJson(message);
  std::string head = absl::StrCat(
      "HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\nContent-Type: application/json\r\n",
      "Content-Length: ", body.size(), "\r\nDate: ", HttpDate(), "\r\nConnection: close\r\n");
  for (const auto& [key, value] : headers) absl::StrAppend(&head, key, ": ", value, "\r\n");
  head += "\r\n";
  connection->out.push_back(std::move(head));
  connection->out.push_back(body);
  // What was received of the refused request is dropped, and its budget with it.
  Release(connection->charged);
  connection->charged = 0;
  connection->reader.TakeBody();
  connection->reader.Reset();
  connection->pipelined.clear();
  connection->phase = Connection::Phase::kClosing;
  event_del(connection->readable);
  ArmTimer(connection);
  Flush(connection);
}

void HttpExchange::Loop::Fail(Connection* connection, bool reset) {
  if (connection->dead) return;
  connection->dead = true;
  connection->reset = reset;
  // The request being handled is told now (its answer will find no connection); the connection
  // itself is freed on the loop's next turn, once the callers up the stack are done with it.
  Detach(connection, reset);
  for (event* each : {connection->readable, connection->writable, connection->peer_closed}) {
    if (each != nullptr) event_del(each);
  }
  event_active(connection->timer, EV_TIMEOUT, 0);
}

void HttpExchange::Loop::Detach(Connection* connection, bool reset) {
  HttpExchange* exchange = connection->waiting;
  if (exchange == nullptr) return;
  connection->waiting = nullptr;
  exchange->connection_ = nullptr;
  if (reset && !exchange->cancelled_->exchange(true)) {
    std::function<void()> on_cancel;
    {
      MutexLock lock(&exchange->cancel_mutex_);
      on_cancel = exchange->on_cancel_;
    }
    if (on_cancel) on_cancel();
  }
}

void HttpExchange::Loop::Close(Connection* connection, bool reset) {
  Detach(connection, reset);
  Release(connection->charged);
  if (connection->counted) {
    --counted;
    open_connections.store(counted, std::memory_order_relaxed);
  } else {
    --refused_lingering;
  }
  connections.erase(connection);  // closes the socket
}

void HttpExchange::Loop::Post(std::unique_ptr<HttpExchange> exchange, HttpResponse response) {
  if (current == this) {
    Send(std::move(exchange), std::move(response));
    return;
  }
  MutexLock lock(&mutex);
  if (stopped) {
    --in_flight;
    idle.SignalAll();
    lock.Unlock();
    return;  // the exchange is freed here
  }
  const bool wake_loop = answered.empty();
  answered.emplace_back(std::move(exchange), std::move(response));
  if (wake_loop) event_active(wake, 0, 0);
}

void HttpExchange::Loop::Send(std::unique_ptr<HttpExchange> exchange, HttpResponse response) {
  Connection* connection = exchange->connection_;
  if (connection == nullptr || connection->dead) {
    End(std::move(exchange));  // the client is gone: the answer is dropped
    return;
  }
  connection->waiting = nullptr;
  exchange->connection_ = nullptr;
  event_del(connection->peer_closed);
  // Draining: the client reconnects elsewhere for its next request.
  // After the client's FIN, the requests it pipelined before it are still answered.
  const bool close = !connection->keep_alive || draining ||
                     (connection->peer_eof && connection->pipelined.empty());
  const size_t length = BodyLength(response);
  std::string head =
      absl::StrCat("HTTP/1.1 ", response.code, " ", ReasonPhrase(response.code), "\r\n");
  bool typed = false;
  for (const auto& [key, value] : response.headers) {
    // A handler's header that would break the framing is a bug; it is left out, not sent. The
    // framing headers are the transport's.
    if (key.find_first_of("\r\n:") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos ||
        absl::EqualsIgnoreCase(key, "Content-Length") ||
        absl::EqualsIgnoreCase(key, "Transfer-Encoding") ||
        absl::EqualsIgnoreCase(key, "Connection")) {
      spdlog::error("event=http_header_dropped name={}", key.substr(0, 64));
      continue;
    }
    typed = typed || absl::EqualsIgnoreCase(key, "Content-Type");
    absl::StrAppend(&head, key, ": ", value, "\r\n");
  }
  if (!typed) head += "Content-Type: application/json\r\n";
  absl::StrAppend(&head, "Content-Length: ", length, "\r\nDate: ", HttpDate(), "\r\n");
  if (close) {
    head += "Connection: close\r\n";
  } else if (connection->http10) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  connection->out.push_back(std::move(head));
  // HEAD: the length a GET would get, and no body.
  if (!exchange->head_only_) {
    for (std::string& segment : response.body) {
      if (!segment.empty()) connection->out.push_back(std::move(segment));
    }
  }
  connection->phase = close ? Connection::Phase::kClosing : Connection::Phase::kAnswering;
  End(std::move(exchange));
  ArmTimer(connection);
  Flush(connection);
}

void HttpExchange::Loop::End(std::unique_ptr<HttpExchange> exchange) {
  exchange.reset();
  MutexLock lock(&mutex);
  --in_flight;
  if (in_flight == 0) idle.SignalAll();
}

void HttpExchange::Loop::FinishWriting() {
  if (flush_check == nullptr) {
    flush_deadline = Clock::now() + std::chrono::seconds(1);
    flush_check = event_new(
        base, -1, EV_PERSIST,
        [](evutil_socket_t, short, void* arg) { static_cast<Loop*>(arg)->FinishWriting(); }, this);
    const timeval every{0, 10000};
    event_add(flush_check, &every);
  }
  bool written = true;
  for (const auto& [key, connection] : connections) {
    if (!connection->dead && !connection->out.empty()) written = false;
  }
  if (written || Clock::now() >= flush_deadline) event_base_loopbreak(base);
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                        HttpHandler handler) {
  static std::once_flag once;
  std::call_once(once, [] {
    // Before any event base exists: makes bases lockable and notifiable, so that event_active and
    // event_base_loopbreak may be called from other threads.
    evthread_use_pthreads();
    // Writes use MSG_NOSIGNAL; this also covers any other write to a socket whose client has gone.
    std::signal(SIGPIPE, SIG_IGN);
  });
  auto loop = std::make_shared<HttpExchange::Loop>();
  loop->options = options;
  loop->options.max_buffered_bytes = std::max(options.max_buffered_bytes, size_t{1});
  loop->options.max_inflate_ratio = std::max(options.max_inflate_ratio, 1);
  loop->handler = std::move(handler);
  loop->base = event_base_new();
  if (loop->base == nullptr) return absl::InternalError("libevent: event_base_new failed");

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options.port);
  const int resolved = getaddrinfo(options.address.empty() ? nullptr : options.address.c_str(),
                                   port_text.c_str(), &hints, &found);
  auto cannot_listen = [&](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, ":", options.port, " for HTTP (", why,
                     "); choose another with --http-port, or --allow-http false"));
  };
  if (resolved != 0 || found == nullptr) return cannot_listen(gai_strerror(resolved));
  HttpExchange::Loop* raw = loop.get();
  loop->listener = evconnlistener_new_bind(
      loop->base,
      [](evconnlistener*, evutil_socket_t fd, sockaddr* peer, int length, void* arg) {
        static_cast<HttpExchange::Loop*>(arg)->Accept(
            fd, IpAddress::FromSockaddr(peer, static_cast<socklen_t>(length)));
      },
      raw, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, 1024, found->ai_addr,
      static_cast<int>(found->ai_addrlen));
  const int bind_error = errno;
  freeaddrinfo(found);
  if (loop->listener == nullptr) return cannot_listen(std::strerror(bind_error));
  // Out of file descriptors (EMFILE): the listening socket stays readable, so accepting pauses
  // for a moment instead of spinning; connections already open go on being served.
  evconnlistener_set_error_cb(loop->listener, [](evconnlistener* listener, void* arg) {
    auto* self = static_cast<HttpExchange::Loop*>(arg);
    const int error = errno;
    self->refusals.Warn("http_accept_failed",
                        absl::StrCat("reason=\"", std::strerror(error), "\""));
    evconnlistener_disable(listener);
    const timeval pause{0, 100000};
    event_base_once(
        self->base, -1, EV_TIMEOUT,
        [](evutil_socket_t, short, void* again) {
          auto* loop = static_cast<HttpExchange::Loop*>(again);
          if (loop->listener != nullptr) evconnlistener_enable(loop->listener);
        },
        self, &pause);
  });
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  getsockname(evconnlistener_get_fd(loop->listener), reinterpret_cast<sockaddr*>(&bound),
              &bound_size);
  const int port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  loop->wake = event_new(
      loop->base, -1, 0,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<HttpExchange::Loop*>(arg);
        std::deque<std::pair<std::unique_ptr<HttpExchange>, HttpResponse>> answered;
        bool stopping = false;
        {
          MutexLock lock(&self->mutex);
          answered.swap(self->answered);
          stopping = self->stopping;
        }
        for (auto& [exchange, response] : answered)
          self->Send(std::move(exchange), std::move(response));
        if (stopping) self->FinishWriting();
      },
      loop.get());
  loop->thread = std::thread([raw] {
    NameThisThread("sluice-http");
    HttpExchange::Loop::current = raw;
    // Runs until Stop, also with nothing to wait for (after StopAccepting, before answers come).
    event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY);
    HttpExchange::Loop::current = nullptr;
  });
  for (int i = 0; i < options.compression_threads; ++i)
    loop->codec_threads.emplace_back([raw] { raw->CodecLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(loop), port));
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::StopAccepting() {
  HttpExchange::Loop* loop = loop_.get();
  {
    MutexLock lock(&loop->mutex);
    if (loop->listener_closed || loop->stopped) return;
  }
  // The listener belongs to the loop: the loop closes it, and this waits until it has (or the
  // loop has ended).
  event_base_once(
      loop->base, -1, EV_TIMEOUT,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<HttpExchange::Loop*>(arg);
        if (self->listener != nullptr) evconnlistener_free(self->listener);
        self->listener = nullptr;
        self->draining = true;
        MutexLock lock(&self->mutex);
        self->listener_closed = true;
        self->idle.SignalAll();
      },
      loop, nullptr);
  MutexLock lock(&loop->mutex);
  while (!loop->listener_closed && !loop->stopped) loop->idle.Wait(&loop->mutex);
}

size_t HttpServer::open_connections() const {
  return loop_->open_connections.load(std::memory_order_relaxed);
}

int64_t HttpServer::compressed_off_thread() const {
  return loop_->compressed_off_thread.load(std::memory_order_relaxed);
}

size_t HttpServer::buffered_bytes() const {
  return loop_->buffered.load(std::memory_order_relaxed);
}

bool HttpServer::WaitIdle(std::chrono::milliseconds timeout) {
  HttpExchange::Loop* loop = loop_.get();
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&loop->mutex);
  while (loop->in_flight > 0) {
    if (!loop->idle.WaitUntil(&loop->mutex, deadline)) return loop->in_flight == 0;
  }
  return true;
}

void HttpServer::Stop() {
  HttpExchange::Loop* loop = loop_.get();
  if (!loop->thread.joinable()) return;
  // First, while the loop still sends: bodies being inflated are handled, and answers being
  // compressed go out with the others.
  loop->StopCodecs();
  {
    // Through the wake event, which stays pending until the loop runs it: a loopbreak from here
    // would be lost if the loop had not started yet (event_base_loop clears it on entry).
    MutexLock lock(&loop->mutex);
    loop->stopping = true;
    event_active(loop->wake, 0, 0);
  }
  loop->thread.join();
  std::deque<std::pair<std::unique_ptr<HttpExchange>, HttpResponse>> unsent;
  {
    MutexLock lock(&loop->mutex);
    loop->stopped = true;
    unsent.swap(loop->answered);
    loop->in_flight -= static_cast<int64_t>(unsent.size());
    // Exchanges still unanswered stay alive for their Respond (which now drops the answer);
    // freeing the connections below must not reach them.
    for (auto& [key, connection] : loop->connections) {
      if (connection->waiting != nullptr) connection->waiting->connection_ = nullptr;
      connection->waiting = nullptr;
      loop->Release(connection->charged);
      connection->charged = 0;
    }
    loop->idle.SignalAll();
  }
  unsent.clear();
  loop->connections.clear();  // closes every socket
  loop->counted = 0;
  loop->refused_lingering = 0;
  loop->open_connections.store(0, std::memory_order_relaxed);
  if (loop->listener != nullptr) evconnlistener_free(loop->listener);
  loop->listener = nullptr;
}

}  // namespace sluice
