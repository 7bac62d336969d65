#include "server/core/thread_name.h"

#include <pthread.h>

namespace sluice {

void NameThisThread(const std::string& name) {
  constexpr size_t kLinuxLimit = 15;  // TASK_COMM_LEN - 1
  pthread_setname_np(pthread_self(), name.substr(0, kLinuxLimit).c_str());
}

}  // namespace sluice
