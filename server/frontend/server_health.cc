#include "server/frontend/server_health.h"

namespace sluice {

bool ServerHealth::Ready() const {
  if (!started_ || draining_ || !Live()) return false;
  return !options_.strict || options_.models == nullptr || options_.models->AllReady();
}

}  // namespace sluice
