// The client quotas' series, built at each scrape from the quotas' report (so they are exact and
// need no thread): per client (a bounded set, the rest as client="other")
//   sluice_client_requests_total{client,outcome}   outcome: admitted, rate_limited,
//                                                  in_flight_limited
//   sluice_client_requests_in_flight{client}
//   sluice_client_quota_clients                    clients tracked now
#pragma once

#include <functional>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "server/core/client_counts.h"

namespace sluice {

class ClientQuotaMetrics final : public prometheus::Collectable {
 public:
  // `report` is called on the metrics endpoint's thread at each scrape; it must be thread-safe
  // and stay callable as long as this object lives.
  explicit ClientQuotaMetrics(std::function<ClientQuotaReport()> report)
      : report_(std::move(report)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<ClientQuotaReport()> report_;
};

}  // namespace sluice
