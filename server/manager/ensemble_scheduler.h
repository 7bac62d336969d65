// The scheduler of an ensemble (platform "ensemble", ensemble_scheduling): each request runs its
// steps as requests to their models, through each model's ModelHandle::Submit (its validation,
// queue timeout and batcher), so a step batches with that model's other traffic and with other
// ensembles' steps. A step starts as soon as every ensemble tensor it reads exists (a DAG: fan-out
// and fan-in); independent steps run at once.
//
// What a step's request carries from the ensemble's: its id, protocol, deadline, priority and
// timeout parameters, and a cancellation flag of the ensemble request's own, set when the caller
// goes away (Poke) or a step fails, so that steps still queued are answered at once. The first
// step that fails answers the ensemble request with its status, the step named, once no step of
// it is still in flight (they view the caller's bytes). A step's model is looked up when the step
// starts: a composing model reloaded serves the next step; one unloaded answers UNAVAILABLE
// naming it.
//
// With max_inflight_requests (Triton's), at most that many requests of each step are in its model
// at once, across all of the ensemble's requests; a step beyond that waits in the ensemble, in
// order, until one of them is answered. No thread waits: the answer that frees a slot submits the
// next. A waiting step whose request is cancelled (or whose run failed) is dropped; one whose
// deadline passes is refused by its model's queue when it is submitted.
//
// Tensors between steps stay where the step's model made them (held: OutputSink::Hold; on a GPU,
// its memory): the steps after it read them in place (no copy when a step's batch is that one
// request, unpadded, on a model without CUDA graphs; one copy on the device when it batches with
// other requests or into a graph's static input). Outputs a model brings to
// the host (strings; a composing model with a response cache) are read from the host. The
// ensemble's outputs are copied once, into the caller's sink. The copies between steps are
// counted per request (the ensemble's ModelStats, its trace span). A step's model must not write
// its inputs in place: it reads the tensor the step before made, as do the other steps that read
// it.
#pragma once

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "server/core/mutex.h"
#include "server/manager/model_handle.h"

namespace sluice {

// Thread-safe.
class EnsembleScheduler final : public Scheduler, public QueueSharing {
 public:
  struct Options {
    const ModelLookup* lookup = nullptr;  // where steps find their models; required, outlives this
    const TimeSource* clock = nullptr;    // required, outlives this
    std::shared_ptr<ModelStats> stats;    // the ensemble's own statistics; may be null
  };

  // Checks every step of `spec` against its model as served now: the model ready; each tensor
  // the step maps among the model's inputs or outputs; every input the model needs mapped;
  // datatypes equal and shapes compatible (-1 matches any size) between an ensemble tensor, its
  // writer and its readers; a batching ensemble's steps batch, with a max_batch_size at least
  // the ensemble's. UNAVAILABLE when a step's model is not ready, INVALID_ARGUMENT otherwise,
  // naming the step.
  static StatusOr<std::unique_ptr<EnsembleScheduler>> Create(ModelSpec spec, Options options);
  ~EnsembleScheduler() override;

  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override ABSL_LOCKS_EXCLUDED(mutex_);
  // Requests whose caller went away drop their queued steps.
  void Poke() override ABSL_LOCKS_EXCLUDED(mutex_);
  // Nothing to warm: each step's model warmed itself up.
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    return WarmupReport{};
  }
  void SetCallerRuns(bool) override {}  // steps run on their models' workers
  void SetBatchSizeLadder(std::vector<int>) override {}
  // The latest change of a model its steps run (ModelLookup::Generation): a step model loaded,
  // reloaded or unloaded may change the answers; any such change raises it.
  uint64_t AnswersGeneration() const override;
  // Refuses new requests (UNAVAILABLE) and waits for those in flight to be answered.
  void Stop() override ABSL_LOCKS_EXCLUDED(mutex_);

  // QueueSharing, for the response cache's single flight (an ensemble with response_cache). An
  // ensemble has no queue of its own: its steps wait in their models' queues, under those caps,
  // so every waiter is admitted. Reschedule raises the deadline (to the later one) of the run
  // whose flag is `tag` for the steps it has not started yet; a step already queued keeps what it
  // was given. Priority levels are a queue's (an ensemble has none: each step carries the
  // request's priority parameter to its model), and the DELAY timeout action is the step
  // models' own, so `priority_level` and `delay_after` are not passed on. False when no run has
  // that flag.
  Status AdmitWaiter(const InferRequest&) override { return absl::OkStatus(); }
  void ReleaseWaiter(int, size_t) override {}
  bool Reschedule(const std::atomic<bool>* tag, int priority_level, TimePoint deadline,
                  TimePoint delay_after) override ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Run;
  class StepOutputs;
  EnsembleScheduler(ModelSpec spec, Options options);
  // A step's request waiting for a slot (max_inflight_requests).
  struct Waiting {
    std::shared_ptr<Run> run;
    std::unique_ptr<InferRequest> request;
  };
  // Submits the steps of `run` in `steps` (whose inputs all exist), or queues those whose step
  // has no slot free.
  void StartSteps(const std::shared_ptr<Run>& run, std::vector<size_t> steps)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // Hands `request` to the step's model (it holds a slot, when there are slots).
  void SubmitStep(const std::shared_ptr<Run>& run, size_t step,
                  std::unique_ptr<InferRequest> request) ABSL_LOCKS_EXCLUDED(mutex_);
  // `held_slot`: the step held one of max_inflight_requests' slots (false for a step dropped
  // while it waited for one).
  void StepAnswered(const std::shared_ptr<Run>& run, size_t step, Status status,
                    bool held_slot = true) ABSL_LOCKS_EXCLUDED(mutex_);
  // A slot of `step` is free: it passes to the first waiting request whose run goes on (those
  // cancelled meanwhile are answered), or is given back.
  void ReleaseSlot(size_t step) ABSL_LOCKS_EXCLUDED(mutex_);
  // Answers the waiting steps of runs cancelled (caller gone, a step failed).
  void DropCancelledWaiting() ABSL_LOCKS_EXCLUDED(mutex_);
  static Status DroppedWhileWaiting();
  // Answers the ensemble request (every step of it answered, or none left to start).
  void Finish(const std::shared_ptr<Run>& run, Status status) ABSL_LOCKS_EXCLUDED(mutex_);

  const ModelSpec spec_;
  const Options options_;
  std::vector<std::vector<size_t>> readers_;  // by step: the steps that read one of its outputs
  // By step: its model's outputs that another step reads (held between steps; the rest come to
  // the host, read only by the caller).
  std::vector<std::set<std::string>> read_by_steps_;
  std::vector<int> producers_;  // by step: how many steps write what it reads

  Mutex mutex_;
  CondVar idle_;  // the last run ended
  std::set<std::shared_ptr<Run>> live_ ABSL_GUARDED_BY(mutex_);
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
  // max_inflight_requests, by step: the slots taken (requests in the step's model), and the
  // requests waiting for one, in order.
  std::vector<uint32_t> slots_taken_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::deque<Waiting>> waiting_ ABSL_GUARDED_BY(mutex_);
  // Slots freed and not yet handed on, and whether a thread is handing them on (ReleaseSlot).
  std::deque<size_t> released_ ABSL_GUARDED_BY(mutex_);
  bool handing_on_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace sluice
