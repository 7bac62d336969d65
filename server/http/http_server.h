// The HTTP/1.1 transport beside gRPC: libevent's event-driven HTTP server on one thread
// (sluice-http), no thread per connection. It parses requests (keep-alive, chunked bodies, the
// body-size limit, timeouts), decompresses gzip/deflate bodies, and hands each request to a
// handler as an HttpExchange. Whoever answers calls Respond once, from any thread (a model's
// worker for inference); when the client asked for a compressed answer and the answer may be
// compressed (HttpResponse::compress), a small one is compressed
// on that thread and one of 64 KiB or more on the server's compression threads (a model's worker
// goes back to its queue meanwhile); the event loop writes it. Nothing here knows the KServe
// protocol (http_service.h does).
// Ownership is in the types: the server owns an exchange until it hands it to the handler inside
// an HttpResponder; whoever holds the responder owns the exchange and answers it once, which hands
// it back to the server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "server/core/status.h"

struct evhttp_request;

namespace sluice {

struct HttpServerOptions {
  std::string address = "0.0.0.0";       // --http-address
  int port = 8000;                        // --http-port; 0: any free port (see HttpServer::port)
  size_t max_body_bytes = size_t{1} << 30;  // --http-max-body-bytes: larger bodies (also once
                                            // decompressed) get 413; at most 4 GiB - 1
  int max_connections = 2048;             // --http-max-connections: a request on a connection past
                                          // this gets 503 and the connection is closed
  int timeout_ms = 60000;                 // --http-timeout-ms: a connection silent this long (an
                                          // idle keep-alive one, a body that stalls) is closed
  int compression_threads = 2;            // --http-compression-threads: threads that compress large
                                          // answers; 0: the answering thread compresses
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

  const std::string& method() const { return method_; }  // "GET", "POST"
  const std::string& path() const { return path_; }      // as sent (still percent-encoded), no query
  // The value of request header `name` (case-insensitive); null when absent.
  const char* Header(const char* name) const;
  // The request body, decompressed when it came with Content-Encoding gzip or deflate.
  absl::string_view body() const { return body_; }
  // Set when the client's connection closes before the response is sent.
  const std::shared_ptr<std::atomic<bool>>& cancelled() const { return cancelled_; }
  // `on_cancel` runs on the server's thread when the connection closes before the answer; set it
  // before handing the responder on, and make it safe to run concurrently with Respond.
  void OnCancel(std::function<void()> on_cancel) { on_cancel_ = std::move(on_cancel); }

 private:
  friend class HttpServer;
  friend class HttpResponder;
  struct Loop;
  HttpExchange() = default;

  std::shared_ptr<Loop> loop_;
  evhttp_request* request_ = nullptr;
  void* connection_ = nullptr;  // the connection's bookkeeping entry; null once it closed
  std::string method_;
  std::string path_;
  absl::string_view body_;
  std::string inflated_;  // body_ points here when the body was compressed
  int accept_encoding_ = 0;  // 0: identity, 1: gzip, 2: deflate
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  std::function<void()> on_cancel_;
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

// Called on the server's thread for every request; must not block (hand model work on and
// return). Answers through the responder now or later.
using HttpHandler = std::function<void(HttpResponder responder)>;

class HttpServer {
 public:
  // Binds and starts the event loop. UNAVAILABLE when the address cannot be bound. The first
  // call sets SIGPIPE to be ignored, process-wide (a client gone mid-response must not kill the
  // process).
  static StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, HttpHandler handler);
  // Stop().
  ~HttpServer();

  int port() const { return port_; }
  // Answers the compression threads have compressed so far (for tests and diagnostics).
  int64_t compressed_off_thread() const;

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
  HttpServer(std::shared_ptr<HttpExchange::Loop> loop, int port) : loop_(std::move(loop)), port_(port) {}

  std::shared_ptr<HttpExchange::Loop> loop_;
  const int port_;
};

}  // namespace sluice
