// One admission policy for every scheduler. A request waiting in a queue counts against its
// model version's request cap (max_queue_size), the version's byte cap (sluice.max_queued_bytes)
// and the server-wide byte budget (--max-queued-bytes) from admission until it leaves the queue
// (it starts running, expires, is cancelled or is dropped). Past a cap the request is refused
// UNAVAILABLE with a message naming the cap. The queue timeout is the policy's other half and
// applies to every scheduler alike: ModelHandle::Submit narrows each request's deadline to it, and
// every scheduler answers a request whose deadline passes while it waits.
//
// A scheduler may keep its waiting requests in shares, each capped on its own: the sequence
// batcher keeps the requests of sequences that wait for a slot apart from those of sequences bound
// to one, so that waiting sequences can never keep bound ones from reaching their end (which is
// what frees slots). The server budget is one for all shares and all models.
//
// Not thread-safe: a scheduler calls it under its own lock (the server budget is atomic).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

#include "server/core/status.h"

namespace sluice {

// A server-wide cap on the input bytes waiting in all queues. Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(size_t limit) : limit_(limit) {}
  bool TryAcquire(size_t bytes);
  void Release(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t limit() const { return limit_; }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
};

class Admission {
 public:
  struct Options {
    size_t max_requests = 1024;     // waiting requests per share (max_queue_size)
    size_t max_bytes = 256u << 20;  // waiting input bytes per share (sluice.max_queued_bytes)
    std::shared_ptr<ByteBudget>
        server_budget;  // --max-queued-bytes, shared by every model; may be null
    int shares = 1;     // see above
    // Each share's request cap (index: share); empty: max_requests for every share.
    std::vector<size_t> share_max_requests = {};
    // The byte cap holds for all shares together (priority levels), not for each (sequences).
    bool bytes_across_shares = false;
  };
  // The refusal when `share` holds max_requests already (its words are the scheduler's: what
  // waits there); `waiting` is that count.
  using CountRefusal = absl::FunctionRef<Status(size_t waiting)>;

  explicit Admission(Options options);
  ~Admission();  // gives what is still counted back to the server budget
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Counts a request of `bytes` for `model` (named in refusals) into `share`, or returns why not. A
  // request larger than max_bytes alone is admitted into an empty share: otherwise it could never
  // run, and "retry later" would be a lie (the share's bytes stay bounded by the larger of the cap
  // and one request, itself bounded by the transport's message limit).
  Status Admit(int share, size_t bytes, absl::string_view model, CountRefusal count_refusal);
  // A request that was admitted left the queue.
  void Release(int share, size_t bytes);
  // Admitted requests move to another share (a sequence got a slot); no cap is checked: they
  // were admitted already.
  void Move(int from, int to, size_t requests, size_t bytes);
  // Every request left the queue (the scheduler answered them all).
  void ReleaseAll();

  size_t requests(int share = 0) const { return shares_[share].requests; }
  size_t bytes(int share = 0) const { return shares_[share].bytes; }
  size_t total_requests() const;
  size_t total_bytes() const;

 private:
  struct Share {
    size_t requests = 0;
    size_t bytes = 0;
  };
  const Options options_;
  std::vector<Share> shares_;
};

}  // namespace sluice
