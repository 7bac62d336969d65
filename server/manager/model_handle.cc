#include "server/manager/model_handle.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/core/message_text.h"
#include "server/core/logging.h"

#include "server/core/validation.h"

namespace sluice {

ModelHandle::ModelHandle(std::shared_ptr<const RepositoryModel> model, int64_t version,
                         std::string device, std::shared_ptr<Scheduler> scheduler,
                         std::shared_ptr<ModelStats> stats, const TimeSource* clock,
                         BatchSizeChoice batch_sizes, bool caches_responses)
    : model_(std::move(model)),
      version_(version),
      device_(std::move(device)),
      scheduler_(std::move(scheduler)),
      sequences_(dynamic_cast<SequenceScheduler*>(scheduler_.get())),
      stats_(std::move(stats)),
      clock_(clock),
      batch_sizes_(std::move(batch_sizes)),
      caches_responses_(caches_responses) {}

ModelHandle::~ModelHandle() { Stop(); }

void ModelHandle::Submit(std::unique_ptr<InferRequest> request, OutputSink* sink,
                         InferCompletion done) {
  request->model_version = version_;
  if (Status valid = ValidateRequest(model_->spec, request.get()); !valid.ok()) {
    spdlog::debug("event=request_rejected model={} version={} request_id=\"{}\" reason=\"{}\"",
                  model_->name, version_, QuoteClientText(request->id, 64), valid.message());
    done(Reject(std::move(valid), request->protocol));
    return;
  }
  const DynamicBatchingSpec& batching = model_->spec.dynamic_batching;
  request->priority_level = batching.LevelOf(request->parameters.priority);
  const QueuePolicySpec& policy = batching.PolicyOf(request->priority_level);
  int64_t timeout_us = policy.default_timeout_us;
  if (policy.allow_timeout_override && request->parameters.timeout_us > 0) {
    timeout_us = request->parameters.timeout_us;
  }
  if (timeout_us > 0) {
    const TimePoint timeout = clock_->Now() + std::chrono::microseconds(timeout_us);
    // DELAY: the timeout demotes the request instead of ending it (PriorityLevels::DelayOverdue).
    if (policy.delay) {
      request->delay_after = timeout;
    } else {
      request->deadline = std::min(request->deadline, timeout);
    }
  }
  scheduler_->Enqueue(std::move(request), sink, std::move(done));
}

Status ModelHandle::Reject(Status status, Protocol protocol) {
  stats_->RecordRejected(status, protocol);
  return status;
}

void ModelHandle::Poke() { scheduler_->Poke(); }

InFlightModel ModelHandle::Acquire() {
  {
    MutexLock lock(&in_flight_->mutex);
    in_flight_->peak = std::max(in_flight_->peak, ++in_flight_->count);
  }
  // The reference shares nothing with the manager's: its deleter keeps the handle alive until it
  // runs, then lets go of it before counting itself out, so that when WaitIdle returns the
  // manager's reference is the last one and the instances are freed where it chooses.
  return InFlightModel(std::shared_ptr<ModelHandle>(
      this, [self = shared_from_this(), state = in_flight_](ModelHandle*) mutable {
        self.reset();
        state->Release();
      }));
}

void ModelHandle::InFlight::Release() {
  MutexLock lock(&mutex);
  if (--count == 0) idle.SignalAll();
}

int64_t ModelHandle::in_flight() const {
  MutexLock lock(&in_flight_->mutex);
  return in_flight_->count;
}

int64_t ModelHandle::peak_in_flight() const {
  MutexLock lock(&in_flight_->mutex);
  return in_flight_->peak;
}

void ModelHandle::WaitIdle() {
  const TimePoint started = clock_->Now();
  InFlight& state = *in_flight_;
  MutexLock lock(&state.mutex);
  TimePoint next_report = started + std::chrono::seconds(10);
  while (state.count > 0 && !state.stopped) {
    if (clock_->WaitUntil(&state.idle, &state.mutex, next_report) || clock_->Now() < next_report)
      continue;
    next_report += std::chrono::seconds(10);
    spdlog::warn("event=model_draining model={} version={} in_flight={} waited_s={}", model_->name,
                 version_, state.count,
                 std::chrono::duration_cast<std::chrono::seconds>(clock_->Now() - started).count());
  }
}

InFlightModel RouteSequence(const ModelLookup& lookup, InFlightModel found,
                            const InferRequest& request, bool version_given) {
  const SequenceControl& sequence = request.parameters.sequence;
  if (version_given || sequence.start || !sequence.id.present() ||
      !found->spec().sequence_batching.enabled || found->HasSequence(sequence.id)) {
    return found;
  }
  StatusOr<InFlightModel> holder = lookup.FindSequence(found->spec().name, sequence.id);
  if (!holder.ok()) return found;
  return *std::move(holder);
}

void ModelHandle::DrainSequences(Duration grace) {
  if (sequences_ == nullptr) return;
  const size_t active = sequences_->ActiveSequences();
  if (active == 0) return;
  spdlog::info("event=model_draining_sequences model={} version={} active={} grace_ms={}",
               model_->name, version_, active,
               std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
  if (sequences_->WaitSequencesEnded(clock_->Now() + grace)) return;
  const size_t left = sequences_->ActiveSequences();
  spdlog::warn(
      "event=model_sequences_ended model={} version={} sequences={} reason=\"drain period over\"",
      model_->name, version_, left);
  sequences_->EndSequences(absl::UnavailableError(absl::StrCat(
      "the sequence was ended: model '", model_->name, "' version ", version_,
      " was unloaded or replaced, and the sequence did not end within the drain period (",
      std::chrono::duration_cast<std::chrono::milliseconds>(grace).count(),
      " ms, --shutdown-grace-seconds); start it again with sequence_start")));
}

void ModelHandle::Stop() {
  {
    MutexLock lock(&in_flight_->mutex);
    in_flight_->stopped = true;
  }
  in_flight_->idle.SignalAll();
  scheduler_->Stop();
}

}  // namespace sluice
