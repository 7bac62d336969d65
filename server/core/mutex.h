// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// understands (-Wthread-safety, on in every clang build: see SLUICE_THREAD_SAFETY). libstdc++'s
// std::mutex carries no capability attributes, so ABSL_GUARDED_BY(a std::mutex) cannot be
// checked. absl::Mutex can, but Debian's libabsl is not built with ThreadSanitizer and its futex
// waits are invisible to it; these wrap std::mutex and std::condition_variable, which TSan
// intercepts, so the same code is checked statically by clang and dynamically by TSan.
//
// Habits the analysis needs: a condition is waited for with an explicit loop
// (`while (!ready_) wake_.Wait(&mutex_);`), not a predicate lambda, since a lambda's body is
// analysed as a function of its own that holds no lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace sluice {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mutex_;
};

// Holds `mutex` for its scope. Unlock/Lock let go of it and take it again inside the scope (the
// destructor releases it only when held).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : mutex_(mutex) {
    mutex_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mutex_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mutex_->Unlock();
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mutex_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mutex_;
  bool held_ = true;
};

// Waits release `mutex` (which the caller holds) while blocked and hold it again on return.
// Wake-ups may be spurious: wait in a loop on the condition.
class CondVar {
 public:
  void Wait(Mutex* mutex) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    std::unique_lock<std::mutex> lock(mutex->mutex_, std::adopt_lock);
    wake_.wait(lock);
    lock.release();
  }
  // False when `deadline` passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mutex, const std::chrono::time_point<Clock, Duration>& deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    std::unique_lock<std::mutex> lock(mutex->mutex_, std::adopt_lock);
    const bool woken = wake_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // False when `timeout` passed.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mutex, const std::chrono::duration<Rep, Period>& timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    return WaitUntil(mutex, std::chrono::steady_clock::now() + timeout);
  }
  void Signal() {
    signals_.fetch_add(1, std::memory_order_release);
    wake_.notify_one();
  }
  void SignalAll() {
    signals_.fetch_add(1, std::memory_order_release);
    wake_.notify_all();
  }
  // Signals so far. A waiter that waits in slices (FakeTimeSource) compares it across a slice
  // that timed out: a signal sent while it was between two waits is not lost.
  uint64_t signals() const { return signals_.load(std::memory_order_acquire); }

 private:
  std::condition_variable wake_;
  std::atomic<uint64_t> signals_{0};
};

}  // namespace sluice
