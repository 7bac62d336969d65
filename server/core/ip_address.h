// Network addresses of peers, for deciding whom to trust (--trusted-proxies) and whom to count
// (client quotas): an IPv4 or IPv6 address, and a network (CIDR block) that may contain it.
// An IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a dual-stack socket reports for an IPv4
// peer) is the IPv4 address: it matches IPv4 networks and prints as a.b.c.d.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "server/core/status.h"

namespace sluice {

class IpAddress {
 public:
  enum class Family : uint8_t { kV4, kV6 };

  // "10.1.2.3", "::1", "fe80::1" (no brackets, no port, no zone); nullopt when it is none.
  static std::optional<IpAddress> Parse(absl::string_view text);
  // An AF_INET or AF_INET6 socket address; nullopt for any other family (a Unix socket).
  static std::optional<IpAddress> FromSockaddr(const sockaddr* address, socklen_t length);
  // A gRPC peer string: "ipv4:10.1.2.3:5000", "ipv6:[::1]:5000" (the host may be
  // percent-encoded, as newer gRPC writes it); nullopt for "unix:..." and anything else.
  static std::optional<IpAddress> FromGrpcPeer(absl::string_view peer);

  Family family() const { return family_; }
  // Canonical text: dotted quad, or RFC 5952 (inet_ntop's) for IPv6.
  std::string ToString() const;
  bool operator==(const IpAddress& other) const {
    return family_ == other.family_ && bytes_ == other.bytes_;
  }

 private:
  friend class IpNetwork;
  IpAddress() = default;
  Family family_ = Family::kV4;
  std::array<uint8_t, 16> bytes_{};  // network order; IPv4 in the first 4
};

class IpNetwork {
 public:
  // "10.0.0.0/8", "fd00::/8", or a single address ("10.1.2.3": /32, "::1": /128).
  // INVALID_ARGUMENT naming the text when it is no network, or the prefix is too long.
  static StatusOr<IpNetwork> Parse(absl::string_view text);
  // The network of `prefix` bits (clamped to the family's width) that holds `address`.
  static IpNetwork Of(const IpAddress& address, int prefix);
  // "a/b,c/d" (spaces around items allowed); INVALID_ARGUMENT naming the bad item.
  static StatusOr<std::vector<IpNetwork>> ParseList(absl::string_view text);

  bool Contains(const IpAddress& address) const;
  std::string ToString() const;

 private:
  IpNetwork(IpAddress base, int prefix) : base_(base), prefix_(prefix) {}
  IpAddress base_;
  int prefix_ = 0;
};

}  // namespace sluice
