// Quotas per client on inference requests (ModelInfer, each request of ModelStreamInfer, HTTP
// .../infer), across gRPC and HTTP: a rate (token bucket: `burst` requests at once, refilled at
// `rate` per second) and a cap on requests in flight (admitted, not answered yet). A request over
// either is refused at once, before it reaches its model (no lookup, no tensor decoding, no
// queue), with RESOURCE_EXHAUSTED (HTTP 429)
// and a time to retry after (core/retry_after.h). A request within its quota goes on to its
// model, where the queue caps and priorities apply as to any other: quotas come first and
// compose with them (a request refused by its model's queue still used a token).
//
// Who the client is (IdentifyClient): the value of an operator-named header, believed only on
// connections from a trusted proxy (an ingress that sets it, replacing what the client sent: the
// first value is read); else the subject of the client's TLS certificate (mutual TLS); else the
// peer's IPv4 address, or the /64 of its IPv6 address.
//
// Bounded state: at most max_clients clients are tracked. When a new one comes and the table is
// full, clients that hold nothing (none in flight, a full bucket) are forgotten; a client that
// finds the table full of active ones shares one bucket with every such client (the default
// quota), so that a flood of made-up identities competes only with itself. Clients with their
// own quota and clients the metrics name are never forgotten.
//
// Thread-safety: every member may be called from any thread; Admit takes one mutex, a ticket's
// release none.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"

#include "server/core/client_counts.h"
#include "server/core/clock.h"
#include "server/core/ip_address.h"
#include "server/core/mutex.h"
#include "server/core/status.h"

namespace sluice {

struct ClientQuota {
  double rate = 0;        // requests per second refilled; 0: no rate limit
  double burst = 0;       // the bucket's size; 0: max(1, rate) (one second's worth)
  int max_in_flight = 0;  // requests admitted and not answered yet; 0: no cap
};

// One --client-quota value: "rate=R[,burst=B][,in-flight=N]" for every client without its own,
// or "...:CLIENT" for one client (the identity as IdentifyClient gives it: an address, a
// certificate subject, a header value; everything after the first ':'). R and B are numbers
// >= 0, N a whole number >= 0. INVALID_ARGUMENT saying what is wrong.
struct ClientQuotaRule {
  std::string client;  // empty: the default
  ClientQuota quota;
};
StatusOr<ClientQuotaRule> ParseClientQuota(absl::string_view text);

struct ClientIdentityOptions {
  // The request header (lower case) naming the client, as set by a trusted proxy; empty: none.
  std::string header;
  // Peers whose header is believed (--trusted-proxies); from any other peer it is ignored.
  std::vector<IpNetwork> trusted_proxies;
};

// The identity of a request's client (see above). `header_value`: what the request carries in
// options.header (null: absent); `certificate_subject`: the verified client certificate's
// subject (empty: none); `peer`: the connection's address (nullopt: not an IP socket, "local";
// IPv6: its /64, "2001:db8:1:2::/64").
// A header value longer than 256 bytes is cut there.
std::string IdentifyClient(const ClientIdentityOptions& options,
                           const std::optional<IpAddress>& peer,
                           absl::string_view certificate_subject, const char* header_value);

class ClientQuotas {
 public:
  struct Options {
    ClientQuota quota;                           // every client without its own
    std::map<std::string, ClientQuota> clients;  // clients with their own quota
    ClientIdentityOptions identity;
    size_t max_clients = 10000;         // clients tracked at once (see above); >= 1
    size_t named_clients = 10;          // clients the metrics name (the busiest first), 0: none
    const TimeSource* clock = nullptr;  // null: the steady clock
  };
  // INVALID_ARGUMENT for a quota that is no quota (a negative number, a burst below 1 with a rate)
  // or max_clients 0.
  static StatusOr<std::unique_ptr<ClientQuotas>> Create(Options options);
  ~ClientQuotas();

  struct Entry;
  // A request admitted and not answered yet: move-only; releasing it (or destroying it) ends the
  // request's place in its client's in-flight count. Empty when default-constructed or moved from.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : entry_(other.entry_) { other.entry_ = nullptr; }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Release(); }
    void Release();
    explicit operator bool() const { return entry_ != nullptr; }

   private:
    friend class ClientQuotas;
    explicit Ticket(Entry* entry) : entry_(entry) {}
    Entry* entry_ = nullptr;  // alive while its in-flight count is above 0 (never forgotten)
  };

  // Admits one request of `client`, or refuses it (RESOURCE_EXHAUSTED with a retry time, the
  // client and the quota named). Tickets must be released before the quotas are destroyed.
  StatusOr<Ticket> Admit(const std::string& client) ABSL_LOCKS_EXCLUDED(mutex_);

  std::string Identify(const std::optional<IpAddress>& peer, absl::string_view certificate_subject,
                       const char* header_value) const {
    return IdentifyClient(options_.identity, peer, certificate_subject, header_value);
  }
  const ClientIdentityOptions& identity() const { return options_.identity; }

  // The counts for the metrics. Names the busiest unnamed clients while fewer than named_clients
  // are named; a client named now counts from now (what it did before stays in "other"), so
  // that every series only grows.
  ClientQuotaReport Report() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  explicit ClientQuotas(Options options);
  Entry* Find(const std::string& client, TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Forget(TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  Mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Entry>> clients_ ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<Entry> overflow_;  // the clients that found the table full; never forgotten
  size_t named_ ABSL_GUARDED_BY(mutex_) = 0;
  TimePoint last_forget_ ABSL_GUARDED_BY(mutex_){};
  // Every client's, since the start (the named ones' share is taken out for "other").
  uint64_t admitted_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t rate_limited_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t in_flight_limited_ ABSL_GUARDED_BY(mutex_) = 0;
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace sluice
