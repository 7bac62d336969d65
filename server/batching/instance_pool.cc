#include "server/batching/instance_pool.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/inlined_vector.h"

#include "server/batching/warmup.h"
#include "server/core/logging.h"
#include "server/os/threads.h"

namespace sluice {
namespace {

// Stands between the backend and one request's sink. Notes when the first output of the
// execution was asked for (the end of the forward pass, which splits compute_infer from
// compute_output), and keeps a sink's refusal to itself: the backend writes that output into
// scratch memory instead, so the other requests of the batch are still answered, and only this
// one fails with the sink's error.
class TargetSink final : public OutputSink {
 public:
  TargetSink(OutputSink* inner, const TimeSource* clock, TimePoint* first)
      : inner_(inner), clock_(clock), first_(first) {}
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    if (*first_ == TimePoint{}) *first_ = clock_->Now();
    if (status_.ok()) {
      StatusOr<char*> memory = inner_->Allocate(output);
      if (memory.ok()) return memory;
      status_ = memory.status();
    }
    // Somewhere to write what the caller will not get (its request failed already).
    scratch_.push_back(std::make_unique<char[]>(std::max<size_t>(output.byte_size, 1)));
    return scratch_.back().get();
  }
  bool TakesHeld(const std::string& name) const override { return inner_->TakesHeld(name); }
  Status Hold(const OutputDescription& output, std::shared_ptr<HeldTensor> tensor) override {
    if (*first_ == TimePoint{}) *first_ = clock_->Now();
    if (status_.ok()) status_ = inner_->Hold(output, std::move(tensor));
    return absl::OkStatus();  // a refusal fails this request only, as Allocate's does
  }
  const Status& status() const { return status_; }

 private:
  OutputSink* const inner_;
  const TimeSource* const clock_;
  TimePoint* const first_;
  Status status_;
  std::vector<std::unique_ptr<char[]>> scratch_;  // empty, and unallocated, unless the sink failed
};

// A lone request that needs no padding runs on its own bytes: nothing to assemble.
bool RunsOnItsOwnBytes(const FormedBatch& batch) {
  return batch.requests.size() == 1 && batch.padded_rows == batch.rows;
}

}  // namespace

StatusOr<std::unique_ptr<InstancePool>> InstancePool::Create(
    ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options) {
  if (instances.empty())
    return absl::InvalidArgumentError("an instance pool needs at least one instance");
  if (options.clock == nullptr) return absl::InvalidArgumentError("an instance pool needs a clock");
  return std::unique_ptr<InstancePool>(
      new InstancePool(std::move(spec), std::move(instances), std::move(options)));
}

InstancePool::InstancePool(ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances,
                           Options options)
    : spec_(std::move(spec)), options_(std::move(options)) {
  for (auto& backend : instances) {
    instances_.push_back(std::make_unique<Instance>(instances_.size(), std::move(backend)));
  }
  idle_ = static_cast<int>(instances_.size());
  tasks_.resize(instances_.size());
  assigned_.resize(instances_.size());
  waiting_.assign(instances_.size(), 0);
  claimed_.assign(instances_.size(), 0);
  running_.assign(instances_.size(), 0);
  staged_.resize(instances_.size());
  behind_.resize(instances_.size());
  for (size_t i = 0; i < instances_.size(); ++i)
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  if (options_.stage_ahead) {
    for (size_t i = 0; i < instances_.size(); ++i)
      stagers_.emplace_back([this, i] { StagerLoop(i); });
  }
}

InstancePool::~InstancePool() { Stop(); }

void InstancePool::Run(FormedBatch batch) {
  {
    MutexLock lock(&mutex_);
    if (!stopping_) {
      idle_.fetch_sub(1, std::memory_order_acq_rel);
      ready_.push_back(std::move(batch));
      WakeOne();
      return;
    }
  }
  Fail(batch.requests, ShutdownStatus(), /*ran=*/false);
}

void InstancePool::RunOn(size_t instance, FormedBatch batch) {
  {
    MutexLock lock(&mutex_);
    if (!stopping_) {
      idle_.fetch_sub(1, std::memory_order_acq_rel);
      assigned_[instance].push_back(std::move(batch));
      Wake(instance);
      return;
    }
  }
  Fail(batch.requests, ShutdownStatus(), /*ran=*/false);
}

void InstancePool::StageAhead(FormedBatch batch) {
  {
    MutexLock lock(&mutex_);
    if (!stopping_) {
      for (size_t i = 0; options_.stage_ahead && i < instances_.size(); ++i) {
        if (!running_[i] || staged_[i].state != Staged::State::kEmpty) continue;
        staged_[i].state = Staged::State::kQueued;
        staged_[i].batch = std::move(batch);
        ahead_slots_.fetch_sub(1, std::memory_order_acq_rel);
        instances_[i]->stage.Signal();
        return;
      }
      // The instance that had room went idle meanwhile: an ordinary hand-over.
      idle_.fetch_sub(1, std::memory_order_acq_rel);
      ready_.push_back(std::move(batch));
      WakeOne();
      return;
    }
  }
  Fail(batch.requests, ShutdownStatus(), /*ran=*/false);
}

void InstancePool::StagerLoop(size_t index) {
  NameThisThread("sluice-stager-" + std::to_string(index));
  // Its work is off the cycle: it runs as the front ends do (SCHED_BATCH where they do), so that
  // on a shared CPU waking it to complete a batch does not preempt the worker starting the next.
  RunThisThreadAsFrontEnd();
  (void)RunThisThreadOnModelCpus();  // the worker already said so if it cannot
  Instance* const instance = instances_[index].get();
  MutexLock lock(&mutex_);
  for (;;) {
    while (!stopping_ && staged_[index].state != Staged::State::kQueued && !behind_[index])
      instance->stage.Wait(&mutex_);
    // Answers first: their callers send the requests that make the next batch. The slot stays
    // taken (its value moved out) until the batch is completed: the worker sees the stager busy.
    if (behind_[index]) {
      Ran ran = std::move(*behind_[index]);
      lock.Unlock();
      Complete(instance, std::move(ran), /*behind=*/true);
      lock.Lock();
      behind_[index].reset();
      continue;
    }
    // Stopping: a batch still queued is assembled all the same (the worker runs it). Nothing is
    // handed over to complete after stopping_ is set (the worker completes its batches itself).
    if (staged_[index].state != Staged::State::kQueued) return;
    staged_[index].state = Staged::State::kAssembling;
    FormedBatch batch = std::move(staged_[index].batch);
    lock.Unlock();
    const TimePoint started = options_.clock->Now();
    InferRequest assembled;
    if (!RunsOnItsOwnBytes(batch)) assembled = AssembleBatch(spec_, batch, instance->spare.get());
    const Duration took = options_.clock->Now() - started;
    lock.Lock();
    Staged& staged = staged_[index];
    staged.batch = std::move(batch);
    staged.assembled = std::move(assembled);
    staged.assembly = took;
    staged.state = Staged::State::kReady;
    instance->staged.Signal();
  }
}

std::optional<InstancePool::Staged> InstancePool::TakeStaged(size_t index) {
  Instance* const instance = instances_[index].get();
  Staged& staged = staged_[index];
  while (staged.state == Staged::State::kAssembling) instance->staged.Wait(&mutex_);
  if (staged.state == Staged::State::kEmpty) return std::nullopt;
  // kQueued: the stager has not started; the worker assembles it itself, as any batch.
  if (staged.state == Staged::State::kReady) std::swap(instance->staging, instance->spare);
  Staged taken = std::move(staged);
  staged = Staged();
  ahead_slots_.fetch_add(1, std::memory_order_acq_rel);
  return taken;
}

std::optional<InstancePool::Staged> InstancePool::TakeQueuedElsewhere(size_t index) {
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (i == index || staged_[i].state != Staged::State::kQueued) continue;
    Staged taken = std::move(staged_[i]);
    staged_[i] = Staged();
    ahead_slots_.fetch_add(1, std::memory_order_acq_rel);  // instance i may stage again
    return taken;
  }
  return std::nullopt;
}

bool InstancePool::HasWork(size_t index) const {
  return !claimed_[index] &&
         (!tasks_[index].empty() || !assigned_[index].empty() || !ready_.empty());
}

void InstancePool::Wake(size_t index) {
  if (!waiting_[index]) return;
  waiting_[index] = 0;
  instances_[index]->wake.Signal();
}

void InstancePool::WakeOne() {
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (waiting_[i] && !claimed_[i]) return Wake(i);
  }
}

std::optional<size_t> InstancePool::TryClaim() {
  MutexLock lock(&mutex_);
  if (stopping_ || idle_.load(std::memory_order_acquire) <= 0) return std::nullopt;
  for (size_t i = 0; i < instances_.size(); ++i) {
    // Waiting and not woken: nothing is promised to it (a woken worker is on its way to a batch).
    if (waiting_[i] && !claimed_[i] && tasks_[i].empty() && assigned_[i].empty()) {
      claimed_[i] = 1;
      ++claims_;
      idle_.fetch_sub(1, std::memory_order_acq_rel);
      return i;
    }
  }
  return std::nullopt;
}

void InstancePool::EndClaim(size_t index) {
  claimed_[index] = 0;
  --claims_;
  idle_.fetch_add(1, std::memory_order_acq_rel);
  if (HasWork(index)) Wake(index);  // what was handed over meanwhile, if no other worker took it
  claims_cv_.SignalAll();
}

void InstancePool::Unclaim(size_t instance) {
  MutexLock lock(&mutex_);
  EndClaim(instance);
}

void InstancePool::RunClaimed(size_t instance, FormedBatch batch) {
  RunBatch(instances_[instance].get(), std::move(batch));
  {
    MutexLock lock(&mutex_);
    EndClaim(instance);
  }
  if (options_.on_idle) options_.on_idle(instance, /*after_batch=*/false);
}

void InstancePool::Drop(PendingRequest& pending, const Status& status) {
  if (pending.request->trace) pending.request->trace->Queued(pending.enqueued);
  if (options_.stats) {
    options_.stats->RecordPriorityRefused(pending.request->priority_level, status);
    options_.stats->RecordFailure(options_.clock->Now() - pending.enqueued, status, /*ran=*/false,
                                  pending.request->protocol);
  }
  pending.done(status);
}

void InstancePool::Fail(std::vector<PendingRequest>& requests, const Status& status, bool ran) {
  const TimePoint now = options_.clock->Now();
  for (PendingRequest& pending : requests) {
    if (options_.stats && !pending.filler)
      options_.stats->RecordFailure(now - pending.enqueued, status, ran, pending.request->protocol);
    if (!ran && pending.request->trace) pending.request->trace->Queued(pending.enqueued);
    pending.done(status);
  }
}

StatusOr<WarmupReport> InstancePool::WarmUp(std::vector<WarmupRequest> requests,
                                            const std::atomic<bool>* abandon) {
  auto shared = std::make_shared<const std::vector<WarmupRequest>>(std::move(requests));
  WarmupCollector collector(static_cast<int>(instances_.size()));
  // Held by each instance's whole warm-up when they go one at a time; shared, because a task's
  // last moments (after it reported) may outlive this call.
  // It guards no data, only turns: a plain std::mutex.
  auto one_at_a_time = options_.warm_up_one_at_a_time ? std::make_shared<std::mutex>() : nullptr;
  {
    MutexLock lock(&mutex_);
    if (stopping_) return absl::UnavailableError("the scheduler has stopped");
    for (size_t i = 0; i < instances_.size(); ++i) {
      Instance* instance = instances_[i].get();
      tasks_[i].push_back([this, instance, i, shared, abandon, one_at_a_time, &collector] {
        std::unique_lock<std::mutex> turn;
        if (one_at_a_time) turn = std::unique_lock<std::mutex>(*one_at_a_time);
        collector.Report(RunWarmupOnInstance(
            static_cast<int>(i), *shared, abandon, *options_.clock,
            [&](const InferRequest& request) -> Status {
              FormedBatch batch;
              batch.requests.emplace_back();
              batch.requests.back().request = std::make_unique<InferRequest>(ViewOf(request));
              batch.rows = batch.padded_rows = request.batch_size;
              TensorSink discarded;
              const OutputTarget target{request.batch_size, &request.requested_outputs, &discarded};
              TimePoint assembled_at, infer_done;
              // Where requests never run together they run on their own bytes: so does warm-up.
              const bool assemble = spec_.batches() && options_.batches;
              Status status = Execute(instance, batch, assemble, /*assembled=*/nullptr,
                                      absl::MakeConstSpan(&target, 1), &assembled_at, &infer_done);
              // Stage ahead: the second set reaches its size here too (pinned memory on a GPU),
              // not at the first batch staged in serving. On the worker: no stager uses it yet.
              if (status.ok() && assemble && options_.stage_ahead)
                (void)AssembleBatch(spec_, batch, instance->spare.get());
              if (IsFatal(status) && options_.on_fatal) options_.on_fatal(status);
              // Captures count wherever they happen; warm-up's replays are not served batches.
              if (status.ok() && options_.stats &&
                  instance->backend->LastGraphRun() == ModelBackend::GraphRun::kCaptured) {
                options_.stats->RecordGraphRun(ModelBackend::GraphRun::kCaptured);
              }
              return status;
            }));
      });
      Wake(i);
    }
  }
  return collector.Wait();
}

Status InstancePool::Execute(Instance* instance, const FormedBatch& batch, bool assemble,
                             const InferRequest* assembled, absl::Span<const OutputTarget> targets,
                             TimePoint* assembled_at, TimePoint* infer_done) {
  InferRequest assembled_here;
  const InferRequest* run = batch.requests[0].request.get();
  if (assemble) {
    if (assembled == nullptr) {
      assembled_here = AssembleBatch(spec_, batch, instance->staging.get());
      assembled = &assembled_here;
    }
    run = assembled;
  }
  *assembled_at = options_.clock->Now();
  Status status = instance->backend->Execute(*run, targets);
  if (*infer_done == TimePoint{}) *infer_done = options_.clock->Now();
  return status;
}

void InstancePool::WorkerLoop(size_t index) {
  NameThisThread("sluice-worker-" + std::to_string(index));
  RunThisThreadAsModelWork();
  if (!RunThisThreadOnModelCpus()) {
    spdlog::warn(
        "event=model_cpus_refused worker={} reason=\"{}\" action=\"running on the front ends' "
        "CPUs\"",
        index, strerror(errno));
  }
  Instance* const instance = instances_[index].get();
  MutexLock lock(&mutex_);
  for (;;) {
    while (!stopping_ && !HasWork(index)) {
      waiting_[index] = 1;
      options_.clock->WaitUntil(&instance->wake, &mutex_,
                                kNoDeadline);  // (a fake clock sees it wait)
      waiting_[index] = 0;
    }
    if (!HasWork(index)) return;  // stopping, and nothing left to run here (a claim ends by itself)
    if (!tasks_[index].empty()) {
      std::function<void()> task = std::move(tasks_[index].front());
      tasks_[index].pop_front();
      idle_.fetch_sub(1, std::memory_order_acq_rel);
      lock.Unlock();
      task();
      idle_.fetch_add(1, std::memory_order_acq_rel);
      if (options_.on_idle) options_.on_idle(index, /*after_batch=*/false);
    } else {
      std::deque<FormedBatch>& queue = assigned_[index].empty() ? ready_ : assigned_[index];
      FormedBatch batch = std::move(queue.front());
      queue.pop_front();
      if (!options_.stage_ahead) {
        lock.Unlock();
        RunBatch(instance, std::move(batch));
      } else {
        running_[index] = 1;
        ahead_slots_.fetch_add(1, std::memory_order_acq_rel);
        lock.Unlock();
        if (options_.on_slot) options_.on_slot();
        std::optional<Ran> ended = ExecuteBatch(instance, std::move(batch));
        lock.Lock();
        // What was staged behind it runs now, and else a batch staged behind a busier instance
        // that its stager has not started: the instance does not go idle in between. The batch
        // that ended is completed by the stager meanwhile; with nothing to run next, here (and
        // then what was staged while it completed runs).
        for (;;) {
          std::optional<Staged> staged = TakeStaged(index);
          if (!staged) staged = TakeQueuedElsewhere(index);
          // The ended batch goes to the stager when a batch runs next, unless stopping or the
          // stager is still busy with the one before (answers never pile up behind a stager that
          // falls behind: at most one waits). Else the worker completes it here, and with nothing
          // to run next looks again for what was staged meanwhile.
          if (ended && staged && !stopping_ && !behind_[index]) {
            // The cycle ended when the worker was done with it (a wait above for the staged
            // batch's assembly is the next batch's idle time); the completion runs beside.
            instance->last_end = ended->executed_at;
            ended->phases.complete = ended->executed_at - ended->delivered_at;
            behind_[index] = std::move(*ended);
            ended.reset();
            instance->stage.Signal();
          } else if (ended) {
            lock.Unlock();
            Complete(instance, std::move(*ended), /*behind=*/false);
            ended.reset();
            lock.Lock();
            if (!staged) continue;
          }
          if (!staged) break;
          lock.Unlock();
          // The batch ended (the scheduler counts on one call per batch), and its slot is free.
          if (options_.on_idle) options_.on_idle(index, /*after_batch=*/true);
          FormedBatch next = std::move(staged->batch);
          ended = ExecuteBatch(instance, std::move(next), &*staged);
          lock.Lock();
        }
        running_[index] = 0;
        ahead_slots_.fetch_sub(1, std::memory_order_acq_rel);
        lock.Unlock();
      }
      idle_.fetch_add(1, std::memory_order_acq_rel);
      if (options_.on_idle) options_.on_idle(index, /*after_batch=*/true);
    }
    lock.Lock();
  }
}

void InstancePool::RunBatch(Instance* instance, FormedBatch batch) {
  std::optional<Ran> ran = ExecuteBatch(instance, std::move(batch));
  if (ran) Complete(instance, std::move(*ran), /*behind=*/false);
}

std::optional<InstancePool::Ran> InstancePool::ExecuteBatch(Instance* instance, FormedBatch batch,
                                                            Staged* staged) {
  const TimePoint started = options_.clock->Now();
  // The instance's idle time since its previous batch (warm-up before the first is not counted).
  const Duration idle =
      instance->last_end == TimePoint{} ? Duration::zero() : started - instance->last_end;
  const bool alone = RunsOnItsOwnBytes(batch);
  if (options_.stats) {
    const auto callers =
        std::count_if(batch.requests.begin(), batch.requests.end(),
                      [](const PendingRequest& pending) { return !pending.filler; });
    options_.stats->RecordStarted(static_cast<int64_t>(callers));
    for (const PendingRequest& pending : batch.requests) {
      if (!pending.filler)
        options_.stats->RecordPriorityQueued(pending.request->priority_level,
                                             started - pending.enqueued);
    }
  }
  TimePoint infer_done{};
  // Inline for the usual batch sizes: no allocation per batch.
  absl::InlinedVector<TargetSink, 8> sinks;
  absl::InlinedVector<OutputTarget, 8> targets;
  sinks.reserve(batch.requests.size());
  targets.reserve(batch.requests.size());
  for (PendingRequest& pending : batch.requests) {
    sinks.emplace_back(pending.sink, options_.clock, &infer_done);
    targets.push_back(
        {pending.request->batch_size, &pending.request->requested_outputs, &sinks.back()});
  }
  TimePoint assembled_at;
  // A batch the stager assembled runs on its assembly; one the worker took over before the stager
  // started is assembled here, as any batch.
  const bool assembled_ahead = staged != nullptr && staged->state == Staged::State::kReady;
  const InferRequest* assembled = assembled_ahead ? &staged->assembled : nullptr;
  Status status = Execute(instance, batch, !alone, assembled, targets, &assembled_at, &infer_done);
  const TimePoint delivered_at = options_.clock->Now();
  TraceRun(*instance, batch, status, started, infer_done, delivered_at);
  if (!status.ok()) {
    if (IsFatal(status) && options_.on_fatal) options_.on_fatal(status);
    Fail(batch.requests, status, /*ran=*/true);
    instance->last_end = options_.clock->Now();
    return std::nullopt;
  }
  Ran ran;
  ran.started = started;
  ran.delivered_at = delivered_at;
  BatchPhases& phases = ran.phases;
  phases.idle = idle;
  phases.assembly = assembled_at - started;
  phases.execute = infer_done - assembled_at;
  phases.scatter = delivered_at - infer_done;
  if (options_.stats) {
    options_.stats->RecordExecution(batch.padded_rows, phases.assembly, phases.execute,
                                    phases.scatter);
    options_.stats->RecordGraphRun(instance->backend->LastGraphRun());
  }
  if (options_.costs) {
    // The batch's shape group, as its queue keyed it (one group, "", where requests run alone).
    const std::string group =
        options_.batches ? BatchQueue::GroupKey(*batch.requests.front().request) : std::string();
    const std::optional<Duration> predicted =
        options_.costs->Observe(instance->index, group, batch.padded_rows, delivered_at - started);
    if (options_.stats) {
      options_.stats->RecordBatchCost(started - batch.requests.front().enqueued, predicted,
                                      delivered_at - started);
    }
  }
  ran.refused.reserve(sinks.size());
  for (const TargetSink& sink : sinks) ran.refused.push_back(sink.status());
  if (assembled_ahead) {
    phases.assembly_ahead = staged->assembly;
    phases.staged_ahead = true;
  }
  phases.device = instance->backend->LastPhases();  // the next batch's Execute replaces them
  phases.rows = batch.rows;
  phases.padded_rows = batch.padded_rows;
  ran.batch = std::move(batch);
  ran.executed_at = options_.clock->Now();
  return ran;
}

void InstancePool::Complete(Instance* instance, Ran ran, bool behind) {
  const TimePoint began = options_.clock->Now();
  std::vector<PendingRequest>& requests = ran.batch.requests;
  // Answers to a connection that several callers of this batch share leave together.
  AnswerConnections connections;
  if (requests.size() > 1) {
    for (const PendingRequest& pending : requests) {
      if (!pending.filler) connections.Add(pending.sink);
    }
    connections.Hold();
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    PendingRequest& pending = requests[i];
    const Status& refused = ran.refused[i];
    if (options_.costs && refused.ok() && !pending.filler)
      options_.costs->ObserveAnswer(ran.delivered_at - pending.enqueued);
    if (options_.stats && !pending.filler) {
      if (refused.ok()) {
        // The request's compute times are its batch's input, infer and output phases.
        options_.stats->RecordSuccess(pending.request->batch_size, ran.started - pending.enqueued,
                                      ran.phases.assembly, ran.phases.execute, ran.phases.scatter,
                                      options_.clock->Now() - pending.enqueued,
                                      pending.request->protocol);
      } else {
        options_.stats->RecordFailure(options_.clock->Now() - pending.enqueued, refused,
                                      /*ran=*/true, pending.request->protocol);
      }
    }
    pending.done(refused);
  }
  connections.Release();
  const TimePoint end = options_.clock->Now();
  if (behind) {
    ran.phases.complete_behind = end - began;
  } else {
    instance->last_end = end;
    ran.phases.complete = end - ran.delivered_at;
  }
  if (options_.stats) options_.stats->RecordPhases(ran.phases);
}

void InstancePool::TraceRun(const Instance& instance, const FormedBatch& batch,
                            const Status& status, TimePoint started, TimePoint computed,
                            TimePoint delivered) {
  absl::InlinedVector<RequestTrace*, 8> traced;
  for (const PendingRequest& pending : batch.requests) {
    if (pending.filler || !pending.request->trace) continue;
    pending.request->trace->Queued(pending.enqueued);
    traced.push_back(pending.request->trace.get());
  }
  if (traced.empty()) return;  // the usual case: nothing here is traced
  BatchTraceInfo info;
  info.model = spec_.name;
  info.version = batch.requests.front().request->model_version;
  info.requests = static_cast<int64_t>(
      std::count_if(batch.requests.begin(), batch.requests.end(),
                    [](const PendingRequest& pending) { return !pending.filler; }));
  info.rows = batch.rows;
  info.padded_rows = batch.padded_rows;
  info.instance = instance.index;
  info.started = started;
  info.computed = computed;
  info.delivered = delivered;
  info.status = status;
  TraceBatch(traced, info);
}

void InstancePool::Stop() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    for (size_t i = 0; i < instances_.size(); ++i) {
      Wake(i);
      instances_[i]->stage.Signal();
    }
    while (claims_ > 0) claims_cv_.Wait(&mutex_);
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  for (std::thread& stager : stagers_) {
    if (stager.joinable()) stager.join();
  }
}

size_t InstancePool::StagingAllocations() const {
  MutexLock lock(&mutex_);  // a worker swaps its two sets under it
  size_t total = 0;
  for (const auto& instance : instances_)
    total += instance->staging->allocations() + instance->spare->allocations();
  return total;
}

}  // namespace sluice
