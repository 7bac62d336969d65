// Whether the process can still serve. A fatal device error (a sticky CUDA error poisons every
// later kernel on that device) makes it not live for good, so that an orchestrator restarts it.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"

#include "server/core/mutex.h"
#include "server/core/status.h"

namespace sluice {

// Thread-safe.
class LivenessMonitor {
 public:
  bool live() const { return live_.load(); }

  std::string reason() const ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    return reason_;
  }

  // Records the first fatal error and calls the listener (once).
  void ReportFatal(const Status& status) ABSL_LOCKS_EXCLUDED(mutex_) {
    std::function<void()> listener;
    {
      MutexLock lock(&mutex_);
      if (!live_.load()) return;
      live_.store(false);
      reason_ = std::string(status.message());
      listener = listener_;
    }
    if (listener) listener();
  }

  // Called after a fatal error is recorded, from the thread that reported it.
  void SetListener(std::function<void()> listener) ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    listener_ = std::move(listener);
  }

 private:
  std::atomic<bool> live_{true};
  mutable Mutex mutex_;
  std::string reason_ ABSL_GUARDED_BY(mutex_);
  std::function<void()> listener_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
