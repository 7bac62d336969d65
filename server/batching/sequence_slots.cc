#include "server/batching/sequence_slots.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

#include "server/core/logging.h"

namespace sluice {

bool Sequence::EndQueued() const {
  return std::any_of(pending.begin(), pending.end(), [](const PendingRequest& each) {
    return each.request->parameters.sequence.end;
  });
}

namespace {

Admission::Options WithShares(Admission::Options options) {
  options.shares = 2;
  return options;
}

}  // namespace

SequenceSlots::SequenceSlots(const ModelSpec* spec, Options options)
    : spec_(spec),
      options_(std::move(options)),
      slots_(options_.instances, std::vector<std::shared_ptr<Sequence>>(
                                     static_cast<size_t>(options_.slots_per_instance))),
      admission_(WithShares(options_.admission)) {}

const Sequence* SequenceSlots::Find(const CorrelationId& id) const {
  auto found = sequences_.find(id);
  return found == sequences_.end() ? nullptr : found->second.get();
}

Status SequenceSlots::Admit(const Sequence* sequence, size_t bytes) {
  const bool bound = sequence != nullptr && sequence->slot.has_value();
  const size_t slots = options_.instances * static_cast<size_t>(options_.slots_per_instance);
  const size_t cap = options_.admission.max_requests;
  return admission_.Admit(
      bound ? kBoundShare : kWaitingShare, bytes, spec_->name, [&](size_t waiting) {
        if (bound) {
          return absl::UnavailableError(absl::StrCat(
              "model '", spec_->name, "' has ", waiting,
              " requests queued for its active sequences (max_queue_size ", cap, "); retry later"));
        }
        return absl::UnavailableError(absl::StrCat("model '", spec_->name, "' has ", waiting,
                                                   " requests of sequences waiting for one of its ",
                                                   slots, " sequence slots (max_queue_size ", cap,
                                                   "); retry later"));
      });
}

Status SequenceSlots::Add(PendingRequest& pending, TimePoint now) {
  const SequenceControl& control = pending.request->parameters.sequence;
  auto found = sequences_.find(control.id);
  std::shared_ptr<Sequence> sequence = found == sequences_.end() ? nullptr : found->second;
  // Only a refusal needs the sequence described: admitted requests build no string.
  auto name = [&] {
    return absl::StrCat("sequence ", control.id.ToString(), " of model '", spec_->name, "'");
  };
  if (control.start && sequence != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(),
                     " is already active; sequence_start begins a new sequence: end the active one "
                     "with sequence_end "
                     "first, or use another sequence_id"));
  }
  if (!control.start && sequence == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(),
                     " is not active: its first request must set sequence_start (a sequence ends "
                     "with its sequence_end "
                     "request, after ",
                     spec_->sequence_batching.max_sequence_idle_us / 1000,
                     " ms without a request (max_sequence_idle_microseconds), or when its model "
                     "version is unloaded)"));
  }
  if (sequence != nullptr && sequence->EndQueued()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(),
                     " already has its sequence_end request queued; start a new sequence with "
                     "sequence_start once it "
                     "has been answered"));
  }
  SLUICE_RETURN_IF_ERROR(Admit(sequence.get(), pending.bytes));
  if (sequence == nullptr) {
    sequence = std::make_shared<Sequence>();
    sequence->id = control.id;
    sequences_.emplace(control.id, sequence);
    waiting_.push_back(sequence);
    if (options_.stats) options_.stats->RecordSequenceStarted();
  }
  pending.enqueued = now;
  sequence->pending.push_back(std::move(pending));
  sequence->last_activity = now;
  return absl::OkStatus();
}

void SequenceSlots::AssignSlots() {
  while (!waiting_.empty()) {
    int best_instance = -1, best_row = -1, best_free = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      int free = 0, first = -1;
      for (int row = 0; row < options_.slots_per_instance; ++row) {
        if (slots_[i][static_cast<size_t>(row)] != nullptr) continue;
        ++free;
        if (first < 0) first = row;
      }
      if (free > best_free) {
        best_free = free;
        best_instance = static_cast<int>(i);
        best_row = first;
      }
    }
    if (best_instance < 0) return;  // every slot is bound
    std::shared_ptr<Sequence> sequence = std::move(waiting_.front());
    waiting_.pop_front();
    size_t bytes = 0;
    for (const PendingRequest& pending : sequence->pending) bytes += pending.bytes;
    admission_.Move(kWaitingShare, kBoundShare, sequence->pending.size(), bytes);
    sequence->slot = Sequence::Slot{static_cast<size_t>(best_instance), best_row};
    sequence->phase = Sequence::Phase::kBound;
    slots_[static_cast<size_t>(best_instance)][static_cast<size_t>(best_row)] = sequence;
    spdlog::debug("event=sequence_bound model={} sequence={} instance={} slot={}", spec_->name,
                  sequence->id.ToString(), best_instance, best_row);
  }
}

void SequenceSlots::Forget(const std::shared_ptr<Sequence>& sequence, SequenceOutcome outcome) {
  if (options_.stats) options_.stats->RecordSequenceFinished(outcome);
  if (sequence->slot) {
    std::shared_ptr<Sequence>& slot =
        slots_[sequence->slot->instance][static_cast<size_t>(sequence->slot->row)];
    if (slot == sequence) slot.reset();
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), sequence), waiting_.end());
  }
  auto found = sequences_.find(sequence->id);
  if (found != sequences_.end() && found->second == sequence) sequences_.erase(found);
}

TimePoint SequenceSlots::Expire(TimePoint now,
                                std::vector<std::pair<PendingRequest, Status>>* out) {
  TimePoint next = kNoDeadline;
  const Duration idle = std::chrono::microseconds(spec_->sequence_batching.max_sequence_idle_us);
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    const std::shared_ptr<Sequence> sequence = it->second;
    ++it;  // Forget may erase this entry
    bool start_lost = false;
    for (auto pending = sequence->pending.begin(); pending != sequence->pending.end();) {
      const InferRequest& request = *pending->request;
      if (!request.IsCancelled() && request.deadline > now) {
        next = std::min(next, request.deadline);
        ++pending;
        continue;
      }
      if (request.parameters.sequence.start && !sequence->started()) start_lost = true;
      admission_.Release(ShareOf(*sequence), pending->bytes);
      Status status = QueuedExpiryStatus(request);
      out->emplace_back(std::move(*pending), std::move(status));
      pending = sequence->pending.erase(pending);
    }
    if (start_lost) {
      // Without its start the model would see the sequence's other requests as another's: drop it.
      for (PendingRequest& pending : sequence->pending) {
        admission_.Release(ShareOf(*sequence), pending.bytes);
        out->emplace_back(std::move(pending),
                          absl::UnavailableError(absl::StrCat(
                              "sequence ", sequence->id.ToString(), " of model '", spec_->name,
                              "' was dropped: its sequence_start request expired before it ran")));
      }
      sequence->pending.clear();
      spdlog::info(
          "event=sequence_dropped model={} sequence={} reason=\"start expired while queued\"",
          spec_->name, sequence->id.ToString());
      Forget(sequence, SequenceOutcome::kDropped);
      continue;
    }
    if (sequence->phase == Sequence::Phase::kIdle && sequence->pending.empty()) {
      const TimePoint idle_at = sequence->last_activity + idle;
      if (idle_at <= now) {
        spdlog::info(
            "event=sequence_idle_expired model={} sequence={} instance={} slot={} idle_us={}",
            spec_->name, sequence->id.ToString(), sequence->slot->instance, sequence->slot->row,
            spec_->sequence_batching.max_sequence_idle_us);
        Forget(sequence, SequenceOutcome::kIdleExpired);
      } else {
        next = std::min(next, idle_at);
      }
    }
  }
  return next;
}

PendingRequest SequenceSlots::Take(std::shared_ptr<Sequence> sequence, WrapCompletion wrap) {
  PendingRequest pending = std::move(sequence->pending.front());
  sequence->pending.pop_front();
  admission_.Release(kBoundShare, pending.bytes);
  const SequenceControl& control = pending.request->parameters.sequence;
  if (!spec_->sequence_batching.states.empty()) {
    pending.request->state_rows.assign(1, StateRow{sequence->slot->row, control.start});
  }
  pending.done = wrap(sequence, control.start, std::move(pending.done));
  if (control.end) {
    // The slot is free for another sequence from now on; its start runs in a later execution
    // of this instance (executions of one instance run in order).
    sequence->phase = Sequence::Phase::kEnding;
    Forget(sequence, SequenceOutcome::kEnded);
  } else {
    sequence->phase = Sequence::Phase::kRunning;
  }
  return pending;
}

std::optional<FormedBatch> SequenceSlots::FormBatch(
    size_t instance, TimePoint now, TimePoint* wake, WrapCompletion wrap,
    absl::FunctionRef<PendingRequest(const InferRequest&)> filler) {
  std::vector<std::shared_ptr<Sequence>>& rows = slots_[instance];
  // A slot's next request may run unless one of its sequence's requests still runs: one at a time
  // per sequence. (The batcher forms batches for idle instances only, and InstancePool answers an
  // execution's requests, so Finished has run, before it reports the instance idle.)
  auto ready = [](const std::shared_ptr<Sequence>& sequence) {
    return sequence != nullptr && !sequence->pending.empty() &&
           sequence->phase != Sequence::Phase::kRunning;
  };
  auto arrived = [&](int slot) {
    return rows[static_cast<size_t>(slot)]->pending.front().enqueued;
  };
  std::vector<int> candidates;  // slots with a request that may run
  for (int slot = 0; slot < options_.slots_per_instance; ++slot) {
    if (ready(rows[static_cast<size_t>(slot)])) candidates.push_back(slot);
  }
  if (candidates.empty()) return std::nullopt;
  const int oldest = *std::min_element(candidates.begin(), candidates.end(),
                                       [&](int a, int b) { return arrived(a) < arrived(b); });
  // Rows of one execution share their non-batch shapes; slots whose next request has another
  // shape wait for the next execution.
  const bool batches = spec_->batches();
  if (batches) {
    const std::string key =
        BatchQueue::GroupKey(*rows[static_cast<size_t>(oldest)]->pending.front().request);
    candidates.erase(
        std::remove_if(candidates.begin(), candidates.end(),
                       [&](int slot) {
                         return BatchQueue::GroupKey(
                                    *rows[static_cast<size_t>(slot)]->pending.front().request) !=
                                key;
                       }),
        candidates.end());
  }
  const SequenceBatchingSpec& batching = spec_->sequence_batching;
  const TimePoint due = arrived(oldest) + std::chrono::microseconds(batching.max_queue_delay_us);
  FormedBatch batch;
  if (batching.strategy == SequenceStrategy::kOldest) {
    // Up to max_batch_size sequences, oldest request first, packed into rows.
    const size_t most = batches ? static_cast<size_t>(spec_->max_batch_size) : 1;
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](int a, int b) { return arrived(a) < arrived(b); });
    size_t wanted = most;  // the largest preferred size that fits, else max_batch_size
    for (int size : batching.preferred_batch_sizes) {
      if (static_cast<size_t>(size) <= most) wanted = static_cast<size_t>(size);
    }
    if (candidates.size() < wanted && batching.max_queue_delay_us > 0 && now < due) {
      *wake = std::min(*wake, due);
      return std::nullopt;
    }
    candidates.resize(std::min(candidates.size(), wanted));
    for (int slot : candidates)
      batch.requests.push_back(Take(rows[static_cast<size_t>(slot)], wrap));
    batch.rows = batch.padded_rows = static_cast<int64_t>(batch.requests.size());
    return batch;
  }
  if (batching.max_queue_delay_us > 0) {
    const auto wanted = static_cast<size_t>(
        std::ceil(batching.minimum_slot_utilization * options_.slots_per_instance));
    if (candidates.size() < wanted && now < due) {
      *wake = std::min(*wake, due);
      return std::nullopt;
    }
  }
  // Direct: each slot's request in its slot's row. Fillers take their shapes from a real row: its
  // request object stays where it is when its owner moves into the batch.
  const InferRequest* like =
      rows[static_cast<size_t>(candidates.front())]->pending.front().request.get();
  const int height = batches ? candidates.back() + 1 : 1;
  size_t next = 0;
  for (int row = 0; row < height; ++row) {
    if (next == candidates.size() || candidates[next] != row) {
      batch.requests.push_back(filler(*like));
      continue;
    }
    ++next;
    batch.requests.push_back(Take(rows[static_cast<size_t>(row)], wrap));
  }
  batch.rows = batch.padded_rows = height;
  return batch;
}

void SequenceSlots::Finished(const std::shared_ptr<Sequence>& sequence, bool start,
                             const Status& status, TimePoint now,
                             std::deque<PendingRequest>* orphans) {
  sequence->last_activity = now;
  if (sequence->phase != Sequence::Phase::kRunning) return;  // it ended with this request
  auto found = sequences_.find(sequence->id);
  const bool active = found != sequences_.end() && found->second == sequence;
  if (start && !status.ok() && active) {
    // A start that failed leaves nothing for the rest of the sequence to build on: drop it, so
    // that the client can start it again, and answer what was queued behind it.
    for (const PendingRequest& orphan : sequence->pending)
      admission_.Release(kBoundShare, orphan.bytes);
    orphans->swap(sequence->pending);
    spdlog::info("event=sequence_dropped model={} sequence={} reason=\"its start failed: {}\"",
                 spec_->name, sequence->id.ToString(), status.message());
    Forget(sequence, SequenceOutcome::kDropped);
  }
  sequence->phase = Sequence::Phase::kIdle;
}

std::vector<PendingRequest> SequenceSlots::EndAll() {
  std::vector<PendingRequest> ended;
  for (auto& [id, sequence] : sequences_) {
    spdlog::debug("event=sequence_ended model={} sequence={} queued={}", spec_->name, id.ToString(),
                  sequence->pending.size());
    if (options_.stats) options_.stats->RecordSequenceFinished(SequenceOutcome::kCut);
    for (PendingRequest& pending : sequence->pending) ended.push_back(std::move(pending));
    sequence->pending.clear();
  }
  admission_.ReleaseAll();
  sequences_.clear();
  waiting_.clear();
  for (auto& rows : slots_) std::fill(rows.begin(), rows.end(), nullptr);
  return ended;
}

}  // namespace sluice
