// The sequence batcher (direct strategy): a fake stateful model that keeps a running sum per batch
// slot (as Triton's direct-strategy models do), so a sequence that moved slot or instance, or a
// request run out of order, shows up as a wrong sum. Also run under ThreadSanitizer.
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/sequence_batcher.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

ModelSpec AccumulatorSpec(int max_batch_size = 4) {
  ModelSpec spec;
  spec.name = "acc";
  spec.max_batch_size = max_batch_size;
  spec.inputs = {{"INPUT", DataType::kInt32, {1}}};
  spec.outputs = {{"OUTPUT", DataType::kInt32, {1}}};
  SequenceBatchingSpec& sequences = spec.sequence_batching;
  sequences.enabled = true;
  sequences.max_sequence_idle_us = 1'000'000;
  sequences.controls = {{SequenceControlKind::kStart, "START", DataType::kInt32, 0, 1},
                        {SequenceControlKind::kEnd, "END", DataType::kInt32, 0, 1},
                        {SequenceControlKind::kReady, "READY", DataType::kInt32, 0, 1},
                        {SequenceControlKind::kCorrId, "CORRID", DataType::kInt64, 0, 0}};
  sequences.correlation_id_type = DataType::kInt64;
  for (const SequenceControlSpec& control : sequences.controls) {
    TensorSpec input{control.input, control.dtype, {1}};
    input.filled_by_server = true;
    spec.inputs.push_back(input);
  }
  return spec;
}

template <typename T>
std::vector<T> Values(const InferRequest& request, const std::string& name) {
  for (const TensorView& input : request.inputs) {
    if (input.name != name) continue;
    std::vector<T> values(input.byte_size / sizeof(T));
    std::memcpy(values.data(), input.data, input.byte_size);
    return values;
  }
  ADD_FAILURE() << "no input " << name;
  return {};
}

// An input value that makes the fake model fail its execution.
constexpr int32_t kPoison = -999;

// One execution as the model saw it.
struct Execution {
  std::vector<int32_t> ready, start, end, input;
  std::vector<int64_t> corrid;
};

// OUTPUT = the running sum of INPUT in this row's slot since the slot's last START; rows with READY
// off return 0 and change nothing. One per instance, behind a FakeBackend (which can hold it at a
// gate).
class SlotAccumulator {
 public:
  StatusOr<std::vector<Tensor>> Run(const InferRequest& batch) {
    Execution seen{Values<int32_t>(batch, "READY"), Values<int32_t>(batch, "START"),
                   Values<int32_t>(batch, "END"), Values<int32_t>(batch, "INPUT"),
                   Values<int64_t>(batch, "CORRID")};
    std::vector<int32_t> out(static_cast<size_t>(batch.batch_size), 0);
    for (size_t row = 0; row < out.size(); ++row) {
      if (seen.ready[row] == 0) continue;
      if (seen.input[row] == kPoison) return absl::InternalError("poisoned row");
      if (seen.start[row] != 0) sums_[row] = 0;
      sums_[row] += seen.input[row];
      out[row] = sums_[row];
      if (seen.end[row] != 0) sums_[row] = 0;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      executions_.push_back(std::move(seen));
    }
    return std::vector<Tensor>{
        {"OUTPUT",
         DataType::kInt32,
         {batch.batch_size, 1},
         std::string(reinterpret_cast<const char*>(out.data()), out.size() * 4)}};
  }
  std::vector<Execution> executions() {
    std::lock_guard<std::mutex> lock(mutex_);
    return executions_;
  }

 private:
  std::map<size_t, int32_t> sums_;  // by slot (row); only the instance's worker touches it
  std::mutex mutex_;
  std::vector<Execution> executions_;
};

// One request: its value, its sequence controls, and the answer.
struct Call {
  int32_t value = 0;
  TensorSink sink;
  std::promise<StatusOr<int32_t>> answer;
  std::future<StatusOr<int32_t>> future = answer.get_future();

  StatusOr<int32_t> Get() {
    if (future.wait_for(10s) != std::future_status::ready)
      return absl::DeadlineExceededError("no answer in 10 s");
    return future.get();
  }
};

std::unique_ptr<InferRequest> Request(Call& call, CorrelationId id, bool start, bool end,
                                      int64_t rows = 1) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = "acc";
  request->batch_size = rows;
  request->inputs.push_back({"INPUT",
                             DataType::kInt32,
                             {rows, 1},
                             reinterpret_cast<const char*>(&call.value),
                             4 * static_cast<size_t>(rows),
                             {}});
  request->parameters.sequence = {std::move(id), start, end};
  return request;
}

CorrelationId Id(uint64_t number) { return {number, "", false}; }

class SequenceBatcherTest : public ::testing::Test {
 protected:
  std::unique_ptr<SequenceBatcher> Make(
      int instances = 1, ModelSpec spec = AccumulatorSpec(), size_t max_requests = 64,
      const TimeSource* clock = nullptr,
      const std::function<void(SequenceBatcher::Options&)>& tune = nullptr) {
    std::vector<std::unique_ptr<ModelBackend>> backends;
    for (int i = 0; i < instances; ++i) {
      auto model = std::make_shared<SlotAccumulator>();
      auto backend = std::make_unique<testing::FakeBackend>(
          [model](const InferRequest& batch) { return model->Run(batch); });
      accumulators_.push_back(model);
      models_.push_back(backend.get());
      backends.push_back(std::move(backend));
    }
    SequenceBatcher::Options options;
    options.clock = clock != nullptr ? clock : &real_clock_;
    options.stats = stats_;
    options.max_requests = max_requests;
    if (tune) tune(options);
    return *SequenceBatcher::Create(std::move(spec), std::move(backends), options);
  }

  // Sends one request and waits for its answer.
  StatusOr<int32_t> Send(SequenceBatcher& batcher, CorrelationId id, int32_t value,
                         bool start = false, bool end = false) {
    Call call;
    call.value = value;
    batcher.Enqueue(Request(call, std::move(id), start, end), &call.sink, Done(call));
    return call.Get();
  }

  static InferCompletion Done(Call& call) {
    return [&call](Status status) {
      if (!status.ok()) {
        call.answer.set_value(status);
        return;
      }
      int32_t value = 0;
      std::memcpy(&value, call.sink.outputs().at(0).data.data(), 4);
      call.answer.set_value(value);
    };
  }

  SteadyTimeSource real_clock_;
  std::shared_ptr<ModelStats> stats_ = std::make_shared<ModelStats>();
  std::vector<testing::FakeBackend*> models_;                   // gates
  std::vector<std::shared_ptr<SlotAccumulator>> accumulators_;  // what each instance saw
};

TEST_F(SequenceBatcherTest, InterleavedSequencesEachGetTheirOwnRunningSum) {
  auto batcher = Make(/*instances=*/2);
  EXPECT_EQ(batcher->slots_per_instance(), 4);
  constexpr int kSequences = 8, kSteps = 6;  // every slot of both instances
  std::vector<std::unique_ptr<Call>> calls;
  // Everything is sent at once, each sequence's requests in order, sequences interleaved.
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < kSequences; ++s) {
      calls.push_back(std::make_unique<Call>());
      Call& call = *calls.back();
      call.value = (s + 1) * 100 + step;
      batcher->Enqueue(Request(call, Id(1000 + s), step == 0, step == kSteps - 1), &call.sink,
                       Done(call));
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < kSequences; ++s) {
      int32_t expected = 0;
      for (int k = 0; k <= step; ++k) expected += (s + 1) * 100 + k;
      StatusOr<int32_t> got = calls[static_cast<size_t>(step * kSequences + s)]->Get();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, expected) << "sequence " << s << " step " << step;
    }
  }
  // Both instances ran sequences, and executions carried several sequences' rows.
  size_t most_rows = 0;
  for (const auto& model : accumulators_) {
    EXPECT_FALSE(model->executions().empty());
    for (const Execution& execution : model->executions())
      most_rows = std::max(most_rows, execution.ready.size());
  }
  EXPECT_GT(most_rows, 1u);
  EXPECT_EQ(batcher->ActiveSequences(), 0u);
}

TEST_F(SequenceBatcherTest, EmptySlotsBelowABusyOneAreFillerRowsWithReadyOff) {
  auto batcher = Make();
  ASSERT_EQ(*Send(*batcher, Id(1), 5, /*start=*/true), 5);       // slot 0
  ASSERT_EQ(*Send(*batcher, Id(2), 7, /*start=*/true), 7);       // slot 1
  ASSERT_EQ(*Send(*batcher, Id(3), 9, /*start=*/true), 9);       // slot 2
  ASSERT_EQ(*Send(*batcher, Id(1), 1, false, /*end=*/true), 6);  // slot 0 is free again
  ASSERT_EQ(*Send(*batcher, Id(3), 1), 10);                      // alone, in row 2
  const std::vector<Execution> executions = accumulators_[0]->executions();
  ASSERT_EQ(executions.size(), 5u);
  const Execution& second = executions[1];
  EXPECT_THAT(second.ready, ElementsAre(0, 1));
  EXPECT_THAT(second.start, ElementsAre(0, 1));
  EXPECT_THAT(second.corrid, ElementsAre(0, 2));
  const Execution& ending = executions[3];
  EXPECT_THAT(ending.ready, ElementsAre(1));
  EXPECT_THAT(ending.end, ElementsAre(1));
  EXPECT_THAT(ending.corrid, ElementsAre(1));
  const Execution& last = executions[4];
  EXPECT_THAT(last.ready, ElementsAre(0, 0, 1));
  EXPECT_THAT(last.input, ElementsAre(0, 0, 1));  // fillers hold zeros
  EXPECT_THAT(last.corrid, ElementsAre(0, 0, 3));
  EXPECT_THAT(last.start, ElementsAre(0, 0, 0));
  // A new sequence takes the lowest free slot: 0, the one sequence 1 left.
  ASSERT_EQ(*Send(*batcher, Id(4), 2, /*start=*/true), 2);
  EXPECT_THAT(accumulators_[0]->executions().back().corrid, ElementsAre(4));
  // Fillers are not requests: the statistics count the callers' six.
  EXPECT_EQ(stats_->Snapshot().success.count, 6u);
  EXPECT_EQ(stats_->Snapshot().inference_count, 6u);
}

TEST_F(SequenceBatcherTest, ControlValuesFollowTheConfigTypes) {
  ModelSpec spec = AccumulatorSpec();
  spec.sequence_batching.controls = {{SequenceControlKind::kStart, "S", DataType::kFp32, 0.5, 2.0},
                                     {SequenceControlKind::kEnd, "E", DataType::kBool, 0, 1},
                                     {SequenceControlKind::kReady, "R", DataType::kInt32, 7, 9},
                                     {SequenceControlKind::kCorrId, "C", DataType::kBytes, 0, 0}};
  InferRequest request;
  request.batch_size = 2;
  const SequenceControl control{{0, "user-42", true}, /*start=*/true, /*end=*/false};
  AppendSequenceControls(spec, &control, &request);
  ASSERT_EQ(request.inputs.size(), 4u);
  EXPECT_THAT(Values<float>(request, "S"), ElementsAre(2.0f, 2.0f));
  EXPECT_THAT(Values<uint8_t>(request, "E"), ElementsAre(0, 0));
  EXPECT_THAT(Values<int32_t>(request, "R"), ElementsAre(9, 9));
  EXPECT_EQ(request.inputs[0].shape, (Shape{2, 1}));
  const TensorView& corrid = request.inputs[3];
  EXPECT_EQ(std::string(corrid.data, corrid.byte_size),
            std::string("\x07\0\0\0user-42\x07\0\0\0user-42", 22));

  InferRequest filler;  // a filler row or warm-up: every flag off, an empty id
  filler.batch_size = 1;
  spec.max_batch_size = 0;  // no batch dimension: shape [1]
  AppendSequenceControls(spec, nullptr, &filler);
  EXPECT_THAT(Values<float>(filler, "S"), ElementsAre(0.5f));
  EXPECT_THAT(Values<int32_t>(filler, "R"), ElementsAre(7));
  EXPECT_EQ(filler.inputs[0].shape, (Shape{1}));
  EXPECT_EQ(std::string(filler.inputs[3].data, filler.inputs[3].byte_size), std::string(4, '\0'));
}

TEST_F(SequenceBatcherTest, BadRequestsAreRefusedByNameAndTheBatcherServesOn) {
  auto batcher = Make();
  auto expect = [&](StatusOr<int32_t> got, absl::StatusCode code, const std::string& words) {
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(words));
  };
  expect(Send(*batcher, Id(0), 1, true), absl::StatusCode::kInvalidArgument,
         "needs the parameter sequence_id");
  expect(Send(*batcher, {0, "text", true}, 1, true), absl::StatusCode::kInvalidArgument,
         "takes integer sequence ids (CONTROL_SEQUENCE_CORRID is INT64); sequence_id 'text' is a "
         "string");
  expect(Send(*batcher, Id(uint64_t{1} << 63), 1, true), absl::StatusCode::kInvalidArgument,
         "does not fit");
  expect(Send(*batcher, Id(5), 1), absl::StatusCode::kInvalidArgument,
         "sequence 5 of model 'acc' is not active: its first request must set sequence_start");
  {
    Call call;
    int32_t two[2] = {1, 2};
    auto request = Request(call, Id(5), true, false, /*rows=*/2);
    request->inputs[0].data = reinterpret_cast<const char*>(two);
    batcher->Enqueue(std::move(request), &call.sink, Done(call));
    expect(call.Get(), absl::StatusCode::kInvalidArgument, "needs batch size 1, found 2");
  }
  ASSERT_EQ(*Send(*batcher, Id(5), 3, true), 3);
  expect(Send(*batcher, Id(5), 1, true), absl::StatusCode::kInvalidArgument,
         "sequence 5 of model 'acc' is already active");
  // A request behind a queued end: the model is held so that the end stays queued.
  models_[0]->CloseGate();
  Call busy, ending;
  busy.value = 1;
  batcher->Enqueue(Request(busy, Id(6), true, false), &busy.sink, Done(busy));
  models_[0]->WaitStarted(2);
  ending.value = 10;
  batcher->Enqueue(Request(ending, Id(6), false, true), &ending.sink, Done(ending));
  expect(Send(*batcher, Id(6), 1), absl::StatusCode::kInvalidArgument,
         "already has its sequence_end request queued");
  models_[0]->OpenGate();
  EXPECT_EQ(*busy.Get(), 1);
  EXPECT_EQ(*ending.Get(), 11);
  EXPECT_EQ(*Send(*batcher, Id(5), 4, false, true), 7);  // the first sequence was untouched
  EXPECT_EQ(stats_->Snapshot().fail.count, 7u);
}

TEST_F(SequenceBatcherTest, StringIdsWhenCorrIdIsAStringAndAnyIdWithoutCorrId) {
  ModelSpec strings = AccumulatorSpec();
  strings.sequence_batching.controls.pop_back();
  strings.inputs.pop_back();
  strings.sequence_batching.correlation_id_type = DataType::kBytes;
  auto batcher = Make(1, strings);
  // (The model reads CORRID; without it the fake sees none, so it is not asked here.)
  Call call;
  call.value = 1;
  batcher->Enqueue(Request(call, Id(3), true, false), &call.sink, Done(call));
  StatusOr<int32_t> refused = call.Get();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("takes string sequence ids"));

  ModelSpec untyped = AccumulatorSpec();
  untyped.sequence_batching.correlation_id_type.reset();
  auto any = Make(1, untyped);
  EXPECT_EQ(*Send(*any, {0, "a", true}, 2, true), 2);
  EXPECT_EQ(*Send(*any, Id(uint64_t{1} << 63), 5, true), 5);
  EXPECT_EQ(*Send(*any, {0, "a", true}, 2), 4);
  EXPECT_TRUE(any->HasSequence({0, "a", true}));
  EXPECT_FALSE(any->HasSequence(Id(3)));
}

// Each request carries 24 input bytes: INPUT (4) and the controls START, END, READY (4 each) and
// CORRID (8).
constexpr size_t kRequestBytes = 24;

TEST_F(SequenceBatcherTest, TheModelsByteCapHoldsForAStatefulModel) {
  auto budget = std::make_shared<ByteBudget>(1000);
  auto batcher = Make(1, AccumulatorSpec(), 64, nullptr, [&](SequenceBatcher::Options& options) {
    options.max_bytes = 2 * kRequestBytes;
    options.server_budget = budget;
  });
  models_[0]->CloseGate();
  Call first, second, third, fourth;
  first.value = 1;
  second.value = 2;
  third.value = 3;
  fourth.value = 4;
  batcher->Enqueue(Request(first, Id(1), true, false), &first.sink, Done(first));
  models_[0]->WaitStarted(1);  // running, so no longer waiting: it counts against no cap
  batcher->Enqueue(Request(second, Id(1), false, false), &second.sink, Done(second));
  batcher->Enqueue(Request(third, Id(1), false, false), &third.sink, Done(third));
  EXPECT_EQ(budget->used(), 2 * kRequestBytes);
  batcher->Enqueue(Request(fourth, Id(1), false, true), &fourth.sink, Done(fourth));
  StatusOr<int32_t> refused = fourth.Get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model 'acc' has 48 input bytes waiting and this request brings 24 "
                        "(limit sluice.max_queued_bytes=48)"));
  EXPECT_EQ(budget->used(), 2 * kRequestBytes);  // the refused request took nothing
  models_[0]->OpenGate();
  EXPECT_EQ(*first.Get(), 1);
  EXPECT_EQ(*second.Get(), 3);
  EXPECT_EQ(*third.Get(), 6);
  EXPECT_EQ(budget->used(), 0u);  // every admitted byte given back once it ran
}

TEST_F(SequenceBatcherTest,
       TheServerByteBudgetHoldsForAStatefulModelAndIsGivenBackWhenSequencesEnd) {
  auto budget = std::make_shared<ByteBudget>(kRequestBytes + kRequestBytes / 2);
  auto batcher = Make(1, AccumulatorSpec(), 64, nullptr,
                      [&](SequenceBatcher::Options& options) { options.server_budget = budget; });
  models_[0]->CloseGate();
  Call first, second, third;
  first.value = 1;
  second.value = 2;
  third.value = 3;
  batcher->Enqueue(Request(first, Id(1), true, false), &first.sink, Done(first));
  models_[0]->WaitStarted(1);
  batcher->Enqueue(Request(second, Id(1), false, false), &second.sink, Done(second));
  batcher->Enqueue(Request(third, Id(2), true, false), &third.sink, Done(third));  // a new sequence
  StatusOr<int32_t> refused = third.Get();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the server has 24 input bytes waiting (limit 36, --max-queued-bytes)"));
  batcher->EndSequences(absl::UnavailableError("ended by the test"));
  EXPECT_EQ(second.Get().status().message(), "ended by the test");
  EXPECT_EQ(budget->used(), 0u);
  models_[0]->OpenGate();
  EXPECT_EQ(*first.Get(), 1);
}

TEST_F(SequenceBatcherTest, SequencesBeyondTheSlotsWaitForOneThenThePolicyRefusesThem) {
  auto batcher = Make(1, AccumulatorSpec(/*max_batch_size=*/2), /*max_requests=*/2);
  ASSERT_EQ(*Send(*batcher, Id(1), 1, true), 1);
  ASSERT_EQ(*Send(*batcher, Id(2), 2, true), 2);
  Call third, fourth, fifth;
  third.value = 30;
  fourth.value = 40;
  fifth.value = 50;
  batcher->Enqueue(Request(third, Id(3), true, false), &third.sink, Done(third));
  batcher->Enqueue(Request(fourth, Id(4), true, false), &fourth.sink, Done(fourth));
  batcher->Enqueue(Request(fifth, Id(5), true, false), &fifth.sink, Done(fifth));
  StatusOr<int32_t> refused = fifth.Get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("has 2 requests of sequences waiting for one "
                                                    "of its 2 sequence slots (max_queue_size 2)"));
  EXPECT_EQ(third.future.wait_for(50ms), std::future_status::timeout);  // waiting for a slot
  ASSERT_EQ(*Send(*batcher, Id(1), 1, false, true), 2);  // frees slot 0 for sequence 3
  EXPECT_EQ(*third.Get(), 30);
  ASSERT_EQ(*Send(*batcher, Id(2), 1, false, true), 3);
  EXPECT_EQ(*fourth.Get(), 40);
  EXPECT_EQ(*Send(*batcher, Id(3), 1), 31);
  EXPECT_EQ(*Send(*batcher, Id(4), 2), 42);
}

TEST_F(SequenceBatcherTest, AnIdleSequenceIsEndedAndItsSlotFreed) {
  FakeTimeSource clock;
  auto batcher = Make(1, AccumulatorSpec(/*max_batch_size=*/1), 64, &clock);
  ASSERT_EQ(*Send(*batcher, Id(1), 1, true), 1);
  clock.Advance(900ms);
  ASSERT_EQ(*Send(*batcher, Id(1), 1), 2);  // a request restarts the idle time
  // The batcher's thread and the worker wait on the clock; once both wait, unsignalled, with
  // their deadlines still ahead, they have done everything due by then.
  clock.Advance(900ms);
  ASSERT_TRUE(clock.AwaitWaiting(2));
  EXPECT_TRUE(batcher->HasSequence(Id(1)));
  clock.Advance(200ms);
  ASSERT_TRUE(clock.AwaitWaiting(2));
  EXPECT_FALSE(batcher->HasSequence(Id(1)));
  StatusOr<int32_t> late = Send(*batcher, Id(1), 1);
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr("after 1000 ms without a request"));
  EXPECT_EQ(*Send(*batcher, Id(2), 5, true), 5);  // the only slot serves a new sequence
}

TEST_F(SequenceBatcherTest, AStartThatExpiresWhileWaitingForASlotDropsItsSequence) {
  FakeTimeSource clock;
  auto batcher = Make(1, AccumulatorSpec(/*max_batch_size=*/1), 64, &clock);
  ASSERT_EQ(*Send(*batcher, Id(1), 1, true), 1);
  Call start, next;
  auto request = Request(start, Id(2), true, false);
  request->deadline = clock.Now() + 1s;
  batcher->Enqueue(std::move(request), &start.sink, Done(start));
  batcher->Enqueue(Request(next, Id(2), false, false), &next.sink, Done(next));
  clock.Advance(2s);  // wakes the batcher's thread, which waits on the clock
  StatusOr<int32_t> expired = start.Get(), dropped = next.Get();
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_FALSE(dropped.ok());
  EXPECT_THAT(dropped.status().message(),
              HasSubstr("its sequence_start request expired before it ran"));
  EXPECT_FALSE(batcher->HasSequence(Id(2)));
}

TEST_F(SequenceBatcherTest, AStartTheModelFailsDropsItsSequenceSoThatItCanStartAgain) {
  auto batcher = Make();
  models_[0]->CloseGate();
  Call start, next;
  start.value = kPoison;
  next.value = 1;
  batcher->Enqueue(Request(start, Id(9), true, false), &start.sink, Done(start));
  models_[0]->WaitStarted(1);
  batcher->Enqueue(Request(next, Id(9), false, false), &next.sink, Done(next));
  models_[0]->OpenGate();
  EXPECT_EQ(start.Get().status().code(), absl::StatusCode::kInternal);
  StatusOr<int32_t> orphan = next.Get();
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(orphan.status().message(),
              HasSubstr("its sequence_start request failed (poisoned row)"));
  EXPECT_FALSE(batcher->HasSequence(Id(9)));
  EXPECT_EQ(*Send(*batcher, Id(9), 4, true), 4);
  // A later request that fails leaves its sequence active.
  EXPECT_EQ(Send(*batcher, Id(9), kPoison).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(*Send(*batcher, Id(9), 1, false, true), 5);
}

TEST_F(SequenceBatcherTest, DrainWaitsForSequencesThenEndsThoseLeft) {
  FakeTimeSource clock;
  auto batcher = Make(1, AccumulatorSpec(), 64, &clock);
  ASSERT_EQ(*Send(*batcher, Id(1), 1, true), 1);
  ASSERT_EQ(*Send(*batcher, Id(2), 1, true), 1);
  // The drain waits on the batcher's clock until its deadline, then says sequences are left.
  auto drained = std::async(std::launch::async,
                            [&] { return batcher->WaitSequencesEnded(clock.Now() + 20ms); });
  ASSERT_TRUE(clock.AwaitWaiting(3));  // the drain, the batcher's thread and the worker
  EXPECT_EQ(drained.wait_for(0ms), std::future_status::timeout);
  clock.Advance(20ms);
  EXPECT_FALSE(drained.get());
  std::thread ender([&] { EXPECT_EQ(*Send(*batcher, Id(1), 1, false, true), 2); });
  ender.join();
  EXPECT_EQ(batcher->ActiveSequences(), 1u);
  models_[0]->CloseGate();
  Call running, queued;
  batcher->Enqueue(Request(running, Id(2), false, false), &running.sink, Done(running));
  models_[0]->WaitStarted(4);
  batcher->Enqueue(Request(queued, Id(2), false, false), &queued.sink, Done(queued));
  batcher->EndSequences(absl::UnavailableError("version unloaded"));
  StatusOr<int32_t> ended = queued.Get();
  ASSERT_FALSE(ended.ok());
  EXPECT_EQ(ended.status().message(), "version unloaded");
  EXPECT_TRUE(batcher->WaitSequencesEnded(clock.Now()));
  models_[0]->OpenGate();
  EXPECT_EQ(*running.Get(), 1);  // what was running finishes
  EXPECT_FALSE(Send(*batcher, Id(2), 1).ok());
}

TEST_F(SequenceBatcherTest, StopAnswersQueuedRequestsAndWarmUpRunsWithReadyOff) {
  auto batcher = Make();
  ASSERT_TRUE(batcher->WarmUp(testing::ZeroWarmup(2, 1, "INPUT"), nullptr).ok());
  ASSERT_EQ(accumulators_[0]->executions().size(), 1u);
  EXPECT_THAT(accumulators_[0]->executions()[0].ready, ElementsAre(0, 0));

  ASSERT_EQ(*Send(*batcher, Id(1), 1, true), 1);
  models_[0]->CloseGate();
  Call running, queued;
  batcher->Enqueue(Request(running, Id(1), false, false), &running.sink, Done(running));
  models_[0]->WaitStarted(3);
  batcher->Enqueue(Request(queued, Id(1), false, false), &queued.sink, Done(queued));
  std::thread stopper([&] { batcher->Stop(); });
  StatusOr<int32_t> stopped = queued.Get();
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kUnavailable);
  models_[0]->OpenGate();
  stopper.join();
  EXPECT_EQ(*running.Get(), 1);
  EXPECT_EQ(Send(*batcher, Id(2), 1, true).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice
