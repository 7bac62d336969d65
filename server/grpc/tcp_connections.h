// The TCP connections gRPC accepted, found by the peer string gRPC reports for a call
// ("ipv4:127.0.0.1:50123", "ipv6:[::1]:50123"), so that a batch's answers to one connection can
// be held back and sent together (core/output_sink.h AnswerConnection): TCP_CORK on the socket
// while the worker runs the batch's completions, one push when it is lifted. gRPC does not
// expose the socket of a call, so the registry finds it itself: a peer it has not seen makes it
// look at every socket of the process (/proc/self/fd: SO_TYPE, getsockname, getpeername) and
// remember each connected TCP socket on one of the gRPC ports by its peer address. The look runs
// on the thread that asked (a worker, before its batch's answers), outside the registry's lock,
// at most once per kRescanInterval, so that connections that come and go cannot make it
// expensive: it costs three system calls per descriptor of the process.
//
// Holding never changes what is sent, only when: Hold first checks that the descriptor still is
// a TCP socket connected to that peer (gRPC may have closed it, and the number may have been
// reused), and does nothing otherwise (the entry is then dropped, and found again at the next
// look); Release lifts the cork, which sends at once whatever was held, whoever wrote it (another
// worker's answer, gRPC's own frames). So anything written to a held connection waits at most
// until the holding worker has run its batch's completions (and never past the kernel's own
// 200 ms bound on a cork). The check and the setsockopt are not atomic against gRPC closing the
// socket: in that window a reused descriptor could be corked until Release, which delays that
// socket's data by as much and changes nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/core/output_sink.h"

namespace sluice {

class TcpConnections {
 public:
  static constexpr std::chrono::milliseconds kRescanInterval{100};

  // `clock` (null: the steady clock) times the looks; it outlives the registry.
  explicit TcpConnections(const TimeSource* clock = nullptr)
      : clock_(clock != nullptr ? clock : &steady_) {}
  TcpConnections(const TcpConnections&) = delete;
  TcpConnections& operator=(const TcpConnections&) = delete;

  // The connection whose peer is `peer` (gRPC's ServerContext::peer()), or null: not TCP
  // ("unix:..."), not parseable, or no such socket in this process (or not yet seen, and the
  // last look was less than kRescanInterval ago). Thread-safe.
  std::shared_ptr<AnswerConnection> Find(absl::string_view peer);

  // The local ports gRPC listens on: only connections to one of them are remembered (the
  // process's other sockets, HTTP's or outgoing ones, may share a client's address and port).
  // Empty (the default, until the server has bound its port): any local port. Thread-safe.
  void SetListeningPorts(std::vector<int> ports);

  // How many times the process's sockets were looked through, and how many holds of a found
  // connection took (its socket checked and corked): what tests and benchmarks read.
  int scans() const;
  int64_t holds() const { return holds_->load(std::memory_order_relaxed); }

 private:
  class CorkedSocket;  // the AnswerConnection of one remembered socket (tcp_connections.cc)
  using Known = absl::flat_hash_map<std::string, std::shared_ptr<CorkedSocket>>;
  // Every connected TCP socket of the process on `ports` (any when empty), by its peer address
  // (the key format of PeerKey); a socket `previous` already knew keeps its object.
  Known Scan(const std::vector<int>& ports, const Known& previous) const;

  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  // Shared with the connections handed out, which may outlive a Find's registry entry.
  const std::shared_ptr<std::atomic<int64_t>> holds_ = std::make_shared<std::atomic<int64_t>>(0);
  mutable Mutex mutex_;
  Known known_ ABSL_GUARDED_BY(mutex_);
  std::vector<int> ports_ ABSL_GUARDED_BY(mutex_);
  TimePoint last_scan_ ABSL_GUARDED_BY(mutex_){};
  int scans_ ABSL_GUARDED_BY(mutex_) = 0;
};

// The peer address of gRPC's peer string as a key comparable with a socket's getpeername
// (family, address bytes, port); empty when it is not an IPv4 or IPv6 peer. Exposed for tests.
std::string PeerKey(absl::string_view peer);

}  // namespace sluice
