#include "server/batching/response_order.h"

#include <memory>
#include <utility>

namespace sluice {

InferCompletion ResponseOrder::InLine(InferCompletion done) {
  uint64_t place = 0;
  {
    MutexLock lock(&mutex_);
    place = next_place_++;
  }
  // `this` outlives the completion: the handle that owns it stays alive while a request is in
  // flight.
  return [this, place, done = std::move(done)](Status status) mutable {
    Finish(place, std::move(done), std::move(status));
  };
}

void ResponseOrder::Finish(uint64_t place, InferCompletion done, Status status) {
  MutexLock lock(&mutex_);
  held_.emplace(place, Finished{std::move(done), std::move(status)});
  if (delivering_) return;  // the delivering thread runs it when its turn comes
  delivering_ = true;
  while (true) {
    auto next = held_.find(next_out_);
    if (next == held_.end()) break;
    Finished finished = std::move(next->second);
    held_.erase(next);
    ++next_out_;
    // Outside the lock, and let go of before taking it again: a completion may send a response,
    // submit another request, or own the call it answers.
    lock.Unlock();
    finished.done(std::move(finished.status));
    finished = Finished{};
    lock.Lock();
  }
  delivering_ = false;
}

size_t ResponseOrder::held() const {
  MutexLock lock(&mutex_);
  return held_.size();
}

}  // namespace sluice
