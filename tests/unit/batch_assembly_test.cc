// Batch assembly: the requests of a formed batch staged into one, and outputs delivered back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_assembly.h"
#include "server/batching/batch_former.h"
#include "server/core/bytes_tensor.h"
#include "tests/unit/batch_former_fixture.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class BatchAssemblyTest : public testing::BatchFormerFixture {};
using testing::Make;

TEST_F(BatchAssemblyTest, AssembleAndDeliverRoundTripWithPadding) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());  // tag 1
  ASSERT_TRUE(Add(queue, 2).ok());  // tag 2
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_EQ(batch->padded_rows, 4);
  ModelSpec spec;
  spec.max_batch_size = 8;
  spec.inputs = {{"x", DataType::kInt32, {2}}};
  testing::EchoBackend echo;
  StagingPool pool(&echo);
  InferRequest assembled = AssembleBatch(spec, *batch, &pool);
  ASSERT_EQ(assembled.batch_size, 4);
  EXPECT_THAT(assembled.inputs[0].shape, ElementsAre(4, 2));
  std::vector<int32_t> staged(8);
  std::memcpy(staged.data(), assembled.inputs[0].data, 32);
  EXPECT_THAT(staged, ElementsAre(1, 1, 2, 2, 2, 2, 0, 0));  // padding rows are zero
  TensorSink first, second;
  const std::vector<OutputTarget> targets = {{1, nullptr, &first}, {2, nullptr, &second}};
  ASSERT_TRUE(echo.Execute(assembled, targets).ok());
  ASSERT_EQ(first.outputs().size(), 1u);
  ASSERT_EQ(second.outputs().size(), 1u);
  EXPECT_THAT(first.outputs()[0].shape, ElementsAre(1, 2));
  EXPECT_THAT(second.outputs()[0].shape, ElementsAre(2, 2));  // padding never reaches a caller
  EXPECT_EQ(second.outputs()[0].data.size(), 16u);
  std::vector<int32_t> rows(4);
  std::memcpy(rows.data(), second.outputs()[0].data.data(), 16);
  EXPECT_THAT(rows, ElementsAre(2, 2, 2, 2));
  EXPECT_EQ(echo.bytes_copied(), 8u + 16u);  // each caller's rows, once; the padding rows never
  // The same pool serves later batches without allocating again.
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(Add(queue, 1 + i % 8).ok());
    auto next = queue.TakeReadyBatch(clock_.Now());
    AssembleBatch(spec, *next, &pool);
  }
  EXPECT_EQ(pool.allocations(), 1u);  // 64 bytes (the minimum) hold max_batch_size rows here
}

TEST_F(BatchAssemblyTest, StateInputsAreLeftToTheRuntimeAndStateRowsFollowTheRows) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());  // one row, with a sequence in slot 3
  ASSERT_TRUE(Add(queue, 2).ok());  // two rows, without
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_EQ(batch->padded_rows, 4);
  batch->requests[0].request->state_rows = {StateRow{3, true}};
  ModelSpec spec;
  spec.max_batch_size = 8;
  TensorSpec state{"STATE__1", DataType::kFp32, {2}};
  state.filled_by_server = state.sequence_state = true;
  spec.inputs = {{"x", DataType::kInt32, {2}}, state};
  spec.sequence_batching.states.push_back({"STATE__1", "STATE__1", DataType::kFp32, {2}});
  testing::EchoBackend echo;
  StagingPool pool(&echo);
  InferRequest assembled = AssembleBatch(spec, *batch, &pool);
  ASSERT_EQ(assembled.inputs.size(), 1u);  // the state is the runtime's to fill
  ASSERT_EQ(assembled.state_rows.size(), 4u);
  EXPECT_EQ(assembled.state_rows[0].slot, 3);
  EXPECT_TRUE(assembled.state_rows[0].start);
  for (size_t row = 1; row < 4; ++row) EXPECT_EQ(assembled.state_rows[row].slot, -1);
}

TEST_F(BatchAssemblyTest, StringRowsConcatenateAndSplitBackByElementCount) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchFormer queue(options);
  // Two requests of [rows, 1] strings of different lengths (one group: the element count per
  // row is what must agree, not the bytes).
  std::vector<std::string> buffers(2);
  AppendBytesElement("a", &buffers[0]);
  AppendBytesElement("bbbb", &buffers[1]);
  AppendBytesElement("", &buffers[1]);
  for (int i = 0; i < 2; ++i) {
    auto request = std::make_unique<InferRequest>();
    request->model_name = "m";
    request->batch_size = i + 1;
    request->inputs.push_back(
        {"s", DataType::kBytes, {i + 1, 1}, buffers[i].data(), buffers[i].size(), {}});
    PendingRequest pending{std::move(request), nullptr, nullptr, clock_.Now(), buffers[i].size()};
    ASSERT_TRUE(queue.Add(pending).ok());
  }
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->rows, 3);
  ASSERT_EQ(batch->padded_rows, 4);
  ModelSpec spec;
  spec.max_batch_size = 8;
  spec.inputs = {{"s", DataType::kBytes, {1}}};
  testing::EchoBackend echo;
  StagingPool pool(&echo);
  InferRequest assembled = AssembleBatch(spec, *batch, &pool);
  EXPECT_THAT(assembled.inputs[0].shape, ElementsAre(4, 1));
  const std::string_view staged(assembled.inputs[0].data, assembled.inputs[0].byte_size);
  ASSERT_TRUE(CheckBytesTensor("staged", staged, 4, true).ok());
  EXPECT_THAT(SplitBytesTensor(staged),
              ElementsAre("a", "bbbb", "", ""));  // the padding row: empty

  // The batch's output splits back by rows, whatever each row's byte length.
  const std::string name = "out";
  std::string out;
  for (const char* element : {"x", "yyyyyy", "zz", "pad"}) AppendBytesElement(element, &out);
  const HostOutput strings{&name,      DataType::kBytes, {4, 1},
                           out.data(), out.size(),       MemoryType::kCpu};
  TensorSink first, second;
  const std::vector<OutputTarget> targets = {{1, nullptr, &first}, {2, nullptr, &second}};
  ASSERT_TRUE(DeliverOutputs({&strings, 1}, targets, /*batched=*/true).ok());
  EXPECT_THAT(first.outputs()[0].shape, ElementsAre(1, 1));
  EXPECT_THAT(SplitBytesTensor(first.outputs()[0].data), ElementsAre("x"));
  EXPECT_THAT(second.outputs()[0].shape, ElementsAre(2, 1));
  EXPECT_THAT(SplitBytesTensor(second.outputs()[0].data), ElementsAre("yyyyyy", "zz"));
}

// Inputs held on a device (an ensemble step's) are not copied on the host: the batch lists their
// rows for the runtime to gather there; an input every request holds so uses no staging buffer.
// Inputs held in host memory are copied in like bytes, counted as copied where they live.
TEST_F(BatchAssemblyTest, DeviceHeldInputsAreListedByRowHostHeldOnesStaged) {
  ModelSpec spec;
  spec.max_batch_size = 8;
  spec.inputs = {{"x", DataType::kInt32, {2}}};
  const std::string bytes = std::string("\1\0\0\0\2\0\0\0", 8);
  auto held = [](int32_t value, int64_t rows) {
    std::string data;
    for (int64_t i = 0; i < rows * 2; ++i) data.append(reinterpret_cast<const char*>(&value), 4);
    return std::make_shared<testing::HostHeldTensor>(DataType::kInt32, Shape{rows, 2}, data,
                                                     /*device=*/0);
  };
  auto request = [&](std::shared_ptr<HeldTensor> tensor) {
    auto made = std::make_unique<InferRequest>();
    made->model_name = "m";
    made->batch_size = tensor ? tensor->shape()[0] : 1;
    if (tensor) {
      made->inputs.push_back({"x",
                              DataType::kInt32,
                              tensor->shape(),
                              nullptr,
                              tensor->byte_size(),
                              {HeldRows{0, tensor}}});
    } else {
      made->inputs.push_back({"x", DataType::kInt32, {1, 2}, bytes.data(), bytes.size(), {}});
    }
    return PendingRequest{std::move(made), nullptr, nullptr, clock_.Now(), 8};
  };
  testing::EchoBackend echo;
  StagingPool pool(&echo);

  FormedBatch mixed;
  mixed.requests.push_back(request(nullptr));
  const auto two_rows = held(7, 2);
  mixed.requests.push_back(request(two_rows));
  mixed.rows = 3;
  mixed.padded_rows = 4;
  InferRequest assembled = AssembleBatch(spec, mixed, &pool);
  const TensorView& view = assembled.inputs[0];
  EXPECT_THAT(view.shape, ElementsAre(4, 2));
  EXPECT_EQ(view.byte_size, 32u);
  ASSERT_EQ(view.held.size(), 1u);
  EXPECT_EQ(view.held[0].first_row, 1);
  EXPECT_EQ(view.held[0].tensor, two_rows);
  ASSERT_NE(view.data, nullptr);
  EXPECT_EQ(std::string(view.data, 8), bytes);                       // the bytes row
  EXPECT_EQ(std::string(view.data + 8, 24), std::string(24, '\0'));  // held and padding rows
  EXPECT_EQ(pool.allocations(), 1u);

  FormedBatch all_held;
  all_held.requests.push_back(request(held(1, 1)));
  all_held.requests.push_back(request(held(2, 1)));
  all_held.rows = all_held.padded_rows = 2;
  InferRequest gathered = AssembleBatch(spec, all_held, &pool);
  EXPECT_EQ(gathered.inputs[0].data, nullptr);
  EXPECT_EQ(gathered.inputs[0].byte_size, 16u);
  ASSERT_EQ(gathered.inputs[0].held.size(), 2u);
  EXPECT_EQ(gathered.inputs[0].held[1].first_row, 1);
  EXPECT_EQ(pool.allocations(), 1u);  // no staging for it

  // What a runtime reads: the rows gathered in order, each copy counted on the device.
  auto ledger = std::make_shared<CopyLedger>();
  for (HeldRows& rows : gathered.inputs[0].held)
    std::const_pointer_cast<HeldTensor>(rows.tensor)->set_ledger(ledger);
  auto readable = testing::ReadHeld(gathered);
  ASSERT_NE(readable, nullptr);
  int32_t values[4];
  std::memcpy(values, readable->inputs[0].data, 16);
  EXPECT_THAT(values, ElementsAre(1, 1, 2, 2));
  EXPECT_EQ(ledger->on_device.load(), 16u);

  // Held in host memory: staged like bytes, the copy counted on the tensor.
  auto on_host = std::make_shared<testing::HostHeldTensor>(DataType::kInt32, Shape{1, 2},
                                                           std::string("\5\0\0\0\6\0\0\0", 8));
  on_host->set_ledger(ledger);
  FormedBatch host_held;
  host_held.requests.push_back(request(nullptr));
  host_held.requests.push_back(request(on_host));
  host_held.rows = host_held.padded_rows = 2;
  InferRequest staged = AssembleBatch(spec, host_held, &pool);
  EXPECT_TRUE(staged.inputs[0].held.empty());
  std::memcpy(values, staged.inputs[0].data, 16);
  EXPECT_THAT(values, ElementsAre(1, 2, 5, 6));
  EXPECT_EQ(ledger->on_device.load(), 16u + 8u);
}

TEST_F(BatchAssemblyTest, DeliverRejectsOutputsWithoutBatchDimension) {
  const std::string name = "y";
  const std::string data(12, '\0');
  const HostOutput wrong{&name,       DataType::kFp32, {1, 3},
                         data.data(), data.size(),     MemoryType::kCpu};
  TensorSink a, b;
  const std::vector<OutputTarget> targets = {{1, nullptr, &a}, {1, nullptr, &b}};
  EXPECT_THAT(DeliverOutputs({&wrong, 1}, targets, /*batched=*/true).message(),
              HasSubstr("does not start with the batch dimension (2 rows)"));
  EXPECT_TRUE(a.outputs().empty());
}

}  // namespace
}  // namespace sluice
