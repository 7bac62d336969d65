// A ready model version as a protocol front end holds it: what it is (spec, config, version) and
// how to send it a request. The request policy lives here, not in the front ends: validation,
// the queue timeout, rejection statistics. The manager drains a version by waiting for its
// in-flight count to reach zero (WaitIdle), without polling.
#pragma once

#include <cstdint>
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

// Thread-safe. Create it with std::make_shared (Acquire needs shared_from_this).
class ModelHandle : public std::enable_shared_from_this<ModelHandle> {
 public:
  // `clock` outlives the handle; `stats` never null.
  ModelHandle(std::shared_ptr<const RepositoryModel> model, int64_t version, std::string device,
              std::shared_ptr<Scheduler> scheduler, std::shared_ptr<ModelStats> stats, const TimeSource* clock,
              BatchSizeChoice batch_sizes = {});
  ~ModelHandle();

  const ModelSpec& spec() const { return model_->spec; }
  const RepositoryModel& model() const { return *model_; }  // the configuration it was loaded with
  int64_t version() const { return version_; }
  const std::string& device() const { return device_; }    // "cpu", "cuda:0", or a list
  // The batch sizes warm-up measured and the batcher forms (sluice.auto_batch_sizes).
  const BatchSizeChoice& batch_sizes() const { return batch_sizes_; }
  ModelStatsSnapshot Statistics() const { return stats_->Snapshot(); }

  // Validates `request` against the model (INVALID_ARGUMENT, answered at once), narrows its
  // deadline to the queue timeout (its parameters.timeout_us when the model's dynamic_batching
  // allows overrides, else the model's default_timeout_us; none when 0) and hands it to the
  // scheduler, which writes the outputs into `sink` and calls `done` exactly once (see
  // Scheduler::Enqueue for the lifetimes). Never blocks on model work.
  void Submit(std::unique_ptr<InferRequest> request, OutputSink* sink, InferCompletion done);

  // Records a request that never became an InferRequest (the front end could not convert it) as
  // rejected, and returns `status`.
  Status Reject(Status status, Protocol protocol);

  // The caller of a queued request went away (its `cancelled` flag is set): answer it now.
  void Poke();

  // A reference to this handle that counts as in flight until it is destroyed: the manager's
  // lookups hand these out, and a front end keeps one until the request it serves is answered.
  std::shared_ptr<ModelHandle> Acquire();
  int64_t in_flight() const;

  // Blocks until no reference from Acquire is alive, or Stop was called. Logs a line every 10 s
  // while it waits (model, version, what is still in flight).
  void WaitIdle();

  // Whether the sequence `id` is active on this version (stateful models; see SequenceBatcher).
  bool HasSequence(const CorrelationId& id) const { return scheduler_->HasSequence(id); }
  // For a retired version of a stateful model: waits up to `grace` for its active sequences to
  // end (requests for them still come here, see ModelManager::FindSequence), then ends those left with
  // UNAVAILABLE, naming the reason. Returns at once when none is active.
  void DrainSequences(Duration grace);

  // Stops the scheduler: queued requests are answered UNAVAILABLE, running ones finish, workers
  // are joined. Wakes WaitIdle. Idempotent.
  void Stop();

 private:
  const std::shared_ptr<const RepositoryModel> model_;
  const int64_t version_;
  const std::string device_;
  const std::shared_ptr<Scheduler> scheduler_;
  const std::shared_ptr<ModelStats> stats_;
  const TimeSource* const clock_;
  const BatchSizeChoice batch_sizes_;

  // Shared with the references Acquire hands out, so that a reference can drop its hold on the
  // handle before it signals: WaitIdle returning means no reference holds the handle any more.
  struct InFlight {
    void Release();
    Mutex mutex;
    CondVar idle;
    int64_t count ABSL_GUARDED_BY(mutex) = 0;
    bool stopped ABSL_GUARDED_BY(mutex) = false;
  };
  const std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

// A front end's hold on the version one request runs on: set at submission (an Acquire'd
// reference, which keeps the version in flight), dropped when the request is answered, so that an
// unload waits for the answer and not for the transport to let go. Thread-safe: the answer (on a
// worker) and a cancellation (on a transport thread) may race.
class ModelHold {
 public:
  void Set(std::shared_ptr<ModelHandle> model) ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    model_ = std::move(model);
  }
  // Drops the reference (outside the lock: the last reference may wake an unload).
  void Release() ABSL_LOCKS_EXCLUDED(mutex_) {
    std::shared_ptr<ModelHandle> model;
    {
      MutexLock lock(&mutex_);
      model = std::move(model_);
    }
  }
  // The version held, or null.
  std::shared_ptr<ModelHandle> Get() ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    return model_;
  }
  // The caller went away: the model answers the request now if it is still queued.
  void Poke() ABSL_LOCKS_EXCLUDED(mutex_) {
    std::shared_ptr<ModelHandle> model;
    {
      MutexLock lock(&mutex_);
      model = model_;
    }
    if (model) model->Poke();
  }

 private:
  Mutex mutex_;
  std::shared_ptr<ModelHandle> model_ ABSL_GUARDED_BY(mutex_);
};

// Where front ends find model versions. ModelManager implements it; tests fake it.
class ModelLookup {
 public:
  virtual ~ModelLookup() = default;
  // An Acquire'd reference to the version a request goes to. `version` empty: the newest ready
  // one. NOT_FOUND: no such model or version; UNAVAILABLE: it exists but is not ready.
  virtual StatusOr<std::shared_ptr<ModelHandle>> Find(const std::string& name, const std::string& version) const = 0;
  // An Acquire'd reference to the version of `name` on which the sequence `id` is active: a
  // version retired by a reload or unload that still drains its sequences, or another ready
  // version. NOT_FOUND when none holds it.
  virtual StatusOr<std::shared_ptr<ModelHandle>> FindSequence(const std::string& /*name*/,
                                                              const CorrelationId& /*id*/) const {
    return absl::NotFoundError("no sequences");
  }
};

// The version a converted request runs on: `found` (what Find chose), unless the request
// continues a sequence (sequence_id without sequence_start, no version asked for) that another
// version of the model holds: a sequence stays on the version it started on, across reloads.
std::shared_ptr<ModelHandle> RouteSequence(const ModelLookup& lookup, std::shared_ptr<ModelHandle> found,
                                           const InferRequest& request, bool version_given);

}  // namespace sluice
