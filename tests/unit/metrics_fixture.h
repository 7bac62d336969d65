// What the metrics tests share: a registry with ServerMetrics over it, and reading series back
// from its text exposition.
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "server/metrics/server_metrics.h"

namespace sluice {

inline std::string Exposition(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The value of one series ("name{labels}" exactly as exposed), or -1 when it is absent.
inline double Value(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

class MetricsTest : public ::testing::Test {
 protected:
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics_{registry_};
};

}  // namespace sluice
