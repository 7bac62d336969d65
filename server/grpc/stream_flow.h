// The bookkeeping of one ModelStreamInfer stream, without threads or gRPC: StreamReactor feeds
// it every event under its lock and starts what Next plans, outside the lock. It owns each
// request (a `Call`) from the read that fills it until its response is written.
//
// The states and every transition:
//   phase   kOpen       --ReadDone(false): the client half-closed, or the stream broke-->
//   kClientDone
//           kOpen, kClientDone --WriteDone(false): the transport is gone-->            kBroken
//           kClientDone, kBroken --Next: the read idle, no write pending, no call in flight,
//                                  no reaction active-->                               kFinished
//                                  (planned once)
//           (Refuse: kFinished at once, nothing is ever planned)
//   read    kIdle --Next: kOpen and fewer than max_in_flight calls in flight--> kPending
//           kPending --ReadDone(true), not kBroken--> kSubmitting (the call is in flight)
//           kPending --ReadDone(false), or ReadDone(true) when kBroken (the request is dropped)-->
//           kIdle kSubmitting --Submitted: the call was handed on (queued with its model, or
//           answered;
//                         after the wait, for a model loading on demand)--> kIdle
//           (The next read waits for Submitted: a request read later must never reach its model
//           first, or a sequence's requests could run out of order.)
//   write   kIdle --Next: an answer is queued--> kPending (the oldest answer) --WriteDone--> kIdle
//   a call  read --Answered--> queued for writing (dropped when kBroken) --WriteDone--> gone
// A reaction (every event: ReadDone, Answered, WriteDone, Enter; Submitted is not one) is active
// until the Next(true) that ends it: the stream cannot finish while one runs, so the reactor stays
// alive for it.
#pragma once

#include <deque>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"

namespace sluice {

template <typename Call>
class StreamFlow {
 public:
  enum class Phase { kOpen, kClientDone, kBroken, kFinished };
  enum class Op { kIdle, kPending, kSubmitting };  // kSubmitting: reads only
  // What to start now, outside the lock.
  struct Plan {
    Call* write = nullptr;  // write this call's response
    Call* read = nullptr;   // read the next request into this call
    bool finish = false;    // finish the stream; nothing may touch the reactor after that
  };

  explicit StreamFlow(int max_in_flight) : max_in_flight_(max_in_flight) {}

  // The stream is refused before its first read.
  void Refuse() { phase_ = Phase::kFinished; }

  // A reaction that is none of the events below begins (a cancellation poking queued calls).
  void Enter() { ++active_; }

  // The pending read completed. `ok`: a request arrived: returns its call, now in flight, for the
  // reactor to submit and then report Submitted (null when the stream broke meanwhile: the
  // request is dropped).
  Call* ReadDone(bool ok) {
    ++active_;
    read_ = Op::kIdle;
    std::unique_ptr<Call> next = std::move(next_);
    if (!ok) {
      if (phase_ == Phase::kOpen) phase_ = Phase::kClientDone;
      return nullptr;
    }
    if (phase_ == Phase::kBroken) return nullptr;
    Call* call = next.get();
    calls_.emplace(call, std::move(next));
    read_ = Op::kSubmitting;
    return call;
  }

  // The call ReadDone returned has been handed on (queued with its model, or answered): the next
  // read may start. (Not a reaction: the reactor calls Enter first when it is one.)
  void Submitted() { read_ = Op::kIdle; }

  // `call` was answered: its response waits to be written, or is dropped when the stream broke.
  void Answered(Call* call) {
    ++active_;
    if (phase_ == Phase::kBroken) {
      calls_.erase(call);
    } else {
      write_queue_.push_back(call);
    }
  }

  // The pending write completed; `ok` false: the transport is gone, and so is every answer not
  // yet written. Returns `ok`.
  bool WriteDone(bool ok) {
    ++active_;
    write_ = Op::kIdle;
    calls_.erase(write_queue_.front());
    write_queue_.pop_front();
    if (!ok) {
      if (phase_ != Phase::kFinished) phase_ = Phase::kBroken;
      for (Call* dropped : write_queue_) calls_.erase(dropped);
      write_queue_.clear();
    }
    return ok;
  }

  // Plans what to start; `leaving`: the caller's reaction ends here. A planned read's call comes
  // from `make_call`.
  Plan Next(bool leaving, absl::FunctionRef<std::unique_ptr<Call>()> make_call) {
    if (leaving) --active_;
    Plan plan;
    if (write_ == Op::kIdle && !write_queue_.empty()) {
      write_ = Op::kPending;
      plan.write = write_queue_.front();
    }
    if (read_ == Op::kIdle && phase_ == Phase::kOpen && in_flight() < max_in_flight_) {
      read_ = Op::kPending;
      next_ = make_call();
      plan.read = next_.get();
    }
    if ((phase_ == Phase::kClientDone || phase_ == Phase::kBroken) && read_ == Op::kIdle &&
        write_ == Op::kIdle && calls_.empty() && active_ == 0) {
      phase_ = Phase::kFinished;
      plan.finish = true;
    }
    return plan;
  }

  // Each call in flight (read, not yet written).
  template <typename Fn>
  void ForEachInFlight(Fn fn) const {
    for (const auto& [call, owned] : calls_) fn(*call);
  }

  Phase phase() const { return phase_; }
  int in_flight() const { return static_cast<int>(calls_.size()); }

 private:
  const int max_in_flight_;
  Phase phase_ = Phase::kOpen;
  Op read_ = Op::kIdle;
  Op write_ = Op::kIdle;
  int active_ = 0;
  std::unique_ptr<Call> next_;                               // what the pending read fills
  absl::flat_hash_map<Call*, std::unique_ptr<Call>> calls_;  // in flight: read, not yet written
  std::deque<Call*> write_queue_;  // answered, in answer order; the front is being written when
                                   // write_ is kPending
};

}  // namespace sluice
