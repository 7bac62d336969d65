#include "server/manager/caching_scheduler.h"

#include <optional>

namespace sluice {

CachingScheduler::CachingScheduler(Options options, std::unique_ptr<Scheduler> inner)
    : options_(std::move(options)),
      inner_(std::move(inner)),
      space_(options_.cache->OpenNamespace()),
      generation_(inner_->AnswersGeneration()) {
  SingleFlight::Options flights;
  flights.model = options_.model;
  flights.clock = options_.clock;
  flights.scheduler = inner_.get();
  flights.queue = options_.queue;
  flights.stats = options_.stats.get();
  flights.keep = [cache = options_.cache.get()](const ResponseCache::Key& key,
                                                absl::Span<const OutputView> outputs) {
    cache->Insert(key, outputs);
  };
  flights_ = std::make_unique<SingleFlight>(std::move(flights));
}

CachingScheduler::~CachingScheduler() { Stop(); }

void CachingScheduler::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                               InferCompletion done) {
  const TimePoint started = options_.clock->Now();
  // Read before the request runs: an answer it gives under an older generation goes into a
  // namespace that is closed (or about to be), where it is never found.
  const uint64_t generation = inner_->AnswersGeneration();
  if (generation != generation_.load(std::memory_order_acquire)) {
    MutexLock lock(&regenerate_);
    if (generation != generation_.load(std::memory_order_relaxed)) {
      const uint64_t old = space_.exchange(options_.cache->OpenNamespace());
      generation_.store(generation, std::memory_order_release);
      options_.cache->CloseNamespace(old);
    }
  }
  // The key is the input bytes: an ensemble step's held inputs come to the host for it.
  if (Status loaded = request->LoadHeldInputs(); !loaded.ok()) {
    if (options_.stats) options_.stats->RecordRejected(loaded, request->protocol);
    done(std::move(loaded));
    return;
  }
  ResponseCache::Key key = options_.cache->MakeKey(space_.load(), *request, options_.output_names);
  std::optional<Status> answered;  // set on a hit: the answer written (or the sink's refusal)
  {
    // Let go of the hit before answering: it pins its segment in memory until then.
    if (ResponseCache::Hit hit = options_.cache->Find(key)) answered = hit.WriteTo(sink);
  }
  if (answered) {
    if (!answered->ok()) {
      options_.stats->RecordRejected(*answered, request->protocol);
      done(*std::move(answered));
      return;
    }
    options_.stats->RecordCacheHit(options_.clock->Now() - started, request->protocol);
    if (request->trace) request->trace->AddAttribute("sluice.response_cache", std::string("hit"));
    done(absl::OkStatus());
    return;
  }
  // Run, or wait for the run of an identical request already queued or running. Every answer
  // that runs is kept: the run reads its inputs from the key's copy and writes its outputs where
  // no client can rewrite them (see SingleFlight), so shared-memory requests' answers are too.
  flights_->Submit(std::move(key), std::move(request), sink, std::move(done),
                   options_.clock->Now() - started);
}

void CachingScheduler::Poke() {
  inner_->Poke();
  flights_->Poke();
}

void CachingScheduler::Stop() {
  if (stopped_.exchange(true)) return;
  inner_->Stop();  // answers every flight's run, and so every waiter
  flights_->Stop();
  options_.cache->CloseNamespace(space_.load());
}

}  // namespace sluice
