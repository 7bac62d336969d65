#include "server/os/threads.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <utility>

namespace sluice {

void NameThisThread(const std::string& name) {
  constexpr size_t kLinuxLimit = 15;  // TASK_COMM_LEN - 1
  pthread_setname_np(pthread_self(), name.substr(0, kLinuxLimit).c_str());
}

namespace {

// Whether RunThreadsFromHereAsBatch succeeded here (the front ends run SCHED_BATCH).
std::atomic<bool> front_ends_batch{false};

// The calling thread from policy `from` to `to`; a thread in any other policy is left as it is.
// Best effort: a refusal leaves it where it was.
void SwitchThisThread(int from, int to) {
  if (sched_getscheduler(0) != from) return;
  sched_param none{};
  sched_setscheduler(0, to, &none);
}

std::vector<int>& ModelWorkerCpus() {
  static std::vector<int> cpus;  // written once before any thread starts (SetModelWorkerCpus)
  return cpus;
}

}  // namespace

bool RunThreadsFromHereAsBatch() {
  sched_param none{};
  if (sched_setscheduler(0, SCHED_BATCH, &none) != 0) return false;
  front_ends_batch.store(true, std::memory_order_relaxed);
  return true;
}

bool KeepThreadsFromHereOn(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

void SetModelWorkerCpus(std::vector<int> cpus) { ModelWorkerCpus() = std::move(cpus); }

bool RunThisThreadOnModelCpus() {
  return ModelWorkerCpus().empty() || KeepThreadsFromHereOn(ModelWorkerCpus());
}

void RunThisThreadAsModelWork() { SwitchThisThread(SCHED_BATCH, SCHED_OTHER); }

bool FrontEndsRunAsBatch() { return front_ends_batch.load(std::memory_order_relaxed); }

void RunThisThreadAsFrontEnd() {
  if (FrontEndsRunAsBatch()) SwitchThisThread(SCHED_OTHER, SCHED_BATCH);
}

}  // namespace sluice
