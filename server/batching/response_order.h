// preserve_ordering: a model version's answers leave in the order its requests were taken into
// batches (DynamicBatcher gives each request its place as its batch forms, under its lock, as
// Triton does), whatever order the batches finish in. Requests answered without running (refused
// at arrival, expired, cancelled) never take a place: they are answered at once. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"

#include "server/batching/scheduler.h"
#include "server/core/mutex.h"
#include "server/core/status.h"

namespace sluice {

class ResponseOrder {
 public:
  // Takes the next place in line and returns the completion to call instead of `done`: when it
  // is called, `done` runs at once if every request given a place before it has been answered,
  // else later, right after the last of those (on the thread that answers it). A request that
  // has a place must be answered (its batch runs, or fails): a place never answered would hold
  // every later answer. Completions held keep their request's sink alive, as the scheduler's
  // contract asks. What is held is bounded by what runs meanwhile, not by the queue's caps: a
  // slow batch holds the answers of every batch that finishes while it runs.
  InferCompletion InLine(InferCompletion done) ABSL_LOCKS_EXCLUDED(mutex_);

  // Answers finished but held behind an earlier one (for tests and metrics).
  size_t held() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Finished {
    InferCompletion done;
    Status status;
  };
  void Finish(uint64_t place, InferCompletion done, Status status) ABSL_LOCKS_EXCLUDED(mutex_);

  mutable Mutex mutex_;
  uint64_t next_place_ ABSL_GUARDED_BY(mutex_) = 0;  // the place InLine gives next
  uint64_t next_out_ ABSL_GUARDED_BY(mutex_) = 0;    // the place whose answer leaves next
  absl::flat_hash_map<uint64_t, Finished> held_ ABSL_GUARDED_BY(mutex_);
  // A thread is running completions in order: others leave theirs to it (one at a time, in order).
  bool delivering_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace sluice
