#include "server/batching/sequence_batcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

#include "server/batching/batch_queue.h"
#include "server/core/bytes_tensor.h"
#include "server/core/logging.h"
#include "server/core/thread_name.h"

namespace sluice {
namespace {

template <typename T>
void AppendScalar(T value, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

// One row's value of `control`, in its type's bytes.
void AppendControlValue(const SequenceControlSpec& control, const SequenceControl* sequence, std::string* out) {
  if (control.kind == SequenceControlKind::kCorrId) {
    const CorrelationId none;
    const CorrelationId& id = sequence ? sequence->id : none;
    switch (control.dtype) {
      case DataType::kBytes: AppendBytesElement(id.text, out); return;
      case DataType::kInt64: AppendScalar<int64_t>(static_cast<int64_t>(id.number), out); return;
      default: AppendScalar<int32_t>(static_cast<int32_t>(id.number), out); return;
    }
  }
  bool on = false;
  if (sequence != nullptr) {
    switch (control.kind) {
      case SequenceControlKind::kStart: on = sequence->start; break;
      case SequenceControlKind::kEnd: on = sequence->end; break;
      case SequenceControlKind::kReady: on = true; break;
      case SequenceControlKind::kCorrId: break;
    }
  }
  out->append(ScalarBytes(control.dtype, on ? control.true_value : control.false_value));
}

// The largest correlation id each CORRID type holds.
uint64_t LargestId(DataType type) {
  switch (type) {
    case DataType::kInt64: return static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    case DataType::kInt32: return static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    default: return std::numeric_limits<uint64_t>::max();
  }
}

}  // namespace

void AppendSequenceControls(const ModelSpec& spec, const SequenceControl* control, InferRequest* request) {
  const int64_t rows = spec.batches() ? request->batch_size : 1;
  for (const SequenceControlSpec& each : spec.sequence_batching.controls) {
    std::string bytes;
    for (int64_t row = 0; row < rows; ++row) AppendControlValue(each, control, &bytes);
    request->AddOwnedInput(each.input, each.dtype, spec.batches() ? Shape{rows, 1} : Shape{1}, std::move(bytes));
  }
}

StatusOr<std::unique_ptr<SequenceBatcher>> SequenceBatcher::Create(ModelSpec spec,
                                                                   std::vector<std::unique_ptr<ModelBackend>> instances,
                                                                   Options options) {
  if (instances.empty()) return absl::InvalidArgumentError("a sequence batcher needs at least one instance");
  if (options.clock == nullptr) return absl::InvalidArgumentError("a sequence batcher needs a clock");
  if (!spec.sequence_batching.enabled) {
    return absl::InvalidArgumentError("a sequence batcher serves models with sequence_batching");
  }
  const size_t count = instances.size();
  std::unique_ptr<SequenceBatcher> batcher(new SequenceBatcher(spec, options));
  InstancePool::Options pool_options;
  pool_options.clock = options.clock;
  pool_options.stats = options.stats;
  pool_options.on_fatal = options.on_fatal;
  // Only a finished batch frees an instance it was handed to: a warm-up task's notice may come
  // after traffic started.
  pool_options.on_idle = [raw = batcher.get()](size_t instance, bool after_batch) {
    if (after_batch) raw->InstanceIdle(instance);
  };
  pool_options.batches = spec.batches();
  pool_options.warm_up_one_at_a_time = options.warm_up_one_at_a_time;
  SLUICE_ASSIGN_OR_RETURN(batcher->pool_,
                          InstancePool::Create(std::move(spec), std::move(instances), std::move(pool_options)));
  {
    MutexLock lock(&batcher->mutex_);
    batcher->instances_.resize(count);
    for (InstanceState& instance : batcher->instances_) instance.slots.resize(batcher->slots_per_instance_);
  }
  batcher->batcher_ = std::thread([raw = batcher.get()] { raw->BatcherLoop(); });
  return batcher;
}

SequenceBatcher::SequenceBatcher(ModelSpec spec, Options options)
    : spec_(std::move(spec)),
      options_(std::move(options)),
      slots_per_instance_(std::max(1, spec_.max_batch_size)),
      admission_(Admission::Options{options_.max_requests, options_.max_bytes, options_.server_budget,
                                    /*shares=*/2}) {}

SequenceBatcher::~SequenceBatcher() { Stop(); }

Status SequenceBatcher::CheckRequest(const InferRequest& request) const {
  const CorrelationId& id = request.parameters.sequence.id;
  const std::optional<DataType> declared = spec_.sequence_batching.correlation_id_type;
  if (!id.present()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec_.name, "' is stateful (sequence_batching): every request needs the parameter sequence_id (",
        !declared ? "a non-zero integer or a non-empty string"
                  : *declared == DataType::kBytes ? "a non-empty string" : "a non-zero integer",
        "), and sequence_start on a sequence's first request, sequence_end on its last"));
  }
  if (!declared) return CheckRows(request);
  const DataType type = *declared;
  if (id.is_text != (type == DataType::kBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec_.name, "' takes ", type == DataType::kBytes ? "string" : "integer",
        " sequence ids (CONTROL_SEQUENCE_CORRID is ", DataTypeName(type), "); sequence_id ", id.ToString(), " is ",
        id.is_text ? "a string" : "an integer"));
  }
  if (!id.is_text && id.number > LargestId(type)) {
    return absl::InvalidArgumentError(absl::StrCat("sequence_id ", id.number, " does not fit model '", spec_.name,
                                                   "''s CONTROL_SEQUENCE_CORRID type ", DataTypeName(type),
                                                   " (at most ", LargestId(type), ")"));
  }
  return CheckRows(request);
}

Status SequenceBatcher::CheckRows(const InferRequest& request) const {
  if (spec_.batches() && request.batch_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a request of a sequence carries one row: model '", spec_.name,
        "' (sequence_batching) needs batch size 1, found ", request.batch_size));
  }
  return absl::OkStatus();
}

void SequenceBatcher::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink, InferCompletion done) {
  ModelStats* stats = pool_->stats();
  Status admitted = CheckRequest(*request);
  if (admitted.ok()) {
    const SequenceControl control = request->parameters.sequence;
    AppendSequenceControls(spec_, &control, request.get());
    const TimePoint now = options_.clock->Now();
    MutexLock lock(&mutex_);
    auto found = sequences_.find(control.id);
    std::shared_ptr<Sequence> sequence = found == sequences_.end() ? nullptr : found->second;
    // Only a refusal needs the sequence described: admitted requests build no string.
    auto name = [&] { return absl::StrCat("sequence ", control.id.ToString(), " of model '", spec_.name, "'"); };
    if (stopping_) {
      admitted = absl::UnavailableError(absl::StrCat("model '", spec_.name, "' is shutting down"));
    } else if (control.start && sequence != nullptr) {
      admitted = absl::InvalidArgumentError(absl::StrCat(
          name(), " is already active; sequence_start begins a new sequence: end the active one with sequence_end "
          "first, or use another sequence_id"));
    } else if (!control.start && sequence == nullptr) {
      admitted = absl::InvalidArgumentError(absl::StrCat(
          name(), " is not active: its first request must set sequence_start (a sequence ends with its sequence_end "
          "request, after ", spec_.sequence_batching.max_sequence_idle_us / 1000,
          " ms without a request (max_sequence_idle_microseconds), or when its model version is unloaded)"));
    } else if (sequence != nullptr && sequence->end_queued) {
      admitted = absl::InvalidArgumentError(absl::StrCat(
          name(), " already has its sequence_end request queued; start a new sequence with sequence_start once it "
          "has been answered"));
    } else {
      admitted = AdmitLocked(sequence.get(), request->InputBytes());
    }
    if (admitted.ok()) {
      if (sequence == nullptr) {
        sequence = std::make_shared<Sequence>();
        sequence->id = control.id;
        sequences_.emplace(control.id, sequence);
        waiting_.push_back(sequence);
        if (stats) stats->RecordSequenceStarted();
      }
      PendingRequest pending;
      pending.enqueued = now;
      pending.bytes = request->InputBytes();
      pending.request = std::move(request);
      pending.sink = sink;
      pending.done = std::move(done);
      sequence->pending.push_back(std::move(pending));
      sequence->end_queued = control.end;
      sequence->last_activity = now;
      if (stats) stats->RecordAdmitted();
      batcher_cv_.Signal();
      return;
    }
  }
  spdlog::debug("event=sequence_request_refused model={} sequence={} reason=\"{}\"", spec_.name,
                request->parameters.sequence.id.ToString(), admitted.message());
  if (stats) stats->RecordRejected(admitted, request->protocol);
  done(std::move(admitted));
}

Status SequenceBatcher::AdmitLocked(const Sequence* sequence, size_t bytes) {
  const bool bound = sequence != nullptr && sequence->instance >= 0;
  const size_t slots = instances_.size() * static_cast<size_t>(slots_per_instance_);
  return admission_.Admit(bound ? kBoundShare : kWaitingShare, bytes, spec_.name, [&, slots](size_t waiting) {
    if (bound) {
      return absl::UnavailableError(absl::StrCat("model '", spec_.name, "' has ", waiting,
                                                 " requests queued for its active sequences (max_queue_size ",
                                                 options_.max_requests, "); retry later"));
    }
    return absl::UnavailableError(absl::StrCat(
        "model '", spec_.name, "' has ", waiting, " requests of sequences waiting for one of its ", slots,
        " sequence slots (max_queue_size ",
        options_.max_requests, "); retry later"));
  });
}

void SequenceBatcher::Poke() {
  { MutexLock lock(&mutex_); }
  batcher_cv_.Signal();
}

void SequenceBatcher::InstanceIdle(size_t instance) {
  {
    MutexLock lock(&mutex_);
    if (instance >= instances_.size()) return;
    instances_[instance].busy = false;
  }
  batcher_cv_.Signal();
}

void SequenceBatcher::AssignSlotsLocked() {
  while (!waiting_.empty()) {
    // The instance with the most free slots (spreading sequences over instances), its lowest free
    // slot (keeping executions few rows tall).
    int best_instance = -1, best_slot = -1, best_free = 0;
    for (size_t i = 0; i < instances_.size(); ++i) {
      int free = 0, first = -1;
      for (int s = 0; s < slots_per_instance_; ++s) {
        if (instances_[i].slots[s] != nullptr) continue;
        ++free;
        if (first < 0) first = s;
      }
      if (free > best_free) {
        best_free = free;
        best_instance = static_cast<int>(i);
        best_slot = first;
      }
    }
    if (best_instance < 0) return;  // every slot is bound
    std::shared_ptr<Sequence> sequence = std::move(waiting_.front());
    waiting_.pop_front();
    size_t bytes = 0;
    for (const PendingRequest& pending : sequence->pending) bytes += pending.bytes;
    admission_.Move(kWaitingShare, kBoundShare, sequence->pending.size(), bytes);
    sequence->instance = best_instance;
    sequence->slot = best_slot;
    instances_[best_instance].slots[best_slot] = sequence;
    spdlog::debug("event=sequence_bound model={} sequence={} instance={} slot={}", spec_.name,
                  sequence->id.ToString(), best_instance, best_slot);
  }
}

void SequenceBatcher::ForgetLocked(const std::shared_ptr<Sequence>& sequence, SequenceOutcome outcome) {
  if (ModelStats* stats = pool_->stats()) stats->RecordSequenceFinished(outcome);
  if (sequence->instance >= 0) {
    std::shared_ptr<Sequence>& slot = instances_[sequence->instance].slots[sequence->slot];
    if (slot == sequence) slot.reset();
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), sequence), waiting_.end());
  }
  auto found = sequences_.find(sequence->id);
  if (found != sequences_.end() && found->second == sequence) sequences_.erase(found);
  if (sequences_.empty()) ended_cv_.SignalAll();
}

TimePoint SequenceBatcher::ExpireLocked(TimePoint now, std::vector<std::pair<PendingRequest, Status>>* out) {
  TimePoint next = kNoDeadline;
  const Duration idle = std::chrono::microseconds(spec_.sequence_batching.max_sequence_idle_us);
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    const std::shared_ptr<Sequence> sequence = it->second;
    ++it;  // ForgetLocked may erase this entry
    bool start_lost = false;
    for (auto pending = sequence->pending.begin(); pending != sequence->pending.end();) {
      const InferRequest& request = *pending->request;
      if (!request.IsCancelled() && request.deadline > now) {
        next = std::min(next, request.deadline);
        ++pending;
        continue;
      }
      Status status = QueuedExpiryStatus(request);
      if (request.parameters.sequence.start && !sequence->started) start_lost = true;
      if (request.parameters.sequence.end) sequence->end_queued = false;
      admission_.Release(ShareOf(*sequence), pending->bytes);
      out->emplace_back(std::move(*pending), std::move(status));
      pending = sequence->pending.erase(pending);
    }
    if (start_lost) {
      // Without its start the model would see the sequence's other requests as another's: drop it.
      for (PendingRequest& pending : sequence->pending) {
        admission_.Release(ShareOf(*sequence), pending.bytes);
        out->emplace_back(std::move(pending), absl::UnavailableError(absl::StrCat(
                                                  "sequence ", sequence->id.ToString(), " of model '", spec_.name,
                                                  "' was dropped: its sequence_start request expired before it ran")));
      }
      sequence->pending.clear();
      spdlog::info("event=sequence_dropped model={} sequence={} reason=\"start expired while queued\"", spec_.name,
                   sequence->id.ToString());
      ForgetLocked(sequence, SequenceOutcome::kDropped);
      continue;
    }
    if (sequence->instance >= 0 && sequence->started && sequence->pending.empty() && !sequence->running) {
      const TimePoint idle_at = sequence->last_activity + idle;
      if (idle_at <= now) {
        spdlog::info("event=sequence_idle_expired model={} sequence={} instance={} slot={} idle_us={}", spec_.name,
                     sequence->id.ToString(), sequence->instance, sequence->slot,
                     spec_.sequence_batching.max_sequence_idle_us);
        ForgetLocked(sequence, SequenceOutcome::kIdleExpired);
      } else {
        next = std::min(next, idle_at);
      }
    }
  }
  return next;
}

PendingRequest SequenceBatcher::Filler(const InferRequest& like) const {
  auto request = std::make_unique<InferRequest>();
  request->model_name = like.model_name;
  request->model_version = like.model_version;
  request->batch_size = 1;
  for (const TensorView& input : like.inputs) {
    const bool control = std::any_of(spec_.sequence_batching.controls.begin(), spec_.sequence_batching.controls.end(),
                                     [&](const SequenceControlSpec& each) { return each.input == input.name; });
    if (control) continue;
    // `like` was validated: its shape has a count.
    request->AddOwnedInput(input.name, input.dtype, input.shape,
                           ZeroElements(input.dtype, ElementCount(input.shape).value_or(0)));
  }
  AppendSequenceControls(spec_, nullptr, request.get());
  request->requested_outputs.push_back(spec_.outputs.front().name);
  PendingRequest filler;
  filler.filler = true;
  filler.request = std::move(request);
  auto discarded = std::make_shared<TensorSink>();
  filler.sink = discarded.get();
  filler.done = [discarded](Status) {};
  filler.enqueued = options_.clock->Now();
  return filler;
}

std::optional<FormedBatch> SequenceBatcher::FormBatchLocked(size_t index, TimePoint now, TimePoint* wake) {
  InstanceState& instance = instances_[index];
  const Sequence* oldest = nullptr;
  for (const std::shared_ptr<Sequence>& sequence : instance.slots) {
    if (sequence == nullptr || sequence->pending.empty()) continue;
    if (oldest == nullptr || sequence->pending.front().enqueued < oldest->pending.front().enqueued) {
      oldest = sequence.get();
    }
  }
  if (oldest == nullptr) return std::nullopt;
  // Rows of one execution share their non-batch shapes; slots whose next request has another
  // shape wait for the next execution.
  const std::string key = spec_.batches() ? BatchQueue::GroupKey(*oldest->pending.front().request) : std::string();
  std::vector<int> chosen;
  for (int s = 0; s < slots_per_instance_; ++s) {
    const std::shared_ptr<Sequence>& sequence = instance.slots[s];
    if (sequence == nullptr || sequence->pending.empty()) continue;
    if (spec_.batches() && BatchQueue::GroupKey(*sequence->pending.front().request) != key) continue;
    chosen.push_back(s);
  }
  const SequenceBatchingSpec& batching = spec_.sequence_batching;
  if (batching.max_queue_delay_us > 0) {
    const auto wanted = static_cast<size_t>(std::ceil(batching.minimum_slot_utilization * slots_per_instance_));
    const TimePoint due = oldest->pending.front().enqueued + std::chrono::microseconds(batching.max_queue_delay_us);
    if (chosen.size() < wanted && now < due) {
      *wake = std::min(*wake, due);
      return std::nullopt;
    }
  }
  // Fillers take their shapes from a real row: its request object stays where it is when its
  // owner moves into the batch.
  const InferRequest* like = instance.slots[chosen.front()]->pending.front().request.get();
  FormedBatch batch;
  const int rows = spec_.batches() ? chosen.back() + 1 : 1;
  size_t next = 0;
  for (int s = 0; s < rows; ++s) {
    if (next < chosen.size() && chosen[next] == s) {
      ++next;
      const std::shared_ptr<Sequence> sequence = instance.slots[s];
      PendingRequest pending = std::move(sequence->pending.front());
      sequence->pending.pop_front();
      admission_.Release(kBoundShare, pending.bytes);
      sequence->started = true;
      sequence->running = true;
      // Idle time counts from the answer, noted before the caller hears it (so a client that sends
      // its next request at once is never late). Only the worker calls this, never under our lock
      // (the pool is running while executions are handed to it).
      const bool start = pending.request->parameters.sequence.start;
      pending.done = [this, sequence, start, done = std::move(pending.done)](Status status) mutable {
        std::deque<PendingRequest> orphans;
        {
          MutexLock lock(&mutex_);
          sequence->running = false;
          sequence->last_activity = options_.clock->Now();
          // A start that failed leaves nothing for the rest of the sequence to build on: drop it,
          // so that the client can start it again, and answer what was queued behind it.
          auto found = sequences_.find(sequence->id);
          if (start && !status.ok() && found != sequences_.end() && found->second == sequence) {
            orphans.swap(sequence->pending);
            for (const PendingRequest& orphan : orphans) admission_.Release(ShareOf(*sequence), orphan.bytes);
            spdlog::info("event=sequence_dropped model={} sequence={} reason=\"its start failed: {}\"", spec_.name,
                         sequence->id.ToString(), status.message());
            ForgetLocked(sequence, SequenceOutcome::kDropped);
          }
        }
        for (PendingRequest& orphan : orphans) {
          pool_->Drop(orphan, absl::UnavailableError(absl::StrCat(
                                  "sequence ", sequence->id.ToString(), " of model '", spec_.name,
                                  "' was dropped: its sequence_start request failed (", status.message(), ")")));
        }
        done(std::move(status));
      };
      // After its end the slot is free for another sequence, whose start runs in a later
      // execution of this instance (executions of one instance are in order).
      if (pending.request->parameters.sequence.end) ForgetLocked(sequence, SequenceOutcome::kEnded);
      batch.requests.push_back(std::move(pending));
    } else {
      batch.requests.push_back(Filler(*like));
    }
  }
  batch.rows = batch.padded_rows = rows;
  return batch;
}

void SequenceBatcher::BatcherLoop() {
  NameThisThread("sluice-sequence");
  MutexLock lock(&mutex_);
  while (!stopping_) {
    const TimePoint now = options_.clock->Now();
    std::vector<std::pair<PendingRequest, Status>> expired;
    TimePoint wake = ExpireLocked(now, &expired);
    if (!expired.empty()) {
      lock.Unlock();
      for (auto& [pending, status] : expired) pool_->Drop(pending, status);
      lock.Lock();
      continue;
    }
    AssignSlotsLocked();
    for (size_t i = 0; i < instances_.size(); ++i) {
      if (instances_[i].busy) continue;
      if (std::optional<FormedBatch> batch = FormBatchLocked(i, now, &wake)) {
        instances_[i].busy = true;
        pool_->RunOn(i, *std::move(batch));
      }
    }
    if (wake == kNoDeadline) {
      batcher_cv_.Wait(&mutex_);
    } else {
      // The clock may be a fake one: wait for the real time it says is left, or a signal.
      batcher_cv_.WaitFor(&mutex_, std::max(wake - now, Duration(std::chrono::microseconds(50))));
    }
  }
}

StatusOr<WarmupReport> SequenceBatcher::WarmUp(std::vector<WarmupRequest> requests, const std::atomic<bool>* abandon) {
  for (WarmupRequest& warmup : requests) AppendSequenceControls(spec_, nullptr, warmup.request.get());
  return pool_->WarmUp(std::move(requests), abandon);
}

bool SequenceBatcher::HasSequence(const CorrelationId& id) const {
  MutexLock lock(&mutex_);
  return sequences_.count(id) > 0;
}

size_t SequenceBatcher::ActiveSequences() const {
  MutexLock lock(&mutex_);
  return sequences_.size();
}

bool SequenceBatcher::WaitSequencesEnded(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mutex_);
  while (!sequences_.empty() && !stopping_) {
    if (!ended_cv_.WaitUntil(&mutex_, deadline)) return sequences_.empty();
  }
  return true;
}

void SequenceBatcher::EndSequences(const Status& why) {
  std::vector<PendingRequest> ended;
  {
    MutexLock lock(&mutex_);
    if (!sequences_.empty()) {
      spdlog::info("event=sequences_ended model={} sequences={} queued={} reason=\"{}\"", spec_.name,
                   sequences_.size(), admission_.total_requests(), why.message());
    }
    for (auto& [id, sequence] : sequences_) {
      spdlog::debug("event=sequence_ended model={} sequence={} queued={}", spec_.name, id.ToString(),
                    sequence->pending.size());
      if (ModelStats* stats = pool_->stats()) stats->RecordSequenceFinished(SequenceOutcome::kCut);
      for (PendingRequest& pending : sequence->pending) ended.push_back(std::move(pending));
      sequence->pending.clear();
    }
    admission_.ReleaseAll();
    sequences_.clear();
    waiting_.clear();
    for (InstanceState& instance : instances_) std::fill(instance.slots.begin(), instance.slots.end(), nullptr);
    ended_cv_.SignalAll();
  }
  for (PendingRequest& pending : ended) pool_->Drop(pending, why);
}

void SequenceBatcher::Stop() {
  {
    MutexLock lock(&mutex_);
    if (stopped_ || pool_ == nullptr) return;  // no pool: Create failed, nothing ever started
    stopped_ = true;
    stopping_ = true;
  }
  batcher_cv_.SignalAll();
  EndSequences(ShutdownStatus());
  if (batcher_.joinable()) batcher_.join();
  pool_->Stop();  // the executions already handed over finish first
}

}  // namespace sluice
