// --trace-config as Triton spells it.
#include "server/tracing/trace_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(TraceConfigTest, DefaultsAreTritons) {
  auto config = ParseTraceConfig({});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->settings.level, TraceLevel::kOff);
  EXPECT_EQ(config->settings.rate, 1000);
  EXPECT_EQ(config->settings.count, -1);
  EXPECT_EQ(config->exporter.url, "http://localhost:4318/v1/traces");
  EXPECT_EQ(config->exporter.max_queue_size, 2048u);
  EXPECT_EQ(config->exporter.schedule_delay, std::chrono::milliseconds(5000));
  EXPECT_EQ(config->exporter.max_export_batch_size, 512u);
}

TEST(TraceConfigTest, ReadsEverySetting) {
  auto config = ParseTraceConfig(
      {"mode=opentelemetry", "level=TIMESTAMPS", "rate=1", "count=100",
       "opentelemetry,url=http://collector:4318/v1/traces",
       "opentelemetry,resource=service.name=ranker", "opentelemetry,resource=env=prod=eu",
       "opentelemetry,bsp_max_queue_size=64", "opentelemetry,bsp_schedule_delay=50",
       "opentelemetry,bsp_max_export_batch_size=16"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->settings.level, TraceLevel::kTimestamps);
  EXPECT_EQ(config->settings.rate, 1);
  EXPECT_EQ(config->settings.count, 100);
  EXPECT_EQ(config->exporter.url, "http://collector:4318/v1/traces");
  EXPECT_THAT(config->exporter.resource,
              ElementsAre(Pair("service.name", "ranker"), Pair("env", "prod=eu")));
  EXPECT_EQ(config->exporter.max_queue_size, 64u);
  EXPECT_EQ(config->exporter.schedule_delay, std::chrono::milliseconds(50));
  EXPECT_EQ(config->exporter.max_export_batch_size, 16u);
}

TEST(TraceConfigTest, BadValuesSayWhatIsWrong) {
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"level=TENSORS"}, "not tensor contents"},
      {{"level=loud"}, "OFF or TIMESTAMPS"},
      {{"rate=0"}, "integer >= 1"},
      {{"count=-5"}, "integer >= -1"},
      {{"mode=triton"}, "only trace mode is opentelemetry"},
      {{"triton,file=/tmp/t.json"}, "writes no trace files"},
      {{"opentelemetry,url=https://collector/v1/traces"}, "plain HTTP"},
      {{"opentelemetry,url=collector:4318"}, "not an http:// URL"},
      {{"opentelemetry,resource=novalue"}, "key=value"},
      {{"opentelemetry,colour=blue"}, "unknown OpenTelemetry setting"},
      {{"jaeger,url=x"}, "unknown section 'jaeger'"},
      {{"verbose"}, "is not <setting>=<value>"},
      {{"opentelemetry,bsp_schedule_delay=86400001"}, "at most one day"},
      {{"opentelemetry,bsp_max_queue_size=8", "opentelemetry,bsp_max_export_batch_size=9"},
       "must not exceed"},
  };
  for (const auto& [values, message] : cases) {
    auto config = ParseTraceConfig(values);
    EXPECT_TRUE(absl::IsInvalidArgument(config.status())) << values[0];
    EXPECT_THAT(config.status().message(), HasSubstr(message)) << values[0];
  }
}

}  // namespace
}  // namespace sluice
