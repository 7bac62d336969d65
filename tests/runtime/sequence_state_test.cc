// The implicit-state store of a sequence model's instance (server/runtime/sequence_state.h), on
// the CPU: rows gathered by slot, initial values for starts and rows without a sequence, states
// kept only for rows with one, and a wrong state from the model refused without keeping anything.
#include "server/runtime/sequence_state.h"

#include <ATen/ATen.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A batched model (max_batch_size 4, direct: 4 slots) with one FP32 [2] state.
ModelSpec StateSpec(int max_batch_size = 4, std::shared_ptr<const std::string> initial = nullptr) {
  ModelSpec spec;
  spec.name = "acc";
  spec.max_batch_size = max_batch_size;
  TensorSpec input{"INPUT__0", DataType::kFp32, {2}};
  TensorSpec state_in{"STATE__1", DataType::kFp32, {2}};
  state_in.filled_by_server = state_in.sequence_state = true;
  spec.inputs = {input, state_in};
  TensorSpec output{"OUTPUT__0", DataType::kFp32, {2}};
  TensorSpec state_out{"STATE_OUT__1", DataType::kFp32, {2}};
  state_out.state_only = true;
  spec.outputs = {output, state_out};
  spec.sequence_batching.enabled = true;
  SequenceStateSpec state{"STATE__1", "STATE_OUT__1", DataType::kFp32, {2}};
  state.initial = std::move(initial);
  spec.sequence_batching.states.push_back(std::move(state));
  return spec;
}

InferRequest Batch(std::vector<StateRow> rows) {
  InferRequest batch;
  batch.batch_size = static_cast<int64_t>(rows.size());
  batch.state_rows = std::move(rows);
  return batch;
}

// Runs the store as an instance does around a model that adds `step` to every state element.
at::Tensor Step(SequenceStateStore& store, const InferRequest& batch, float step) {
  std::vector<c10::IValue> inputs(2);
  store.Gather(batch, &inputs);
  at::Tensor state = inputs[1].toTensor();
  at::Tensor next = state + step;
  EXPECT_TRUE(store.Keep(batch, {c10::IValue(next), c10::IValue(next)}).ok());
  return state;
}

TEST(SequenceStateTest, NoStoreWithoutStates) {
  ModelSpec spec;
  EXPECT_EQ(SequenceStateStore::Create(spec, at::Device(at::kCPU)), nullptr);
}

TEST(SequenceStateTest, EachSlotKeepsItsSequencesStateAndAStartReadsTheInitialValue) {
  const ModelSpec spec = StateSpec();
  auto store = SequenceStateStore::Create(spec, at::Device(at::kCPU));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->bytes(), 4u * 2 * sizeof(float));  // four slots of FP32 [2]
  // Slots 2 and 0 start; a filler row (no sequence) between them.
  at::Tensor seen = Step(*store, Batch({{2, true}, {-1, false}, {0, true}}), 1);
  EXPECT_TRUE(at::equal(seen, at::zeros({3, 2})));
  // Rows in another order: each slot's state follows it; the filler kept nothing.
  seen = Step(*store, Batch({{0, false}, {2, false}, {1, false}}), 10);
  EXPECT_TRUE(at::equal(seen.select(0, 0), at::full({2}, 1.0f)));
  EXPECT_TRUE(at::equal(seen.select(0, 1), at::full({2}, 1.0f)));
  EXPECT_TRUE(at::equal(seen.select(0, 2), at::zeros({2})));  // slot 1 was never written
  // A new sequence on slot 2 starts from the initial value, whatever the slot held.
  seen = Step(*store, Batch({{2, true}, {0, false}}), 1);
  EXPECT_TRUE(at::equal(seen.select(0, 0), at::zeros({2})));
  EXPECT_TRUE(at::equal(seen.select(0, 1), at::full({2}, 11.0f)));
  // Warm-up: no state rows at all.
  InferRequest warmup;
  warmup.batch_size = 2;
  seen = Step(*store, warmup, 100);
  EXPECT_TRUE(at::equal(seen, at::zeros({2, 2})));
  seen = Step(*store, Batch({{0, false}}), 0);
  EXPECT_TRUE(at::equal(seen, at::full({1, 2}, 12.0f)));  // untouched by the warm-up
}

TEST(SequenceStateTest, TheInitialStateFileSeedsEveryStart) {
  const float seed[2] = {5, 6};
  auto bytes =
      std::make_shared<const std::string>(reinterpret_cast<const char*>(seed), sizeof(seed));
  const ModelSpec spec = StateSpec(4, bytes);
  auto store = SequenceStateStore::Create(spec, at::Device(at::kCPU));
  at::Tensor seen = Step(*store, Batch({{3, true}, {-1, false}}), 1);
  const at::Tensor expected = at::tensor({5.0f, 6.0f});
  EXPECT_TRUE(at::equal(seen.select(0, 0), expected));
  EXPECT_TRUE(at::equal(seen.select(0, 1), expected));
  seen = Step(*store, Batch({{3, false}}), 0);
  EXPECT_TRUE(at::equal(seen.select(0, 0), expected + 1));
}

TEST(SequenceStateTest, AModelWithoutABatchDimensionHasOneRow) {
  const ModelSpec spec = StateSpec(/*max_batch_size=*/0);
  auto store = SequenceStateStore::Create(spec, at::Device(at::kCPU));
  InferRequest batch = Batch({{0, true}});
  batch.batch_size = 1;
  at::Tensor seen = Step(*store, batch, 2);
  EXPECT_EQ(seen.sizes(), (std::vector<int64_t>{2}));
  seen = Step(*store, Batch({{0, false}}), 2);
  EXPECT_TRUE(at::equal(seen, at::full({2}, 2.0f)));
}

TEST(SequenceStateTest, AWrongStateFromTheModelIsRefusedAndNothingIsKept) {
  const ModelSpec spec = StateSpec();
  auto store = SequenceStateStore::Create(spec, at::Device(at::kCPU));
  Step(*store, Batch({{0, true}}), 1);
  const InferRequest batch = Batch({{0, false}});
  const at::Tensor good = at::ones({1, 2});
  for (const c10::IValue& bad :
       {c10::IValue(at::ones({1, 3})), c10::IValue(at::ones({1, 2}, at::kDouble)),
        c10::IValue(int64_t{3})}) {
    Status kept = store->Keep(batch, {c10::IValue(good), bad});
    EXPECT_EQ(kept.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(kept.message(), HasSubstr("returned state output 'STATE_OUT__1' as"));
    EXPECT_THAT(kept.message(), HasSubstr("its sequence_batching state is FP32 [1,2]"));
  }
  std::vector<c10::IValue> inputs(2);
  store->Gather(batch, &inputs);
  EXPECT_TRUE(at::equal(inputs[1].toTensor(), at::ones({1, 2})));  // still the first step's
}

}  // namespace
}  // namespace sluice
