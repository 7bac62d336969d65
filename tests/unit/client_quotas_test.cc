// Client quotas on a fake clock: the --client-quota grammar, who a client is, the token bucket,
// the in-flight cap, bounded state, and the report the metrics read.
#include "server/frontend/client_quotas.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "server/core/retry_after.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

TEST(ClientQuotaTest, ParsesTheDefaultAndOneClientsQuota) {
  const ClientQuotaRule all = ParseClientQuota("rate=100,burst=20,in-flight=8").value();
  EXPECT_TRUE(all.client.empty());
  EXPECT_EQ(all.quota.rate, 100);
  EXPECT_EQ(all.quota.burst, 20);
  EXPECT_EQ(all.quota.max_in_flight, 8);
  // The client is everything after the first ':' (subjects have commas, IPv6 has colons).
  const ClientQuotaRule one = ParseClientQuota("rate=0.5:CN=batch,O=Acme").value();
  EXPECT_EQ(one.client, "CN=batch,O=Acme");
  EXPECT_EQ(one.quota.rate, 0.5);
  EXPECT_EQ(ParseClientQuota("in-flight=2:fd00::1").value().client, "fd00::1");
}

TEST(ClientQuotaTest, RefusesWhatIsNoQuotaSayingWhy) {
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {"", "no setting"},
      {"rate", "'rate' has no '='"},
      {"rate=-1", "rate must be a number >= 0"},
      {"rate=inf", "rate must be a number >= 0"},
      {"rate=nan", "rate must be a number >= 0"},
      {"in-flight=1.5", "in-flight must be a whole number"},
      {"speed=3", "unknown setting 'speed'"},
      {"rate=5:", "no client after ':'"},
      {"rate=5,burst=0.5", "burst below 1"},
  };
  for (const auto& each : cases) {
    const StatusOr<ClientQuotaRule> parsed = ParseClientQuota(each.text);
    ASSERT_FALSE(parsed.ok()) << each.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(each.says), std::string::npos)
        << each.text << ": " << parsed.status().message();
  }
}

TEST(IdentifyClientTest, TrustsTheHeaderOnlyFromAProxyThenTheCertificateThenTheAddress) {
  ClientIdentityOptions options;
  options.header = "x-client-id";
  options.trusted_proxies = IpNetwork::ParseList("10.0.0.0/8").value();
  const auto proxy = IpAddress::Parse("10.1.1.1");
  const auto stranger = IpAddress::Parse("192.0.2.7");
  EXPECT_EQ(IdentifyClient(options, proxy, "CN=alice", "tenant-a"), "tenant-a");
  EXPECT_EQ(IdentifyClient(options, stranger, "CN=alice", "tenant-a"), "CN=alice");
  EXPECT_EQ(IdentifyClient(options, stranger, "", "tenant-a"), "192.0.2.7");
  EXPECT_EQ(IdentifyClient(options, proxy, "", nullptr), "10.1.1.1");  // the proxy itself
  EXPECT_EQ(IdentifyClient(options, proxy, "", ""), "10.1.1.1");
  EXPECT_EQ(IdentifyClient(options, std::nullopt, "", "tenant-a"), "local");
  // An IPv6 client is its /64: a host cannot mint new clients from its own subnet.
  EXPECT_EQ(IdentifyClient(options, IpAddress::Parse("2001:db8:1:2:aaaa::7"), "", nullptr),
            "2001:db8:1:2::/64");
  EXPECT_EQ(IdentifyClient(options, IpAddress::Parse("2001:db8:1:2:bbbb::9"), "", nullptr),
            "2001:db8:1:2::/64");
  EXPECT_EQ(IdentifyClient(options, IpAddress::Parse("::ffff:10.9.8.7"), "", nullptr), "10.9.8.7");
  EXPECT_EQ(IdentifyClient(options, proxy, "", std::string(1000, 'k').c_str()).size(), 256u);
  options.trusted_proxies.clear();
  EXPECT_EQ(IdentifyClient(options, proxy, "", "tenant-a"), "10.1.1.1");
}

class ClientQuotasTest : public ::testing::Test {
 protected:
  std::unique_ptr<ClientQuotas> Make(ClientQuotas::Options options) {
    options.clock = &clock_;
    return ClientQuotas::Create(std::move(options)).value();
  }
  FakeTimeSource clock_;
};

TEST_F(ClientQuotasTest, ABucketPassesItsBurstThenRefusesWithTheWaitUntilTheNextToken) {
  ClientQuotas::Options options;
  options.quota.rate = 10;
  options.quota.burst = 3;
  auto quotas = Make(options);
  std::vector<ClientQuotas::Ticket> tickets;
  for (int i = 0; i < 3; ++i) tickets.push_back(quotas->Admit("a").value());
  StatusOr<ClientQuotas::Ticket> over = quotas->Admit("a");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "client 'a' is over its rate of 10 inference requests/s (burst 3; --client-quota); "
            "retry in 0.100 s");
  EXPECT_EQ(RetryAfter(over.status())->count(), 100);
  // Other clients have their own buckets; tokens come back at the rate, up to the burst.
  EXPECT_TRUE(quotas->Admit("b").ok());
  clock_.Advance(50ms);
  EXPECT_EQ(RetryAfter(quotas->Admit("a").status())->count(), 50);
  clock_.Advance(50ms);
  EXPECT_TRUE(quotas->Admit("a").ok());
  EXPECT_FALSE(quotas->Admit("a").ok());
  clock_.Advance(10s);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(quotas->Admit("a").ok()) << i;
  EXPECT_FALSE(quotas->Admit("a").ok());
}

TEST_F(ClientQuotasTest, TheInFlightCapCountsTicketsUntilTheyAreReleased) {
  ClientQuotas::Options options;
  options.quota.max_in_flight = 2;
  options.named_clients = 0;
  auto quotas = Make(options);
  ClientQuotas::Ticket first = quotas->Admit("a").value();
  ClientQuotas::Ticket second = quotas->Admit("a").value();
  StatusOr<ClientQuotas::Ticket> third = quotas->Admit("a");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().message(),
            "client 'a' has 2 inference requests in flight, its cap (--client-quota in-flight); "
            "retry when one is answered");
  EXPECT_EQ(RetryAfter(third.status())->count(), 1000);
  first.Release();
  EXPECT_FALSE(static_cast<bool>(first));
  first.Release();  // twice is once
  ClientQuotas::Ticket again = quotas->Admit("a").value();
  // A moved ticket is released once, by its new owner.
  ClientQuotas::Ticket moved = std::move(second);
  EXPECT_FALSE(quotas->Admit("a").ok());
  moved = ClientQuotas::Ticket();
  EXPECT_TRUE(quotas->Admit("a").ok());  // released at once again (a temporary)
  EXPECT_EQ(quotas->Report().other.in_flight, 1);
}

TEST_F(ClientQuotasTest, AClientWithItsOwnQuotaIsHeldToItAndTheOthersToTheDefault) {
  ClientQuotas::Options options;
  options.quota.rate = 1;
  options.clients["CN=batch"] = ClientQuota{0, 0, 1};  // no rate, one in flight
  auto quotas = Make(options);
  ClientQuotas::Ticket held = quotas->Admit("CN=batch").value();
  EXPECT_FALSE(quotas->Admit("CN=batch").ok());
  held.Release();
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(quotas->Admit("CN=batch").ok()) << i;
  EXPECT_TRUE(quotas->Admit("CN=other").ok());
  EXPECT_FALSE(quotas->Admit("CN=other").ok());
}

TEST_F(ClientQuotasTest, IdleClientsAreForgottenAndNewOnesPastTheBoundShareOneBucket) {
  ClientQuotas::Options options;
  options.quota.rate = 1;
  options.quota.burst = 2;
  options.max_clients = 3;
  options.named_clients = 0;
  auto quotas = Make(options);
  for (const char* client : {"a", "b", "c"}) ASSERT_TRUE(quotas->Admit(client).ok());
  EXPECT_EQ(quotas->Report().tracked, 3u);
  // The table is full of clients whose buckets are not full: new ones share the overflow bucket
  // (burst 2), whichever name they give.
  EXPECT_TRUE(quotas->Admit("d").ok());
  EXPECT_TRUE(quotas->Admit("e").ok());
  const Status shared = quotas->Admit("f").status();
  EXPECT_EQ(shared.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(shared.message().find("sharing one quota with other new clients"), std::string::npos)
      << shared.message();
  EXPECT_EQ(quotas->Report().tracked, 3u);
  // Once their buckets refill (and nothing of theirs is in flight) they are forgotten; a client
  // holding a ticket is kept.
  ClientQuotas::Ticket held = quotas->Admit("a").value();
  clock_.Advance(5s);
  EXPECT_TRUE(quotas->Admit("g").ok());
  EXPECT_EQ(quotas->Report().tracked, 2u);  // "a" (in flight) and "g"
  held.Release();
  // A forgotten client starts again with a full bucket: it lost nothing by being forgotten.
  EXPECT_TRUE(quotas->Admit("b").ok());
  EXPECT_TRUE(quotas->Admit("b").ok());
  EXPECT_FALSE(quotas->Admit("b").ok());
}

TEST_F(ClientQuotasTest, AFullTableOfActiveClientsIsScannedAtMostOnceASecond) {
  ClientQuotas::Options options;
  options.quota.rate = 1;
  options.quota.burst = 1;
  options.max_clients = 2;
  options.named_clients = 0;
  auto quotas = Make(options);
  ASSERT_TRUE(quotas->Admit("a").ok());
  ASSERT_TRUE(quotas->Admit("b").ok());
  EXPECT_TRUE(quotas->Admit("c").ok());  // scanned: nothing idle, so the overflow bucket
  clock_.Advance(2s);                    // "a" and "b" are idle now, but the last scan...
  EXPECT_TRUE(quotas->Admit("d").ok());  // ...was 2 s ago: scanned again, both forgotten
  EXPECT_EQ(quotas->Report().tracked, 1u);
  ASSERT_TRUE(quotas->Admit("e").ok());  // the table is full again ("d", "e"), both active
  EXPECT_TRUE(quotas->Admit("f").ok());  // the last scan was now: the overflow bucket
  clock_.Advance(500ms);
  EXPECT_FALSE(quotas->Admit("g").ok());  // no scan within the second: the overflow bucket is dry
  clock_.Advance(600ms);                  // "d" and "e" refilled, and a second has passed
  EXPECT_TRUE(quotas->Admit("g").ok());
  EXPECT_EQ(quotas->Report().tracked, 1u);
}

TEST_F(ClientQuotasTest, ATinyRateAsksForADayAtMost) {
  ClientQuotas::Options options;
  options.quota.rate = 1e-12;
  options.quota.burst = 1;
  auto quotas = Make(options);
  ASSERT_TRUE(quotas->Admit("a").ok());
  const Status refused = quotas->Admit("a").status();
  ASSERT_TRUE(RetryAfter(refused).has_value());
  EXPECT_EQ(RetryAfter(refused)->count(), 86400000);
}

TEST_F(ClientQuotasTest, TheReportNamesTheBusiestClientsForGoodAndEverySeriesOnlyGrows) {
  ClientQuotas::Options options;
  options.quota.rate = 1;
  options.quota.burst = 1;
  options.named_clients = 2;
  auto quotas = Make(options);
  for (int i = 0; i < 3; ++i) (void)quotas->Admit("busy");    // 1 admitted, 2 refused
  for (int i = 0; i < 2; ++i) (void)quotas->Admit("medium");  // 1 admitted, 1 refused
  (void)quotas->Admit("quiet");
  ClientQuotaReport first = quotas->Report();
  ASSERT_EQ(first.clients.size(), 2u);
  // Named now: they count from now; what they did so far stays in "other".
  EXPECT_EQ(first.clients[0].client, "busy");
  EXPECT_EQ(first.clients[1].client, "medium");
  EXPECT_EQ(first.clients[0].admitted + first.clients[0].rate_limited, 0u);
  EXPECT_EQ(first.other.client, "other");
  EXPECT_EQ(first.other.admitted, 3u);
  EXPECT_EQ(first.other.rate_limited, 3u);
  EXPECT_EQ(first.other.in_flight, 0);  // each ticket went with its statement
  EXPECT_EQ(first.tracked, 3u);

  // Later traffic: the named clients' own series grow, "quiet" (unnamed: both names are taken)
  // stays in "other", and no series goes down.
  clock_.Advance(1s);
  ClientQuotas::Ticket busy = quotas->Admit("busy").value();
  (void)quotas->Admit("busy");
  (void)quotas->Admit("quiet");
  const ClientQuotaReport second = quotas->Report();
  ASSERT_EQ(second.clients.size(), 2u);
  EXPECT_EQ(second.clients[0].admitted, 1u);
  EXPECT_EQ(second.clients[0].rate_limited, 1u);
  EXPECT_EQ(second.clients[0].in_flight, 1);
  EXPECT_EQ(second.clients[1].admitted, 0u);
  EXPECT_GE(second.other.admitted, first.other.admitted);
  EXPECT_GE(second.other.rate_limited, first.other.rate_limited);
  EXPECT_EQ(second.other.admitted + second.other.rate_limited, 6u + 1u);  // + quiet's
}

TEST_F(ClientQuotasTest, ClientNamesAreQuotedForTheMetricsAndNeverTakeTheLabelOther) {
  ClientQuotas::Options options;
  auto quotas = Make(options);
  (void)quotas->Admit("other");
  (void)quotas->Admit("bad\nname\xc0");
  const ClientQuotaReport report = quotas->Report();
  ASSERT_EQ(report.clients.size(), 2u);
  EXPECT_EQ(report.clients[0].client, "'other'");
  EXPECT_EQ(report.clients[1].client, "bad\\x0Aname\\xC0");
}

TEST_F(ClientQuotasTest, RefusesQuotasThatAreNone) {
  ClientQuotas::Options negative;
  negative.quota.rate = -1;
  EXPECT_EQ(ClientQuotas::Create(negative).status().code(), absl::StatusCode::kInvalidArgument);
  ClientQuotas::Options tiny_burst;
  tiny_burst.clients["x"] = ClientQuota{5, 0.5, 0};
  EXPECT_NE(ClientQuotas::Create(tiny_burst).status().message().find("'x'"), std::string::npos);
  ClientQuotas::Options nobody;
  nobody.max_clients = 0;
  EXPECT_FALSE(ClientQuotas::Create(nobody).ok());
}

// Many threads admitting and releasing at once (run under TSan in the sanitizer build): every
// admission is counted once, and nothing stays in flight.
TEST_F(ClientQuotasTest, ConcurrentAdmissionsAndReleasesAddUp) {
  ClientQuotas::Options options;
  options.quota.max_in_flight = 1000;
  options.max_clients = 4;
  auto quotas = Make(options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&quotas, t] {
      for (int i = 0; i < 2000; ++i) {
        ClientQuotas::Ticket ticket =
            quotas->Admit("client-" + std::to_string((t + i) % 6)).value();
        if (i % 100 == 0) (void)quotas->Report();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const ClientQuotaReport report = quotas->Report();
  uint64_t admitted = report.other.admitted;
  int64_t in_flight = report.other.in_flight;
  for (const ClientCounts& counts : report.clients) {
    admitted += counts.admitted;
    in_flight += counts.in_flight;
  }
  EXPECT_EQ(admitted, 8000u);  // "other" takes what named clients did before their naming
  EXPECT_EQ(in_flight, 0);
}

}  // namespace
}  // namespace sluice
