#include "server/frontend/client_quotas.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "server/core/message_text.h"
#include "server/core/retry_after.h"

namespace sluice {
namespace {

constexpr size_t kMaxHeaderIdentityBytes = 256;
// Forgetting idle clients scans the table: when it freed nothing, the next scan waits this long
// (a table full of active clients is not scanned for every new one).
constexpr auto kForgetInterval = std::chrono::seconds(1);
// A client at its in-flight cap is told to try again after this (when one of its requests is
// answered is not known).
constexpr auto kInFlightRetry = std::chrono::seconds(1);
constexpr double kLongestWait = 86400;  // seconds a refusal asks a client to wait, at most
// An IPv6 client is its /64: a host gets a whole /64 (SLAAC, privacy addresses), so addresses
// within one are one client, and a host cannot mint fresh clients from its own subnet.
constexpr int kIpv6ClientPrefix = 64;

double BurstOf(const ClientQuota& quota) {
  return quota.burst > 0 ? quota.burst : std::max(1.0, quota.rate);
}

Status CheckQuota(const ClientQuota& quota, absl::string_view whose) {
  if (!(quota.rate >= 0) || !std::isfinite(quota.rate) || !(quota.burst >= 0) ||
      !std::isfinite(quota.burst) || quota.max_in_flight < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the quota of ", whose, " has a negative or non-finite number"));
  }
  if (quota.rate > 0 && BurstOf(quota) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the quota of ", whose, " has a burst below 1: no request could ever pass"));
  }
  return absl::OkStatus();
}

}  // namespace

struct ClientQuotas::Entry {
  // Read by tickets without the lock; the rest is guarded by the owner's mutex_.
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t>* total_in_flight = nullptr;

  std::string client;
  ClientQuota quota;
  bool kept = false;  // its own quota, or the overflow bucket: never forgotten
  double tokens = 0;
  TimePoint refilled{};
  uint64_t admitted = 0;
  uint64_t rate_limited = 0;
  uint64_t in_flight_limited = 0;
  bool named = false;  // the metrics name it (never forgotten); `at_naming` is what it had then
  ClientCounts at_naming;

  // The bucket brought up to `now`.
  void Refill(TimePoint now) {
    if (quota.rate <= 0 || now <= refilled) return;
    const double seconds = std::chrono::duration<double>(now - refilled).count();
    tokens = std::min(BurstOf(quota), tokens + seconds * quota.rate);
    refilled = now;
  }
  bool Idle(TimePoint now) {
    if (kept || named || in_flight.load(std::memory_order_acquire) != 0) return false;
    Refill(now);
    return quota.rate <= 0 || tokens >= BurstOf(quota);
  }
};

namespace {

// A client's state with a full bucket, counted in `total_in_flight` while it holds tickets.
std::unique_ptr<ClientQuotas::Entry> NewEntry(std::atomic<int64_t>* total_in_flight,
                                              const std::string& client, const ClientQuota& quota,
                                              bool kept, TimePoint now) {
  auto entry = std::make_unique<ClientQuotas::Entry>();
  entry->total_in_flight = total_in_flight;
  entry->client = client;
  entry->quota = quota;
  entry->kept = kept;
  entry->tokens = BurstOf(quota);
  entry->refilled = now;
  return entry;
}

}  // namespace

StatusOr<ClientQuotaRule> ParseClientQuota(absl::string_view text) {
  const absl::string_view original = text;
  ClientQuotaRule rule;
  const size_t colon = text.find(':');
  if (colon != absl::string_view::npos) {
    rule.client = std::string(text.substr(colon + 1));
    text = text.substr(0, colon);
    if (rule.client.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--client-quota '", original, "': no client after ':' (leave out ':' for the default)"));
    }
  }
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client-quota '", original, "': ", why,
                     "; write rate=R[,burst=B][,in-flight=N][:CLIENT], e.g. rate=100,in-flight=8"));
  };
  if (absl::StripAsciiWhitespace(text).empty()) return refuse("no setting");
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const size_t equals = item.find('=');
    if (equals == absl::string_view::npos) return refuse(absl::StrCat("'", item, "' has no '='"));
    const absl::string_view key = item.substr(0, equals);
    const absl::string_view value = item.substr(equals + 1);
    if (key == "rate" || key == "burst") {
      double number = 0;
      if (!absl::SimpleAtod(value, &number) || !std::isfinite(number) || number < 0)
        return refuse(absl::StrCat(key, " must be a number >= 0, not '", value, "'"));
      (key == "rate" ? rule.quota.rate : rule.quota.burst) = number;
    } else if (key == "in-flight") {
      if (!absl::SimpleAtoi(value, &rule.quota.max_in_flight) || rule.quota.max_in_flight < 0)
        return refuse(absl::StrCat("in-flight must be a whole number >= 0, not '", value, "'"));
    } else {
      return refuse(absl::StrCat("unknown setting '", key, "'"));
    }
  }
  SLUICE_RETURN_IF_ERROR(CheckQuota(
      rule.quota, rule.client.empty() ? std::string("every client")
                                      : absl::StrCat("'", QuoteClientText(rule.client), "'")));
  return rule;
}

std::string IdentifyClient(const ClientIdentityOptions& options,
                           const std::optional<IpAddress>& peer,
                           absl::string_view certificate_subject, const char* header_value) {
  if (header_value != nullptr && *header_value != '\0' && peer) {
    for (const IpNetwork& proxy : options.trusted_proxies) {
      if (proxy.Contains(*peer)) {
        absl::string_view value(header_value);
        return std::string(value.substr(0, kMaxHeaderIdentityBytes));
      }
    }
  }
  if (!certificate_subject.empty()) return std::string(certificate_subject);
  if (!peer) return "local";
  if (peer->family() == IpAddress::Family::kV6)
    return IpNetwork::Of(*peer, kIpv6ClientPrefix).ToString();
  return peer->ToString();
}

ClientQuotas::Ticket& ClientQuotas::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    entry_ = other.entry_;
    other.entry_ = nullptr;
  }
  return *this;
}

void ClientQuotas::Ticket::Release() {
  if (entry_ == nullptr) return;
  entry_->total_in_flight->fetch_sub(1, std::memory_order_relaxed);
  entry_->in_flight.fetch_sub(1, std::memory_order_release);
  entry_ = nullptr;
}

StatusOr<std::unique_ptr<ClientQuotas>> ClientQuotas::Create(Options options) {
  SLUICE_RETURN_IF_ERROR(CheckQuota(options.quota, "every client"));
  for (const auto& [client, quota] : options.clients)
    SLUICE_RETURN_IF_ERROR(CheckQuota(quota, absl::StrCat("'", QuoteClientText(client), "'")));
  if (options.max_clients == 0)
    return absl::InvalidArgumentError("client quotas must track at least one client");
  return std::unique_ptr<ClientQuotas>(new ClientQuotas(std::move(options)));
}

ClientQuotas::ClientQuotas(Options options)
    : options_(std::move(options)), clock_(options_.clock ? options_.clock : &steady_) {
  const TimePoint now = clock_->Now();
  MutexLock lock(&mutex_);
  for (const auto& [client, quota] : options_.clients)
    clients_[client] = NewEntry(&in_flight_, client, quota, /*kept=*/true, now);
  overflow_ = NewEntry(&in_flight_, "", options_.quota, /*kept=*/true, now);
}

ClientQuotas::~ClientQuotas() = default;

void ClientQuotas::Forget(TimePoint now) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second->Idle(now)) {
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
  last_forget_ = now;
}

ClientQuotas::Entry* ClientQuotas::Find(const std::string& client, TimePoint now) {
  if (auto found = clients_.find(client); found != clients_.end()) return found->second.get();
  const size_t limit = options_.max_clients + options_.clients.size();
  if (clients_.size() >= limit) {
    if (last_forget_ == TimePoint{} || now - last_forget_ >= kForgetInterval) Forget(now);
    if (clients_.size() >= limit) return overflow_.get();
  }
  return clients_
      .emplace(client, NewEntry(&in_flight_, client, options_.quota, /*kept=*/false, now))
      .first->second.get();
}

StatusOr<ClientQuotas::Ticket> ClientQuotas::Admit(const std::string& client) {
  MutexLock lock(&mutex_);
  const TimePoint now = clock_->Now();  // under the lock: refills only move forward
  Entry* entry = Find(client, now);
  const ClientQuota& quota = entry->quota;
  const std::string whose =
      entry == overflow_.get()
          ? absl::StrCat("client '", QuoteClientText(client),
                         "' (sharing one quota with other new clients: the server tracks "
                         "--client-quota-max-clients)")
          : absl::StrCat("client '", QuoteClientText(client), "'");
  if (quota.max_in_flight > 0 &&
      entry->in_flight.load(std::memory_order_relaxed) >= quota.max_in_flight) {
    ++entry->in_flight_limited;
    ++in_flight_limited_;
    return WithRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat(
            whose, " has ", quota.max_in_flight,
            " inference requests in flight, its cap (--client-quota in-flight); retry when one "
            "is answered")),
        kInFlightRetry);
  }
  if (quota.rate > 0) {
    entry->Refill(now);
    if (entry->tokens < 1) {
      ++entry->rate_limited;
      ++rate_limited_;
      // At most a day: a tiny rate's wait would overflow the clock's ticks.
      const auto wait =
          std::chrono::duration<double>(std::min((1 - entry->tokens) / quota.rate, kLongestWait));
      return WithRetryAfter(
          absl::ResourceExhaustedError(absl::StrFormat(
              "%s is over its rate of %g inference requests/s (burst %g; --client-quota); "
              "retry in %.3f s",
              whose, quota.rate, BurstOf(quota), wait.count())),
          std::chrono::duration_cast<Duration>(wait));
    }
    entry->tokens -= 1;
  }
  ++entry->admitted;
  ++admitted_;
  entry->in_flight.fetch_add(1, std::memory_order_relaxed);
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  return Ticket(entry);
}

ClientQuotaReport ClientQuotas::Report() {
  ClientQuotaReport report;
  MutexLock lock(&mutex_);
  if (named_ < options_.named_clients) {
    std::vector<Entry*> candidates;
    for (auto& [client, entry] : clients_) {
      if (!entry->named) candidates.push_back(entry.get());
    }
    auto total = [](const Entry* e) {
      return e->admitted + e->rate_limited + e->in_flight_limited;
    };
    const size_t take = std::min(candidates.size(), options_.named_clients - named_);
    std::partial_sort(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(take),
                      candidates.end(), [&](const Entry* a, const Entry* b) {
                        return total(a) != total(b) ? total(a) > total(b) : a->client < b->client;
                      });
    for (size_t i = 0; i < take; ++i) {
      Entry* entry = candidates[i];
      if (total(entry) == 0) break;  // a client with its own quota and no request yet
      entry->named = true;
      entry->at_naming.admitted = entry->admitted;
      entry->at_naming.rate_limited = entry->rate_limited;
      entry->at_naming.in_flight_limited = entry->in_flight_limited;
      ++named_;
    }
  }
  ClientCounts named_total;
  int64_t named_in_flight = 0;
  for (auto& [client, entry] : clients_) {
    if (!entry->named) continue;
    ClientCounts& counts = report.clients.emplace_back();
    counts.client = QuoteClientText(client, 128);
    if (counts.client == "other") counts.client = "'other'";  // not the label of the rest
    counts.admitted = entry->admitted - entry->at_naming.admitted;
    counts.rate_limited = entry->rate_limited - entry->at_naming.rate_limited;
    counts.in_flight_limited = entry->in_flight_limited - entry->at_naming.in_flight_limited;
    counts.in_flight = entry->in_flight.load(std::memory_order_relaxed);
    named_total.admitted += counts.admitted;
    named_total.rate_limited += counts.rate_limited;
    named_total.in_flight_limited += counts.in_flight_limited;
    named_in_flight += counts.in_flight;
  }
  std::sort(report.clients.begin(), report.clients.end(),
            [](const ClientCounts& a, const ClientCounts& b) { return a.client < b.client; });
  // Two clients whose labels are cut to the same text share one series (a label set must be
  // unique in the exposition).
  std::vector<ClientCounts> merged;
  for (ClientCounts& counts : report.clients) {
    if (!merged.empty() && merged.back().client == counts.client) {
      merged.back().admitted += counts.admitted;
      merged.back().rate_limited += counts.rate_limited;
      merged.back().in_flight_limited += counts.in_flight_limited;
      merged.back().in_flight += counts.in_flight;
    } else {
      merged.push_back(std::move(counts));
    }
  }
  report.clients = std::move(merged);
  report.other.client = "other";
  report.other.admitted = admitted_ - named_total.admitted;
  report.other.rate_limited = rate_limited_ - named_total.rate_limited;
  report.other.in_flight_limited = in_flight_limited_ - named_total.in_flight_limited;
  report.other.in_flight =
      std::max<int64_t>(0, in_flight_.load(std::memory_order_relaxed) - named_in_flight);
  report.tracked = clients_.size();
  return report;
}

}  // namespace sluice
