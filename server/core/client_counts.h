// What the client quotas (frontend/client_quotas.h) report to the metrics: requests per client,
// admitted or refused, with a bounded set of clients named and the rest counted as "other".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

// One client's inference requests since it was named (or, for "other", since the start).
struct ClientCounts {
  std::string client;              // as the metrics label it (quoted client text)
  uint64_t admitted = 0;           // passed the quota (and went on to their model)
  uint64_t rate_limited = 0;       // refused: over the client's rate
  uint64_t in_flight_limited = 0;  // refused: the client's in-flight cap was reached
  int64_t in_flight = 0;           // admitted and not answered yet, now
};

struct ClientQuotaReport {
  std::vector<ClientCounts> clients;  // the named clients, each named for good once it is
  ClientCounts other;                 // every other client together (client "other")
  size_t tracked = 0;                 // clients the quotas hold state for now
};

}  // namespace sluice
