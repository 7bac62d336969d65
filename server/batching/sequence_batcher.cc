#include "server/batching/sequence_batcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

#include "server/batching/batch_queue.h"
#include "server/core/bytes_tensor.h"
#include "server/core/logging.h"
#include "server/os/threads.h"

namespace sluice {
namespace {

template <typename T>
void AppendScalar(T value, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

// One row's value of `control`, in its type's bytes.
void AppendControlValue(const SequenceControlSpec& control, const SequenceControl* sequence,
                        std::string* out) {
  if (control.kind == SequenceControlKind::kCorrId) {
    const CorrelationId none;
    const CorrelationId& id = sequence ? sequence->id : none;
    switch (control.dtype) {
      case DataType::kBytes:
        AppendBytesElement(id.text, out);
        return;
      case DataType::kInt64:
        AppendScalar<int64_t>(static_cast<int64_t>(id.number), out);
        return;
      default:
        AppendScalar<int32_t>(static_cast<int32_t>(id.number), out);
        return;
    }
  }
  bool on = false;
  if (sequence != nullptr) {
    switch (control.kind) {
      case SequenceControlKind::kStart:
        on = sequence->start;
        break;
      case SequenceControlKind::kEnd:
        on = sequence->end;
        break;
      case SequenceControlKind::kReady:
        on = true;
        break;
      case SequenceControlKind::kCorrId:
        break;
    }
  }
  out->append(ScalarBytes(control.dtype, on ? control.true_value : control.false_value));
}

// The largest correlation id each CORRID type holds.
uint64_t LargestId(DataType type) {
  switch (type) {
    case DataType::kInt64:
      return static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    case DataType::kInt32:
      return static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    default:
      return std::numeric_limits<uint64_t>::max();
  }
}

}  // namespace

void AppendSequenceControls(const ModelSpec& spec, const SequenceControl* control,
                            InferRequest* request) {
  const int64_t rows = spec.batches() ? request->batch_size : 1;
  for (const SequenceControlSpec& each : spec.sequence_batching.controls) {
    std::string bytes;
    for (int64_t row = 0; row < rows; ++row) AppendControlValue(each, control, &bytes);
    request->AddOwnedInput(each.input, each.dtype, spec.batches() ? Shape{rows, 1} : Shape{1},
                           std::move(bytes));
  }
}

StatusOr<std::unique_ptr<SequenceBatcher>> SequenceBatcher::Create(
    ModelSpec spec, std::vector<std::unique_ptr<ModelBackend>> instances, Options options) {
  if (instances.empty())
    return absl::InvalidArgumentError("a sequence batcher needs at least one instance");
  if (options.clock == nullptr)
    return absl::InvalidArgumentError("a sequence batcher needs a clock");
  if (!spec.sequence_batching.enabled) {
    return absl::InvalidArgumentError("a sequence batcher serves models with sequence_batching");
  }
  const size_t count = instances.size();
  std::unique_ptr<SequenceBatcher> batcher(new SequenceBatcher(spec, options, count));
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
  SLUICE_ASSIGN_OR_RETURN(
      batcher->pool_,
      InstancePool::Create(std::move(spec), std::move(instances), std::move(pool_options)));
  batcher->batcher_ = std::thread([raw = batcher.get()] { raw->BatcherLoop(); });
  return batcher;
}

SequenceBatcher::SequenceBatcher(ModelSpec spec, Options options, size_t instances)
    : spec_(std::move(spec)),
      options_(std::move(options)),
      slots_per_instance_(spec_.sequence_batching.SlotsPerInstance(spec_.max_batch_size)),
      slots_(&spec_,
             SequenceSlots::Options{instances, slots_per_instance_,
                                    Admission::Options{options_.max_requests, options_.max_bytes,
                                                       options_.server_budget},
                                    options_.stats.get()}),
      busy_(instances, false) {}

SequenceBatcher::~SequenceBatcher() { Stop(); }

Status SequenceBatcher::CheckRequest(const InferRequest& request) const {
  const CorrelationId& id = request.parameters.sequence.id;
  const std::optional<DataType> declared = spec_.sequence_batching.correlation_id_type;
  if (!id.present()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec_.name,
        "' is stateful (sequence_batching): every request needs the parameter sequence_id (",
        !declared                       ? "a non-zero integer or a non-empty string"
        : *declared == DataType::kBytes ? "a non-empty string"
                                        : "a non-zero integer",
        "), and sequence_start on a sequence's first request, sequence_end on its last"));
  }
  if (!declared) return CheckRows(request);
  const DataType type = *declared;
  if (id.is_text != (type == DataType::kBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec_.name, "' takes ", type == DataType::kBytes ? "string" : "integer",
        " sequence ids (CONTROL_SEQUENCE_CORRID is ", DataTypeName(type), "); sequence_id ",
        id.ToString(), " is ", id.is_text ? "a string" : "an integer"));
  }
  if (!id.is_text && id.number > LargestId(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence_id ", id.number, " does not fit model '", spec_.name,
                     "''s CONTROL_SEQUENCE_CORRID type ", DataTypeName(type), " (at most ",
                     LargestId(type), ")"));
  }
  return CheckRows(request);
}

Status SequenceBatcher::CheckRows(const InferRequest& request) const {
  if (spec_.batches() && request.batch_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a request of a sequence carries one row: model '", spec_.name,
                     "' (sequence_batching) needs batch size 1, found ", request.batch_size));
  }
  return absl::OkStatus();
}

void SequenceBatcher::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                              InferCompletion done) {
  ModelStats* stats = pool_->stats();
  Status admitted = CheckRequest(*request);
  if (admitted.ok()) {
    const SequenceControl control = request->parameters.sequence;
    AppendSequenceControls(spec_, &control, request.get());
    PendingRequest pending;
    pending.bytes = request->InputBytes();
    pending.request = std::move(request);
    pending.sink = sink;
    pending.done = std::move(done);
    const TimePoint now = options_.clock->Now();
    {
      MutexLock lock(&mutex_);
      admitted =
          stopping_
              ? absl::UnavailableError(absl::StrCat("model '", spec_.name, "' is shutting down"))
              : slots_.Add(pending, now);
    }
    if (admitted.ok()) {
      if (stats) stats->RecordAdmitted();
      batcher_cv_.Signal();
      return;
    }
    request = std::move(pending.request);  // refused: `pending` is untouched
    done = std::move(pending.done);
  }
  spdlog::debug("event=sequence_request_refused model={} sequence={} reason=\"{}\"", spec_.name,
                request->parameters.sequence.id.ToString(), admitted.message());
  if (stats) stats->RecordRejected(admitted, request->protocol);
  done(std::move(admitted));
}

void SequenceBatcher::Poke() {
  { MutexLock lock(&mutex_); }
  batcher_cv_.Signal();
}

void SequenceBatcher::InstanceIdle(size_t instance) {
  {
    MutexLock lock(&mutex_);
    if (instance >= busy_.size()) return;
    busy_[instance] = false;
  }
  batcher_cv_.Signal();
}

PendingRequest SequenceBatcher::Filler(const InferRequest& like) const {
  auto request = std::make_unique<InferRequest>();
  request->model_name = like.model_name;
  request->model_version = like.model_version;
  request->batch_size = 1;
  for (const TensorView& input : like.inputs) {
    const bool control = std::any_of(
        spec_.sequence_batching.controls.begin(), spec_.sequence_batching.controls.end(),
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

InferCompletion SequenceBatcher::Completion(std::shared_ptr<Sequence> sequence, bool start,
                                            InferCompletion done) {
  // Runs on the worker, never under our lock, before the worker reports the instance idle; the
  // answer is noted before the caller hears it (so a client that sends its next request at once
  // is never late).
  return
      [this, sequence = std::move(sequence), start, done = std::move(done)](Status status) mutable {
        std::deque<PendingRequest> orphans;
        {
          MutexLock lock(&mutex_);
          slots_.Finished(sequence, start, status, options_.clock->Now(), &orphans);
          if (slots_.active() == 0) ended_cv_.SignalAll();
        }
        for (PendingRequest& orphan : orphans) {
          pool_->Drop(orphan, absl::UnavailableError(absl::StrCat(
                                  "sequence ", sequence->id.ToString(), " of model '", spec_.name,
                                  "' was dropped: its sequence_start "
                                  "request failed (",
                                  status.message(), ")")));
        }
        done(std::move(status));
      };
}

void SequenceBatcher::BatcherLoop() {
  NameThisThread("sluice-sequence");
  RunThisThreadAsModelWork();
  MutexLock lock(&mutex_);
  while (!stopping_) {
    const TimePoint now = options_.clock->Now();
    std::vector<std::pair<PendingRequest, Status>> expired;
    TimePoint wake = slots_.Expire(now, &expired);
    if (slots_.active() == 0) ended_cv_.SignalAll();
    if (!expired.empty()) {
      lock.Unlock();
      for (auto& [pending, status] : expired) pool_->Drop(pending, status);
      lock.Lock();
      continue;
    }
    slots_.AssignSlots();
    for (size_t i = 0; i < busy_.size(); ++i) {
      if (busy_[i]) continue;
      std::optional<FormedBatch> batch = slots_.FormBatch(
          i, now, &wake,
          [this](std::shared_ptr<Sequence> sequence, bool start, InferCompletion done) {
            return Completion(std::move(sequence), start, std::move(done));
          },
          [this](const InferRequest& like) { return Filler(like); });
      if (batch) {
        busy_[i] = true;
        pool_->RunOn(i, *std::move(batch));
      }
    }
    if (slots_.active() == 0) ended_cv_.SignalAll();
    // (At least 50 us: a deadline reported as due but not acted on must not spin.)
    if (wake != kNoDeadline) wake = std::max(wake, now + std::chrono::microseconds(50));
    options_.clock->WaitUntil(&batcher_cv_, &mutex_, wake);
  }
}

StatusOr<WarmupReport> SequenceBatcher::WarmUp(std::vector<WarmupRequest> requests,
                                               const std::atomic<bool>* abandon) {
  for (WarmupRequest& warmup : requests)
    AppendSequenceControls(spec_, nullptr, warmup.request.get());
  return pool_->WarmUp(std::move(requests), abandon);
}

bool SequenceBatcher::HasSequence(const CorrelationId& id) const {
  MutexLock lock(&mutex_);
  return slots_.Has(id);
}

size_t SequenceBatcher::ActiveSequences() const {
  MutexLock lock(&mutex_);
  return slots_.active();
}

bool SequenceBatcher::WaitSequencesEnded(TimePoint deadline) {
  MutexLock lock(&mutex_);
  while (slots_.active() > 0 && !stopping_) {
    if (!options_.clock->WaitUntil(&ended_cv_, &mutex_, deadline)) return slots_.active() == 0;
  }
  return true;
}

void SequenceBatcher::EndSequences(const Status& why) {
  std::vector<PendingRequest> ended;
  {
    MutexLock lock(&mutex_);
    if (slots_.active() > 0) {
      spdlog::info("event=sequences_ended model={} sequences={} queued={} reason=\"{}\"",
                   spec_.name, slots_.active(), slots_.queued(), why.message());
    }
    ended = slots_.EndAll();
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
