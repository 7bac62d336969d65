// How a dynamic batcher turns waiting requests into batches: one interface, one policy per
// model version, chosen when it loads (MakeBatchPolicy). The queue (BatchQueue) keeps the
// requests; the policy answers "which group is ready, with how many requests", "when will one be",
// "what may wait" and "what must leave unrun". Without threads and not thread-safe: BatchFormer
// calls it under the batcher's lock, tests call it with a fake clock.
//
// The policies:
//  - DynamicBatchingPolicy: Triton's dynamic batching: max_batch_size, preferred sizes, the queue
//    delay, padding to preferred sizes, the measured batch-size ladder.
//  - OneRequestPerBatchPolicy: a model without dynamic_batching: each request is a batch, in
//    arrival order whatever its shape.
//  - LatencyTargetPolicy (latency_target_policy.h): sluice.latency_target_us over either of them.
// Priority levels and DELAY decide where a request waits, not when a batch forms: they are the
// queue's order (PriorityLevels), and hold under every policy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/batch_cost.h"
#include "server/batching/batch_queue.h"
#include "server/core/clock.h"
#include "server/core/status.h"

namespace sluice {

class BatchPolicy {
 public:
  virtual ~BatchPolicy() = default;

  // The shape group a request waits in.
  virtual std::string KeyOf(const InferRequest& request) const = 0;

  // Whether `pending` (not yet queued; it would join group `key`) may wait at all, or why not
  // (`*refused`, may be null, then says which kind of refusal). `busy`: instances running a batch
  // now, -1 when unknown.
  virtual Status CheckArrival(const BatchQueue& queue, const PendingRequest& pending,
                              const std::string& key, int busy, EarlyRefusal* refused) const = 0;
  // A request of `rows` rows that arrived at `at` was queued.
  virtual void Arrived(TimePoint at, int64_t rows) = 0;

  // How many requests from the front of `group` form a batch at `now`; 0 while it should wait.
  virtual size_t ReadyPrefix(const BatchQueue& queue, const std::string& key,
                             const BatchQueue::Group& group, TimePoint now) const = 0;
  // When `group` becomes ready by waiting if nothing more arrives (a time in the past: now).
  virtual TimePoint ReadyAt(const BatchQueue& queue, const std::string& key,
                            const BatchQueue::Group& group) const = 0;
  // The earliest time by which a waiting request must be answered beyond its own deadline
  // (kNoDeadline: the policy sets none).
  virtual TimePoint EarliestAnswerBy(const BatchQueue& queue) const = 0;
  // Takes out the requests the policy refuses while they wait, with their answers. `forming`: an
  // instance is free and a batch is about to form.
  virtual std::vector<RefusedRequest> TakeRefused(BatchQueue& queue, TimePoint now,
                                                  bool forming) = 0;
  // How many requests from the front of `group` form a batch that no arrival could make larger
  // (the largest batch size is reached), for a batch staged ahead while every instance is busy
  // (InstancePool::StageAhead); 0 while waiting could still change it, and always for a policy
  // that decides by time (the default).
  virtual size_t FullPrefix(const BatchQueue& /*queue*/, const std::string& /*key*/,
                            const BatchQueue::Group& /*group*/, TimePoint /*now*/) const {
    return 0;
  }
  // A batch of group `key`, `padded_rows` rows, was handed to an instance at `now`.
  virtual void Formed(const std::string& key, int64_t padded_rows, TimePoint now) = 0;

  // The rows the model sees for a batch of `rows` rows.
  virtual int64_t PaddedRows(int64_t rows) const = 0;
  // The batch sizes to form from now on (ascending, each in [1, max_batch_size]; empty: every
  // size up to max_batch_size). A policy that forms no batches keeps none.
  virtual void SetBatchSizeLadder(std::vector<int> sizes) = 0;
};

// Triton's dynamic batching.
class DynamicBatchingPolicy final : public BatchPolicy {
 public:
  struct Options {
    int max_batch_size = 1;
    std::vector<int> preferred_batch_sizes;  // ascending
    Duration max_queue_delay{0};             // 0: a batch forms as soon as an instance is free
    bool pad_to_preferred = false;           // pad rows to the next preferred size / max
  };
  explicit DynamicBatchingPolicy(Options options) : options_(std::move(options)) {}

  // What a group's front offers at `now`, before any cut.
  struct Prefix {
    size_t fitting = 0;    // requests from the front within the largest batch size
    int64_t rows = 0;      // their rows
    size_t preferred = 0;  // the longest prefix whose rows are a preferred size (0: none)
    bool full = false;     // more requests wait than fit, or the rows reach the largest size
    bool waited = false;   // the group's oldest request has waited max_queue_delay
  };
  // `fitting` is 0 when the front request alone is larger than the largest batch size.
  Prefix Measure(const BatchQueue& queue, const BatchQueue::Group& group, TimePoint now) const;
  // The requests a group with `prefix` forms a batch of: 0 while neither full nor waited (or its
  // preferred prefix), else the longest prefix within the largest ladder size its rows reach.
  size_t Decide(const BatchQueue::Group& group, const Prefix& prefix) const;
  // The largest batch size: the ladder's largest, or max_batch_size.
  int64_t Largest() const { return ladder_.empty() ? options_.max_batch_size : ladder_.back(); }
  Duration max_queue_delay() const { return options_.max_queue_delay; }

  std::string KeyOf(const InferRequest& request) const override {
    return BatchQueue::GroupKey(request);
  }
  Status CheckArrival(const BatchQueue&, const PendingRequest&, const std::string&, int,
                      EarlyRefusal*) const override {
    return absl::OkStatus();  // the caps alone decide what waits
  }
  void Arrived(TimePoint, int64_t) override {}  // it keeps no rate
  size_t ReadyPrefix(const BatchQueue& queue, const std::string& key,
                     const BatchQueue::Group& group, TimePoint now) const override;
  // A group whose rows reach the largest batch size (or whose next request does not fit) has the
  // batch it would form when an instance frees: the same prefix ReadyPrefix takes then.
  size_t FullPrefix(const BatchQueue& queue, const std::string& key, const BatchQueue::Group& group,
                    TimePoint now) const override;
  TimePoint ReadyAt(const BatchQueue& queue, const std::string&,
                    const BatchQueue::Group& group) const override {
    return queue.Oldest(group) + options_.max_queue_delay;
  }
  TimePoint EarliestAnswerBy(const BatchQueue&) const override { return kNoDeadline; }
  std::vector<RefusedRequest> TakeRefused(BatchQueue&, TimePoint, bool) override {
    return {};  // a request leaves unrun only by its own deadline or cancellation
  }
  void Formed(const std::string&, int64_t, TimePoint) override {}
  int64_t PaddedRows(int64_t rows) const override;
  void SetBatchSizeLadder(std::vector<int> sizes) override { ladder_ = std::move(sizes); }

 private:
  const Options options_;
  std::vector<int> ladder_;  // empty: no limit below max_batch_size
};

// A model without dynamic_batching: every batch is one request (its own batch size, at most
// max_batch_size), and requests wait in one group in arrival order whatever their shapes.
class OneRequestPerBatchPolicy final : public BatchPolicy {
 public:
  explicit OneRequestPerBatchPolicy(Duration max_queue_delay) : max_queue_delay_(max_queue_delay) {}

  std::string KeyOf(const InferRequest&) const override { return std::string(); }
  Status CheckArrival(const BatchQueue&, const PendingRequest&, const std::string&, int,
                      EarlyRefusal*) const override {
    return absl::OkStatus();
  }
  void Arrived(TimePoint, int64_t) override {}
  size_t ReadyPrefix(const BatchQueue&, const std::string&, const BatchQueue::Group&,
                     TimePoint) const override {
    return 1;
  }
  TimePoint ReadyAt(const BatchQueue& queue, const std::string&,
                    const BatchQueue::Group& group) const override {
    return queue.Oldest(group) + max_queue_delay_;
  }
  TimePoint EarliestAnswerBy(const BatchQueue&) const override { return kNoDeadline; }
  std::vector<RefusedRequest> TakeRefused(BatchQueue&, TimePoint, bool) override { return {}; }
  void Formed(const std::string&, int64_t, TimePoint) override {}
  int64_t PaddedRows(int64_t rows) const override { return rows; }
  void SetBatchSizeLadder(std::vector<int>) override {}  // it forms no batches

 private:
  const Duration max_queue_delay_;
};

}  // namespace sluice
