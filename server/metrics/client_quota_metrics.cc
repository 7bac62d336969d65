#include "server/metrics/client_quota_metrics.h"

#include <string>

#include <prometheus/client_metric.h>

namespace sluice {
namespace {

prometheus::ClientMetric Sample(std::vector<prometheus::ClientMetric::Label> labels, double value,
                                bool counter) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  if (counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

}  // namespace

std::vector<prometheus::MetricFamily> ClientQuotaMetrics::Collect() const {
  const ClientQuotaReport report = report_();
  prometheus::MetricFamily requests{
      "sluice_client_requests_total",
      "Inference requests per client under the client quotas, by outcome: admitted, "
      "rate_limited or in_flight_limited (refused with RESOURCE_EXHAUSTED / 429)",
      prometheus::MetricType::Counter,
      {}};
  prometheus::MetricFamily in_flight{"sluice_client_requests_in_flight",
                                     "Inference requests per client admitted and not answered yet",
                                     prometheus::MetricType::Gauge,
                                     {}};
  auto add = [&](const ClientCounts& counts) {
    const struct {
      const char* outcome;
      uint64_t value;
    } outcomes[] = {{"admitted", counts.admitted},
                    {"rate_limited", counts.rate_limited},
                    {"in_flight_limited", counts.in_flight_limited}};
    for (const auto& each : outcomes) {
      requests.metric.push_back(Sample({{"client", counts.client}, {"outcome", each.outcome}},
                                       static_cast<double>(each.value), true));
    }
    in_flight.metric.push_back(
        Sample({{"client", counts.client}}, static_cast<double>(counts.in_flight), false));
  };
  for (const ClientCounts& counts : report.clients) add(counts);
  add(report.other);
  prometheus::MetricFamily tracked{"sluice_client_quota_clients",
                                   "Clients the client quotas hold state for now",
                                   prometheus::MetricType::Gauge,
                                   {Sample({}, static_cast<double>(report.tracked), false)}};
  return {std::move(requests), std::move(in_flight), std::move(tracked)};
}

}  // namespace sluice
