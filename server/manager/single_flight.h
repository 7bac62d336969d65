// Single flight for a model with a response cache: a request that misses the cache while an
// identical one (the same ResponseCache::Key) is queued or running does not run again; it waits
// for that one's answer. Sluice's own (Triton runs every request that misses).
//
// A flight is one run and the requests waiting for it (its waiters; the first request is one of
// them). The run is a request of its own: it reads its inputs from the key (which holds a copy of
// them), has its own cancellation flag, and so does not depend on any one waiter's caller:
//  - Caps: every waiter counts against the scheduler's caps (count and bytes) at its own priority
//    level, as if queued: the run counts for one of them, QueueSharing::AdmitWaiter for the others.
//    A waiter the caps refuse is answered UNAVAILABLE, as Enqueue would answer it.
//  - Deadlines: each waiter keeps its own. The run waits until the latest of them (raised with
//    QueueSharing::Reschedule as waiters join); a waiter whose deadline passes while the run has
//    not answered is answered DEADLINE_EXCEEDED then, on this class's thread, and the others wait
//    on.
//  - Priority: the run waits at the highest priority of its waiters (Reschedule moves it up).
//  - Cancellation: a waiter whose caller goes away is answered CANCELLED at once (Poke); the run
//    is cancelled only when every waiter has gone (the last one is answered by the run then:
//    CANCELLED while it is queued, its answer if it already runs).
// The run writes its outputs into one waiter's sink (the first Allocate picks a waiter whose
// outputs are not in shared memory; it is then answered with the run, whatever its deadline),
// or into memory of its own when none can take them; every other waiter gets a copy, and the
// cache keeps one. So a flight of one request copies its outputs once, as without single flight.
//
// Statistics: the run is the scheduler's request and counts as one (success, failure, cache
// miss) for the waiter it stands for; every other waiter answered OK is a shared answer
// (ModelStats::RecordSharedAnswer), one answered with an error a rejection.
//
// Thread-safe. Lock order: this class's lock, then the scheduler's (it calls AdmitWaiter and
// Reschedule under its own); the scheduler must call completions and sinks without its lock held.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/mutex.h"
#include "server/core/output_sink.h"
#include "server/manager/response_cache.h"

namespace sluice {

class SingleFlight {
 public:
  struct Options {
    std::string model;                  // named in answers
    const TimeSource* clock = nullptr;  // required; outlives this
    Scheduler* scheduler = nullptr;     // required; runs the flights; outlives this
    QueueSharing* queue = nullptr;  // required; the queue `scheduler` holds runs in; outlives this
    ModelStats* stats = nullptr;    // required; outlives this
    // Called with every run's outputs when it answered OK, before any waiter is answered, on the
    // thread that completes the run: the cache keeps them. `outputs` are valid during the call.
    absl::AnyInvocable<void(const ResponseCache::Key&, absl::Span<const OutputView>)> keep;
  };

  // Starts the thread that answers waiters whose deadline passed or whose caller went away.
  explicit SingleFlight(Options options);
  ~SingleFlight();  // Stop()
  SingleFlight(const SingleFlight&) = delete;
  SingleFlight& operator=(const SingleFlight&) = delete;

  // `request` (validated, its priority level, deadline and delay set by ModelHandle::Submit)
  // missed the cache with `key` after `lookup`. It joins the flight of `key` if one is queued or
  // running, else starts one. Answered through `sink` and `done` exactly once, with
  // Scheduler::Enqueue's contract on their lifetimes and the request's bytes.
  void Submit(ResponseCache::Key key, std::unique_ptr<InferRequest> request, OutputSink* sink,
              InferCompletion done, Duration lookup) ABSL_LOCKS_EXCLUDED(mutex_);

  // A waiter's caller went away (its `cancelled` flag is set): answer it now. Cheap.
  void Poke() ABSL_LOCKS_EXCLUDED(mutex_);

  // Joins the thread. Call it after the scheduler stopped (which answers every run, and so every
  // waiter). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mutex_);

  // Flights whose run has not answered yet, and the requests waiting in them (tests, statistics).
  size_t flights() const ABSL_LOCKS_EXCLUDED(mutex_);
  size_t waiters() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Waiter {
    OutputSink* sink = nullptr;
    InferCompletion done;
    TimePoint arrived;
    TimePoint deadline = kNoDeadline;
    std::shared_ptr<std::atomic<bool>> cancelled;  // the caller's; may be null
    Protocol protocol = Protocol::kGrpc;
    int level = 0;
    size_t bytes = 0;
    bool counted = false;        // AdmitWaiter counted it (the run counts the one it stands for)
    bool pinned = false;         // the run writes into its sink: it is answered with the run
    bool shared_memory = false;  // its outputs may go to shared memory: never pinned
    bool Cancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }
  };
  struct Flight;
  class FlightSink;
  // The table's key: a view of a flight's key bytes, found by the key's hash.
  struct TableKey {
    uint64_t hash = 0;
    absl::string_view bytes;
    bool operator==(const TableKey& other) const {
      return hash == other.hash && bytes == other.bytes;
    }
    template <typename H>
    friend H AbslHashValue(H state, const TableKey& key) {
      return H::combine(std::move(state), key.hash);
    }
  };
  // A waiter answered outside the lock.
  struct Answer {
    Waiter waiter;
    Status status;
  };

  // The run of `flight` answered `status` (its outputs are in `sink`).
  void Finish(const std::shared_ptr<Flight>& flight, FlightSink* sink, Status status)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // Takes out every waiter whose caller went away or whose deadline (before the run's) passed, into
  // `answers`; flights left without waiters are cancelled (`*poke`: tell the scheduler). Returns
  // when to look again.
  TimePoint SweepLocked(std::vector<Answer>* answers, bool* poke)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Takes `waiter` out of `flight`, giving its count back, or, when it is the one the run stands
  // for, moving that to another waiter.
  Waiter RemoveLocked(Flight& flight, std::list<Waiter>::iterator waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void UnlistLocked(Flight& flight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Answers `answers` (expired or cancelled waiters) and records them.
  void AnswerLeft(std::vector<Answer> answers);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mutex_);

  Options options_;
  mutable Mutex mutex_;
  CondVar wake_;
  absl::flat_hash_map<TableKey, std::shared_ptr<Flight>> table_ ABSL_GUARDED_BY(mutex_);
  size_t waiting_ ABSL_GUARDED_BY(mutex_) = 0;
  bool poked_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread timer_;
};

}  // namespace sluice
