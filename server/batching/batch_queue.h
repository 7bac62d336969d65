// The decisions of the dynamic batcher, without threads: which requests wait together, when a
// group of them becomes a batch, what is admitted, what has expired. DynamicBatcher drives it
// under its lock; tests drive it with a fake clock.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/batching/admission.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/status.h"

namespace sluice {

// A request waiting in a queue, with what it costs there.
struct PendingRequest {
  std::unique_ptr<InferRequest> request;
  OutputSink* sink = nullptr;  // the caller's; alive until `done` has run
  InferCompletion done;
  TimePoint enqueued;
  size_t bytes = 0;
  // A row the scheduler added, not a caller's request (an empty sequence slot below a busy one):
  // it runs and is answered like the others but counts in no statistics.
  bool filler = false;
};

// Requests that run together in one forward pass.
struct FormedBatch {
  std::vector<PendingRequest> requests;  // in arrival order
  int64_t rows = 0;                      // rows the callers sent
  int64_t padded_rows = 0;               // rows the model sees (>= rows)
};

class BatchQueue {
 public:
  struct Options {
    int max_batch_size = 1;
    std::vector<int> preferred_batch_sizes;  // ascending
    Duration max_queue_delay{0};             // 0: a batch forms as soon as an instance is free
    size_t max_requests = 1024;              // waiting requests
    size_t max_bytes = 256u << 20;           // waiting input bytes (one larger request may wait alone)
    int max_groups = 16;                     // distinct shapes waiting at once
    bool pad_to_preferred = false;           // pad rows to the next preferred size / max
    std::shared_ptr<ByteBudget> server_budget;  // shared by every model; may be null
    // Every batch is one request (with its own batch size, at most max_batch_size), and requests
    // wait in one queue in arrival order whatever their shapes: a model without dynamic_batching.
    bool one_request_per_batch = false;
  };

  explicit BatchQueue(Options options);

  // Admits `pending` or returns why not (UNAVAILABLE: a cap is reached, see Admission, or too many
  // shapes wait; the caller answers the request). Requests whose non-batch shapes differ wait in
  // different groups.
  Status Add(PendingRequest& pending);

  // Removes and returns the requests that are cancelled or whose deadline is at or before `now`.
  std::vector<PendingRequest> TakeExpired(TimePoint now);

  // The next batch, if a group is ready at `now`: it can fill max_batch_size, or a prefix of it
  // sums to a preferred batch size, or its oldest request has waited max_queue_delay. Among
  // ready groups the one with the oldest request goes first. Groups never block each other.
  std::optional<FormedBatch> TakeReadyBatch(TimePoint now);

  // When a group next becomes ready by its delay, assuming nothing arrives; kNoDeadline when
  // the queue is empty. (A time in the past: a group is ready now.)
  TimePoint NextBatchTime() const;

  // The earliest deadline of a waiting request; kNoDeadline when none has one.
  TimePoint NextDeadline() const;

  // Limits the batches formed from now on to the rows in `sizes` (ascending, each in
  // [1, max_batch_size]; empty: every size up to max_batch_size): a group whose waiting rows
  // reach sizes.back() is full, and a batch takes the longest prefix of requests whose rows stay
  // within the largest size in `sizes` that the waiting rows reach (at least one request, so a
  // request larger than sizes.back() still runs, alone). Ignored with one_request_per_batch.
  void SetBatchSizeLadder(std::vector<int> sizes) { ladder_ = std::move(sizes); }

  // Everything still waiting (for shutdown).
  std::vector<PendingRequest> TakeAll();

  size_t size() const { return admission_.requests(); }
  size_t bytes() const { return admission_.bytes(); }
  size_t groups() const { return groups_.size(); }

  // The key of a request's group: its inputs' names and non-batch dimensions.
  static std::string GroupKey(const InferRequest& request);

 private:
  struct Group {
    std::deque<PendingRequest> queue;  // arrival order
  };

  // How many requests from the front of `group` form a batch now, or 0 when it should wait.
  size_t ReadyPrefix(const Group& group, TimePoint now) const;
  void Forget(const PendingRequest& pending);
  int64_t PaddedRows(int64_t rows) const;

  using Groups = std::map<std::string, Group>;
  // Removes an emptied group, keeping its map node (key, deque and their memory) for the next
  // new group: a steady stream of one shape then allocates nothing per request for its group.
  void EraseGroup(Groups::iterator group);

  const Options options_;
  std::vector<int> ladder_;  // SetBatchSizeLadder's sizes; empty: no limit below max_batch_size
  Groups groups_;
  Groups::node_type spare_group_;  // EraseGroup's kept node; empty when none
  Admission admission_;
};

}  // namespace sluice
