// Which requests the tracer samples, and the trace settings API's rules.
#include "server/tracing/tracer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kParent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

absl::string_view NoHeaders(const char*) { return ""; }

class TracerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tracer> Make(TraceLevel level, int64_t rate, int64_t count) {
    Tracer::Options options;
    options.settings = {level, rate, count};
    options.sink = &sink_;
    return std::make_unique<Tracer>(options);
  }
  // How many of `requests` requests to `model` without a trace context are traced.
  int Sampled(Tracer& tracer, const std::string& model, int requests) {
    int traced = 0;
    for (int i = 0; i < requests; ++i) traced += tracer.Start(model, NoHeaders, "r") != nullptr;
    return traced;
  }
  testing::SpanRecorder sink_;
};

TEST_F(TracerTest, OffReadsNoHeadersAndTracesNothingEvenWithAParent) {
  auto tracer = Make(TraceLevel::kOff, 1, -1);
  EXPECT_FALSE(tracer->active());
  int reads = 0;
  auto header = [&](const char*) -> absl::string_view {
    ++reads;
    return kParent;
  };
  EXPECT_EQ(tracer->Start("m", header, "r"), nullptr);
  EXPECT_EQ(reads, 0);
}

TEST_F(TracerTest, RateTracesOneInNStartingWithTheFirstAndCountStops) {
  auto every_third = Make(TraceLevel::kTimestamps, 3, -1);
  EXPECT_TRUE(every_third->active());
  EXPECT_EQ(Sampled(*every_third, "m", 9), 3);
  auto first = every_third->Start("m", NoHeaders, "r");
  EXPECT_NE(first, nullptr);  // the 10th: 1 + 3k
  auto two = Make(TraceLevel::kTimestamps, 1, 2);
  EXPECT_EQ(Sampled(*two, "m", 5), 2);
  EXPECT_EQ(two->Get("")["trace_count"], std::vector<std::string>{"0"});  // what is left
}

TEST_F(TracerTest, ACallerWithATraceContextIsTracedWhateverTheRateAndCount) {
  auto tracer = Make(TraceLevel::kTimestamps, 1000000, 0);
  EXPECT_EQ(Sampled(*tracer, "m", 10), 0);
  auto header = [](const char* name) -> absl::string_view {
    return std::string(name) == "traceparent" ? kParent : "vendor=1";
  };
  auto trace = tracer->Start("m", header, "r");
  ASSERT_NE(trace, nullptr);
  ASSERT_TRUE(trace->parent().has_value());
  EXPECT_EQ(HexOf(trace->trace_id()), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(trace->parent()->trace_state, "vendor=1");
  // A caller that does not record its trace (sampled flag 0) gets no spans either.
  auto unsampled = [](const char* name) -> absl::string_view {
    return std::string(name) == "traceparent"
               ? "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
               : "";
  };
  EXPECT_EQ(tracer->Start("m", unsampled, "r"), nullptr);
  // A malformed traceparent is ignored: the request is sampled as any other (here: not at all).
  auto bad = [](const char* name) -> absl::string_view {
    return std::string(name) == "traceparent" ? "00-zz" : "";
  };
  EXPECT_EQ(tracer->Start("m", bad, "r"), nullptr);
}

TEST_F(TracerTest, AModelsOwnSettingsOverrideTheServersAndClearingFallsBack) {
  auto tracer = Make(TraceLevel::kOff, 1, -1);
  auto updated = tracer->Update("m", {{"trace_level", {"TIMESTAMPS"}}, {"trace_rate", {"2"}}});
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ((*updated)["trace_level"], std::vector<std::string>{"TIMESTAMPS"});
  EXPECT_EQ((*updated)["trace_rate"], std::vector<std::string>{"2"});
  EXPECT_TRUE(tracer->active());
  EXPECT_EQ(Sampled(*tracer, "m", 4), 2);
  EXPECT_EQ(Sampled(*tracer, "other", 4), 0);  // the server's level: OFF
  EXPECT_EQ(tracer->Get("other")["trace_level"], std::vector<std::string>{"OFF"});
  // A model's count is its own.
  ASSERT_TRUE(tracer->Update("m", {{"trace_count", {"1"}}}).ok());
  EXPECT_EQ(Sampled(*tracer, "m", 4), 1);
  // Clearing every setting it has: the server's again, and nothing is active.
  ASSERT_TRUE(
      tracer->Update("m", {{"trace_level", {}}, {"trace_rate", {}}, {"trace_count", {}}}).ok());
  EXPECT_EQ(tracer->Get("m")["trace_level"], std::vector<std::string>{"OFF"});
  EXPECT_FALSE(tracer->active());
  // The server's settings: changed, then cleared back to the start-up value.
  ASSERT_TRUE(tracer->Update("", {{"trace_level", {"TIMESTAMPS"}}}).ok());
  EXPECT_TRUE(tracer->active());
  EXPECT_EQ(Sampled(*tracer, "other", 3), 3);
  ASSERT_TRUE(tracer->Update("", {{"trace_level", {}}}).ok());
  EXPECT_FALSE(tracer->active());
}

TEST_F(TracerTest, AModelWithSettingsOfItsOwnKeepsItsOwnCounterAndCount) {
  auto tracer = Make(TraceLevel::kTimestamps, 2, 3);
  // Only the rate is its own: its count starts from the server's (3) but is counted apart.
  ASSERT_TRUE(tracer->Update("m", {{"trace_rate", {"1"}}}).ok());
  EXPECT_EQ(Sampled(*tracer, "m", 10), 3);
  EXPECT_EQ(tracer->Get("m")["trace_count"], std::vector<std::string>{"0"});
  EXPECT_EQ(tracer->Get("")["trace_count"],
            std::vector<std::string>{"3"});     // the server's untouched
  EXPECT_EQ(Sampled(*tracer, "other", 10), 3);  // 1 in 2, three times
  // Setting (or clearing) its count starts it again.
  ASSERT_TRUE(tracer->Update("m", {{"trace_count", {"2"}}}).ok());
  EXPECT_EQ(Sampled(*tracer, "m", 10), 2);
  ASSERT_TRUE(tracer->Update("m", {{"trace_count", {}}}).ok());
  EXPECT_EQ(tracer->Get("m")["trace_count"], std::vector<std::string>{"3"});
}

TEST_F(TracerTest, BadUpdatesChangeNothingAndSayWhatIsWrong) {
  auto tracer = Make(TraceLevel::kTimestamps, 10, -1);
  const TraceSettingsMap before = tracer->Get("");
  struct Case {
    TraceSettingsMap update;
    const char* message;
  };
  const Case cases[] = {
      {{{"trace_rate", {"2"}}, {"trace_level", {"LOUD"}}}, "unknown trace level 'LOUD'"},
      {{{"trace_level", {"TENSORS"}}}, "TENSORS is not supported"},
      {{{"trace_rate", {"0"}}}, "'trace_rate' must be an integer >= 1"},
      {{{"trace_rate", {"ten"}}}, "'trace_rate' must be an integer >= 1"},
      {{{"trace_count", {"-2"}}}, "'trace_count' must be an integer >= -1"},
      {{{"trace_count", {"1", "2"}}}, "takes one value"},
      {{{"log_frequency", {"5"}}}, "writes no trace files"},
      {{{"trace_file", {"/tmp/x"}}}, "cannot be changed at run time"},
      {{{"trace_mode", {"triton"}}}, "cannot be changed at run time"},
      {{{"url", {"http://elsewhere:4318/v1/traces"}}}, "unknown trace setting 'url'"},
  };
  for (const Case& each : cases) {
    auto result = tracer->Update("", each.update);
    EXPECT_TRUE(absl::IsInvalidArgument(result.status()));
    EXPECT_THAT(result.status().message(), HasSubstr(each.message));
  }
  EXPECT_EQ(tracer->Get(""), before);
  EXPECT_TRUE(tracer->Update("", {{"log_frequency", {"0"}}}).ok());
  EXPECT_THAT(tracer->Get("")["trace_mode"], ElementsAre("opentelemetry"));
}

}  // namespace
}  // namespace sluice
