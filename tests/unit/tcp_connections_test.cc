// The registry of gRPC's TCP connections on real loopback sockets: peer strings as gRPC writes
// them, finding an accepted socket, corking it while held, and what happens once it is gone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "server/grpc/tcp_connections.h"

namespace sluice {
namespace {

// A listening socket and one connection to it: the accepted (server) end and the client's.
struct Loopback {
  explicit Loopback(int family) {
    listener = socket(family, SOCK_STREAM, 0);
    if (listener < 0) return;  // no IPv6 here: the caller skips
    if (family == AF_INET6) {
      const int off = 0;  // dual stack whatever net.ipv6.bindv6only says
      EXPECT_EQ(setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)), 0);
    }
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET) {
      auto& in = reinterpret_cast<sockaddr_in&>(address);
      in.sin_family = AF_INET;
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      length = sizeof(in);
    } else {
      auto& in6 = reinterpret_cast<sockaddr_in6&>(address);
      in6.sin6_family = AF_INET6;
      in6.sin6_addr = in6addr_any;  // dual stack: an IPv4 client shows as ::ffff:127.0.0.1
      length = sizeof(in6);
    }
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in&>(address).sin_port
                                   : reinterpret_cast<sockaddr_in6&>(address).sin6_port);
    client = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(port);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    accepted = accept(listener, nullptr, nullptr);
    sockaddr_in own{};
    socklen_t own_length = sizeof(own);
    EXPECT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&own), &own_length), 0);
    peer = absl::StrCat("ipv4:127.0.0.1:", ntohs(own.sin_port));  // as gRPC names the client
  }
  ~Loopback() {
    for (int fd : {client, accepted, listener}) {
      if (fd >= 0) close(fd);
    }
  }
  int Corked() const {
    int on = -1;
    socklen_t length = sizeof(on);
    EXPECT_EQ(getsockopt(accepted, IPPROTO_TCP, TCP_CORK, &on, &length), 0);
    return on;
  }

  int listener = -1, client = -1, accepted = -1;
  int port = 0;  // the listener's
  std::string peer;
};

TEST(TcpConnectionsTest, PeerKeysReadGrpcsPeerStrings) {
  EXPECT_FALSE(PeerKey("ipv4:127.0.0.1:50123").empty());
  EXPECT_EQ(PeerKey("ipv4:127.0.0.1:50123"), PeerKey("ipv4:127.0.0.1:50123"));
  EXPECT_NE(PeerKey("ipv4:127.0.0.1:50123"), PeerKey("ipv4:127.0.0.1:50124"));
  EXPECT_NE(PeerKey("ipv4:127.0.0.1:50123"), PeerKey("ipv4:127.0.0.2:50123"));
  EXPECT_FALSE(PeerKey("ipv6:[::1]:50123").empty());
  EXPECT_EQ(PeerKey("ipv6:[::1]:50123"),
            PeerKey("ipv6:%5B::1%5D:50123"));  // URI-escaped, newer gRPC
  EXPECT_EQ(PeerKey("ipv6:[fe80::1%25eth0]:7"),
            PeerKey("ipv6:[fe80::1]:7"));  // the scope is not compared
  EXPECT_NE(PeerKey("ipv6:[::1]:50123"), PeerKey("ipv4:127.0.0.1:50123"));
  for (const char* peer : {"unix:/tmp/socket", "", "ipv4:", "ipv4:127.0.0.1", "ipv4:127.0.0.1:port",
                           "ipv4:127.0.0.1:70000", "ipv4:300.0.0.1:1", "ipv6:::1:5", "ipv6:[::1]",
                           "ipv6:[zz]:1", "dns:localhost:1"}) {
    EXPECT_TRUE(PeerKey(peer).empty()) << peer;
  }
}

TEST(TcpConnectionsTest, FindsAnAcceptedConnectionAndCorksItWhileHeld) {
  for (int family : {AF_INET, AF_INET6}) {
    SCOPED_TRACE(family == AF_INET ? "IPv4 listener" : "dual-stack IPv6 listener");
    Loopback loopback(family);
    if (loopback.listener < 0) GTEST_SKIP() << "no IPv6 sockets here";
    TcpConnections connections;
    std::shared_ptr<AnswerConnection> connection = connections.Find(loopback.peer);
    ASSERT_NE(connection, nullptr);
    EXPECT_EQ(connections.Find(loopback.peer), connection);  // remembered: no second look
    EXPECT_EQ(connections.scans(), 1);
    EXPECT_EQ(loopback.Corked(), 0);
    ASSERT_TRUE(connection->Hold());
    EXPECT_EQ(loopback.Corked(), 1);
    connection->Release();
    EXPECT_EQ(loopback.Corked(), 0);
    EXPECT_EQ(connections.holds(), 1);
  }
}

TEST(TcpConnectionsTest, WhatHeldWritesSendIsUnchangedAndLeavesOnRelease) {
  Loopback loopback(AF_INET);
  TcpConnections connections;
  std::shared_ptr<AnswerConnection> connection = connections.Find(loopback.peer);
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection->Hold());
  const auto written = std::chrono::steady_clock::now();
  ASSERT_EQ(write(loopback.accepted, "abc", 3), 3);
  ASSERT_EQ(write(loopback.accepted, "de", 2), 2);
  char buffer[16];
  const ssize_t early = recv(loopback.client, buffer, sizeof(buffer), MSG_DONTWAIT);
  // Held back, unless this thread stalled past the kernel's own limit on a cork (200 ms).
  if (std::chrono::steady_clock::now() - written < std::chrono::milliseconds(150))
    EXPECT_EQ(early, -1);
  std::string received =
      early > 0 ? std::string(buffer, static_cast<size_t>(early)) : std::string();
  connection->Release();
  while (received.size() < 5) {
    const ssize_t n = recv(loopback.client, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0);
    received.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(received, "abcde");
}

TEST(TcpConnectionsTest, AClosedConnectionIsNotHeldAndUnknownPeersLookAgainAtMostEveryInterval) {
  FakeTimeSource clock;
  TcpConnections connections(&clock);
  std::shared_ptr<AnswerConnection> connection;
  {
    Loopback loopback(AF_INET);
    connection = connections.Find(loopback.peer);
    ASSERT_NE(connection, nullptr);
  }  // gRPC closed it
  EXPECT_FALSE(connection->Hold());
  connection->Release();  // harmless
  EXPECT_EQ(connections.holds(), 0);

  EXPECT_EQ(connections.Find("unix:/tmp/x"), nullptr);  // not TCP: no look at all
  EXPECT_EQ(connections.scans(), 1);
  EXPECT_EQ(connections.Find("ipv4:127.0.0.9:1"), nullptr);  // unknown, and looked at just now
  EXPECT_EQ(connections.scans(), 1);
  Loopback later(AF_INET);
  EXPECT_EQ(connections.Find(later.peer), nullptr);  // a new connection waits for the next look
  clock.Advance(TcpConnections::kRescanInterval);
  EXPECT_NE(connections.Find(later.peer), nullptr);
  EXPECT_EQ(connections.scans(), 2);
}

TEST(TcpConnectionsTest, OnlyConnectionsToTheListeningPortsAreFound) {
  Loopback grpc(AF_INET), other(AF_INET);
  TcpConnections connections;
  connections.SetListeningPorts({grpc.port});
  EXPECT_NE(connections.Find(grpc.peer), nullptr);
  EXPECT_EQ(connections.scans(), 1);
  EXPECT_EQ(connections.Find(other.peer), nullptr);  // another port's socket (HTTP's, say)
}

TEST(TcpConnectionsTest, AConnectionFoundStaleIsLookedForAgainAndOneStillOpenKeepsItsObject) {
  FakeTimeSource clock;
  TcpConnections connections(&clock);
  Loopback kept(AF_INET);
  std::shared_ptr<AnswerConnection> first = connections.Find(kept.peer);
  ASSERT_NE(first, nullptr);
  auto closed = std::make_unique<Loopback>(AF_INET);
  const std::string closed_peer = closed->peer;
  clock.Advance(TcpConnections::kRescanInterval);
  std::shared_ptr<AnswerConnection> gone = connections.Find(closed_peer);  // a second look
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(connections.scans(), 2);
  EXPECT_EQ(connections.Find(kept.peer), first);  // the look kept the open connection's object
  closed.reset();
  EXPECT_FALSE(gone->Hold());  // closed: marked stale
  clock.Advance(TcpConnections::kRescanInterval);
  EXPECT_EQ(connections.Find(closed_peer), nullptr);  // dropped, looked for again, not there
  EXPECT_EQ(connections.scans(), 3);
  EXPECT_EQ(connections.Find(kept.peer), first);
}

}  // namespace
}  // namespace sluice
