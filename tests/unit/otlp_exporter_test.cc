// The OTLP/HTTP exporter against a collector stub on loopback: the bodies decode as OTLP, batches
// form by size and by delay, and a slow or absent collector never holds up Export.
#include "server/tracing/otlp_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "otlp_trace.pb.h"
#include "tests/unit/http_client.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// Accepts connections on 127.0.0.1, reads one HTTP request from each and answers `status_line`
// (with `hold`, only once Release is called: a collector slower than any timeout). Keeps the
// bodies.
class CollectorStub {
 public:
  explicit CollectorStub(std::string status_line = "HTTP/1.1 200 OK", bool hold = false)
      : status_line_(std::move(status_line)), held_(hold), thread_([this] { Serve(); }) {}
  ~CollectorStub() {
    stop_ = true;
    Release();
    thread_.join();
  }
  // A held collector answers from now on.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_ = false;
    }
    released_.notify_all();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(listener_.port()) + "/v1/traces";
  }

  // Waits (up to 10 s) until `spans` spans have arrived; the requests so far.
  std::vector<otlp::ExportTraceServiceRequest> WaitForSpans(size_t spans) {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_.wait_for(lock, std::chrono::seconds(10), [&] { return spans_ >= spans; });
    return requests_;
  }
  std::string last_head() {
    std::lock_guard<std::mutex> lock(mutex_);
    return head_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd entry{listener_.fd(), POLLIN, 0};
      if (poll(&entry, 1, 20) <= 0) continue;
      const int client = accept(listener_.fd(), nullptr, nullptr);
      if (client < 0) continue;
      std::string data;
      char buffer[4096];
      size_t body_at = std::string::npos, length = 0;
      for (;;) {
        const ssize_t got = recv(client, buffer, sizeof(buffer), 0);
        if (got <= 0) break;
        data.append(buffer, static_cast<size_t>(got));
        if (body_at == std::string::npos &&
            (body_at = data.find("\r\n\r\n")) != std::string::npos) {
          body_at += 4;
          const size_t at = data.find("Content-Length: ");
          length = at == std::string::npos ? 0 : std::stoul(data.substr(at + 16));
        }
        if (body_at != std::string::npos && data.size() >= body_at + length) break;
      }
      {
        std::unique_lock<std::mutex> lock(mutex_);
        released_.wait(lock, [&] { return !held_; });
      }
      const std::string answer = status_line_ + "\r\nContent-Length: 0\r\n\r\n";
      send(client, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(client);
      if (body_at == std::string::npos) continue;
      otlp::ExportTraceServiceRequest request;
      const bool parsed = request.ParseFromString(data.substr(body_at, length));
      std::lock_guard<std::mutex> lock(mutex_);
      head_ = data.substr(0, body_at);
      if (!parsed) continue;  // the tests of the answer post bodies that are no OTLP
      for (const auto& resource : request.resource_spans()) {
        for (const auto& scope : resource.scope_spans())
          spans_ += static_cast<size_t>(scope.spans_size());
      }
      requests_.push_back(std::move(request));
      arrived_.notify_all();
    }
  }

  const std::string status_line_;
  bool held_;  // guarded by mutex_
  testing::TakenPort listener_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable arrived_, released_;
  std::vector<otlp::ExportTraceServiceRequest> requests_;
  size_t spans_ = 0;
  std::string head_;
  std::thread thread_;
};

// A port nothing listens on (taken, then released).
int ClosedPort() {
  testing::TakenPort taken;
  return taken.port();
}

SpanData Span(const std::string& name) {
  SpanData span;
  span.trace_id = NewTraceId();
  span.span_id = NewSpanId();
  span.name = name;
  span.start_unix_ns = 1000;
  span.end_unix_ns = 2000;
  return span;
}

class CountingObserver final : public TraceExportObserver {
 public:
  void OnSpansExported(uint64_t spans) override { exported += spans; }
  void OnSpansDropped(SpanDropReason reason, uint64_t spans) override {
    switch (reason) {
      case SpanDropReason::kQueueFull:
        queue_full += spans;
        break;
      case SpanDropReason::kExportFailed:
        export_failed += spans;
        break;
      case SpanDropReason::kShutdown:
        shutdown += spans;
        break;
    }
  }
  std::atomic<uint64_t> exported{0}, queue_full{0}, export_failed{0}, shutdown{0};
};

TEST(OtlpUrlTest, ReadsHostPortAndPathAndRefusesTheRest) {
  auto url = ParseOtlpUrl("http://collector.monitoring:4318/v1/traces");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->host, "collector.monitoring");
  EXPECT_EQ(url->port, 4318);
  EXPECT_EQ(url->path, "/v1/traces");
  auto bare = ParseOtlpUrl("http://localhost");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, 80);
  EXPECT_EQ(bare->path, "/");
  auto v6 = ParseOtlpUrl("http://[::1]:4318/v1/traces");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->ToString(), "http://[::1]:4318/v1/traces");
  for (const char* bad :
       {"https://c/v1/traces", "c:4318", "http://:4318/", "http://c:0/", "http://c:99999/",
        "http://c:x/", "http://user:pw@c/", "http://[::1/", "http://::1/"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseOtlpUrl(bad).status())) << bad;
  }
  EXPECT_THAT(ParseOtlpUrl("https://c/").status().message(), HasSubstr("plain HTTP"));
}

TEST(OtlpEncodingTest, SpansDecodeWithTheirIdsTimesAttributesLinksAndStatus) {
  SpanData span = Span("compute");
  span.parent_span_id = NewSpanId();
  span.attributes = {{"s", std::string("text")}, {"i", int64_t{7}}, {"d", 0.5}, {"b", true}};
  span.links.push_back({NewTraceId(), NewSpanId(), "k=v", 1});
  span.error = true;
  span.status_message = "the model failed";
  const SpanData spans[] = {span};
  otlp::ExportTraceServiceRequest request;
  ASSERT_TRUE(request.ParseFromString(EncodeExportRequest({{"service.name", "sluice"}}, spans)));
  ASSERT_EQ(request.resource_spans_size(), 1);
  const auto& resource = request.resource_spans(0);
  EXPECT_EQ(resource.resource().attributes(0).key(), "service.name");
  EXPECT_EQ(resource.scope_spans(0).scope().name(), "sluice");
  const otlp::Span& out = resource.scope_spans(0).spans(0);
  EXPECT_EQ(out.trace_id(), std::string(span.trace_id.begin(), span.trace_id.end()));
  EXPECT_EQ(out.parent_span_id(),
            std::string(span.parent_span_id.begin(), span.parent_span_id.end()));
  EXPECT_EQ(out.name(), "compute");
  EXPECT_EQ(out.kind(), otlp::Span::SPAN_KIND_INTERNAL);
  EXPECT_EQ(out.start_time_unix_nano(), 1000u);
  EXPECT_EQ(out.end_time_unix_nano(), 2000u);
  ASSERT_EQ(out.attributes_size(), 4);
  EXPECT_EQ(out.attributes(0).value().string_value(), "text");
  EXPECT_EQ(out.attributes(1).value().int_value(), 7);
  EXPECT_EQ(out.attributes(2).value().double_value(), 0.5);
  EXPECT_TRUE(out.attributes(3).value().bool_value());
  ASSERT_EQ(out.links_size(), 1);
  EXPECT_EQ(out.links(0).trace_state(), "k=v");
  EXPECT_EQ(out.status().code(), otlp::Status::STATUS_CODE_ERROR);
  EXPECT_EQ(out.status().message(), "the model failed");
}

TEST(OtlpEncodingTest, InvalidUtf8IsReplacedSoThatStrictDecodersTakeTheBody) {
  EXPECT_EQ(ValidUtf8("plain"), "plain");
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(ValidUtf8("a\xFF"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(ValidUtf8("\xC3"), "\xEF\xBF\xBD");                                  // cut short
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80").substr(0, 3), "\xEF\xBF\xBD");         // past U+10FFFF
  SpanData span = Span("m\xFF");
  span.status_message = "no model '\xFF'";
  const SpanData spans[] = {span};
  otlp::ExportTraceServiceRequest request;
  ASSERT_TRUE(request.ParseFromString(EncodeExportRequest({}, spans)));
  EXPECT_EQ(request.resource_spans(0).scope_spans(0).spans(0).name(), "m\xEF\xBF\xBD");
}

TEST(PostOtlpTest, PostsProtobufAndReadsTheCollectorsAnswer) {
  CollectorStub ok;
  const SpanData spans[] = {Span("a")};
  ASSERT_TRUE(
      PostOtlp(*ParseOtlpUrl(ok.url()), EncodeExportRequest({}, spans), std::chrono::seconds(5))
          .ok());
  ok.WaitForSpans(1);
  EXPECT_THAT(ok.last_head(), HasSubstr("POST /v1/traces HTTP/1.1\r\n"));
  EXPECT_THAT(ok.last_head(), HasSubstr("Content-Type: application/x-protobuf\r\n"));

  CollectorStub refusing("HTTP/1.1 503 Service Unavailable");
  Status refused = PostOtlp(*ParseOtlpUrl(refusing.url()), "x", std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(refused));
  EXPECT_THAT(refused.message(), HasSubstr("503 Service Unavailable"));

  Status absent = PostOtlp(*ParseOtlpUrl("http://127.0.0.1:" + std::to_string(ClosedPort()) + "/"),
                           "x", std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(absent));
  EXPECT_THAT(absent.message(), HasSubstr("cannot connect"));

  CollectorStub slow("HTTP/1.1 200 OK", /*hold=*/true);
  Status late = PostOtlp(*ParseOtlpUrl(slow.url()), "x", std::chrono::milliseconds(200));
  EXPECT_THAT(late.message(), HasSubstr("timed out"));
  slow.Release();
}

TEST(OtlpHttpExporterTest, AFullBatchGoesAtOnceAndTheRestAfterTheDelay) {
  CollectorStub collector;
  CountingObserver observer;
  OtlpHttpExporter::Options options;
  options.url = collector.url();
  options.max_export_batch_size = 4;
  options.max_queue_size = 16;
  options.schedule_delay = std::chrono::milliseconds(300);
  options.observer = &observer;
  auto exporter = *OtlpHttpExporter::Create(options);
  for (int i = 0; i < 5; ++i) exporter->Export(Span("s" + std::to_string(i)));
  auto requests = collector.WaitForSpans(5);
  ASSERT_EQ(requests.size(), 2u);  // 4 at once, then 1 after the delay
  EXPECT_EQ(requests[0].resource_spans(0).scope_spans(0).spans_size(), 4);
  EXPECT_EQ(requests[1].resource_spans(0).scope_spans(0).spans_size(), 1);
  EXPECT_EQ(requests[0].resource_spans(0).resource().attributes(0).value().string_value(),
            "sluice");
  exporter.reset();  // its thread has counted the last post's answer
  EXPECT_EQ(observer.exported.load(), 5u);
  EXPECT_EQ(observer.queue_full + observer.export_failed + observer.shutdown, 0u);
}

TEST(OtlpHttpExporterTest, StopFlushesWhatWaits) {
  CollectorStub collector;
  OtlpHttpExporter::Options options;
  options.url = collector.url();
  options.schedule_delay = std::chrono::hours(1);
  auto exporter = *OtlpHttpExporter::Create(options);
  exporter->Export(Span("last"));
  exporter.reset();
  EXPECT_EQ(collector.WaitForSpans(1).size(), 1u);
}

TEST(OtlpHttpExporterTest, AnAbsentCollectorNeverHoldsUpExportAndDropsAreCounted) {
  CountingObserver observer;
  OtlpHttpExporter::Options options;
  options.url = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/v1/traces";
  options.max_queue_size = 8;
  options.max_export_batch_size = 8;
  options.schedule_delay = std::chrono::milliseconds(50);
  options.observer = &observer;
  auto exporter = *OtlpHttpExporter::Create(options);
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) exporter->Export(Span("s"));
  // No network wait on this thread: generous for a loaded machine, far below one connect timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(1));
  exporter.reset();
  EXPECT_EQ(exporter == nullptr, true);
  EXPECT_EQ(observer.queue_full + observer.export_failed + observer.shutdown, 1000u);
  EXPECT_GT(observer.queue_full.load(), 0u);
  EXPECT_GT(observer.export_failed.load(), 0u);
  EXPECT_EQ(observer.exported.load(), 0u);
}

TEST(OtlpHttpExporterTest, AHungCollectorHoldsShutdownForTheStopTimeOnly) {
  testing::TakenPort hung;  // accepts connections (the kernel does) and never answers
  CountingObserver observer;
  OtlpHttpExporter::Options options;
  options.url = "http://127.0.0.1:" + std::to_string(hung.port()) + "/v1/traces";
  options.schedule_delay = std::chrono::milliseconds(20);
  options.export_timeout = std::chrono::seconds(60);
  options.observer = &observer;
  auto exporter = *OtlpHttpExporter::Create(options);
  exporter->Export(Span("waits"));
  // Its post is under way once its connection waits on the (never accepting) listener.
  pollfd pending{hung.fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pending, 1, 10000), 1);
  exporter->Stop(std::chrono::milliseconds(500));
  exporter->Export(Span("late"));  // after Stop: dropped as shutdown
  const auto started = std::chrono::steady_clock::now();
  exporter.reset();
  // The stop time and one abandon check, with room for a loaded machine; far below the 60 s.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_EQ(observer.shutdown.load(), 2u);
  EXPECT_EQ(observer.exported.load(), 0u);
}

TEST(OtlpHttpExporterTest, BadOptionsAreRefused) {
  OtlpHttpExporter::Options options;
  options.url = "https://c/v1/traces";
  EXPECT_TRUE(absl::IsInvalidArgument(OtlpHttpExporter::Create(options).status()));
  options.url = kDefaultOtlpUrl;
  options.max_export_batch_size = 10;
  options.max_queue_size = 5;
  EXPECT_THAT(OtlpHttpExporter::Create(options).status().message(), HasSubstr("must not exceed"));
  options.max_queue_size = 10;
  options.schedule_delay = std::chrono::hours(25);
  EXPECT_THAT(OtlpHttpExporter::Create(options).status().message(), HasSubstr("one day"));
}

}  // namespace
}  // namespace sluice
