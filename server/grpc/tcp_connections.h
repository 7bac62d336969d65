// The TCP connections gRPC accepted, found by the peer string gRPC reports for a call
// ("ipv4:127.0.0.1:50123", "ipv6:[::1]:50123"), so that a batch's answers to one connection can
// be held back and sent together (core/output_sink.h AnswerConnection): TCP_CORK on the socket
// while the worker finishes the calls, one push when it is lifted. gRPC does not expose the
// socket of a call, so the registry finds it itself: a peer it has not seen makes it look at
// every socket of the process (/proc/self/fd, getpeername) and remember each connected TCP
// socket by its peer address; at most one such look per kRescanInterval, so that connections
// that come and go cannot make it expensive.
//
// Holding never changes what is sent, only when: Hold first checks that the descriptor still is
// a TCP socket connected to that peer (gRPC may have closed it, and the number may have been
// reused), and does nothing otherwise; Release lifts the cork, which sends at once whatever was
// held, whoever wrote it. The check and the setsockopt are not atomic against gRPC closing the
// socket: in that window a reused descriptor could be corked for the few microseconds until
// Release, which delays that socket's data by as much and changes nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

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
  explicit TcpConnections(const TimeSource* clock = nullptr) : clock_(clock != nullptr ? clock : &steady_) {}
  TcpConnections(const TcpConnections&) = delete;
  TcpConnections& operator=(const TcpConnections&) = delete;

  static constexpr size_t kMaxRemembered = 4096;  // past this the memory is forgotten and rebuilt

  // The connection whose peer is `peer` (gRPC's ServerContext::peer()), or null: not TCP
  // ("unix:..."), not parseable, or no such socket in this process (or not yet seen, and the
  // last look was less than kRescanInterval ago). Thread-safe.
  std::shared_ptr<AnswerConnection> Find(absl::string_view peer);

  // How many times the process's sockets were looked through, and how many holds of a found
  // connection took (its socket checked and corked): what tests and benchmarks read.
  int scans() const;
  int64_t holds() const { return holds_->load(std::memory_order_relaxed); }

 private:
  // Remembers every connected TCP socket of the process by its peer address (the key format of
  // PeerKey). Called with mutex_ held.
  void ScanLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  // Shared with the connections handed out, which may outlive a Find's registry entry.
  const std::shared_ptr<std::atomic<int64_t>> holds_ = std::make_shared<std::atomic<int64_t>>(0);
  mutable Mutex mutex_;
  absl::flat_hash_map<std::string, std::shared_ptr<AnswerConnection>> known_ ABSL_GUARDED_BY(mutex_);
  TimePoint last_scan_ ABSL_GUARDED_BY(mutex_){};
  int scans_ ABSL_GUARDED_BY(mutex_) = 0;
};

// The peer address of gRPC's peer string as a key comparable with a socket's getpeername
// (family, address bytes, port); empty when it is not an IPv4 or IPv6 peer. Exposed for tests.
std::string PeerKey(absl::string_view peer);

}  // namespace sluice
