// Time as the batchers and the model control see it: what time it is, and waiting for a time.
// Injected, so that tests control it: with a FakeTimeSource a test moves time by hand and can
// tell when the threads that wait on the clock have caught up, instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "server/core/mutex.h"

namespace sluice {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = Clock::duration;

// TimePoint::max(): "no deadline".
inline constexpr TimePoint kNoDeadline = TimePoint::max();

class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual TimePoint Now() const = 0;
  // Waits on `cv` (the caller holds `mutex`; released while blocked, held again on return) until
  // `cv` is signalled or this clock reaches `deadline` (kNoDeadline: none). False when the
  // deadline has passed. Wake-ups may be spurious: the caller waits in a loop on its condition
  // and reads Now() again. Every wait of a thread whose work depends on time goes through here.
  virtual bool WaitUntil(CondVar* cv, Mutex* mutex, TimePoint deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) = 0;
};

class SteadyTimeSource final : public TimeSource {
 public:
  TimePoint Now() const override { return Clock::now(); }
  bool WaitUntil(CondVar* cv, Mutex* mutex, TimePoint deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    if (deadline == kNoDeadline) {
      cv->Wait(mutex);
      return true;
    }
    return cv->WaitUntil(mutex, deadline);
  }
};

// A clock that moves only when told to (it starts at one hour). Thread-safe. A thread waiting on
// it looks at it again at least every kRecheck of real time, so Advance needs no signal to reach
// it (and holds no pointer to a waiter that may be gone); a signal of its condition variable
// ends the wait even if it came between two looks (CondVar::signals).
class FakeTimeSource final : public TimeSource {
 public:
  static constexpr std::chrono::milliseconds kRecheck{1};

  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  bool WaitUntil(CondVar* cv, Mutex* mutex, TimePoint deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex);
  void Advance(Duration by) ABSL_LOCKS_EXCLUDED(waiters_mutex_);

  // Threads in WaitUntil now whose deadline is still ahead of the clock (or who have none) and
  // whose condition variable has not been signalled since they began to wait: those with nothing
  // to do until the clock moves or someone signals them.
  size_t Waiting() const ABSL_LOCKS_EXCLUDED(waiters_mutex_);
  // Blocks until at least `threads` threads are Waiting() or `timeout` (real time) passes; true
  // when they are. After an Advance, this says that the threads it woke have done what was due
  // and gone back to waiting.
  bool AwaitWaiting(size_t threads,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) const
      ABSL_LOCKS_EXCLUDED(waiters_mutex_);

 private:
  size_t WaitingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiters_mutex_);

  std::atomic<Duration::rep> now_{Duration(std::chrono::hours(1)).count()};
  mutable Mutex waiters_mutex_;
  mutable CondVar waiters_changed_;
  struct Waiter {
    std::thread::id thread;
    TimePoint deadline;
    const CondVar* cv;  // alive while the entry is: WaitUntil removes it before it returns
    uint64_t signals;   // cv->signals() when the wait began
  };
  mutable std::vector<Waiter> waiters_
      ABSL_GUARDED_BY(waiters_mutex_);  // one per thread in WaitUntil
};

}  // namespace sluice
