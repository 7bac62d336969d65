#include "server/manager/model_handle.h"

#include <chrono>

#include "server/core/logging.h"

#include "server/core/validation.h"

namespace sluice {

ModelHandle::ModelHandle(std::shared_ptr<const RepositoryModel> model, int64_t version, std::string device,
                         std::shared_ptr<Scheduler> scheduler, std::shared_ptr<ModelStats> stats,
                         const TimeSource* clock)
    : model_(std::move(model)),
      version_(version),
      device_(std::move(device)),
      scheduler_(std::move(scheduler)),
      stats_(std::move(stats)),
      clock_(clock) {}

ModelHandle::~ModelHandle() { Stop(); }

void ModelHandle::Submit(std::unique_ptr<InferRequest> request, OutputSink* sink, InferCompletion done) {
  request->model_version = version_;
  if (Status valid = ValidateRequest(model_->spec, request.get()); !valid.ok()) {
    spdlog::debug("event=request_rejected model={} version={} request_id={} reason=\"{}\"", model_->name,
                  version_, request->id, valid.message());
    done(Reject(std::move(valid)));
    return;
  }
  const DynamicBatchingSpec& batching = model_->spec.dynamic_batching;
  int64_t timeout_us = batching.default_timeout_us;
  if (batching.allow_timeout_override && request->parameters.timeout_us > 0) {
    timeout_us = request->parameters.timeout_us;
  }
  if (timeout_us > 0) {
    request->deadline = std::min(request->deadline, clock_->Now() + std::chrono::microseconds(timeout_us));
  }
  scheduler_->Enqueue(std::move(request), sink, std::move(done));
}

Status ModelHandle::Reject(Status status) {
  stats_->RecordRejected(status);
  return status;
}

void ModelHandle::Poke() { scheduler_->Poke(); }

std::shared_ptr<ModelHandle> ModelHandle::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  // The reference shares nothing with the manager's: its deleter only counts it back, and keeps
  // the handle alive until then.
  return std::shared_ptr<ModelHandle>(this, [self = shared_from_this()](ModelHandle*) { self->Release(); });
}

void ModelHandle::Release() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (--in_flight_ == 0) idle_.notify_all();
}

int64_t ModelHandle::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

void ModelHandle::WaitIdle() {
  const auto started = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!idle_.wait_for(lock, std::chrono::seconds(10), [this] { return in_flight_ == 0 || stopped_; })) {
    spdlog::warn("event=model_draining model={} version={} in_flight={} waited_s={}", model_->name, version_,
                 in_flight_,
                 std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started).count());
  }
}

void ModelHandle::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  idle_.notify_all();
  scheduler_->Stop();
}

}  // namespace sluice
