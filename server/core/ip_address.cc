#include "server/core/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#include "server/core/percent_decode.h"

namespace sluice {
namespace {

constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

}  // namespace

std::optional<IpAddress> IpAddress::Parse(absl::string_view text) {
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  const std::string terminated(text);
  IpAddress address;
  if (text.find(':') == absl::string_view::npos) {
    if (inet_pton(AF_INET, terminated.c_str(), address.bytes_.data()) != 1) return std::nullopt;
    return address;
  }
  if (inet_pton(AF_INET6, terminated.c_str(), address.bytes_.data()) != 1) return std::nullopt;
  if (std::memcmp(address.bytes_.data(), kMappedPrefix, sizeof(kMappedPrefix)) == 0) {
    std::memmove(address.bytes_.data(), address.bytes_.data() + 12, 4);
    std::memset(address.bytes_.data() + 4, 0, 12);
    return address;
  }
  address.family_ = Family::kV6;
  return address;
}

std::optional<IpAddress> IpAddress::FromSockaddr(const sockaddr* address, socklen_t length) {
  if (address == nullptr) return std::nullopt;
  IpAddress out;
  if (address->sa_family == AF_INET && length >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    std::memcpy(out.bytes_.data(), &v4->sin_addr, 4);
    return out;
  }
  if (address->sa_family == AF_INET6 && length >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&v6->sin6_addr);
    if (std::memcmp(bytes, kMappedPrefix, sizeof(kMappedPrefix)) == 0) {
      std::memcpy(out.bytes_.data(), bytes + 12, 4);
      return out;
    }
    out.family_ = Family::kV6;
    std::memcpy(out.bytes_.data(), bytes, 16);
    return out;
  }
  return std::nullopt;
}

std::optional<IpAddress> IpAddress::FromGrpcPeer(absl::string_view peer) {
  if (!absl::ConsumePrefix(&peer, "ipv4:") && !absl::ConsumePrefix(&peer, "ipv6:"))
    return std::nullopt;
  const std::optional<std::string> decoded = PercentDecode(peer);
  if (!decoded) return std::nullopt;
  absl::string_view host = *decoded;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t end = host.find(']');
    if (end == absl::string_view::npos) return std::nullopt;
    host = host.substr(0, end);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != absl::string_view::npos) host = host.substr(0, colon);
  }
  return Parse(host);
}

std::string IpAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family_ == Family::kV4 ? AF_INET : AF_INET6, bytes_.data(), text, sizeof(text));
  return text;
}

StatusOr<IpNetwork> IpNetwork::Parse(absl::string_view text) {
  const absl::string_view original = text;
  text = absl::StripAsciiWhitespace(text);
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", original, "' is not a network (", why,
                                                   "); write an address or address/prefix, "
                                                   "e.g. 10.0.0.0/8 or fd00::/8"));
  };
  const size_t slash = text.find('/');
  std::optional<IpAddress> base = IpAddress::Parse(text.substr(0, slash));
  if (!base) return refuse("no IPv4 or IPv6 address before the prefix");
  const int bits = base->family() == IpAddress::Family::kV4 ? 32 : 128;
  int prefix = bits;
  if (slash != absl::string_view::npos) {
    const absl::string_view digits = text.substr(slash + 1);
    if (digits.empty() || digits.size() > 3 ||
        digits.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(digits, &prefix) || prefix > bits) {
      return refuse(absl::StrCat("the prefix must be a number from 0 to ", bits));
    }
  }
  return Of(*base, prefix);
}

IpNetwork IpNetwork::Of(const IpAddress& address, int prefix) {
  const int bits = address.family() == IpAddress::Family::kV4 ? 32 : 128;
  prefix = std::max(0, std::min(prefix, bits));
  IpAddress base = address;
  // The base keeps only the prefix's bits, so that 10.1.2.3/8 is 10.0.0.0/8.
  for (int bit = prefix; bit < 128; ++bit)
    base.bytes_[bit / 8] &= static_cast<uint8_t>(~(0x80u >> (bit % 8)));
  return IpNetwork(base, prefix);
}

StatusOr<std::vector<IpNetwork>> IpNetwork::ParseList(absl::string_view text) {
  std::vector<IpNetwork> networks;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (absl::StripAsciiWhitespace(item).empty()) continue;
    StatusOr<IpNetwork> network = Parse(item);
    if (!network.ok()) return network.status();
    networks.push_back(*network);
  }
  return networks;
}

bool IpNetwork::Contains(const IpAddress& address) const {
  if (address.family_ != base_.family_) return false;
  for (int bit = 0; bit < prefix_; bit += 8) {
    const int take = prefix_ - bit >= 8 ? 8 : prefix_ - bit;
    const auto mask = static_cast<uint8_t>(0xffu << (8 - take));
    if ((address.bytes_[bit / 8] & mask) != base_.bytes_[bit / 8]) return false;
  }
  return true;
}

std::string IpNetwork::ToString() const { return absl::StrCat(base_.ToString(), "/", prefix_); }

}  // namespace sluice
