#include "server/core/clock.h"

#include <algorithm>

namespace sluice {

bool FakeTimeSource::WaitUntil(CondVar* cv, Mutex* mutex, TimePoint deadline) const {
  if (Now() >= deadline) return false;
  // A signal sent outside `mutex` can fall between two slices; the count still shows it.
  const uint64_t signals = cv->signals();
  {
    MutexLock lock(&waiters_mutex_);
    waiters_.push_back({std::this_thread::get_id(), deadline, cv, signals});
    waiters_changed_.SignalAll();
  }
  bool signalled = false;
  while (Now() < deadline) {
    if (cv->WaitFor(mutex, kRecheck) || cv->signals() != signals) {
      signalled = true;
      break;
    }
  }
  MutexLock lock(&waiters_mutex_);
  const std::thread::id self = std::this_thread::get_id();
  waiters_.erase(std::find_if(waiters_.begin(), waiters_.end(),
                              [self](const Waiter& waiter) { return waiter.thread == self; }));
  waiters_changed_.SignalAll();
  return signalled;
}

void FakeTimeSource::Advance(Duration by) {
  MutexLock lock(&waiters_mutex_);  // so that AwaitWaiting sees the new time with the waiters
  now_ += by.count();
  waiters_changed_.SignalAll();
}

size_t FakeTimeSource::WaitingLocked() const {
  const TimePoint now = Now();
  return static_cast<size_t>(
      std::count_if(waiters_.begin(), waiters_.end(), [now](const Waiter& waiter) {
        return waiter.deadline > now && waiter.cv->signals() == waiter.signals;
      }));
}

size_t FakeTimeSource::Waiting() const {
  MutexLock lock(&waiters_mutex_);
  return WaitingLocked();
}

bool FakeTimeSource::AwaitWaiting(size_t threads, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&waiters_mutex_);
  while (WaitingLocked() < threads) {
    if (!waiters_changed_.WaitUntil(&waiters_mutex_, deadline)) return WaitingLocked() >= threads;
  }
  return true;
}

}  // namespace sluice
