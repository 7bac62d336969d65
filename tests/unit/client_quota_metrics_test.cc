// The client quotas' series, built from the report (the endpoint test scrapes them).
#include "server/metrics/client_quota_metrics.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

ClientQuotaReport SampleReport() {
  ClientQuotaReport report;
  ClientCounts& named = report.clients.emplace_back();
  named.client = "CN=alice";
  named.admitted = 7;
  named.rate_limited = 2;
  named.in_flight = 1;
  report.other.client = "other";
  report.other.admitted = 40;
  report.other.in_flight_limited = 3;
  report.tracked = 12;
  return report;
}

TEST(ClientQuotaMetricsTest, EachClientHasItsOutcomesAndInFlightAndTheRestIsOther) {
  ClientQuotaMetrics metrics(SampleReport);
  const std::string text = prometheus::TextSerializer().Serialize(metrics.Collect());
  EXPECT_THAT(
      text, HasSubstr("sluice_client_requests_total{client=\"CN=alice\",outcome=\"admitted\"} 7"));
  EXPECT_THAT(
      text,
      HasSubstr("sluice_client_requests_total{client=\"CN=alice\",outcome=\"rate_limited\"} 2"));
  EXPECT_THAT(
      text,
      HasSubstr("sluice_client_requests_total{client=\"other\",outcome=\"in_flight_limited\"} 3"));
  EXPECT_THAT(text, HasSubstr("sluice_client_requests_in_flight{client=\"CN=alice\"} 1"));
  EXPECT_THAT(text, HasSubstr("sluice_client_requests_in_flight{client=\"other\"} 0"));
  EXPECT_THAT(text, HasSubstr("sluice_client_quota_clients 12"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_client_requests_total counter"));
}

}  // namespace
}  // namespace sluice
