// HttpServer over real loopback sockets: a raw client writes exactly the bytes each case needs
// (chunked bodies, a stalled body, too many connections) and reads the raw answer.
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <memory>
#include <vector>
#include <chrono>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

#include "server/core/mutex.h"
#include "tests/unit/fakes.h"
#include "tests/unit/http_client.h"

namespace sluice {
namespace {

using testing::Client;
using testing::Get;
using testing::Post;
using testing::Reply;

std::string Gzip(const std::string& text, int window_bits) {
  z_stream stream{};
  deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&stream, text.size()) + 32, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(out.size() - stream.avail_out);
  deflateEnd(&stream);
  return out;
}

std::string Gunzip(const std::string& data) {
  z_stream stream{};
  inflateInit2(&stream, 15 + 32);
  std::string out(1 << 20, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  inflate(&stream, Z_FINISH);
  out.resize(out.size() - stream.avail_out);
  inflateEnd(&stream);
  return out;
}

// Echoes method, path and body back, compressed when asked unless the path starts /plain; paths
// starting /later hand the exchange to `parked`, paths starting /drop drop it unanswered.
class HttpServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<HttpServer> Start(HttpServerOptions options = {}) {
    options.address = "127.0.0.1";
    options.port = 0;
    StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(options, [this](HttpResponder responder) {
          if (absl::StartsWith(responder->path(), "/drop")) return;  // a handler bug: no answer
          if (absl::StartsWith(responder->path(), "/later")) {
            responder->OnCancel([this] {
              MutexLock lock(&mutex_);
              ++cancels_;
              changed_.SignalAll();
            });
            MutexLock lock(&mutex_);
            parked_.push_back(std::move(responder));
            changed_.SignalAll();
            return;
          }
          HttpResponse response;
          response.compress = !absl::StartsWith(responder->path(), "/plain");
          response.headers.emplace_back("X-Path", responder->path());
          response.body.push_back(responder->method() + " ");
          response.body.push_back(std::string(responder->body()));
          responder.Respond(std::move(response));
        });
    EXPECT_TRUE(server.ok()) << server.status();
    return *std::move(server);
  }

  // The first exchange parked, or an empty responder after 5 s.
  HttpResponder WaitParked() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    MutexLock lock(&mutex_);
    while (parked_.empty()) {
      if (!changed_.WaitUntil(&mutex_, deadline) && parked_.empty()) return HttpResponder();
    }
    HttpResponder responder = std::move(parked_.front());
    parked_.erase(parked_.begin());
    return responder;
  }

  // The cancellations heard once there are at least `count`, or after 2 s.
  int WaitCancels(int count) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    MutexLock lock(&mutex_);
    while (cancels_ < count) {
      if (!changed_.WaitUntil(&mutex_, deadline)) break;
    }
    return cancels_;
  }

  Mutex mutex_;
  CondVar changed_;  // an exchange parked or a cancellation heard
  std::vector<HttpResponder> parked_ ABSL_GUARDED_BY(mutex_);
  int cancels_ ABSL_GUARDED_BY(mutex_) = 0;
};

TEST_F(HttpServerTest, AnswersOnAKeepAliveConnectionWithPathAndBody) {
  auto server = Start();
  ASSERT_GT(server->port(), 0);
  Client client(server->port());
  ASSERT_TRUE(client.connected());
  client.Send(Get("/v2/health/live?x=1"));
  Reply first = client.Read();
  EXPECT_EQ(first.code, 200);
  EXPECT_EQ(first.body, "GET ");
  EXPECT_TRUE(absl::StrContains(first.headers, "x-path: /v2/health/live\r\n")) << first.headers;
  client.Send(Post("/infer", "payload"));
  Reply second = client.Read();  // same connection
  EXPECT_EQ(second.code, 200);
  EXPECT_EQ(second.body, "POST payload");
}

TEST_F(HttpServerTest, ChunkedBodiesArriveWhole) {
  auto server = Start();
  Client client(server->port());
  client.Send(
      "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n "
      "world\r\n0\r\n\r\n");
  Reply reply = client.Read();
  EXPECT_EQ(reply.code, 200);
  EXPECT_EQ(reply.body, "POST hello world");
}

TEST_F(HttpServerTest, BodiesPastTheLimitGet413) {
  HttpServerOptions options;
  options.max_body_bytes = 100;
  auto server = Start(options);
  Client client(server->port());
  client.Send(Post("/big", std::string(101, 'x')));
  EXPECT_EQ(client.Read().code, 413);
  Client exact(server->port());
  exact.Send(Post("/ok", std::string(100, 'x')));
  EXPECT_EQ(exact.Read().code, 200);
  // A small gzip body that inflates past the limit: 413 too.
  Client bomb(server->port());
  bomb.Send(Post("/bomb", Gzip(std::string(1000, 'a'), 15 + 16), "Content-Encoding: gzip\r\n"));
  Reply refused = bomb.Read();
  EXPECT_EQ(refused.code, 413);
  EXPECT_TRUE(absl::StrContains(refused.body, "--http-max-body-bytes")) << refused.body;
}

TEST_F(HttpServerTest, CompressedBodiesInflateAndResponsesCompressWhenAsked) {
  auto server = Start();
  const std::string text(5000, 'z');
  for (int window_bits : {15 + 16, 15, -15}) {  // gzip, zlib ("deflate"), raw deflate
    Client client(server->port());
    client.Send(Post(
        "/z", Gzip(text, window_bits),
        absl::StrCat("Content-Encoding: ", window_bits == 15 + 16 ? "gzip" : "deflate", "\r\n")));
    Reply reply = client.Read();
    EXPECT_EQ(reply.code, 200) << window_bits;
    EXPECT_EQ(reply.body, "POST " + text) << window_bits;
  }
  for (const char* accept : {"gzip", "deflate", "br;q=1.0, gzip;q=0.5"}) {
    Client client(server->port());
    client.Send(Post("/z", text, absl::StrCat("Accept-Encoding: ", accept, "\r\n")));
    Reply reply = client.Read();
    EXPECT_EQ(reply.code, 200);
    EXPECT_TRUE(absl::StrContains(reply.headers, "content-encoding: ")) << reply.headers;
    EXPECT_LT(reply.body.size(), text.size() / 10);
    EXPECT_EQ(Gunzip(reply.body), "POST " + text) << accept;
  }
  Client refused(server->port());
  refused.Send(Post("/z", text, "Accept-Encoding: gzip;q=0\r\n"));
  Reply plain = refused.Read();
  EXPECT_FALSE(absl::StrContains(plain.headers, "content-encoding")) << plain.headers;
  // An answer that may not be compressed goes out plain whatever the client accepts, small or
  // large.
  for (size_t size : {size_t{5000}, size_t{100000}}) {
    Client asked(server->port());
    asked.Send(Post("/plain", std::string(size, 'p'), "Accept-Encoding: gzip, deflate\r\n"));
    Reply uncompressed = asked.Read();
    EXPECT_FALSE(absl::StrContains(uncompressed.headers, "content-encoding"))
        << uncompressed.headers;
    EXPECT_EQ(uncompressed.body, "POST " + std::string(size, 'p'));
  }
  EXPECT_EQ(server->compressed_off_thread(), 0);
  Client broken(server->port());
  broken.Send(Post("/z", "not gzip at all", "Content-Encoding: gzip\r\n"));
  EXPECT_EQ(broken.Read().code, 400);
  Client unknown(server->port());
  unknown.Send(Post("/z", "x", "Content-Encoding: br\r\n"));
  EXPECT_EQ(unknown.Read().code, 415);
}

// Answers of 64 KiB or more go to the compression threads, smaller ones compress where they were
// given; with no compression threads every answer compresses where it was given. The client gets
// the same bytes either way.
TEST_F(HttpServerTest, LargeAnswersCompressOnTheCompressionThreads) {
  std::string large(200000, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>('a' + (i * 7919 % 26));
  const std::string small(5000, 's');
  for (int threads : {2, 0}) {
    HttpServerOptions options;
    options.compression_threads = threads;
    auto server = Start(options);
    Client client(server->port());
    client.Send(Post("/z", large, "Accept-Encoding: gzip\r\n"));
    Reply reply = client.Read();
    EXPECT_EQ(reply.code, 200);
    EXPECT_TRUE(absl::StrContains(reply.headers, "content-encoding: gzip")) << reply.headers;
    EXPECT_EQ(Gunzip(reply.body), "POST " + large) << threads;
    EXPECT_EQ(server->compressed_off_thread(), threads > 0 ? 1 : 0) << threads;
    client.Send(Post("/z", small, "Accept-Encoding: gzip\r\n"));
    reply = client.Read();
    EXPECT_EQ(Gunzip(reply.body), "POST " + small) << threads;
    EXPECT_EQ(server->compressed_off_thread(), threads > 0 ? 1 : 0) << threads;
    client.Send(Post("/z", large));  // no Accept-Encoding: nothing to compress
    reply = client.Read();
    EXPECT_EQ(reply.body, "POST " + large) << threads;
    EXPECT_EQ(server->compressed_off_thread(), threads > 0 ? 1 : 0) << threads;
  }
}

// Stop sends an answer that was waiting for compression when it was called.
TEST_F(HttpServerTest, StopSendsAnAnswerQueuedForCompression) {
  HttpServerOptions options;
  options.compression_threads = 1;
  auto server = Start(options);
  Client client(server->port());
  client.Send(Post("/later/zip", "x", "Accept-Encoding: deflate\r\n"));
  HttpResponder parked = WaitParked();
  ASSERT_TRUE(parked);
  HttpResponse response;
  response.compress = true;
  response.body.push_back(std::string(1 << 20, 'q'));
  parked.Respond(std::move(response));
  server->Stop();
  Reply reply = client.Read();
  EXPECT_EQ(reply.code, 200);
  EXPECT_TRUE(absl::StrContains(reply.headers, "content-encoding: deflate")) << reply.headers;
  EXPECT_EQ(Gunzip(reply.body), std::string(1 << 20, 'q'));
  EXPECT_EQ(server->compressed_off_thread(), 1);
}

// Every accepted connection has Nagle's algorithm off: with it on, the tail of an answer larger
// than a TCP segment waited for the client's delayed acknowledgement (40 ms on Linux), which cut
// REST throughput at concurrency 1 on a 1 MiB answer to a quarter.
TEST_F(HttpServerTest, AcceptedConnectionsSendWithoutDelay) {
  auto server = Start();
  Client client(server->port());
  client.Send(Get("/x"));
  EXPECT_EQ(client.Read().code, 200);
  // The server runs in this process: find its side of the connection among our descriptors.
  int accepted = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    sockaddr_in local{};
    socklen_t size = sizeof(local);
    int listening = 0;
    socklen_t flag_size = sizeof(listening);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != server->port() ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_size) != 0 || listening) {
      continue;
    }
    int nodelay = 0;
    flag_size = sizeof(nodelay);
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &flag_size), 0);
    EXPECT_EQ(nodelay, 1) << "fd " << fd;
    ++accepted;
  }
  EXPECT_EQ(accepted, 1);
}

TEST_F(HttpServerTest, ResponsesFromOtherThreadsAndCancellation) {
  auto server = Start();
  Client client(server->port());
  client.Send(Get("/later/1"));
  HttpResponder parked = WaitParked();
  ASSERT_TRUE(parked);
  std::thread worker([responder = std::move(parked)]() mutable {
    HttpResponse response;
    response.code = 202;
    response.body.push_back(std::string(100000, 'w'));  // a segment that moves by reference
    responder.Respond(std::move(response));
  });
  Reply reply = client.Read();
  worker.join();
  EXPECT_EQ(reply.code, 202);
  EXPECT_EQ(reply.body.size(), 100000u);
  EXPECT_TRUE(server->WaitIdle(std::chrono::milliseconds(1000)));

  // The client resets its connection while its request is being worked on: on_cancel runs, and
  // the late answer is dropped without harm.
  Client leaving(server->port());
  leaving.Send(Get("/later/2"));
  HttpResponder abandoned = WaitParked();
  ASSERT_TRUE(abandoned);
  EXPECT_FALSE(abandoned->cancelled()->load());
  leaving.Abort();
  EXPECT_EQ(WaitCancels(1), 1);
  EXPECT_TRUE(abandoned->cancelled()->load());
  EXPECT_FALSE(server->WaitIdle(std::chrono::milliseconds(10)));
  abandoned.Respond(HttpResponse{});
  EXPECT_TRUE(server->WaitIdle(std::chrono::milliseconds(1000)));

  Client after(server->port());
  after.Send(Get("/still"));
  EXPECT_EQ(after.Read().code, 200);
}

TEST_F(HttpServerTest, AClientThatHalfClosesAfterItsRequestGetsItsAnswer) {
  auto server = Start();
  Client client(server->port());
  client.Send(Get("/later/half", "Connection: close\r\n"));
  client.ShutdownWrite();
  HttpResponder parked = WaitParked();
  ASSERT_TRUE(parked);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the FIN has arrived
  EXPECT_FALSE(parked->cancelled()->load());
  parked.Respond(HttpResponse{201, {}, {"done"}});
  Reply reply = client.Read();
  EXPECT_EQ(reply.code, 201);
  EXPECT_EQ(reply.body, "done");
  EXPECT_TRUE(client.Read().closed);
  EXPECT_EQ(WaitCancels(0), 0);

  // The same without Connection: close (keep-alive by default), answered on the handler's thread:
  // the answer, then the close.
  Client again(server->port());
  again.Send(Get("/now"));
  again.ShutdownWrite();
  EXPECT_EQ(again.Read().code, 200);
  EXPECT_TRUE(again.Read().closed);
}

TEST_F(HttpServerTest, RequestsPipelinedBeforeAHalfCloseAreAllAnswered) {
  auto server = Start();
  Client client(server->port());
  client.Send(Get("/first") + Get("/second"));
  client.ShutdownWrite();
  Reply first = client.Read();
  EXPECT_EQ(first.code, 200);
  EXPECT_TRUE(absl::StrContains(first.headers, "x-path: /first")) << first.headers;
  Reply second = client.Read();
  EXPECT_EQ(second.code, 200);
  EXPECT_TRUE(absl::StrContains(second.headers, "x-path: /second")) << second.headers;
  EXPECT_TRUE(client.Read().closed);
}

TEST_F(HttpServerTest, ExpectContinueGetsA100BeforeTheBodyOnHttp11Only) {
  auto server = Start();
  Client client(server->port());
  client.Send("POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  Reply interim = client.Read();
  EXPECT_EQ(interim.code, 100);
  client.Send("abc");
  Reply reply = client.Read();
  EXPECT_EQ(reply.code, 200);
  EXPECT_EQ(reply.body, "POST abc");
  Client old(server->port());
  old.Send("POST /c HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabc");
  EXPECT_EQ(old.Read().code, 200);  // no 100 first: HTTP/1.0 knows no interim answers
}

TEST_F(HttpServerTest, RequestsFramedTwoWaysAreRefusedNotSmuggled) {
  auto server = Start();
  Client client(server->port());
  // Two Content-Lengths: the first used to win and the rest ("lo") was answered as a request.
  client.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nhello");
  Reply refused = client.Read();
  EXPECT_EQ(refused.code, 400);
  EXPECT_TRUE(absl::StrContains(refused.body, "Content-Length")) << refused.body;
  EXPECT_TRUE(absl::StrContains(refused.headers, "connection: close")) << refused.headers;
  EXPECT_TRUE(client.Read().closed);  // no second answer
  Client chunked(server->port());
  chunked.Send(
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: "
      "chunked\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(chunked.Read().code, 400);
  EXPECT_TRUE(chunked.Read().closed);
  Client after(server->port());
  after.Send(Get("/still"));
  EXPECT_EQ(after.Read().code, 200);
}

TEST_F(HttpServerTest, AMalformedChunkSizeIs400) {
  auto server = Start();
  Client client(server->port());
  client.Send(
      "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\nabc\r\n0\r\n\r\n");
  Reply reply = client.Read();
  EXPECT_EQ(reply.code, 400);
  EXPECT_TRUE(absl::StrContains(reply.body, "chunk size")) << reply.body;
}

TEST_F(HttpServerTest, SlowHeadersTimeOutAndCountAgainstTheConnectionLimit) {
  HttpServerOptions options;
  options.header_timeout_ms = 400;
  options.max_connections = 3;
  auto server = Start(options);
  // Two clients trickle a request line a byte at a time, never finishing it; a third connects and
  // says nothing. All three count; a fourth is refused at once, before it sends a byte.
  Client first(server->port());
  Client second(server->port());
  Client silent(server->port());
  first.Send("G");
  second.Send("G");
  testing::Eventually([&] { return server->open_connections() == 3; });
  EXPECT_EQ(server->open_connections(), 3u);
  Client fourth(server->port());
  Reply refused = fourth.Read();
  EXPECT_EQ(refused.code, 503);
  EXPECT_TRUE(absl::StrContains(refused.headers, "retry-after: 1")) << refused.headers;
  // Trickling keeps the connection busy, but not past the header deadline.
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    first.Send("E");
  }
  Reply timed_out = first.Read(3000);
  EXPECT_EQ(timed_out.code, 408) << timed_out.headers;
  EXPECT_TRUE(absl::StrContains(timed_out.body, "--http-header-timeout-ms")) << timed_out.body;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
  // The one that never sent a byte is closed at the same deadline (counted from its accept).
  EXPECT_TRUE(silent.Read(3000).closed);
  testing::Eventually([&] { return server->open_connections() <= 1; });
  Client later(server->port());
  later.Send(Get("/served"));
  EXPECT_EQ(later.Read().code, 200);
}

TEST_F(HttpServerTest, RefusalsPastTheLimitStayBoundedAndAnswered) {
  HttpServerOptions options;
  options.max_connections = 1;
  auto server = Start(options);
  Client held(server->port());
  held.Send(Get("/held"));
  EXPECT_EQ(held.Read().code, 200);
  // One refusal lingers (the bound is max_connections of them); those past it are closed at once.
  // However many come, the count of lingering refusals must not drift: later ones still get 503.
  std::vector<std::unique_ptr<Client>> refused;
  for (int i = 0; i < 4; ++i) refused.push_back(std::make_unique<Client>(server->port()));
  EXPECT_EQ(refused[0]->Read().code, 503);
  for (auto& client : refused) client->Close();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // their closes are seen
  for (int round = 0; round < 3; ++round) {
    Client next(server->port());
    Reply reply = next.Read();
    EXPECT_EQ(reply.code, 503) << round;
    next.Close();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(server->open_connections(), 1u);
}

TEST_F(HttpServerTest, HalfSentBodiesShareOneBudgetAndPastIt503) {
  HttpServerOptions options;
  options.max_buffered_bytes = 1 << 20;
  auto server = Start(options);
  // Declared within the body limit but past the budget: refused before a byte of it is read.
  Client large(server->port());
  large.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n");
  Reply declared = large.Read();
  EXPECT_EQ(declared.code, 503);
  EXPECT_TRUE(absl::StrContains(declared.body, "--http-max-buffered-bytes")) << declared.body;
  // Two bodies each within the budget, half sent, together past it: the second is refused.
  Client a(server->port());
  Client b(server->port());
  a.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n" +
         std::string(600000, 'a'));
  testing::Eventually([&] { return server->buffered_bytes() >= 600000; });
  EXPECT_EQ(server->buffered_bytes(), 600000u);
  b.Send("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n");
  Reply over = b.Read();
  EXPECT_EQ(over.code, 503);
  EXPECT_TRUE(absl::StrContains(over.headers, "retry-after: 1")) << over.headers;
  // The first finishes and is answered; once it is, the budget is back to nothing.
  a.Send(std::string(300000, 'a'));
  Reply answered = a.Read();
  EXPECT_EQ(answered.code, 200);
  EXPECT_EQ(answered.body.size(), 5u + 900000u);
  testing::Eventually([&] { return server->buffered_bytes() == 0; });
  EXPECT_EQ(server->buffered_bytes(), 0u);
}

TEST_F(HttpServerTest, AGzipBombIsRefusedOffTheLoopWhileOthersAreServed) {
  HttpServerOptions options;
  options.max_body_bytes = size_t{1} << 30;
  auto server = Start(options);
  // 256 MiB of spaces in about 250 KiB of gzip: past the default ratio (100) long before the
  // body limit.
  std::string spaces(size_t{256} << 20, ' ');
  const std::string bomb = Gzip(spaces, 15 + 16);
  std::string().swap(spaces);
  Client attacker(server->port());
  attacker.Send(Post("/a", bomb, "Content-Encoding: gzip\r\n"));
  Reply refused = attacker.Read(10000);
  EXPECT_EQ(refused.code, 413);
  EXPECT_TRUE(absl::StrContains(refused.body, "--http-max-inflate-ratio")) << refused.body;
  testing::Eventually([&] { return server->buffered_bytes() == 0; });
  EXPECT_EQ(server->buffered_bytes(), 0u);
  // A compressed body within the ratio is inflated and handled (on a codec thread).
  Client honest(server->port());
  honest.Send(Post("/b", Gzip(std::string(100000, 'x'), 15 + 16), "Content-Encoding: gzip\r\n"));
  Reply inflated = honest.Read();
  EXPECT_EQ(inflated.code, 200);
}

TEST_F(HttpServerTest, ConnectionsPastTheLimitGet503AndAreClosed) {
  HttpServerOptions options;
  options.max_connections = 2;
  auto server = Start(options);
  Client first(server->port());
  Client second(server->port());
  first.Send(Get("/a"));
  EXPECT_EQ(first.Read().code, 200);
  second.Send(Get("/b"));
  EXPECT_EQ(second.Read().code, 200);
  Client third(server->port());
  Reply refused = third.Read();  // answered at once, before it sends anything
  EXPECT_EQ(refused.code, 503);
  EXPECT_TRUE(absl::StrContains(refused.body, "--http-max-connections")) << refused.body;
  EXPECT_TRUE(third.Read().closed);
  EXPECT_EQ(server->open_connections(), 2u);  // the refused one is not counted
  first.Close();  // frees a place once the server's loop has seen it close
  testing::Eventually([&] { return server->open_connections() <= 1; });
  ASSERT_EQ(server->open_connections(), 1u);
  Client fourth(server->port());
  fourth.Send(Get("/d"));
  EXPECT_EQ(fourth.Read().code, 200);
}

TEST_F(HttpServerTest, AStalledBodyTimesOutAndOthersAreServed) {
  HttpServerOptions options;
  options.timeout_ms = 300;
  auto server = Start(options);
  Client slow(server->port());
  slow.Send("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part");
  Client other(server->port());
  other.Send(Get("/fast"));
  EXPECT_EQ(other.Read().code, 200);
  const auto started = std::chrono::steady_clock::now();
  Reply stalled = slow.Read(5000);
  EXPECT_TRUE(stalled.closed || stalled.code >= 400) << stalled.code;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
}

TEST_F(HttpServerTest, StopAcceptingThenStopWithAnExchangeStillOpen) {
  auto server = Start();
  Client open(server->port());
  open.Send(Get("/later/x"));
  HttpResponder responder = WaitParked();
  ASSERT_TRUE(responder);
  server->StopAccepting();  // returns with the socket closed
  Client refused(server->port());
  EXPECT_FALSE(refused.connected());
  EXPECT_FALSE(server->WaitIdle(std::chrono::milliseconds(20)));
  server->Stop();
  responder.Respond(HttpResponse{});  // after Stop: dropped, no crash
  EXPECT_TRUE(open.Read().closed);
}

TEST_F(HttpServerTest, AResponderDroppedWithoutAnAnswerAnswers500AndTheServerGoesOn) {
  auto server = Start();
  Client client(server->port());
  client.Send(Get("/drop/me"));
  Reply dropped = client.Read();
  EXPECT_EQ(dropped.code, 500);
  EXPECT_NE(dropped.body.find("without an answer"), std::string::npos) << dropped.body;
  EXPECT_TRUE(server->WaitIdle(std::chrono::milliseconds(1000)));  // nothing leaked in flight
  client.Send(Get("/next"));                                       // same connection
  EXPECT_EQ(client.Read().code, 200);
}

TEST(HttpServerStartTest, APortInUseIsUnavailableWithTheFlagNamed) {
  HttpServerOptions options;
  options.address = "127.0.0.1";
  options.port = 0;
  StatusOr<std::unique_ptr<HttpServer>> first =
      HttpServer::Start(options, [](HttpResponder responder) { responder.Respond({}); });
  ASSERT_TRUE(first.ok());
  HttpServerOptions taken;
  taken.address = "127.0.0.1";
  taken.port = (*first)->port();
  StatusOr<std::unique_ptr<HttpServer>> second =
      HttpServer::Start(taken, [](HttpResponder responder) { responder.Respond({}); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "--http-port")) << second.status();
}

}  // namespace
}  // namespace sluice
