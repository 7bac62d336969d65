#include "server/grpc/tcp_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

// family, then the address bytes, then the port (network order): the same for the peer string
// and the socket's own getpeername (an IPv4-mapped IPv6 address keys as the IPv4 one).
std::string KeyOf(const sockaddr_storage& address) {
  std::string key;
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    key.push_back('4');
    key.append(reinterpret_cast<const char*>(&in.sin_addr), sizeof(in.sin_addr));
    key.append(reinterpret_cast<const char*>(&in.sin_port), sizeof(in.sin_port));
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      // A dual-stack listener's IPv4 client: gRPC names it "ipv4:a.b.c.d:port".
      key.push_back('4');
      key.append(reinterpret_cast<const char*>(&in6.sin6_addr) + 12, 4);
      key.append(reinterpret_cast<const char*>(&in6.sin6_port), sizeof(in6.sin6_port));
      return key;
    }
    key.push_back('6');
    key.append(reinterpret_cast<const char*>(&in6.sin6_addr), sizeof(in6.sin6_addr));
    key.append(reinterpret_cast<const char*>(&in6.sin6_port), sizeof(in6.sin6_port));
  }
  return key;
}

// The key of socket `fd`'s peer when it is a connected TCP socket; empty otherwise.
std::string SocketPeerKey(int fd) {
  int type = 0;
  socklen_t type_length = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 || type != SOCK_STREAM)
    return {};
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {};
  return KeyOf(address);
}

// The local port of socket `fd`, or -1.
int LocalPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return -1;
}

}  // namespace

std::string PeerKey(absl::string_view peer) {
  sockaddr_storage address{};
  absl::string_view host;
  absl::string_view port;
  std::string unescaped;
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    if (colon == absl::string_view::npos) return {};
    host = peer.substr(0, colon);
    port = peer.substr(colon + 1);
    address.ss_family = AF_INET;
  } else if (absl::ConsumePrefix(&peer, "ipv6:")) {
    // "[::1]:50123", or URI-escaped "%5B::1%5D:50123" (newer gRPC releases)
    unescaped = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}, {"%25", "%"}});
    absl::string_view text = unescaped;
    if (!absl::ConsumePrefix(&text, "[")) return {};
    const size_t close = text.find("]:");
    if (close == absl::string_view::npos) return {};
    host = text.substr(0, close);
    port = text.substr(close + 2);
    if (const size_t scope = host.find('%'); scope != absl::string_view::npos)
      host = host.substr(0, scope);
    address.ss_family = AF_INET6;
  } else {
    return {};
  }
  uint32_t port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number > 65535) return {};
  const std::string host_text(host);
  if (address.ss_family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(address);
    if (inet_pton(AF_INET, host_text.c_str(), &in.sin_addr) != 1) return {};
    in.sin_port = htons(static_cast<uint16_t>(port_number));
  } else {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(address);
    if (inet_pton(AF_INET6, host_text.c_str(), &in6.sin6_addr) != 1) return {};
    in6.sin6_port = htons(static_cast<uint16_t>(port_number));
  }
  return KeyOf(address);
}

class TcpConnections::CorkedSocket final : public AnswerConnection {
 public:
  CorkedSocket(int fd, std::string key, std::shared_ptr<std::atomic<int64_t>> holds)
      : fd_(fd), key_(std::move(key)), holds_(std::move(holds)) {}

  // Only while the descriptor still is the socket found (gRPC may have closed it and the number
  // been reused). Two workers holding the same connection at once each set and lift the cork;
  // the first lift sends what both held so far.
  bool Hold() override {
    if (SocketPeerKey(fd_) != key_ || !SetCork(1)) {
      stale_.store(true, std::memory_order_relaxed);
      return false;
    }
    holds_->fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  void Release() override { SetCork(0); }

  int fd() const { return fd_; }
  // A hold found the descriptor no longer this connection: forget it, look again.
  bool stale() const { return stale_.load(std::memory_order_relaxed); }

 private:
  bool SetCork(int on) const {
    return setsockopt(fd_, IPPROTO_TCP, TCP_CORK, &on, sizeof(on)) == 0;
  }

  const int fd_;
  const std::string key_;
  const std::shared_ptr<std::atomic<int64_t>> holds_;
  std::atomic<bool> stale_{false};
};

std::shared_ptr<AnswerConnection> TcpConnections::Find(absl::string_view peer) {
  const std::string key = PeerKey(peer);
  if (key.empty()) return nullptr;
  std::vector<int> ports;
  Known previous;
  {
    MutexLock lock(&mutex_);
    if (auto found = known_.find(key); found != known_.end()) {
      if (!found->second->stale()) return found->second;
      known_.erase(found);
    }
    const TimePoint now = clock_->Now();
    if (scans_ > 0 && now - last_scan_ < kRescanInterval) return nullptr;
    last_scan_ = now;
    ++scans_;
    ports = ports_;
    previous = known_;
  }
  // Outside the lock: other workers keep finding what is known meanwhile.
  Known scanned = Scan(ports, previous);
  std::shared_ptr<CorkedSocket> connection;
  if (auto found = scanned.find(key); found != scanned.end()) connection = found->second;
  MutexLock lock(&mutex_);
  known_ = std::move(scanned);
  return connection;
}

void TcpConnections::SetListeningPorts(std::vector<int> ports) {
  MutexLock lock(&mutex_);
  ports_ = std::move(ports);
  known_.clear();  // what was remembered before may be on other ports
}

int TcpConnections::scans() const {
  MutexLock lock(&mutex_);
  return scans_;
}

TcpConnections::Known TcpConnections::Scan(const std::vector<int>& ports,
                                           const Known& previous) const {
  // Connections that closed since the last look are forgotten here (a reused descriptor is
  // found again under its new peer).
  Known known;
  DIR* directory = opendir("/proc/self/fd");
  if (directory == nullptr) return known;
  const int own = dirfd(directory);
  while (const dirent* entry = readdir(directory)) {
    int fd = 0;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
    std::string key = SocketPeerKey(fd);
    if (key.empty()) continue;
    if (!ports.empty() && std::find(ports.begin(), ports.end(), LocalPort(fd)) == ports.end())
      continue;
    if (auto old = previous.find(key); old != previous.end()) {
      if (old->second->fd() == fd && !old->second->stale()) {
        known.emplace(std::move(key),
                      old->second);  // the same object: a batch that holds it dedupes by it
        continue;
      }
    }
    auto connection = std::make_shared<CorkedSocket>(fd, key, holds_);
    known.emplace(std::move(key), std::move(connection));
  }
  closedir(directory);
  return known;
}

}  // namespace sluice
