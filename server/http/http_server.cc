#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "server/core/logging.h"
#include "server/core/mutex.h"
#include "server/core/thread_name.h"
#include "server/http/http_codec.h"

namespace sluice {
namespace {

enum Encoding { kIdentity = 0, kGzip = 1, kDeflate = 2 };

// The encoding to answer with for an Accept-Encoding header: gzip, else deflate, else none
// (a coding with q=0 is refused by the client and not chosen).
int ChooseEncoding(const char* accept) {
  if (accept == nullptr) return kIdentity;
  bool gzip = false;
  bool deflate = false;
  for (absl::string_view item : absl::StrSplit(accept, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const std::string coding = absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    bool refused = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      absl::string_view q = absl::StripAsciiWhitespace(parts[i]);
      if (absl::ConsumePrefix(&q, "q=") && !q.empty() && std::all_of(q.begin(), q.end(), [](char c) {
            return c == '0' || c == '.';
          })) {
        refused = true;
      }
    }
    if (refused) continue;
    if (coding == "gzip" || coding == "x-gzip") gzip = true;
    if (coding == "deflate") deflate = true;
  }
  return gzip ? kGzip : deflate ? kDeflate : kIdentity;
}

// Inflates a gzip or zlib (HTTP "deflate") body, or a raw deflate stream as some clients send
// for "deflate". RESOURCE_EXHAUSTED past `limit` bytes (a small body can inflate to gigabytes).
Status Inflate(absl::string_view in, size_t limit, std::string* out, bool raw = false) {
  z_stream stream{};
  // 15 + 32: zlib or gzip header, detected; -15: no header.
  if (inflateInit2(&stream, raw ? -15 : 15 + 32) != Z_OK) return absl::InternalError("zlib inflateInit2 failed");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());
  out->clear();
  int result = Z_OK;
  while (result == Z_OK) {
    if (out->size() >= limit) {
      inflateEnd(&stream);
      return absl::ResourceExhaustedError(
          absl::StrCat("the request body inflates to more than ", limit, " bytes (--http-max-body-bytes)"));
    }
    const size_t used = out->size();
    out->resize(std::min(limit, std::max<size_t>(used * 2, in.size() * 4 + 4096)));
    stream.next_out = reinterpret_cast<Bytef*>(out->data() + used);
    stream.avail_out = static_cast<uInt>(out->size() - used);
    result = inflate(&stream, Z_NO_FLUSH);
    out->resize(out->size() - stream.avail_out);
    if (result == Z_BUF_ERROR && stream.avail_in > 0) result = Z_OK;  // output full: grow
  }
  const bool complete = result == Z_STREAM_END;
  inflateEnd(&stream);
  if (!complete) {
    if (!raw) return Inflate(in, limit, out, /*raw=*/true);
    return absl::InvalidArgumentError("the request body is not valid gzip or deflate data (Content-Encoding)");
  }
  return absl::OkStatus();
}

// Answers at least this large that the client wants compressed go to the compression threads:
// from here the hand-off (a thread wake-up, tens of microseconds) is under 3 % of the deflate
// it moves (about 2 ms per 64 KiB of float bytes at level 6).
constexpr size_t kCompressOffThreadBytes = 64 << 10;

// The body segments compressed into one (gzip or zlib format).
std::string Deflate(const std::vector<std::string>& segments, int encoding) {
  z_stream stream{};
  deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, encoding == kGzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY);
  size_t total = 0;
  for (const std::string& segment : segments) total += segment.size();
  std::string out(deflateBound(&stream, total) + 64 * (segments.size() + 1), '\0');
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  for (const std::string& segment : segments) {
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(segment.data()));
    stream.avail_in = static_cast<uInt>(segment.size());
    deflate(&stream, Z_NO_FLUSH);
  }
  deflate(&stream, Z_FINISH);
  out.resize(out.size() - stream.avail_out);
  deflateEnd(&stream);
  return out;
}

size_t BodyLength(const HttpResponse& response) {
  size_t length = 0;
  for (const std::string& segment : response.body) length += segment.size();
  return length;
}

// Compresses `response` in the encoding the client accepts, when the response may be compressed.
void Encode(int accept_encoding, HttpResponse& response) {
  const size_t length = BodyLength(response);
  // zlib counts in 32 bits: bodies past 1 GiB go out as they are.
  if (!response.compress || accept_encoding == kIdentity || length == 0 || length > (size_t{1} << 30)) return;
  std::string compressed = Deflate(response.body, accept_encoding);
  response.body.clear();
  response.body.push_back(std::move(compressed));
  response.headers.emplace_back("Content-Encoding", accept_encoding == kGzip ? "gzip" : "deflate");
}

const char* FindHeader(evhttp_request* request, const char* name) {
  return evhttp_find_header(evhttp_request_get_input_headers(request), name);
}

void DeleteString(const void*, size_t, void* string) { delete static_cast<std::string*>(string); }

}  // namespace

// The event loop's state, shared by the server and every exchange (an exchange answered after
// the server stopped still finds its mutex).
struct HttpExchange::Loop : std::enable_shared_from_this<HttpExchange::Loop> {
  HttpServerOptions options;
  HttpHandler handler;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  evhttp_bound_socket* socket = nullptr;
  event* wake = nullptr;
  std::thread thread;

  Mutex mutex;
  CondVar idle;
  bool stopping ABSL_GUARDED_BY(mutex) = false;  // Stop asked the loop to end
  bool draining = false;                          // loop thread only: StopAccepting ran
  bool listener_closed ABSL_GUARDED_BY(mutex) = false;  // StopAccepting's close ran on the loop
  event* flush_check = nullptr;                   // while stopping: are the answers written?
  std::chrono::steady_clock::time_point flush_deadline;
  bool stopped ABSL_GUARDED_BY(mutex) = false;   // the loop has ended
  int64_t in_flight ABSL_GUARDED_BY(mutex) = 0;
  std::deque<std::pair<std::unique_ptr<HttpExchange>, HttpResponse>> answered ABSL_GUARDED_BY(mutex);

  // An open connection that has sent a request. `waiting`: its exchanges not yet answered. While
  // there are some, `peer_closed` watches the socket for the client's close (libevent does not
  // read from a connection whose request is being answered, so would not notice).
  struct Connection {
    Loop* loop = nullptr;
    std::vector<HttpExchange*> waiting;  // not owned: their responders own them
    event* peer_closed = nullptr;
    ~Connection() {
      if (peer_closed != nullptr) event_free(peer_closed);
    }
  };
  // Loop thread only: for cancellation and the connection bound.
  std::unordered_map<evhttp_connection*, std::unique_ptr<Connection>> connections;
  std::atomic<size_t> open_connections{0};  // connections.size(), for other threads

  static thread_local const Loop* current;  // the loop this thread runs, if any

  // The compression threads (options.compression_threads of them, started by Start and stopped
  // by Stop before the loop): a large answer the client wants compressed is deflated here, so
  // that the thread that answered (a model's worker) goes back to its own work.
  Mutex compress_mutex;
  CondVar compress_work;
  bool compress_stopping ABSL_GUARDED_BY(compress_mutex) = false;
  std::deque<std::pair<std::unique_ptr<HttpExchange>, HttpResponse>> to_compress ABSL_GUARDED_BY(compress_mutex);
  std::vector<std::thread> compressors;  // Start and Stop only
  std::atomic<int64_t> compressed_off_thread{0};

  ~Loop() {
    if (flush_check != nullptr) event_free(flush_check);
    if (wake != nullptr) event_free(wake);
    if (http != nullptr) evhttp_free(http);
    if (base != nullptr) event_base_free(base);
  }

  void Accept(evhttp_request* request);
  // Writes `response` to the exchange's connection and ends the exchange. Loop thread.
  void Send(std::unique_ptr<HttpExchange> exchange, HttpResponse response);
  // An answer from any thread: sent now on the loop thread, else queued for it (dropped once the
  // loop has stopped).
  void Post(std::unique_ptr<HttpExchange> exchange, HttpResponse response);
  // Forgets the answered exchange and frees it. Loop thread.
  void End(std::unique_ptr<HttpExchange> exchange);
  void ConnectionClosed(evhttp_connection* connection);
  // Stop's last step on the loop: ends it once every answer has been written to its socket, or
  // after a second. Loop thread.
  void FinishWriting();
  // Queues `response` for the compression threads and takes `exchange` and `response`; false (and
  // takes nothing) when there are none, or they have stopped.
  bool QueueCompression(std::unique_ptr<HttpExchange>& exchange, HttpResponse& response);
  void CompressLoop();
  // Compresses and posts what is queued, then ends the compression threads.
  void StopCompressing();
  // Marks the exchanges waiting on `connection` cancelled and runs their on_cancel (once each).
  static void CancelWaiting(Connection* connection);
  // Answers a request no exchange was made for. Loop thread.
  static void Refuse(evhttp_request* request, int code, absl::string_view message, bool close);
};

thread_local const HttpExchange::Loop* HttpExchange::Loop::current = nullptr;

const char* HttpExchange::Header(const char* name) const { return FindHeader(request_, name); }

HttpResponder& HttpResponder::operator=(HttpResponder&& other) noexcept {
  if (this != &other) {
    if (exchange_) Respond(HttpResponse{500, {}, {}});
    exchange_ = std::move(other.exchange_);
  }
  return *this;
}

HttpResponder::~HttpResponder() {
  if (!exchange_) return;
  spdlog::error("event=http_unanswered path={} reason=\"a handler dropped the request without answering\"",
                exchange_->path_);
  HttpResponse response;
  response.code = 500;
  response.headers.emplace_back("Content-Type", "application/json");
  response.body.push_back(ErrorJson("the server dropped this request without an answer (a bug); retry it"));
  Respond(std::move(response));
}

void HttpResponder::Respond(HttpResponse response) {
  std::shared_ptr<HttpExchange::Loop> loop = exchange_->loop_;  // the exchange may be gone when Post returns
  const int accept_encoding = exchange_->accept_encoding_;
  if (response.compress && accept_encoding != kIdentity && BodyLength(response) >= kCompressOffThreadBytes &&
      loop->QueueCompression(exchange_, response)) {
    return;
  }
  Encode(accept_encoding, response);
  loop->Post(std::move(exchange_), std::move(response));
}

bool HttpExchange::Loop::QueueCompression(std::unique_ptr<HttpExchange>& exchange, HttpResponse& response) {
  MutexLock lock(&compress_mutex);
  if (options.compression_threads == 0 || compress_stopping) return false;
  to_compress.emplace_back(std::move(exchange), std::move(response));
  compress_work.Signal();
  return true;
}

void HttpExchange::Loop::CompressLoop() {
  NameThisThread("sluice-http-zip");
  MutexLock lock(&compress_mutex);
  for (;;) {
    while (!compress_stopping && to_compress.empty()) compress_work.Wait(&compress_mutex);
    if (to_compress.empty()) return;  // stopping, and nothing left
    auto [exchange, response] = std::move(to_compress.front());
    to_compress.pop_front();
    lock.Unlock();
    Encode(exchange->accept_encoding_, response);
    compressed_off_thread.fetch_add(1, std::memory_order_relaxed);
    Post(std::move(exchange), std::move(response));
    lock.Lock();
  }
}

void HttpExchange::Loop::StopCompressing() {
  {
    MutexLock lock(&compress_mutex);
    compress_stopping = true;
    compress_work.SignalAll();
  }
  for (std::thread& compressor : compressors) compressor.join();
  compressors.clear();
}

void HttpExchange::Loop::Refuse(evhttp_request* request, int code, absl::string_view message, bool close) {
  evkeyvalq* headers = evhttp_request_get_output_headers(request);
  evhttp_add_header(headers, "Content-Type", "application/json");
  if (close) evhttp_add_header(headers, "Connection", "close");
  const std::string body = ErrorJson(message);
  evbuffer_add(evhttp_request_get_output_buffer(request), body.data(), body.size());
  evhttp_send_reply(request, code, nullptr, nullptr);
}

void HttpExchange::Loop::Accept(evhttp_request* request) {
  evhttp_connection* connection = evhttp_request_get_connection(request);
  auto open = connections.find(connection);
  if (open == connections.end()) {
    if (connections.size() >= static_cast<size_t>(options.max_connections)) {
      spdlog::warn("event=http_connection_refused open={} limit={}", connections.size(), options.max_connections);
      Refuse(request, 503,
             absl::StrCat("the server has ", connections.size(),
                          " HTTP connections open, its limit (--http-max-connections); retry later"),
             /*close=*/true);
      return;
    }
    auto entry = std::make_unique<Connection>();
    entry->loop = this;
    // Answers go out at once: with Nagle's algorithm on, the last part of an answer larger than a
    // segment waits for the client's (delayed, up to 40 ms) acknowledgement of the rest.
    const evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(connection));
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // EV_CLOSED: the client's FIN or RST, seen without reading (epoll's EPOLLRDHUP). A client
    // that half-closes after its request counts as gone.
    if (event_base_get_features(base) & EV_FEATURE_EARLY_CLOSE) {
      entry->peer_closed = event_new(
          base, fd, EV_CLOSED,
          [](evutil_socket_t, short, void* arg) { CancelWaiting(static_cast<Connection*>(arg)); }, entry.get());
    }
    open = connections.emplace(connection, std::move(entry)).first;
    open_connections.store(connections.size(), std::memory_order_relaxed);
    evhttp_connection_set_closecb(
        connection, [](evhttp_connection* closed, void* loop) { static_cast<Loop*>(loop)->ConnectionClosed(closed); },
        this);
  }

  std::unique_ptr<HttpExchange> exchange(new HttpExchange());
  // The server owns the loop through a shared_ptr; an exchange holds one too (see Respond).
  exchange->request_ = request;
  exchange->connection_ = connection;
  switch (evhttp_request_get_command(request)) {
    case EVHTTP_REQ_GET: exchange->method_ = "GET"; break;
    case EVHTTP_REQ_POST: exchange->method_ = "POST"; break;
    case EVHTTP_REQ_HEAD: exchange->method_ = "HEAD"; break;
    default: exchange->method_ = "OTHER"; break;
  }
  const char* uri = evhttp_request_get_uri(request);
  absl::string_view target = uri != nullptr ? uri : "/";
  exchange->path_ = std::string(target.substr(0, target.find('?')));
  exchange->accept_encoding_ = ChooseEncoding(FindHeader(request, "Accept-Encoding"));

  evbuffer* input = evhttp_request_get_input_buffer(request);
  const size_t length = evbuffer_get_length(input);
  if (length > 0) {
    exchange->body_ = absl::string_view(reinterpret_cast<const char*>(evbuffer_pullup(input, -1)), length);
  }
  if (const char* coding = FindHeader(request, "Content-Encoding"); coding != nullptr) {
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(coding));
    if (name == "gzip" || name == "x-gzip" || name == "deflate") {
      Status inflated = Inflate(exchange->body_, options.max_body_bytes, &exchange->inflated_);
      if (!inflated.ok()) {
        Refuse(request, absl::IsResourceExhausted(inflated) ? 413 : 400, inflated.message(), /*close=*/false);
        return;
      }
      exchange->body_ = exchange->inflated_;
    } else if (name != "identity" && !name.empty()) {
      Refuse(request, 415,
             absl::StrCat("Content-Encoding '", coding, "' is not supported; send gzip, deflate or identity"),
             /*close=*/false);
      return;
    }
  }

  Connection& entry = *open->second;
  entry.waiting.push_back(exchange.get());
  if (entry.waiting.size() == 1 && entry.peer_closed != nullptr) event_add(entry.peer_closed, nullptr);
  {
    MutexLock lock(&mutex);
    ++in_flight;
  }
  exchange->loop_ = shared_from_this();
  handler(HttpResponder(std::move(exchange)));
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
  evhttp_request* request = exchange->request_;
  evkeyvalq* headers = evhttp_request_get_output_headers(request);
  for (const auto& [key, value] : response.headers) evhttp_add_header(headers, key.c_str(), value.c_str());
  // Draining: the client reconnects elsewhere for its next request.
  if (draining) evhttp_add_header(headers, "Connection", "close");
  if (exchange->method_ == "HEAD") {
    // libevent writes whatever the output buffer holds, HEAD or not, and leaves Content-Length
    // out: the length of the body a GET would get, and no body.
    size_t length = 0;
    for (const std::string& segment : response.body) length += segment.size();
    evhttp_add_header(headers, "Content-Length", std::to_string(length).c_str());
    response.body.clear();
  }
  evbuffer* out = evhttp_request_get_output_buffer(request);
  for (std::string& segment : response.body) {
    if (segment.size() < 4096) {
      evbuffer_add(out, segment.data(), segment.size());
    } else {
      auto* owned = new std::string(std::move(segment));
      evbuffer_add_reference(out, owned->data(), owned->size(), &DeleteString, owned);
    }
  }
  // Sent, or (the connection has closed) the request is freed by libevent.
  evhttp_send_reply(request, response.code, nullptr, nullptr);
  End(std::move(exchange));
}

void HttpExchange::Loop::End(std::unique_ptr<HttpExchange> exchange) {
  if (exchange->connection_ != nullptr) {
    auto open = connections.find(static_cast<evhttp_connection*>(exchange->connection_));
    if (open != connections.end()) {
      Connection& entry = *open->second;
      entry.waiting.erase(std::remove(entry.waiting.begin(), entry.waiting.end(), exchange.get()),
                          entry.waiting.end());
      if (entry.waiting.empty() && entry.peer_closed != nullptr) event_del(entry.peer_closed);
    }
  }
  exchange.reset();
  MutexLock lock(&mutex);
  --in_flight;
  if (in_flight == 0) idle.SignalAll();
}

void HttpExchange::Loop::ConnectionClosed(evhttp_connection* connection) {
  auto open = connections.find(connection);
  if (open == connections.end()) return;
  std::unique_ptr<Connection> entry = std::move(open->second);
  connections.erase(open);
  open_connections.store(connections.size(), std::memory_order_relaxed);
  CancelWaiting(entry.get());
  for (HttpExchange* exchange : entry->waiting) exchange->connection_ = nullptr;
}  // frees the close watch before libevent closes the socket

void HttpExchange::Loop::FinishWriting() {
  if (flush_check == nullptr) {
    flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    flush_check = event_new(
        base, -1, EV_PERSIST, [](evutil_socket_t, short, void* arg) { static_cast<Loop*>(arg)->FinishWriting(); },
        this);
    const timeval every{0, 10000};
    event_add(flush_check, &every);
  }
  bool written = true;
  for (const auto& [connection, entry] : connections) {
    bufferevent* socket = evhttp_connection_get_bufferevent(connection);
    if (socket != nullptr && evbuffer_get_length(bufferevent_get_output(socket)) > 0) written = false;
  }
  if (written || std::chrono::steady_clock::now() >= flush_deadline) event_base_loopbreak(base);
}

void HttpExchange::Loop::CancelWaiting(Connection* connection) {
  for (HttpExchange* exchange : connection->waiting) {
    if (!exchange->cancelled_->exchange(true) && exchange->on_cancel_) exchange->on_cancel_();
  }
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, HttpHandler handler) {
  static std::once_flag once;
  std::call_once(once, [] {
    // Before any event base exists: makes bases lockable and notifiable, so that event_active and
    // event_base_loopbreak may be called from other threads.
    evthread_use_pthreads();
    // libevent writes with writev: a client gone mid-response would raise SIGPIPE and kill the
    // process. The write fails with EPIPE instead and libevent closes the connection.
    std::signal(SIGPIPE, SIG_IGN);
  });
  auto loop = std::make_shared<HttpExchange::Loop>();
  loop->options = options;
  loop->handler = std::move(handler);
  loop->base = event_base_new();
  if (loop->base == nullptr) return absl::InternalError("libevent: event_base_new failed");
  loop->http = evhttp_new(loop->base);
  if (loop->http == nullptr) return absl::InternalError("libevent: evhttp_new failed");
  evhttp_set_allowed_methods(loop->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
  evhttp_set_max_body_size(loop->http, static_cast<ev_ssize_t>(options.max_body_bytes));
  evhttp_set_max_headers_size(loop->http, 64 << 10);
  evhttp_set_default_content_type(loop->http, "application/json");
  // A body refused for its size is read to its end before the connection closes, so that the
  // client sees the 413 instead of a reset mid-upload.
  evhttp_set_flags(loop->http, EVHTTP_SERVER_LINGERING_CLOSE);
  timeval timeout{options.timeout_ms / 1000, (options.timeout_ms % 1000) * 1000};
  evhttp_set_timeout_tv(loop->http, &timeout);
  evhttp_set_gencb(
      loop->http, [](evhttp_request* request, void* arg) { static_cast<HttpExchange::Loop*>(arg)->Accept(request); },
      loop.get());
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
        for (auto& [exchange, response] : answered) self->Send(std::move(exchange), std::move(response));
        if (stopping) self->FinishWriting();
      },
      loop.get());
  loop->socket = evhttp_bind_socket_with_handle(loop->http, options.address.c_str(), static_cast<uint16_t>(options.port));
  if (loop->socket == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address, ":", options.port,
                                               " for HTTP (in use, or not an address of this host); choose "
                                               "another with --http-port, or --allow-http false"));
  }
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  getsockname(evhttp_bound_socket_get_fd(loop->socket), reinterpret_cast<sockaddr*>(&bound), &bound_size);
  const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  HttpExchange::Loop* raw = loop.get();
  loop->thread = std::thread([raw] {
    NameThisThread("sluice-http");
    HttpExchange::Loop::current = raw;
    // Runs until Stop, also with nothing to wait for (after StopAccepting, before answers come).
    event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY);
    HttpExchange::Loop::current = nullptr;
  });
  for (int i = 0; i < options.compression_threads; ++i) loop->compressors.emplace_back([raw] { raw->CompressLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(loop), port));
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::StopAccepting() {
  HttpExchange::Loop* loop = loop_.get();
  {
    MutexLock lock(&loop->mutex);
    if (loop->listener_closed || loop->stopped) return;
  }
  // evhttp is not thread-safe: the loop closes its own socket, and this waits until it has (or
  // the loop has ended).
  event_base_once(
      loop->base, -1, EV_TIMEOUT,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<HttpExchange::Loop*>(arg);
        if (self->socket != nullptr) evhttp_del_accept_socket(self->http, self->socket);
        self->socket = nullptr;
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

bool HttpServer::WaitIdle(std::chrono::milliseconds timeout) {
  HttpExchange::Loop* loop = loop_.get();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&loop->mutex);
  while (loop->in_flight > 0) {
    if (!loop->idle.WaitUntil(&loop->mutex, deadline)) return loop->in_flight == 0;
  }
  return true;
}

void HttpServer::Stop() {
  HttpExchange::Loop* loop = loop_.get();
  if (!loop->thread.joinable()) return;
  // First, while the loop still sends: answers being compressed go out with the others.
  loop->StopCompressing();
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
    for (auto& [connection, entry] : loop->connections) {
      for (HttpExchange* exchange : entry->waiting) exchange->connection_ = nullptr;
    }
    loop->connections.clear();
    loop->open_connections.store(0, std::memory_order_relaxed);
    loop->idle.SignalAll();
  }
  unsent.clear();  // frees those exchanges before their connections go
  if (loop->http != nullptr) evhttp_free(loop->http);  // closes every connection
  loop->http = nullptr;
  loop->socket = nullptr;
}

}  // namespace sluice
