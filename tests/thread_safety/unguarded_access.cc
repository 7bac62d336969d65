// Must NOT compile cleanly: the ctest thread_safety.catches_unguarded_access builds this file with
// the flags of every server/ target and wants clang's -Wthread-safety to name the unguarded
// write below. It proves the analysis is on in the build, not only that server/ passes it.
#include "server/core/mutex.h"

namespace {

class Counter {
 public:
  void Increment() { ++count_; }  // the violation: count_ written without mutex_

 private:
  sluice::Mutex mutex_;
  int count_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace

void UseCounter() {
  Counter counter;
  counter.Increment();
}
