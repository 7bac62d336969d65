// Thread names and scheduling policies (server/os/threads.h).
#include "server/os/threads.h"

#include <pthread.h>
#include <sched.h>

#include <thread>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(ThreadNameTest, LinuxKeepsFifteenCharacters) {
  std::thread named([] {
    NameThisThread("sluice-a-very-long-name");
    char name[32] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    EXPECT_STREQ(name, "sluice-a-very-l");
    NameThisThread("short");
    pthread_getname_np(pthread_self(), name, sizeof(name));
    EXPECT_STREQ(name, "short");
  });
  named.join();
}

// Runs in its own thread so that the test process's policy is left alone.
TEST(ThreadPolicyTest, BatchIsInheritedAndModelWorkTurnsItBack) {
  std::thread front([] {
    ASSERT_EQ(sched_getscheduler(0), SCHED_OTHER);
    // Before the front ends chose SCHED_BATCH a batcher stays as it is (--model-threads-first
    // false). The choice is the process's for good: a repetition in one process skips this.
    if (!FrontEndsRunAsBatch()) {
      int batcher_before = -1;
      std::thread([&] {
        RunThisThreadAsFrontEnd();
        batcher_before = sched_getscheduler(0);
      }).join();
      EXPECT_EQ(batcher_before, SCHED_OTHER);
    }
    ASSERT_TRUE(RunThreadsFromHereAsBatch());
    EXPECT_TRUE(FrontEndsRunAsBatch());
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
    int started_as = -1, model_work_as = -1;
    std::thread child([&] {  // as gRPC's and the front ends' threads: started after main's call
      started_as = sched_getscheduler(0);
      RunThisThreadAsModelWork();  // as a worker does first
      model_work_as = sched_getscheduler(0);
    });
    child.join();
    EXPECT_EQ(started_as, SCHED_BATCH);
    EXPECT_EQ(model_work_as, SCHED_OTHER);
    // A batcher started by a worker (SCHED_OTHER) runs as the front ends do.
    int batcher_as = -1;
    std::thread worker([&] {
      RunThisThreadAsModelWork();
      std::thread([&] {
        RunThisThreadAsFrontEnd();
        batcher_as = sched_getscheduler(0);
      }).join();
    });
    worker.join();
    EXPECT_EQ(batcher_as, SCHED_BATCH);
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);  // the child's change is its own
  });
  front.join();
  RunThisThreadAsModelWork();  // on a SCHED_OTHER thread: nothing to do
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
}

}  // namespace
}  // namespace sluice
