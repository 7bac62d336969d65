// The clocks: waiting on the steady one, and the fake one's waits, Advance and AwaitWaiting.
#include "server/core/clock.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "server/core/mutex.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

// A waiter of the kind the batchers are: a mutex, a condition variable and a flag it signals.
struct Waiter {
  Mutex mutex;
  CondVar cv;
  bool signalled ABSL_GUARDED_BY(mutex) = false;

  // Waits on `clock` until signalled (true) or `deadline` (false), as a batcher's loop does.
  bool Wait(const TimeSource& clock, TimePoint deadline) ABSL_LOCKS_EXCLUDED(mutex) {
    MutexLock lock(&mutex);
    while (!signalled) {
      if (!clock.WaitUntil(&cv, &mutex, deadline) && clock.Now() >= deadline) return false;
    }
    return true;
  }
  void Signal() ABSL_LOCKS_EXCLUDED(mutex) {
    MutexLock lock(&mutex);
    signalled = true;
    cv.SignalAll();
  }
};

TEST(SteadyTimeSourceTest, WaitsUntilItsDeadlineOrASignal) {
  SteadyTimeSource clock;
  Waiter waiter;
  const TimePoint started = clock.Now();
  EXPECT_FALSE(waiter.Wait(clock, started + 20ms));
  EXPECT_GE(clock.Now() - started, 20ms);
  EXPECT_FALSE(waiter.Wait(clock, started));  // a deadline passed already: no wait
  auto signalled = std::async(std::launch::async, [&] { return waiter.Wait(clock, kNoDeadline); });
  waiter.Signal();
  EXPECT_TRUE(signalled.get());
}

TEST(FakeTimeSourceTest, AWaitEndsWhenTheClockIsMovedPastItsDeadlineAndNotBefore) {
  FakeTimeSource clock;
  Waiter waiter;
  const TimePoint deadline = clock.Now() + 5s;
  auto waited = std::async(std::launch::async, [&] { return waiter.Wait(clock, deadline); });
  ASSERT_TRUE(clock.AwaitWaiting(1));
  clock.Advance(4s);
  EXPECT_EQ(clock.Waiting(), 1u);  // its deadline is still ahead
  EXPECT_EQ(waited.wait_for(0ms), std::future_status::timeout);
  clock.Advance(1s);  // reaches it: no signal needed
  EXPECT_FALSE(waited.get());
  EXPECT_EQ(clock.Waiting(), 0u);
}

TEST(FakeTimeSourceTest, ASignalEndsAWaitWithoutMovingTheClock) {
  FakeTimeSource clock;
  Waiter waiter;
  const TimePoint before = clock.Now();
  auto waited = std::async(std::launch::async, [&] { return waiter.Wait(clock, kNoDeadline); });
  ASSERT_TRUE(clock.AwaitWaiting(1));
  waiter.Signal();
  EXPECT_TRUE(waited.get());
  EXPECT_EQ(clock.Now(), before);
}

TEST(FakeTimeSourceTest, AwaitWaitingCountsOnlyWaitersWhoseDeadlineIsAhead) {
  FakeTimeSource clock;
  EXPECT_EQ(clock.Waiting(), 0u);
  EXPECT_FALSE(clock.AwaitWaiting(1, 10ms));  // nobody waits: it gives up after its timeout
  Waiter soon, never;
  auto first = std::async(std::launch::async, [&] { return soon.Wait(clock, clock.Now() + 1s); });
  auto second = std::async(std::launch::async, [&] { return never.Wait(clock, kNoDeadline); });
  ASSERT_TRUE(clock.AwaitWaiting(2));
  clock.Advance(1s);
  EXPECT_FALSE(first.get());
  EXPECT_EQ(clock.Waiting(), 1u);  // the one without a deadline
  never.Signal();
  EXPECT_TRUE(second.get());
  EXPECT_EQ(clock.Waiting(), 0u);
}

TEST(FakeTimeSourceTest, ASignalSentOutsideTheMutexIsNotLostBetweenTwoLooks) {
  // As the batchers signal: the state changes under the mutex, the signal comes after it is
  // released, and may reach a waiter between two of its 1 ms slices. Many rounds, each must end.
  FakeTimeSource clock;
  Mutex mutex;
  CondVar cv;
  int round_seen = 0;
  for (int round = 1; round <= 1000; ++round) {
    auto waited = std::async(std::launch::async, [&] {
      MutexLock lock(&mutex);
      while (round_seen < round) clock.WaitUntil(&cv, &mutex, kNoDeadline);
    });
    ASSERT_TRUE(clock.AwaitWaiting(1));  // somewhere in its slices
    {
      MutexLock lock(&mutex);
      round_seen = round;
    }
    cv.Signal();
    ASSERT_EQ(waited.wait_for(5s), std::future_status::ready) << "round " << round;
  }
  EXPECT_GE(cv.signals(), 1000u);
}

TEST(FakeTimeSourceTest, APassedDeadlineDoesNotWait) {
  FakeTimeSource clock;
  Waiter waiter;
  MutexLock lock(&waiter.mutex);
  EXPECT_FALSE(clock.WaitUntil(&waiter.cv, &waiter.mutex, clock.Now()));
  EXPECT_EQ(clock.Waiting(), 0u);
}

}  // namespace
}  // namespace sluice
