#include "server/core/thread_name.h"

#include <pthread.h>
#include <sched.h>

namespace sluice {

void NameThisThread(const std::string& name) {
  constexpr size_t kLinuxLimit = 15;  // TASK_COMM_LEN - 1
  pthread_setname_np(pthread_self(), name.substr(0, kLinuxLimit).c_str());
}

bool RunThreadsFromHereAsBatch() {
  sched_param none{};
  return sched_setscheduler(0, SCHED_BATCH, &none) == 0;
}

void RunThisThreadAsModelWork() {
  if (sched_getscheduler(0) != SCHED_BATCH) return;
  sched_param none{};
  sched_setscheduler(0, SCHED_OTHER, &none);
}

}  // namespace sluice
