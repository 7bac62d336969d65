// Peer addresses and networks: parsing, gRPC's peer strings, IPv4-mapped IPv6, containment.
#include "server/core/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(IpAddressTest, ParsesBothFamiliesAndPrintsThemCanonically) {
  EXPECT_EQ(IpAddress::Parse("10.1.2.3")->ToString(), "10.1.2.3");
  EXPECT_EQ(IpAddress::Parse("10.1.2.3")->family(), IpAddress::Family::kV4);
  EXPECT_EQ(IpAddress::Parse("2001:DB8:0:0::1")->ToString(), "2001:db8::1");
  EXPECT_EQ(IpAddress::Parse("::1")->family(), IpAddress::Family::kV6);
  // A dual-stack socket's view of an IPv4 peer is that peer.
  EXPECT_EQ(IpAddress::Parse("::ffff:192.0.2.9")->ToString(), "192.0.2.9");
  EXPECT_EQ(*IpAddress::Parse("::ffff:192.0.2.9"), *IpAddress::Parse("192.0.2.9"));
  for (const char* bad :
       {"", "10.1.2", "10.1.2.256", "host", "[::1]", "::1%eth0", "1.2.3.4:80", " 1.2.3.4"}) {
    EXPECT_FALSE(IpAddress::Parse(bad).has_value()) << bad;
  }
}

TEST(IpAddressTest, ReadsGrpcPeersOfBothFamiliesAndNoUnixSocket) {
  EXPECT_EQ(IpAddress::FromGrpcPeer("ipv4:127.0.0.1:54321")->ToString(), "127.0.0.1");
  EXPECT_EQ(IpAddress::FromGrpcPeer("ipv6:[::1]:54321")->ToString(), "::1");
  EXPECT_EQ(IpAddress::FromGrpcPeer("ipv6:%5B::1%5D:54321")->ToString(), "::1");
  EXPECT_EQ(IpAddress::FromGrpcPeer("ipv6:[::ffff:10.0.0.5]:1")->ToString(), "10.0.0.5");
  EXPECT_FALSE(IpAddress::FromGrpcPeer("unix:/tmp/sock").has_value());
  EXPECT_FALSE(IpAddress::FromGrpcPeer("ipv6:[::1:54321").has_value());
  EXPECT_FALSE(IpAddress::FromGrpcPeer("10.0.0.1:5").has_value());
}

TEST(IpAddressTest, ReadsSocketAddressesAndRefusesOtherFamilies) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  inet_pton(AF_INET, "192.0.2.1", &v4.sin_addr);
  EXPECT_EQ(IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&v4), sizeof(v4))->ToString(),
            "192.0.2.1");
  sockaddr_in6 mapped{};
  mapped.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::ffff:192.0.2.1", &mapped.sin6_addr);
  EXPECT_EQ(
      IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&mapped), sizeof(mapped))->ToString(),
      "192.0.2.1");
  EXPECT_FALSE(IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&v4), 4).has_value());
  sockaddr unix_socket{};
  unix_socket.sa_family = AF_UNIX;
  EXPECT_FALSE(IpAddress::FromSockaddr(&unix_socket, sizeof(unix_socket)).has_value());
  EXPECT_FALSE(IpAddress::FromSockaddr(nullptr, 0).has_value());
}

TEST(IpNetworkTest, ContainsAddressesUnderItsPrefixOnly) {
  const IpNetwork private_a = IpNetwork::Parse("10.0.0.0/8").value();
  EXPECT_TRUE(private_a.Contains(*IpAddress::Parse("10.255.1.2")));
  EXPECT_FALSE(private_a.Contains(*IpAddress::Parse("11.0.0.1")));
  EXPECT_FALSE(private_a.Contains(*IpAddress::Parse("::ffff:b00:1")));  // 11.0.0.1
  EXPECT_TRUE(private_a.Contains(*IpAddress::Parse("::ffff:a00:1")));   // 10.0.0.1
  // The base keeps only the prefix's bits; odd prefixes cut inside a byte.
  EXPECT_EQ(IpNetwork::Parse("10.1.2.3/8")->ToString(), "10.0.0.0/8");
  const IpNetwork odd = IpNetwork::Parse("192.168.0.0/23").value();
  EXPECT_TRUE(odd.Contains(*IpAddress::Parse("192.168.1.200")));
  EXPECT_FALSE(odd.Contains(*IpAddress::Parse("192.168.2.1")));
  // A single address is a /32 or /128; /0 is everything of its family.
  EXPECT_TRUE(IpNetwork::Parse("127.0.0.1")->Contains(*IpAddress::Parse("127.0.0.1")));
  EXPECT_FALSE(IpNetwork::Parse("127.0.0.1")->Contains(*IpAddress::Parse("127.0.0.2")));
  EXPECT_TRUE(IpNetwork::Parse("0.0.0.0/0")->Contains(*IpAddress::Parse("8.8.8.8")));
  EXPECT_FALSE(IpNetwork::Parse("0.0.0.0/0")->Contains(*IpAddress::Parse("::1")));
  const IpNetwork ula = IpNetwork::Parse("fd00::/8").value();
  EXPECT_TRUE(ula.Contains(*IpAddress::Parse("fd12:3456::1")));
  EXPECT_FALSE(ula.Contains(*IpAddress::Parse("fe80::1")));
  EXPECT_FALSE(ula.Contains(*IpAddress::Parse("10.0.0.1")));
}

TEST(IpNetworkTest, TheNetworkOfAnAddressKeepsItsPrefixBits) {
  EXPECT_EQ(IpNetwork::Of(*IpAddress::Parse("2001:db8:1:2:aaaa::7"), 64).ToString(),
            "2001:db8:1:2::/64");
  EXPECT_EQ(IpNetwork::Of(*IpAddress::Parse("10.1.2.3"), 24).ToString(), "10.1.2.0/24");
  EXPECT_EQ(IpNetwork::Of(*IpAddress::Parse("10.1.2.3"), 64).ToString(), "10.1.2.3/32");
  EXPECT_TRUE(
      IpNetwork::Of(*IpAddress::Parse("fd00::1"), 64).Contains(*IpAddress::Parse("fd00::2")));
}

TEST(IpNetworkTest, RefusesWhatIsNoNetworkNamingIt) {
  for (const char* bad : {"10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8x",
                          "example.com/8", "/8", ""}) {
    const StatusOr<IpNetwork> parsed = IpNetwork::Parse(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << parsed.status().message();
  }
  const auto list = IpNetwork::ParseList(" 10.0.0.0/8 , fd00::/8,,127.0.0.1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 3u);
  EXPECT_FALSE(IpNetwork::ParseList("10.0.0.0/8,nope").ok());
}

}  // namespace
}  // namespace sluice
