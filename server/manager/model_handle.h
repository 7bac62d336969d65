// A ready model version as a protocol front end holds it: what it is (spec, config, version) and
// how to send it a request. The request policy lives here, not in the front ends: validation,
// the queue timeout, rejection statistics. The manager drains a version by waiting for its
// in-flight count to reach zero (WaitIdle), without polling.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"

#include "server/batching/batch_sizes.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"
#include "server/core/output_sink.h"
#include "server/core/repository_model.h"

namespace sluice {

class ModelHandle;

// A model version held in flight: while one exists, the version counts as in use and an unload
// waits for it (ModelHandle::WaitIdle). This is not ownership (the manager owns versions, as
// shared_ptr<ModelHandle>): it keeps the version it names alive and counted, no more. Move-only:
// passing it on hands the hold over; a second hold is taken explicitly (Another).
class InFlightModel {
 public:
  InFlightModel() = default;
  InFlightModel(InFlightModel&&) noexcept = default;
  InFlightModel& operator=(InFlightModel&&) noexcept = default;
  InFlightModel(const InFlightModel&) = delete;
  InFlightModel& operator=(const InFlightModel&) = delete;

  ModelHandle* operator->() const { return held_.get(); }
  ModelHandle& operator*() const { return *held_; }
  explicit operator bool() const { return held_ != nullptr; }
  // A second hold on the same version (the version is in flight until both are gone).
  InFlightModel Another() const { return InFlightModel(held_); }
  // A reference that does not hold the version; locking it holds it again while some hold is
  // still alive (a cancellation that pokes the version a request waits in).
  std::weak_ptr<ModelHandle> Watch() const { return held_; }
  void Reset() { held_.reset(); }

 private:
  friend class ModelHandle;
  explicit InFlightModel(std::shared_ptr<ModelHandle> held) : held_(std::move(held)) {}
  std::shared_ptr<ModelHandle> held_;  // from Acquire: its deleter counts the hold out
};

// Thread-safe. Create it with std::make_shared (Acquire needs shared_from_this).
class ModelHandle : public std::enable_shared_from_this<ModelHandle> {
 public:
  // `clock` outlives the handle; `stats` never null. `caches_responses`: `scheduler` is a
  // CachingScheduler (the version's answers are cached).
  ModelHandle(std::shared_ptr<const RepositoryModel> model, int64_t version, std::string device,
              std::shared_ptr<Scheduler> scheduler, std::shared_ptr<ModelStats> stats,
              const TimeSource* clock, BatchSizeChoice batch_sizes = {},
              bool caches_responses = false);
  ~ModelHandle();

  const ModelSpec& spec() const { return model_->spec; }
  const RepositoryModel& model() const { return *model_; }  // the configuration it was loaded with
  int64_t version() const { return version_; }
  const std::string& device() const { return device_; }  // "cpu", "cuda:0", or a list
  // The batch sizes warm-up measured and the batcher forms (sluice.auto_batch_sizes).
  const BatchSizeChoice& batch_sizes() const { return batch_sizes_; }
  ModelStatsSnapshot Statistics() const { return stats_->Snapshot(); }

  // Validates `request` against the model (INVALID_ARGUMENT, answered at once), sets its priority
  // level from its "priority" parameter, narrows its deadline to the queue timeout of its level's
  // queue policy (its parameters.timeout_us when the policy allows overrides, else the policy's
  // default_timeout_us; none when 0; under timeout_action DELAY the timeout sets delay_after
  // instead) and hands it to the scheduler, which writes the outputs into `sink` and calls `done`
  // exactly once (see Scheduler::Enqueue for the lifetimes). Never blocks on model work. With a
  // response cache the scheduler answers cache hits at once (CachingScheduler). With
  // preserve_ordering the scheduler orders the answers of requests that run (ResponseOrder);
  // invalid requests are answered here, at once.
  void Submit(std::unique_ptr<InferRequest> request, OutputSink* sink, InferCompletion done);

  // Records a request that never became an InferRequest (the front end could not convert it) as
  // rejected, and returns `status`.
  Status Reject(Status status, Protocol protocol);

  // The caller of a queued request went away (its `cancelled` flag is set): answer it now.
  void Poke();

  // An inference request found this version (the inference path, not health or metadata calls):
  // the least recently used eviction reads it (last_used). One clock read and a relaxed store.
  void MarkUsed() {
    last_used_ns_.store(clock_->Now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  TimePoint last_used() const {
    return TimePoint(Duration(last_used_ns_.load(std::memory_order_relaxed)));
  }

  // A hold on this version that counts as in flight until it is destroyed: the manager's lookups
  // hand these out, and a front end keeps one until the request it serves is answered.
  InFlightModel Acquire();
  int64_t in_flight() const;
  // The most references from Acquire alive at once since the version loaded.
  int64_t peak_in_flight() const;

  // Blocks until no reference from Acquire is alive, or Stop was called. Logs a line every 10 s
  // while it waits (model, version, what is still in flight).
  void WaitIdle();

  // Whether the sequence `id` is active on this version (stateful models; see SequenceBatcher).
  bool HasSequence(const CorrelationId& id) const {
    return sequences_ != nullptr && sequences_->HasSequence(id);
  }
  size_t active_sequences() const {
    return sequences_ != nullptr ? sequences_->ActiveSequences() : 0;
  }
  // For a retired version of a stateful model: waits up to `grace` for its active sequences to
  // end (requests for them still come here, see ModelManager::FindSequence), then ends those left
  // with UNAVAILABLE, naming the reason. Returns at once when none is active.
  void DrainSequences(Duration grace);

  // Whether this version's answers are cached.
  bool caches_responses() const { return caches_responses_; }

  // Stops the scheduler: queued requests are answered UNAVAILABLE, running ones finish, workers
  // are joined; the version's cached answers are dropped. Wakes WaitIdle. Idempotent.
  void Stop();

 private:
  const std::shared_ptr<const RepositoryModel> model_;
  const int64_t version_;
  const std::string device_;
  const std::shared_ptr<Scheduler> scheduler_;
  SequenceScheduler* const sequences_;  // the scheduler, when it serves a stateful model; else null
  const std::shared_ptr<ModelStats> stats_;
  const TimeSource* const clock_;
  const BatchSizeChoice batch_sizes_;
  const bool caches_responses_;
  std::atomic<Duration::rep> last_used_ns_{0};  // MarkUsed: the clock's ticks since its epoch

  // Shared with the references Acquire hands out, so that a reference can drop its hold on the
  // handle before it signals: WaitIdle returning means no reference holds the handle any more.
  struct InFlight {
    void Release();
    Mutex mutex;
    CondVar idle;
    int64_t count ABSL_GUARDED_BY(mutex) = 0;
    int64_t peak ABSL_GUARDED_BY(mutex) = 0;
    bool stopped ABSL_GUARDED_BY(mutex) = false;
  };
  const std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

// A front end's hold on the version one request runs on: set at submission, dropped when the
// request is answered, so that an unload waits for the answer and not for the transport to let
// go. Thread-safe: the answer (on a worker) and a cancellation (on a transport thread) may race.
class ModelHold {
 public:
  void Set(InFlightModel model) ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    model_ = std::move(model);
  }
  // Drops the hold (outside the lock: the last hold may wake an unload).
  void Release() ABSL_LOCKS_EXCLUDED(mutex_) {
    InFlightModel model;
    {
      MutexLock lock(&mutex_);
      model = std::move(model_);
    }
  }
  // Another hold on the version held; empty when none is.
  InFlightModel Get() ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    return model_.Another();
  }
  // The caller went away: the model answers the request now if it is still queued.
  void Poke() ABSL_LOCKS_EXCLUDED(mutex_) {
    if (InFlightModel model = Get()) model->Poke();
  }

 private:
  Mutex mutex_;
  InFlightModel model_ ABSL_GUARDED_BY(mutex_);
};

// Loads models on a request's behalf (--model-load-on-demand; OnDemandLoader implements it):
// a request for a model that is in the repository but not loaded waits for its load.
// Thread-safe.
class OnDemandLoads {
 public:
  virtual ~OnDemandLoads() = default;
  // Whether a request for `name`, which is not served now, should wait for a load: the model is
  // in the repository and was not unloaded explicitly since it last loaded.
  virtual bool LoadsOnDemand(const std::string& name) const = 0;
  // Starts the load of `name` or joins the one under way. `then` runs exactly once: at once, on
  // the caller's thread, when the load is refused without trying (a back-off after failures, an
  // explicit unload, too many requests waiting, no room a moment ago, shutting down); otherwise on
  // another thread (the control thread's, or the waiters' timer), with OK once the model is ready
  // (look it up again), why the load failed (UNAVAILABLE; RESOURCE_EXHAUSTED when the memory
  // budget had no room), DEADLINE_EXCEEDED when `deadline` passed first, or CANCELLED when
  // `cancelled` was set first.
  virtual void Await(const std::string& name, TimePoint deadline,
                     std::shared_ptr<std::atomic<bool>> cancelled,
                     std::function<void(const Status&)> then) = 0;
  // A request that waited for a load was answered `waited` after it arrived (cold start).
  virtual void RecordColdStart(const std::string& name, Duration waited) = 0;
};

// Where front ends find model versions. ModelManager implements it; tests fake it.
class ModelLookup {
 public:
  virtual ~ModelLookup() = default;
  // A hold on the version a request goes to. `version` empty: the newest ready one. NOT_FOUND:
  // no such model or version; UNAVAILABLE: it exists but is not ready.
  virtual StatusOr<InFlightModel> Find(const std::string& name,
                                       const std::string& version) const = 0;
  // A hold on the version of `name` on which the sequence `id` is active: a version retired by a
  // reload or unload that still drains its sequences, or another ready version. NOT_FOUND when
  // none holds it.
  virtual StatusOr<InFlightModel> FindSequence(const std::string& /*name*/,
                                               const CorrelationId& /*id*/) const {
    return absl::NotFoundError("no sequences");
  }
  // Who loads a model a request asks for while it is not loaded; null: nobody (the request is
  // answered Find's status).
  virtual OnDemandLoads* on_demand() const { return nullptr; }
  // When `name`'s serving versions last changed (a load, reload or unload), as a number that
  // grows with every change of any model: a lookup made after reading a new value finds the new
  // versions. 0 for a name never loaded or forgotten.
  virtual uint64_t Generation(const std::string& /*name*/) const { return 0; }
};

// The version a converted request runs on: `found` (what Find chose), unless the request
// continues a sequence (sequence_id without sequence_start, no version asked for) that another
// version of the model holds: a sequence stays on the version it started on, across reloads.
InFlightModel RouteSequence(const ModelLookup& lookup, InFlightModel found,
                            const InferRequest& request, bool version_given);

}  // namespace sluice
