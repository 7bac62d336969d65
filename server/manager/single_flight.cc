#include "server/manager/single_flight.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/os/threads.h"

namespace sluice {

struct SingleFlight::Flight {
  ResponseCache::Key key;  // its bytes hold the run's inputs
  Duration lookup{0};      // the first request's cache lookup
  // The run's cancellation flag, also its name for Scheduler::Reschedule.
  const std::shared_ptr<std::atomic<bool>> run_cancelled =
      std::make_shared<std::atomic<bool>>(false);
  // Guarded by SingleFlight::mutex_:
  std::list<Waiter> waiters;
  int level = 0;                        // the run's priority level (the highest of its waiters')
  TimePoint deadline = kNoDeadline;     // the run's deadline (the latest of its waiters')
  TimePoint delay_after = kNoDeadline;  // the run's DELAY timeout (the latest of its waiters')
  bool listed = false;                  // in the table: requests with its key join it
  // The run was handed to the scheduler: joiners raise it there (Reschedule); before that, Submit
  // raises it once it has handed it over.
  bool queued = false;
};

// Where a run writes its outputs: the first Allocate picks a waiter to write into (one whose
// outputs are not in shared memory, which the client may rewrite while the others copy them),
// or memory of its own; every output's place is recorded for the copies and the cache. It names
// no Connection (OutputSink::Connection): its waiters may leave before the run answers, so a
// waiter's sink cannot be asked for one.
class SingleFlight::FlightSink final : public OutputSink {
 public:
  FlightSink(SingleFlight* owner, std::shared_ptr<Flight> flight)
      : owner_(owner), flight_(std::move(flight)) {}

  StatusOr<char*> Allocate(const OutputDescription& output) override {
    if (!recording_) {
      OutputSink* into = &scratch_;
      MutexLock lock(&owner_->mutex_);
      for (Waiter& waiter : flight_->waiters) {
        if (waiter.shared_memory) continue;
        waiter.pinned = true;
        into = waiter.sink;
        break;
      }
      recording_.emplace(into);
    }
    return recording_->Allocate(output);
  }
  std::vector<OutputView> Outputs() const {
    return recording_ ? recording_->Outputs() : std::vector<OutputView>();
  }

 private:
  SingleFlight* const owner_;
  const std::shared_ptr<Flight> flight_;
  TensorSink scratch_;
  std::optional<RecordingSink> recording_;
};

SingleFlight::SingleFlight(Options options) : options_(std::move(options)) {
  timer_ = std::thread([this] { TimerLoop(); });
}

SingleFlight::~SingleFlight() { Stop(); }

void SingleFlight::Submit(ResponseCache::Key key, std::unique_ptr<InferRequest> request,
                          OutputSink* sink, InferCompletion done, Duration lookup) {
  Waiter waiter;
  waiter.sink = sink;
  waiter.done = std::move(done);
  waiter.arrived = options_.clock->Now();
  waiter.deadline = request->deadline;
  waiter.cancelled = request->cancelled;
  waiter.protocol = request->protocol;
  waiter.level = request->priority_level;
  waiter.shared_memory = request->shared_memory;
  std::shared_ptr<Flight> flight;
  {
    MutexLock lock(&mutex_);
    auto found = table_.find(TableKey{key.hash, key.bytes});
    // A traced request says how it was answered: by another request's run (its span then has no
    // stage spans of its own), or by the run it starts.
    if (request->trace) {
      request->trace->AddAttribute("sluice.response_cache",
                                   std::string(found != table_.end() ? "shared" : "miss"));
    }
    if (found != table_.end()) {
      Flight& joined = *found->second;
      Status admitted = options_.queue->AdmitWaiter(*request);
      if (!admitted.ok()) {
        lock.Unlock();
        options_.stats->RecordRejected(admitted, waiter.protocol);
        options_.stats->RecordPriorityRefused(waiter.level, admitted);
        waiter.done(std::move(admitted));
        return;
      }
      waiter.bytes = request->InputBytes();
      waiter.counted = true;
      const bool higher = waiter.level > 0 && waiter.level < joined.level;
      const bool later = waiter.deadline > joined.deadline;
      const bool later_delay = request->delay_after > joined.delay_after;
      if (higher) joined.level = waiter.level;
      if (later) joined.deadline = waiter.deadline;
      if (later_delay) joined.delay_after = request->delay_after;
      if ((higher || later || later_delay) && joined.queued) {
        options_.queue->Reschedule(joined.run_cancelled.get(), joined.level, joined.deadline,
                                   joined.delay_after);
      }
      // The timer looks at deadlines before the run's: this one's, or the one it just raised.
      const bool timer = waiter.deadline != kNoDeadline || later;
      joined.waiters.push_back(std::move(waiter));
      ++waiting_;
      lock.Unlock();
      if (timer) wake_.Signal();
      return;
    }
    flight = std::make_shared<Flight>();
    flight->key = std::move(key);
    flight->lookup = lookup;
    flight->level = request->priority_level;
    flight->deadline = request->deadline;
    flight->delay_after = request->delay_after;
    flight->listed = true;
    flight->waiters.push_back(std::move(waiter));
    ++waiting_;
    table_.emplace(TableKey{flight->key.hash, flight->key.bytes}, flight);
  }
  // The run is the first request itself, made independent of its caller: its inputs in the key's
  // copy, its own cancellation flag.
  std::unique_ptr<InferRequest> run = std::move(request);
  for (size_t i = 0; i < run->inputs.size(); ++i) {
    run->inputs[i].data = flight->key.bytes.data() + flight->key.input_offsets[i];
  }
  run->owned_buffers.clear();
  run->cancelled = flight->run_cancelled;
  run->shared_memory = false;
  const int level = run->priority_level;
  const TimePoint deadline = run->deadline;
  const TimePoint delay_after = run->delay_after;
  auto flight_sink = std::make_unique<FlightSink>(this, flight);
  FlightSink* into = flight_sink.get();
  options_.scheduler->Enqueue(std::move(run), into,
                              [this, flight, sink = std::move(flight_sink)](Status status) mutable {
                                Finish(flight, sink.get(), std::move(status));
                              });
  // Waiters that joined while it was being handed over raise it now.
  MutexLock lock(&mutex_);
  flight->queued = true;
  if (flight->listed && (flight->level != level || flight->deadline != deadline ||
                         flight->delay_after != delay_after)) {
    options_.queue->Reschedule(flight->run_cancelled.get(), flight->level, flight->deadline,
                               flight->delay_after);
  }
}

void SingleFlight::Finish(const std::shared_ptr<Flight>& flight, FlightSink* sink, Status status) {
  const std::vector<OutputView> outputs = sink->Outputs();
  Duration took = flight->lookup;
  // Kept before the flight leaves the table: a request with its key finds one or the other.
  if (status.ok() && options_.keep) {
    const TimePoint keeping = options_.clock->Now();
    options_.keep(flight->key, outputs);
    took += options_.clock->Now() - keeping;
  }
  options_.stats->RecordCacheMiss(took);
  std::list<Waiter> waiters;
  {
    MutexLock lock(&mutex_);
    UnlistLocked(*flight);
    waiters.swap(flight->waiters);
    waiting_ -= waiters.size();
    // They leave the caps before they are answered: a caller that sends again at once is counted
    // anew, not twice.
    for (const Waiter& waiter : waiters) {
      if (waiter.counted) options_.queue->ReleaseWaiter(waiter.level, waiter.bytes);
    }
  }
  const TimePoint now = options_.clock->Now();
  Waiter* pinned = nullptr;  // answered last: the others copy from its sink
  for (Waiter& waiter : waiters) {
    if (waiter.pinned) {
      pinned = &waiter;
    } else {
      Status answer = status;
      if (answer.ok()) answer = WriteOutputs(outputs, waiter.sink);
      if (waiter.counted) {
        if (answer.ok()) {
          options_.stats->RecordSharedAnswer(now - waiter.arrived, waiter.protocol);
        } else {
          options_.stats->RecordRejected(answer, waiter.protocol);
        }
      }
      waiter.done(std::move(answer));
    }
  }
  if (pinned != nullptr) {
    if (pinned->counted) {
      if (status.ok()) {
        options_.stats->RecordSharedAnswer(now - pinned->arrived, pinned->protocol);
      } else {
        options_.stats->RecordRejected(status, pinned->protocol);
      }
    }
    pinned->done(status);
  }
}

void SingleFlight::UnlistLocked(Flight& flight) {
  if (!flight.listed) return;
  flight.listed = false;
  table_.erase(TableKey{flight.key.hash, flight.key.bytes});
}

SingleFlight::Waiter SingleFlight::RemoveLocked(Flight& flight, std::list<Waiter>::iterator it) {
  Waiter waiter = std::move(*it);
  flight.waiters.erase(it);
  --waiting_;
  if (waiter.counted) {
    options_.queue->ReleaseWaiter(waiter.level, waiter.bytes);
    return waiter;
  }
  // The run stood for it; it now stands for another waiter, whose own count goes back. The one
  // leaving is then answered and recorded here (`counted`); when none is left, the run is
  // cancelled and records it.
  for (Waiter& other : flight.waiters) {
    if (!other.counted) continue;
    options_.queue->ReleaseWaiter(other.level, other.bytes);
    other.counted = false;
    waiter.counted = true;
    break;
  }
  return waiter;
}

TimePoint SingleFlight::SweepLocked(std::vector<Answer>* answers, bool* poke) {
  const TimePoint now = options_.clock->Now();
  TimePoint next = kNoDeadline;
  std::vector<Flight*> emptied;
  for (auto& [table_key, flight] : table_) {
    for (auto it = flight->waiters.begin(); it != flight->waiters.end();) {
      const Waiter& waiter = *it;
      // A deadline as late as the run's is the run's: the scheduler expires the run, and with it
      // the waiters left.
      const bool timed = waiter.deadline < flight->deadline;
      const bool cancelled = waiter.Cancelled();
      if (waiter.pinned || (!cancelled && !(timed && waiter.deadline <= now))) {
        if (timed && !waiter.pinned) next = std::min(next, waiter.deadline);
        ++it;
        continue;
      }
      if (cancelled && flight->waiters.size() == 1) {
        // The last one: the run answers it (CANCELLED while queued, its answer once it runs).
        flight->run_cancelled->store(true, std::memory_order_relaxed);
        emptied.push_back(flight.get());
        break;
      }
      Status why = cancelled ? absl::CancelledError(
                                   "the request was cancelled while it waited for the answer of an "
                                   "identical request")
                             : absl::DeadlineExceededError(absl::StrCat(
                                   "the request's deadline or queue timeout passed while it waited "
                                   "for the answer of an "
                                   "identical request to model '",
                                   options_.model, "' (single flight); it did not run"));
      auto following = std::next(it);
      answers->push_back({RemoveLocked(*flight, it), std::move(why)});
      it = following;
      if (flight->waiters.empty()) {
        flight->run_cancelled->store(true, std::memory_order_relaxed);
        emptied.push_back(flight.get());
      }
    }
  }
  for (Flight* flight : emptied) UnlistLocked(*flight);
  *poke = !emptied.empty();
  return next;
}

void SingleFlight::AnswerLeft(std::vector<Answer> answers) {
  for (Answer& answer : answers) {
    if (answer.waiter.counted)
      options_.stats->RecordRejected(answer.status, answer.waiter.protocol);
    answer.waiter.done(std::move(answer.status));
  }
}

void SingleFlight::TimerLoop() {
  NameThisThread("sluice-flights");
  MutexLock lock(&mutex_);
  while (!stopping_) {
    poked_ = false;
    std::vector<Answer> answers;
    bool poke = false;
    const TimePoint next = SweepLocked(&answers, &poke);
    if (!answers.empty() || poke) {
      lock.Unlock();
      if (poke) options_.scheduler->Poke();
      AnswerLeft(std::move(answers));
      lock.Lock();
      continue;
    }
    if (poked_ || stopping_) continue;
    options_.clock->WaitUntil(&wake_, &mutex_, next);
  }
}

void SingleFlight::Poke() {
  {
    MutexLock lock(&mutex_);
    poked_ = true;
  }
  wake_.Signal();
}

void SingleFlight::Stop() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
  }
  wake_.Signal();
  if (timer_.joinable()) timer_.join();
}

size_t SingleFlight::flights() const {
  MutexLock lock(&mutex_);
  return table_.size();
}

size_t SingleFlight::waiters() const {
  MutexLock lock(&mutex_);
  return waiting_;
}

}  // namespace sluice
