// Time as the batcher sees it. Injected, so that tests control it.
#pragma once

#include <atomic>
#include <chrono>

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
};

class SteadyTimeSource final : public TimeSource {
 public:
  TimePoint Now() const override { return Clock::now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeTimeSource final : public TimeSource {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  void Advance(Duration by) { now_ += by.count(); }

 private:
  std::atomic<Duration::rep> now_{Duration(std::chrono::hours(1)).count()};
};

}  // namespace sluice
