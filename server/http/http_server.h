// The HTTP/1.1 transport beside gRPC: one event-loop thread (sluice-http) on libevent, no thread
// per connection. It reads requests with HttpRequestReader (framing: keep-alive, chunked bodies,
// the size limits, refusals of ambiguous framing), enforces the deadlines (a head that takes too
// long, a connection silent too long) and a budget for request bytes held across all connections,
// and hands each request to a handler as an HttpExchange. A gzip/deflate body is inflated, and
// its handler called, on the server's codec threads, never on the event loop. Whoever answers
// calls Respond once, from any thread (a model's worker for inference); when the client asked for
// a compressed answer and the answer may be compressed (HttpResponse::compress), a small one is
// compressed on that thread and one of 64 KiB or more on the codec threads (a model's worker goes
// back to its queue meanwhile); the event loop writes it. Nothing here knows the KServe protocol
// (http_service.h does).
// Ownership is in the types: the server owns an exchange until it hands it to the handler inside
// an HttpResponder; whoever holds the responder owns the exchange and answers it once, which hands
// it back to the server.
// A connection's end: a client that closes (or half-closes) its sending side after a complete
// request still gets its answer (HTTP/1.0-style clients, `nc -N`); a connection reset cancels the
// request waiting on it (HttpExchange::cancelled).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "server/core/ip_address.h"
#include "server/core/mutex.h"
#include "server/core/status.h"
#include "server/os/tls_server_context.h"

namespace sluice {

struct HttpServerOptions {
  std::string address = "0.0.0.0";          // --http-address
  int port = 8000;                          // --http-port; 0: any free port (see HttpServer::port)
  size_t max_body_bytes = size_t{1} << 30;  // --http-max-body-bytes: larger bodies (also once
                                            // decompressed) get 413; at most 4 GiB - 1
  int max_connections = 2048;     // --http-max-connections: a request on a connection past
                                  // this gets 503 and the connection is closed
  int timeout_ms = 60000;         // --http-timeout-ms: a connection silent this long (an
                                  // idle keep-alive one, a body that stalls) is closed
  int header_timeout_ms = 10000;  // --http-header-timeout-ms: a request's line and headers
                                  // must arrive within this of its first byte (408)
  size_t max_buffered_bytes = size_t{2} << 30;  // --http-max-buffered-bytes: request bytes held by
                                                // all connections together (bodies being received
                                                // or handled, inflated ones included); past it 503
  int max_inflate_ratio = 100;  // --http-max-inflate-ratio: a compressed body may inflate
                                // to this many times its size (and always to 1 MiB)
  int compression_threads = 2;  // --http-compression-threads: threads that inflate
                                // compressed bodies and compress large answers; 0: the
                                // event loop inflates, the answering thread compresses
  // TLS on every connection (the certificate flags of the gRPC port; see tls_server_context.h):
  // a plaintext request is answered 400 saying so and closed. Null: plaintext.
  std::shared_ptr<TlsServerContext> tls;
};

// A response: status code, headers (Content-Length is added), and the body as segments written
// one after the other. Segments move into the connection's buffer without being copied.
struct HttpResponse {
  int code = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> body;
  // Compressed when the client's Accept-Encoding asks for gzip or deflate. Triton compresses
  // inference answers only, and clients rely on it (tritonclient.http.aio turns its HTTP
  // library's automatic decompression off while that library still sends Accept-Encoding), so
  // only the inference answer sets this.
  bool compress = false;
};

// One request, from its arrival until it is answered: readable (with the body's bytes) by whoever
// holds its HttpResponder, until HttpResponder::Respond.
class HttpExchange {
 public:
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const std::string& method() const { return method_; }  // "GET", "POST", "HEAD", as sent
  const std::string& path() const { return path_; }  // as sent (still percent-encoded), no query
  // The value of request header `name` (case-insensitive); null when absent.
  const char* Header(const char* name) const;
  // The request body, decompressed when it came with Content-Encoding gzip or deflate.
  absl::string_view body() const { return body_; }
  // The client's address (nullopt: the connection is not an IP socket).
  const std::optional<IpAddress>& peer() const { return peer_; }
  // Over mutual TLS: the subject of the client's verified certificate (RFC 2253); else empty.
  const std::string& certificate_subject() const { return certificate_subject_; }
  // Set when the client's connection closes before the response is sent.
  const std::shared_ptr<std::atomic<bool>>& cancelled() const { return cancelled_; }
  // `on_cancel` runs on the server's thread when the connection is reset before the answer; set
  // it before handing the responder on (a cancellation before it shows in cancelled() only), and
  // make it safe to run concurrently with Respond.
  void OnCancel(std::function<void()> on_cancel);
  ~HttpExchange();

 private:
  friend class HttpServer;
  friend class HttpResponder;
  struct Loop;
  struct Connection;
  explicit HttpExchange(std::shared_ptr<Loop> loop);

  std::shared_ptr<Loop> loop_;
  Connection* connection_ = nullptr;  // loop thread only (and Stop, once the loop has ended); null
                                      // once the connection closed
  std::optional<IpAddress> peer_;
  std::string certificate_subject_;
  std::string method_;
  std::string path_;
  std::vector<std::pair<std::string, std::string>> headers_;
  absl::string_view body_;
  std::string received_;     // the body as received
  std::string inflated_;     // body_ points here when the body was compressed
  size_t charged_ = 0;       // bytes of received_ and inflated_ charged to the server's budget
  bool head_only_ = false;   // HEAD: the answer's length, no body
  int accept_encoding_ = 0;  // 0: identity, 1: gzip, 2: deflate
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  Mutex cancel_mutex_;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(cancel_mutex_);
};

// The right and the duty to answer one exchange: move-only, it owns the exchange until Respond
// hands both back to the server. Respond from any thread, once; a responder destroyed without
// answering (a bug) answers 500, so no client is left waiting and no exchange leaks. A response
// to a client that has gone is dropped.
class HttpResponder {
 public:
  HttpResponder() = default;
  explicit HttpResponder(std::unique_ptr<HttpExchange> exchange) : exchange_(std::move(exchange)) {}
  HttpResponder(HttpResponder&&) noexcept = default;
  HttpResponder& operator=(HttpResponder&& other) noexcept;
  ~HttpResponder();

  // The request; valid until Respond.
  HttpExchange& exchange() const { return *exchange_; }
  HttpExchange* operator->() const { return exchange_.get(); }
  explicit operator bool() const { return exchange_ != nullptr; }

  // Sends `response` and ends the exchange; the responder is empty afterwards.
  void Respond(HttpResponse response);

 private:
  std::unique_ptr<HttpExchange> exchange_;
};

// Called for every request on the server's thread, or (a compressed body) on the codec thread
// that inflated it; must not block (hand model work on and return). Answers through the
// responder now or later.
using HttpHandler = std::function<void(HttpResponder responder)>;

class HttpServer {
 public:
  // Binds and starts the event loop. UNAVAILABLE when the address cannot be bound. The first
  // call sets SIGPIPE to be ignored, process-wide (a client gone mid-response must not kill the
  // process).
  static StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                     HttpHandler handler);
  // Stop().
  ~HttpServer();

  int port() const { return port_; }
  // Answers the codec threads have compressed so far (for tests and diagnostics).
  int64_t compressed_off_thread() const;
  // Request bytes held now against max_buffered_bytes (for tests and diagnostics).
  size_t buffered_bytes() const;

  // Closes the listening socket, and returns once it is closed: no new connections; open ones
  // are still served, and each answer from now on closes its connection (Connection: close).
  // Idempotent. Not from a handler (it waits for the loop that runs handlers).
  void StopAccepting();
  // Connections open now (those counted against max_connections), for tests and diagnostics.
  size_t open_connections() const;
  // Waits until every exchange has been answered, or `timeout`. True when none is left.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Sends the answers already given (waiting up to a second for them to be written), stops the
  // event loop and closes every connection. An exchange answered later is dropped; the bodies and
  // headers of exchanges still out are invalid from here on. Idempotent.
  void Stop();

 private:
  HttpServer(std::shared_ptr<HttpExchange::Loop> loop, int port)
      : loop_(std::move(loop)), port_(port) {}

  std::shared_ptr<HttpExchange::Loop> loop_;
  const int port_;
};

}  // namespace sluice
