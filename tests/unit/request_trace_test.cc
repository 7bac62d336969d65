// W3C trace context parsing and the spans one request's trace becomes.
#include "server/core/request_trace.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kParent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

std::optional<std::string> Attribute(const SpanData& span, const std::string& key) {
  for (const SpanAttribute& attribute : span.attributes) {
    if (attribute.key != key) continue;
    if (const auto* text = std::get_if<std::string>(&attribute.value)) return *text;
    if (const auto* number = std::get_if<int64_t>(&attribute.value)) return std::to_string(*number);
  }
  return std::nullopt;
}

TEST(TraceparentTest, ReadsVersion00AndKeepsTracestate) {
  auto context = ParseTraceparent(kParent, "congo=t61rcWkgMzE");
  ASSERT_TRUE(context.has_value());
  EXPECT_EQ(HexOf(context->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(HexOf(context->span_id), "00f067aa0ba902b7");
  EXPECT_EQ(context->flags, 1);
  EXPECT_EQ(context->trace_state, "congo=t61rcWkgMzE");
  EXPECT_EQ(FormatTraceparent(*context), kParent);
  // A later version may append fields; its first four are read.
  EXPECT_TRUE(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra", "")
                  .has_value());
  // A tracestate over 512 characters is dropped, the context kept.
  auto long_state = ParseTraceparent(kParent, std::string(600, 'a'));
  ASSERT_TRUE(long_state.has_value());
  EXPECT_EQ(long_state->trace_state, "");
}

TEST(TraceparentTest, MalformedContextsAreIgnored) {
  for (const char* bad :
       {"", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "00-xyz-00f067aa0ba902b7-01"}) {
    EXPECT_FALSE(ParseTraceparent(bad, "").has_value()) << bad;
  }
}

TEST(TraceIdsTest, NewIdsAreNonZeroAndDiffer) {
  EXPECT_NE(NewTraceId(), TraceId{});
  EXPECT_NE(NewSpanId(), SpanId{});
  EXPECT_NE(NewTraceId(), NewTraceId());
  EXPECT_NE(NewSpanId(), NewSpanId());
}

TEST(RequestTraceTest, ARequestThatRanBecomesNestedSpansUnderTheCallersSpan) {
  testing::SpanRecorder sink;
  const TimePoint t0 = TimePoint(std::chrono::seconds(100));
  auto parent = ParseTraceparent(kParent, "k=v");
  RequestTrace trace(&sink, std::chrono::seconds(1000), parent,
                     "inference.GRPCInferenceService/ModelInfer", t0);
  trace.AddAttribute("sluice.model", std::string("m"));
  trace.SetDevice("cpu");
  trace.Queued(t0 + std::chrono::microseconds(10));
  RequestTrace* traced[] = {&trace};
  BatchTraceInfo info;
  info.model = "m";
  info.version = 3;
  info.requests = 2;
  info.rows = 3;
  info.padded_rows = 4;
  info.instance = 1;
  info.started = t0 + std::chrono::microseconds(30);
  info.computed = t0 + std::chrono::microseconds(80);
  info.delivered = t0 + std::chrono::microseconds(90);
  TraceBatch(traced, info);
  trace.End(absl::OkStatus(), t0 + std::chrono::microseconds(100));
  trace.End(absl::OkStatus(), t0 + std::chrono::microseconds(200));  // once only

  ASSERT_EQ(sink.spans().size(), 5u);
  const SpanData request = sink.Named("inference.GRPCInferenceService/ModelInfer");
  EXPECT_EQ(request.trace_id, parent->trace_id);
  EXPECT_EQ(request.parent_span_id, parent->span_id);
  EXPECT_EQ(request.trace_state, "k=v");
  EXPECT_EQ(request.kind, SpanKind::kServer);
  EXPECT_EQ(request.start_unix_ns, 1100000000000);
  EXPECT_EQ(request.end_unix_ns, 1100000100000);
  EXPECT_FALSE(request.error);
  EXPECT_EQ(Attribute(request, "sluice.model"), "m");
  EXPECT_EQ(Attribute(request, "sluice.status"), "OK");

  const SpanData queue = sink.Named("queue"), compute = sink.Named("compute"),
                 output = sink.Named("output");
  for (const SpanData* child : {&queue, &compute, &output}) {
    EXPECT_EQ(child->trace_id, parent->trace_id);
    EXPECT_EQ(child->parent_span_id, request.span_id);
    EXPECT_GE(child->start_unix_ns, request.start_unix_ns);
    EXPECT_LE(child->end_unix_ns, request.end_unix_ns);
  }
  EXPECT_EQ(queue.start_unix_ns, 1100000010000);
  EXPECT_EQ(queue.end_unix_ns, compute.start_unix_ns);
  EXPECT_EQ(compute.end_unix_ns, 1100000080000);
  EXPECT_EQ(output.start_unix_ns, compute.end_unix_ns);
  EXPECT_EQ(output.end_unix_ns, request.end_unix_ns);

  const SpanData batch = sink.Named("batch");
  EXPECT_NE(batch.trace_id, parent->trace_id);  // a trace of its own
  EXPECT_EQ(batch.parent_span_id, SpanId{});
  ASSERT_EQ(batch.links.size(), 1u);
  EXPECT_EQ(batch.links[0].trace_id, request.trace_id);
  EXPECT_EQ(batch.links[0].span_id, request.span_id);
  ASSERT_EQ(compute.links.size(), 1u);  // and back
  EXPECT_EQ(compute.links[0].span_id, batch.span_id);
  EXPECT_EQ(Attribute(batch, "sluice.batch.padded_rows"), "4");
  EXPECT_EQ(Attribute(batch, "sluice.batch.padding_rows"), "1");
  EXPECT_EQ(Attribute(batch, "sluice.batch.requests"), "2");
  EXPECT_EQ(Attribute(batch, "sluice.instance"), "1");
  EXPECT_EQ(Attribute(batch, "sluice.device"), "cpu");
  EXPECT_EQ(Attribute(batch, "sluice.model_version"), "3");
}

TEST(RequestTraceTest, AFailureMarksTheSpanAndARequestThatNeverRanHasNoStageSpans) {
  testing::SpanRecorder sink;
  const TimePoint t0 = TimePoint(std::chrono::seconds(5));
  RequestTrace trace(&sink, Duration::zero(), std::nullopt, "POST /v2/models/{model}/infer", t0);
  trace.End(absl::NotFoundError("no model 'x'"), t0 + std::chrono::microseconds(5));
  ASSERT_EQ(sink.spans().size(), 1u);
  const SpanData request = sink.spans()[0];
  EXPECT_EQ(request.parent_span_id, SpanId{});  // a new trace: the request span is its root
  EXPECT_NE(request.trace_id, TraceId{});
  EXPECT_TRUE(request.error);
  EXPECT_THAT(request.status_message, HasSubstr("no model 'x'"));
  EXPECT_EQ(Attribute(request, "sluice.status"), "NOT_FOUND");
}

TEST(RequestTraceTest, ARequestDroppedFromTheQueueHasAQueueSpanOnly) {
  testing::SpanRecorder sink;
  const TimePoint t0 = TimePoint(std::chrono::seconds(5));
  RequestTrace trace(&sink, Duration::zero(), std::nullopt, "r", t0);
  trace.Queued(t0 + std::chrono::microseconds(1));
  trace.End(absl::DeadlineExceededError("expired"), t0 + std::chrono::microseconds(9));
  std::vector<std::string> names;
  for (const SpanData& span : sink.spans()) names.push_back(span.name);
  EXPECT_THAT(names, ElementsAre("queue", "r"));
  EXPECT_EQ(sink.Named("queue").end_unix_ns, sink.Named("r").end_unix_ns);
}

TEST(RequestTraceTest, StampsAfterTheAnswerAreIgnored) {
  // The response cache's single flight may answer a first request (its queue timeout) while the
  // run it started goes on and is stamped later, from another thread.
  testing::SpanRecorder sink;
  const TimePoint t0 = TimePoint(std::chrono::seconds(5));
  auto trace = std::make_shared<RequestTrace>(&sink, Duration::zero(), std::nullopt, "r", t0);
  trace->Queued(t0);
  std::thread answer([&] {
    trace->End(absl::DeadlineExceededError("expired"), t0 + std::chrono::milliseconds(1));
  });
  answer.join();
  trace->Ran(t0 + std::chrono::milliseconds(2), t0 + std::chrono::milliseconds(3),
             SpanContext{NewTraceId(), NewSpanId(), 1, ""});
  trace->End(absl::OkStatus(), t0 + std::chrono::milliseconds(4));
  std::vector<std::string> names;
  for (const SpanData& span : sink.spans()) names.push_back(span.name);
  EXPECT_THAT(names, ElementsAre("queue", "r"));
  EXPECT_TRUE(sink.Named("r").error);
}

}  // namespace
}  // namespace sluice
