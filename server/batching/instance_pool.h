// The model instances of one model version and the threads that run them: one worker thread per
// instance, its staging buffers, warm-up on each instance's own thread, fatal-error forwarding and
// the request statistics. It knows nothing of queue policy: a scheduler (DynamicBatcher, or
// SequenceBatcher for stateful models) decides which requests run together, and on which instance,
// and hands the pool formed batches.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"

#include "server/batching/batch_assembly.h"
#include "server/batching/batch_queue.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/backend.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"

namespace sluice {

// Thread-safe. Every request handed to Run or Drop is answered exactly once: OK with its outputs
// in its sink, or the model's error (every request of the failing batch gets it), or its own
// sink's error (only that request: the others of its batch are answered as usual), or the status
// Drop was given.
class InstancePool {
 public:
  struct Options {
    const TimeSource* clock = nullptr;            // required; outlives the pool
    std::shared_ptr<ModelStats> stats;            // may be null
    std::function<void(const Status&)> on_fatal;  // a fatal (sticky device) error; may be null
    // An instance became free: its index, and whether it finished a batch (Run or RunOn:
    // exactly one such call per batch handed over, so a scheduler may count on it) or something
    // else (a warm-up task, which may come after WarmUp returned, or a RunClaimed batch). Runs on
    // the thread that ran it (the instance's worker, or RunClaimed's caller) with no pool lock
    // held; must be cheap. May be null.
    std::function<void(size_t instance, bool after_batch)> on_idle;
    // Whether several requests may run together. False (a model without dynamic_batching): every
    // request runs alone on its own bytes, so warm-up does not assemble either.
    bool batches = true;
    // Warm the instances one after another instead of all at once: with cuDNN benchmark mode on
    // GPU instances, cudnnFind times every algorithm, and instances timing on one GPU at the same
    // time disturb each other's timings (and the choice each keeps). Off: all at once.
    bool warm_up_one_at_a_time = false;
    // Latency target models: every batch's execution time (assembly, forward, delivery) is
    // recorded here per instance, for the batch's shape group (BatchQueue::GroupKey). May be null.
    std::shared_ptr<BatchCostModel> costs;
    // Stage ahead (sluice.stage_ahead): each instance gets a second set of staging buffers and a
    // stager thread, so that a batch handed over with StageAhead while the instance runs is
    // assembled meanwhile and starts the moment the running batch ends; the stager then completes
    // the ended batch's answers while the staged one runs. Off: StageAhead is Run.
    bool stage_ahead = false;
    // Stage ahead: an instance started a batch, so a batch may now be staged behind it
    // (ahead_slots() grew). Runs on the worker with no pool lock held; must be cheap. May be null.
    std::function<void()> on_slot;
  };

  // INVALID_ARGUMENT without instances or without a clock. Starts one worker per instance.
  static StatusOr<std::unique_ptr<InstancePool>> Create(
      ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options);
  ~InstancePool();

  // Instances neither running nor promised a batch. A scheduler hands over a batch only when this
  // is positive, so that requests keep gathering while every instance is busy.
  int idle() const { return idle_.load(std::memory_order_acquire); }

  // Hands `batch` to the next free instance (it waits for one when none is). The worker assembles
  // it in its staging buffers (unless it is one request that needs no padding, which runs on its
  // own bytes), runs it, has the backend write each request's outputs into its sink and answers
  // each request.
  void Run(FormedBatch batch) ABSL_LOCKS_EXCLUDED(mutex_);
  // The same on instance number `instance` (< size()), after the batches already given to it: a
  // scheduler that binds requests to instances (SequenceBatcher) tracks itself which are free.
  void RunOn(size_t instance, FormedBatch batch) ABSL_LOCKS_EXCLUDED(mutex_);

  // Instances running a batch with nothing staged behind them: how many batches StageAhead can
  // place now (0 without Options::stage_ahead).
  int ahead_slots() const { return ahead_slots_.load(std::memory_order_acquire); }
  // Hands `batch` to an instance that runs a batch and has nothing staged behind it: its stager
  // thread assembles it in the instance's second staging buffers while the running batch goes on
  // (or its worker does, if it ends first), and the worker runs it as soon as the running batch
  // ends: the stager completes the ended batch's answers (statistics, each request's done) while
  // the staged batch runs (a batch that ends with nothing staged behind it is completed by its
  // worker, as without staging). A worker about to go idle takes a batch staged
  // behind another instance that its stager has not started. Meant for batches that waiting could
  // not make larger (BatchFormer::TakeFullBatch): a scheduler calls it while idle() is 0 and
  // ahead_slots() is positive. Where no instance has a free slot any more (the one that had it
  // went idle), it is Run. Its requests are not looked at for expiry or cancellation while they
  // wait behind the running batch (at most one batch's time), as a running batch's are not.
  void StageAhead(FormedBatch batch) ABSL_LOCKS_EXCLUDED(mutex_);

  // An instance whose worker waits with nothing to do, taken away from its worker (which runs
  // nothing until the claim ends) for the caller to run one batch on its own thread with
  // RunClaimed; counts as busy in idle(). nullopt when none waits, idle() is not positive, or the
  // pool is stopping. Cheap: no thread is woken.
  std::optional<size_t> TryClaim() ABSL_LOCKS_EXCLUDED(mutex_);
  // Runs `batch` on the claimed instance on the calling thread, as a worker would (assembly,
  // delivery, statistics, every request answered), then ends the claim and calls on_idle.
  void RunClaimed(size_t instance, FormedBatch batch) ABSL_LOCKS_EXCLUDED(mutex_);
  // Ends a claim without running anything (no on_idle call: the scheduler that claimed knows).
  void Unclaim(size_t instance) ABSL_LOCKS_EXCLUDED(mutex_);

  // Answers a request that leaves a queue without running (expired, cancelled, shut down) with
  // `status`, on the calling thread, and records it.
  void Drop(PendingRequest& pending, const Status& status);

  // See Scheduler::WarmUp: each request is assembled in the instance's staging buffers as a
  // one-request batch (so the buffers reach their largest size before traffic comes; with
  // Options::stage_ahead, both sets), unless requests of this model never run together (no batch
  // dimension, or Options::batches false).
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                const std::atomic<bool>* abandon) ABSL_LOCKS_EXCLUDED(mutex_);

  // Runs the batches already handed over, waits for the claimed runs, then joins the workers.
  // Run after Stop answers the batch UNAVAILABLE; TryClaim after Stop finds nothing. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mutex_);

  ModelStats* stats() const { return options_.stats.get(); }  // may be null
  size_t size() const { return instances_.size(); }
  // Staging allocations so far, over all instances.
  size_t StagingAllocations() const;

 private:
  struct Instance {
    Instance(size_t position, std::unique_ptr<ModelBackend> model)
        : index(position),
          backend(std::move(model)),
          staging(std::make_unique<StagingPool>(backend.get())),
          spare(std::make_unique<StagingPool>(backend.get())) {}
    const size_t index;
    std::unique_ptr<ModelBackend> backend;
    // Touched only by whoever runs the instance: its worker, or a claimer.
    std::unique_ptr<StagingPool> staging;
    // Stage ahead: where the stager assembles the next batch while `staging` is in use; the two
    // swap (under the pool's mutex) when the worker takes a staged batch. Touched by the stager
    // only while its batch is kAssembling, by the worker otherwise.
    std::unique_ptr<StagingPool> spare;
    TimePoint last_end{};  // when its last batch ended (unset before the first); as `staging`
    CondVar wake;          // its worker's: work for it, a claim ended, or stop
    CondVar staged;        // the worker's, waiting for the stager to finish a batch
    CondVar stage;         // the stager's: a batch staged for it, a batch to complete, or stop
  };

  // A batch the backend ran without error, up to its answers: what completing it needs (on the
  // worker, or on the stager while the worker runs the batch staged behind it).
  struct Ran {
    FormedBatch batch;
    absl::InlinedVector<Status, 8> refused;  // by request: its sink's refusal (OK: answered)
    TimePoint started, delivered_at;
    TimePoint executed_at;  // when ExecuteBatch was done with it
    BatchPhases phases;     // all but `complete` and `complete_behind`
  };

  // The batch staged ahead on one instance (StageAhead), and where it is.
  struct Staged {
    enum class State {
      kEmpty,       // nothing staged
      kQueued,      // waiting for the stager (or the worker, if the running batch ends first)
      kAssembling,  // the stager assembles it into the instance's spare staging buffers
      kReady,       // assembled: the worker runs it next
    };
    State state = State::kEmpty;
    FormedBatch batch;
    InferRequest assembled;  // kReady: the batch assembled (empty where it runs on its own bytes)
    Duration assembly{0};    // kReady: how long the stager took
  };

  InstancePool(ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances,
               Options options);
  // Runs on the worker thread of instances_[index].
  void WorkerLoop(size_t index) ABSL_LOCKS_EXCLUDED(mutex_);
  // Runs on the stager thread of instances_[index] (Options::stage_ahead).
  void StagerLoop(size_t index) ABSL_LOCKS_EXCLUDED(mutex_);
  // After a batch of instances_[index] ended: waits for the batch staged behind it (if the stager
  // is assembling it) and takes it, or nothing is staged. Swaps the staging sets for a batch the
  // stager assembled.
  std::optional<Staged> TakeStaged(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A batch staged behind another instance whose stager has not started it (kQueued), for
  // instances_[index]'s worker, which has nothing staged and would go idle; nullopt when none.
  std::optional<Staged> TakeQueuedElsewhere(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Runs `batch` and completes it on the calling thread.
  void RunBatch(Instance* instance, FormedBatch batch);
  // Runs `batch` up to its answers: nullopt when it failed (every request answered with the
  // error), else what Complete needs. `staged`: the batch came staged ahead (`batch` is then its
  // batch, moved in). Sets instance->last_end when it fails.
  std::optional<Ran> ExecuteBatch(Instance* instance, FormedBatch batch, Staged* staged = nullptr);
  // Answers the requests of a batch that ran and records them. `behind`: on the stager, while the
  // instance runs the next batch (its time counts as complete_behind, off the cycle; the worker
  // set last_end when it handed it over); else on the instance's runner, which it ends (last_end).
  void Complete(Instance* instance, Ran ran, bool behind);
  // Assembles `batch` in the instance's staging buffers when `assemble` (unless `assembled`, the
  // stager's assembly, is given), runs it and delivers the outputs to `targets`. `*infer_done`:
  // when the first output was asked for (else the end).
  Status Execute(Instance* instance, const FormedBatch& batch, bool assemble,
                 const InferRequest* assembled, absl::Span<const OutputTarget> targets,
                 TimePoint* assembled_at, TimePoint* infer_done);
  void Fail(std::vector<PendingRequest>& requests, const Status& status, bool ran);
  // Stamps the traced requests of an executed batch with their queue and run, and exports the
  // batch's span (only when one of them is traced).
  void TraceRun(const Instance& instance, const FormedBatch& batch, const Status& status,
                TimePoint started, TimePoint computed, TimePoint delivered);
  // Whether instance `index`'s worker may run something now.
  bool HasWork(size_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Wakes instance `index`'s worker if it waits and nobody woke it yet.
  void Wake(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Wakes one waiting worker of an unclaimed instance, if any (for a batch in ready_: any
  // instance may take it; when none waits, a busy worker takes it when it is done).
  void WakeOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void EndClaim(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const ModelSpec spec_;
  const Options options_;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::atomic<int> idle_{0};
  std::atomic<int> ahead_slots_{0};  // see ahead_slots(): running_[i] && staged_[i] empty

  mutable Mutex mutex_;
  CondVar claims_cv_;  // a claim ended (Stop waits for none)
  std::deque<FormedBatch> ready_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::deque<FormedBatch>> assigned_
      ABSL_GUARDED_BY(mutex_);  // RunOn's, by instance index
  // Each instance's own work (warm-up), by instance index, run before batches. Kept here rather
  // than in Instance so that the analysis can see the pool's mutex guards it.
  std::vector<std::deque<std::function<void()>>> tasks_ ABSL_GUARDED_BY(mutex_);
  // By instance index: its worker waits on its `wake` and nobody has woken it since; a caller
  // has claimed it (TryClaim).
  std::vector<char> waiting_ ABSL_GUARDED_BY(mutex_);
  std::vector<char> claimed_ ABSL_GUARDED_BY(mutex_);
  // By instance index: its worker runs a batch (not a task, not a claimer's); what is staged
  // behind it (stage ahead).
  std::vector<char> running_ ABSL_GUARDED_BY(mutex_);
  std::vector<Staged> staged_ ABSL_GUARDED_BY(mutex_);
  // By instance index: the batch its worker handed to its stager to complete (stage ahead), set
  // from the hand-over until the stager has completed it (the worker hands over another only
  // when it is empty, and completes the batch itself otherwise).
  std::vector<std::optional<Ran>> behind_ ABSL_GUARDED_BY(mutex_);
  int claims_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> workers_;
  std::vector<std::thread> stagers_;  // stage ahead only
};

}  // namespace sluice
