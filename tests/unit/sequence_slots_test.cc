// The sequence batcher's decisions without threads or real time: each sequence's phase through
// its life, slots, fillers, expiry, the direct strategy's delay, the oldest strategy's packing,
// and the state rows a model with implicit state gets, all at given instants.
#include "server/batching/sequence_slots.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace sluice {
namespace {

using ::testing::HasSubstr;
using Phase = Sequence::Phase;
using namespace std::chrono_literals;

ModelSpec StatefulSpec(int max_batch_size) {
  ModelSpec spec;
  spec.name = "acc";
  spec.max_batch_size = max_batch_size;
  spec.inputs = {{"INPUT", DataType::kInt32, {1}}};
  spec.outputs = {{"OUTPUT", DataType::kInt32, {1}}};
  spec.sequence_batching.enabled = true;
  spec.sequence_batching.max_sequence_idle_us = 1000;
  return spec;
}

CorrelationId Id(uint64_t number) { return {number, "", false}; }

class SequenceSlotsTest : public ::testing::Test {
 protected:
  void Make(int max_batch_size, size_t instances = 1, size_t max_requests = 16) {
    spec_ = StatefulSpec(max_batch_size);
    Rebuild(instances, max_requests);
  }
  // The oldest strategy with `candidates` slots per instance.
  void MakeOldest(int max_batch_size, int candidates, std::vector<int> preferred = {},
                  int64_t delay_us = 0) {
    spec_ = StatefulSpec(max_batch_size);
    spec_.sequence_batching.strategy = SequenceStrategy::kOldest;
    spec_.sequence_batching.max_candidate_sequences = candidates;
    spec_.sequence_batching.preferred_batch_sizes = std::move(preferred);
    spec_.sequence_batching.max_queue_delay_us = delay_us;
    Rebuild(1, 16);
  }
  void Rebuild(size_t instances, size_t max_requests) {
    SequenceSlots::Options options;
    options.instances = instances;
    options.slots_per_instance = spec_.sequence_batching.SlotsPerInstance(spec_.max_batch_size);
    options.admission.max_requests = max_requests;
    slots_ = std::make_unique<SequenceSlots>(&spec_, options);
  }

  // A one-row request of sequence `id`; its answer goes to answers_[label].
  PendingRequest Request(const std::string& label, uint64_t id, bool start, bool end,
                         TimePoint deadline = kNoDeadline) {
    PendingRequest pending;
    pending.request = std::make_unique<InferRequest>();
    pending.request->model_name = "acc";
    pending.request->inputs.push_back(
        {"INPUT", DataType::kInt32, {1, 1}, reinterpret_cast<const char*>(&value_), 4, {}});
    pending.request->parameters.sequence = {Id(id), start, end};
    pending.request->deadline = deadline;
    pending.bytes = 4;
    pending.done = [this, label](Status status) { answers_[label] = status; };
    return pending;
  }
  Status Add(const std::string& label, uint64_t id, bool start = false, bool end = false,
             TimePoint deadline = kNoDeadline) {
    PendingRequest pending = Request(label, id, start, end, deadline);
    return slots_->Add(pending, now_);
  }
  std::optional<FormedBatch> Form(size_t instance = 0, TimePoint* wake = nullptr) {
    TimePoint ignored = kNoDeadline;
    return slots_->FormBatch(
        instance, now_, wake != nullptr ? wake : &ignored,
        [this](std::shared_ptr<Sequence> sequence, bool start,
               InferCompletion done) -> InferCompletion {
          return [this, sequence, start, done = std::move(done)](Status status) mutable {
            std::deque<PendingRequest> orphans;
            slots_->Finished(sequence, start, status, now_, &orphans);
            for (PendingRequest& orphan : orphans) orphan.done(absl::UnavailableError("orphan"));
            done(status);
          };
        },
        [this](const InferRequest&) {
          PendingRequest filler = Request("filler", 0, false, false);
          filler.filler = true;
          return filler;
        });
  }
  Phase PhaseOf(uint64_t id) { return slots_->Find(Id(id))->phase; }

  ModelSpec spec_;
  std::unique_ptr<SequenceSlots> slots_;
  TimePoint now_ = TimePoint(1h);
  int32_t value_ = 7;
  std::map<std::string, Status> answers_;
};

TEST_F(SequenceSlotsTest, ASequenceGoesThroughItsPhasesAndItsEndFreesTheSlotAtOnce) {
  Make(/*max_batch_size=*/1);
  ASSERT_TRUE(Add("a-start", 1, /*start=*/true).ok());
  EXPECT_EQ(PhaseOf(1), Phase::kWaitingForSlot);
  slots_->AssignSlots();
  EXPECT_EQ(PhaseOf(1), Phase::kBound);
  std::optional<FormedBatch> batch = Form();
  ASSERT_TRUE(batch);
  EXPECT_EQ(PhaseOf(1), Phase::kRunning);
  EXPECT_FALSE(Form());  // one request of a sequence at a time
  batch->requests[0].done(absl::OkStatus());
  EXPECT_EQ(PhaseOf(1), Phase::kIdle);
  ASSERT_TRUE(Add("a-end", 1, false, /*end=*/true).ok());
  ASSERT_TRUE(Add("b-start", 2, /*start=*/true).ok());  // waits: the only slot is bound
  slots_->AssignSlots();
  EXPECT_EQ(PhaseOf(2), Phase::kWaitingForSlot);
  batch = Form();
  ASSERT_TRUE(batch);
  EXPECT_FALSE(slots_->Has(Id(1)));  // ending: no longer active, its slot free...
  slots_->AssignSlots();
  EXPECT_EQ(PhaseOf(2), Phase::kBound);  // ...for the next sequence, before the end has run
  batch->requests[0].done(absl::OkStatus());
  EXPECT_TRUE(answers_.at("a-end").ok());
  EXPECT_EQ(slots_->active(), 1u);
}

TEST_F(SequenceSlotsTest, RefusalsNameTheSequence) {
  Make(2);
  EXPECT_THAT(Add("x", 5).message(), HasSubstr("sequence 5 of model 'acc' is not active"));
  ASSERT_TRUE(Add("s", 5, true).ok());
  EXPECT_THAT(Add("again", 5, true).message(), HasSubstr("is already active"));
  ASSERT_TRUE(Add("e", 5, false, true).ok());
  EXPECT_THAT(Add("after", 5).message(), HasSubstr("already has its sequence_end request queued"));
  EXPECT_EQ(slots_->queued(), 2u);
}

TEST_F(SequenceSlotsTest, AnIdleSequenceEndsAfterMaxSequenceIdle) {
  Make(1);
  ASSERT_TRUE(Add("start", 1, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> batch = Form();
  batch->requests[0].done(absl::OkStatus());  // answered at now_: idle from here
  std::vector<std::pair<PendingRequest, Status>> expired;
  now_ += 999us;
  EXPECT_EQ(slots_->Expire(now_, &expired), now_ + 1us);  // when it will be idle long enough
  EXPECT_TRUE(slots_->Has(Id(1)));
  now_ += 1us;
  EXPECT_EQ(slots_->Expire(now_, &expired), kNoDeadline);
  EXPECT_FALSE(slots_->Has(Id(1)));
  EXPECT_TRUE(expired.empty());  // nothing was queued
}

TEST_F(SequenceSlotsTest, AStartThatExpiresWhileWaitingDropsItsSequence) {
  Make(1);
  ASSERT_TRUE(Add("a", 1, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> running = Form();  // sequence 1 holds the only slot
  ASSERT_TRUE(Add("b-start", 2, true, false, now_ + 1ms).ok());
  ASSERT_TRUE(Add("b-next", 2).ok());
  slots_->AssignSlots();
  std::vector<std::pair<PendingRequest, Status>> expired;
  now_ += 1ms;
  slots_->Expire(now_, &expired);
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(expired[1].second.message(),
              HasSubstr("its sequence_start request expired before it ran"));
  EXPECT_FALSE(slots_->Has(Id(2)));
  EXPECT_EQ(slots_->queued(), 0u);
  running->requests[0].done(absl::OkStatus());
}

TEST_F(SequenceSlotsTest, AFailedStartDropsItsSequenceAndHandsBackWhatWasQueued) {
  Make(1);
  ASSERT_TRUE(Add("start", 1, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> batch = Form();
  ASSERT_TRUE(Add("next", 1).ok());
  batch->requests[0].done(absl::InternalError("the model failed"));
  EXPECT_EQ(answers_.at("next").message(), "orphan");
  EXPECT_FALSE(slots_->Has(Id(1)));
  EXPECT_EQ(slots_->queued(), 0u);
  EXPECT_TRUE(Add("restart", 1, true).ok());  // it may start again
}

TEST_F(SequenceSlotsTest,
       RowsFollowSlotsWithFillersBelowTheHighestAndSequencesSpreadOverInstances) {
  Make(/*max_batch_size=*/2, /*instances=*/2);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(Add("start", id, true).ok());
  slots_->AssignSlots();  // 1 -> instance 0 row 0, 2 -> instance 1 row 0, 3 -> instance 0 row 1
  for (int i = 0; i < 2; ++i) {
    std::optional<FormedBatch> batch = Form(static_cast<size_t>(i));
    ASSERT_TRUE(batch);
    for (PendingRequest& each : batch->requests) each.done(absl::OkStatus());
  }
  ASSERT_TRUE(Add("three", 3).ok());  // only row 1 of instance 0 has a request
  std::optional<FormedBatch> batch = Form(0);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->rows, 2);
  EXPECT_TRUE(batch->requests[0].filler);
  EXPECT_FALSE(batch->requests[1].filler);
  EXPECT_EQ(batch->requests[1].request->parameters.sequence.id.number, 3u);
  EXPECT_FALSE(Form(1));
}

TEST_F(SequenceSlotsTest, TheDirectStrategyWaitsForRowsUntilItsDelay) {
  Make(2);
  spec_.sequence_batching.max_queue_delay_us = 500;
  spec_.sequence_batching.minimum_slot_utilization = 1.0;  // both slots
  ASSERT_TRUE(Add("one", 1, true).ok());
  ASSERT_TRUE(Add("two", 2, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> first = Form();  // both rows: no wait
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rows, 2);
  for (PendingRequest& each : first->requests) each.done(absl::OkStatus());
  ASSERT_TRUE(Add("one-more", 1).ok());
  TimePoint wake = kNoDeadline;
  EXPECT_FALSE(Form(0, &wake));
  EXPECT_EQ(wake, now_ + 500us);
  now_ += 500us;
  std::optional<FormedBatch> late = Form();
  ASSERT_TRUE(late);
  EXPECT_EQ(late->requests.size(), 1u);  // row 0 alone: nothing below it to fill
}

TEST_F(SequenceSlotsTest, EndAllReturnsEveryQueuedRequestAndForgetsEverySequence) {
  Make(1);
  ASSERT_TRUE(Add("a", 1, true).ok());
  ASSERT_TRUE(Add("b", 2, true).ok());
  ASSERT_TRUE(Add("b2", 2).ok());
  slots_->AssignSlots();
  std::vector<PendingRequest> ended = slots_->EndAll();
  EXPECT_EQ(ended.size(), 3u);
  EXPECT_EQ(slots_->active(), 0u);
  EXPECT_EQ(slots_->queued(), 0u);
  EXPECT_THAT(Add("b3", 2).message(), HasSubstr("is not active"));
}

TEST_F(SequenceSlotsTest, TheOldestStrategyPacksTheOldestRequestsOfSeveralSequences) {
  MakeOldest(/*max_batch_size=*/2, /*candidates=*/4);
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(Add("start", id, true).ok());
    now_ += 1us;
  }
  slots_->AssignSlots();  // three candidate slots of four
  std::optional<FormedBatch> batch = Form();
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->rows, 2);  // max_batch_size rows, no fillers
  EXPECT_EQ(batch->requests[0].request->parameters.sequence.id.number, 1u);
  EXPECT_EQ(batch->requests[1].request->parameters.sequence.id.number, 2u);
  EXPECT_FALSE(batch->requests[0].filler || batch->requests[1].filler);
  EXPECT_TRUE(batch->requests[0].request->state_rows.empty());  // no implicit state declared
  // Sequence 1's next request is younger than sequence 3's start: 3 goes first.
  for (PendingRequest& each : batch->requests) each.done(absl::OkStatus());
  ASSERT_TRUE(Add("one-again", 1).ok());
  batch = Form();
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->rows, 2);
  EXPECT_EQ(batch->requests[0].request->parameters.sequence.id.number, 3u);
  EXPECT_EQ(batch->requests[1].request->parameters.sequence.id.number, 1u);
}

TEST_F(SequenceSlotsTest, TheOldestStrategyWaitsForItsPreferredSizeUntilItsDelay) {
  MakeOldest(/*max_batch_size=*/4, /*candidates=*/8, /*preferred=*/{2, 3}, /*delay_us=*/300);
  ASSERT_TRUE(Add("one", 1, true).ok());
  ASSERT_TRUE(Add("two", 2, true).ok());
  slots_->AssignSlots();
  TimePoint wake = kNoDeadline;
  EXPECT_FALSE(Form(0, &wake));  // two of the three it prefers
  EXPECT_EQ(wake, now_ + 300us);
  ASSERT_TRUE(Add("three", 3, true).ok());
  ASSERT_TRUE(Add("four", 4, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> batch = Form();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->rows, 3);  // the largest preferred size, not all four
  for (PendingRequest& each : batch->requests) each.done(absl::OkStatus());
  wake = kNoDeadline;
  EXPECT_FALSE(Form(0, &wake));  // one left: it waits out its delay
  now_ += 300us;
  batch = Form();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->rows, 1);
  EXPECT_EQ(batch->requests[0].request->parameters.sequence.id.number, 4u);
}

TEST_F(SequenceSlotsTest, WithImplicitStateEachRowNamesItsSlotAndWhetherItStarts) {
  Make(/*max_batch_size=*/2);
  spec_.sequence_batching.states.push_back({"STATE__1", "STATE__1", DataType::kFp32, {4}});
  ASSERT_TRUE(Add("a", 1, true).ok());
  ASSERT_TRUE(Add("b", 2, true).ok());
  slots_->AssignSlots();
  std::optional<FormedBatch> batch = Form();
  ASSERT_TRUE(batch);
  for (int row = 0; row < 2; ++row) {
    const std::vector<StateRow>& rows =
        batch->requests[static_cast<size_t>(row)].request->state_rows;
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].slot, row);
    EXPECT_TRUE(rows[0].start);
  }
  for (PendingRequest& each : batch->requests) each.done(absl::OkStatus());
  ASSERT_TRUE(Add("b-next", 2).ok());
  batch = Form();
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->rows, 2);
  EXPECT_TRUE(batch->requests[0].filler);
  EXPECT_TRUE(batch->requests[0].request->state_rows.empty());  // a filler keeps no state
  EXPECT_EQ(batch->requests[1].request->state_rows[0].slot, 1);
  EXPECT_FALSE(batch->requests[1].request->state_rows[0].start);
}

}  // namespace
}  // namespace sluice
