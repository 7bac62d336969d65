// server/core/runtime_log.h: the runtime's composed lines reach spdlog's default logger unchanged,
// at info and warning level.
#include "server/core/runtime_log.h"

#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RuntimeLogTest, LinesReachTheDefaultLoggerAtTheirLevel) {
  std::ostringstream out;
  auto previous = spdlog::default_logger();
  auto capture = std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  capture->set_pattern("%l %v");
  capture->set_level(spdlog::level::info);
  spdlog::set_default_logger(capture);
  LogRuntimeInfo("event=cuda_graph_captured model=m rows=8");
  LogRuntimeWarning("event=cudnn_benchmark_slower model=m ratio=0.71");
  capture->set_level(spdlog::level::warn);
  LogRuntimeInfo("event=dropped_below_level");
  spdlog::set_default_logger(previous);

  EXPECT_THAT(out.str(), HasSubstr("info event=cuda_graph_captured model=m rows=8\n"));
  EXPECT_THAT(out.str(), HasSubstr("warning event=cudnn_benchmark_slower model=m ratio=0.71\n"));
  EXPECT_THAT(out.str(), Not(HasSubstr("dropped_below_level")));
}

}  // namespace
}  // namespace sluice
