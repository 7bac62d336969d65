#include "server/manager/on_demand.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/logging.h"
#include "server/os/threads.h"

namespace sluice {

OnDemandLoader::OnDemandLoader(ModelControl* control, Options options)
    : control_(control),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &steady_) {
  timer_ = std::thread([this] { TimerLoop(); });
}

OnDemandLoader::~OnDemandLoader() { Stop(); }

void OnDemandLoader::Await(const std::string& name, TimePoint deadline,
                           std::shared_ptr<std::atomic<bool>> cancelled,
                           std::function<void(const Status&)> then) {
  const TimePoint now = clock_->Now();
  Waiter waiter;
  waiter.since = now;
  waiter.deadline = std::min(deadline, now + options_.max_wait);
  waiter.own_deadline = deadline <= now + options_.max_wait;
  waiter.cancelled = std::move(cancelled);
  waiter.then = std::move(then);
  Status refused = control_->CheckLoadOnDemand(name);  // answered at once, nothing queued
  bool queue_load = false;
  if (refused.ok()) {
    MutexLock lock(&mutex_);
    if (stopping_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else {
      auto [it, first] = waiters_.try_emplace(name);
      if (it->second.size() >= options_.max_waiters) {
        refused = absl::UnavailableError(absl::StrCat(it->second.size(),
                                                      " requests already wait for model '", name,
                                                      "' to load (--max-queue-size)"));
      } else {
        it->second.push_back(std::move(waiter));
        queue_load = first;
        wake_.Signal();
      }
    }
  }
  if (!refused.ok()) return waiter.then(refused);
  if (queue_load) {
    control_->Submit([this, name] { return control_->LoadOnDemand(name); },
                     [this, name](const Status& status) { Finish(name, status); });
  }
}

void OnDemandLoader::Finish(const std::string& name, const Status& status) {
  std::vector<Waiter> waiters;
  {
    MutexLock lock(&mutex_);
    auto it = waiters_.find(name);
    if (it == waiters_.end()) return;
    waiters = std::move(it->second);
    waiters_.erase(it);
  }
  for (Waiter& waiter : waiters) waiter.then(status);
}

void OnDemandLoader::RecordColdStart(const std::string& name, Duration waited) {
  if (options_.observer != nullptr) options_.observer->OnColdStart(name, waited);
}

size_t OnDemandLoader::waiting() const {
  MutexLock lock(&mutex_);
  size_t count = 0;
  for (const auto& [name, waiters] : waiters_) count += waiters.size();
  return count;
}

void OnDemandLoader::TimerLoop() {
  NameThisThread("sluice-demand");
  MutexLock lock(&mutex_);
  while (!stopping_) {
    const TimePoint now = clock_->Now();
    std::vector<std::pair<Waiter, Status>> answered;
    TimePoint next = kNoDeadline;
    bool watching_cancels = false;
    for (auto& [name, waiters] : waiters_) {
      auto keep = std::partition(waiters.begin(), waiters.end(), [&](const Waiter& waiter) {
        return now < waiter.deadline &&
               !(waiter.cancelled && waiter.cancelled->load(std::memory_order_relaxed));
      });
      for (auto it = keep; it != waiters.end(); ++it) {
        const double waited_ms = std::chrono::duration<double, std::milli>(now - it->since).count();
        Status why =
            now < it->deadline
                ? absl::CancelledError("the request was cancelled while its model loaded on demand")
            : it->own_deadline ? absl::DeadlineExceededError(
                                     absl::StrFormat("the request's deadline passed after %.0f ms "
                                                     "waiting for model '%s' to load on demand",
                                                     waited_ms, name))
                               : absl::DeadlineExceededError(
                                     absl::StrFormat("waited %.0f ms (--model-load-wait-secs) for "
                                                     "model '%s' to load on demand; it is still "
                                                     "loading",
                                                     waited_ms, name));
        answered.emplace_back(std::move(*it), std::move(why));
      }
      waiters.erase(keep, waiters.end());  // the load stays queued for the others (or for none)
      for (const Waiter& waiter : waiters) {
        next = std::min(next, waiter.deadline);
        watching_cancels = watching_cancels || waiter.cancelled != nullptr;
      }
    }
    if (!answered.empty()) {
      lock.Unlock();
      for (auto& [waiter, why] : answered) waiter.then(why);
      lock.Lock();
      continue;
    }
    if (watching_cancels) next = std::min(next, now + options_.cancel_check);
    clock_->WaitUntil(&wake_, &mutex_, next);
  }
}

void OnDemandLoader::Stop() {
  std::map<std::string, std::vector<Waiter>> left;
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (timer_.joinable()) timer_.join();
  {
    MutexLock lock(&mutex_);
    left.swap(waiters_);
  }
  for (auto& [name, waiters] : left) {
    for (Waiter& waiter : waiters)
      waiter.then(absl::UnavailableError("the server is shutting down"));
  }
}

}  // namespace sluice
