// Requests waiting for a model to load on demand (--model-load-on-demand): the front ends'
// OnDemandLoads, over ModelControl. A request for a model that is in the repository but not
// loaded joins the waiters of that model; the first one queues the load on the control thread
// (ModelControl::LoadOnDemand: one load at a time, back-off, memory budget), and every waiter
// hears the result when it ends. A waiter whose deadline passes or whose caller goes away is
// answered at once by the waiters' timer thread, and the load goes on for the others.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/manager/model_control.h"
#include "server/manager/model_events.h"
#include "server/manager/model_handle.h"

namespace sluice {

// Thread-safe. Outlives nothing: destroy it after ModelControl::Stop (which answers the loads
// still queued) and after the front ends stop.
class OnDemandLoader final : public OnDemandLoads {
 public:
  struct Options {
    // The longest a request waits for a load, whatever its own deadline (--model-load-wait-secs;
    // HTTP requests carry none).
    Duration max_wait = std::chrono::seconds(60);
    size_t max_waiters = 1024;  // per model (--max-queue-size); more: UNAVAILABLE, as a full queue
    // How often cancellations are looked at while requests wait (deadlines wake it exactly).
    Duration cancel_check = std::chrono::milliseconds(20);
    const TimeSource* clock = nullptr;  // null: the steady clock
    ModelObserver* observer = nullptr;  // cold starts; may be null
  };

  // `control` outlives the loader.
  OnDemandLoader(ModelControl* control, Options options);
  ~OnDemandLoader() override;

  bool LoadsOnDemand(const std::string& name) const override {
    return control_->LoadsOnDemand(name);
  }
  void Await(const std::string& name, TimePoint deadline,
             std::shared_ptr<std::atomic<bool>> cancelled,
             std::function<void(const Status&)> then) override ABSL_LOCKS_EXCLUDED(mutex_);
  void RecordColdStart(const std::string& name, Duration waited) override;

  // Requests waiting now, every model together.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mutex_);

  // Answers every waiter UNAVAILABLE (shutting down) and joins the timer; later Awaits are
  // answered the same at once. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Waiter {
    TimePoint deadline;
    bool own_deadline = true;  // the request's deadline, not max_wait
    std::shared_ptr<std::atomic<bool>> cancelled;
    std::function<void(const Status&)> then;
    TimePoint since;
  };
  // The load of `name` ended: every waiter hears `status`.
  void Finish(const std::string& name, const Status& status) ABSL_LOCKS_EXCLUDED(mutex_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mutex_);

  ModelControl* const control_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;

  mutable Mutex mutex_;
  CondVar wake_;
  std::map<std::string, std::vector<Waiter>> waiters_
      ABSL_GUARDED_BY(mutex_);  // a load is queued for each key
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread timer_;
};

}  // namespace sluice
