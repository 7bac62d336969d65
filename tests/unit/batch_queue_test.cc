// The batching decisions with a fake clock: no threads, no sleeps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/batch_assembly.h"
#include "server/batching/batch_queue.h"
#include "server/core/bytes_tensor.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A request for input "x" of INT32 with `rows` rows of `width` values, each value = `tag`.
struct Owned {
  std::vector<int32_t> data;
  std::unique_ptr<InferRequest> request;
};
Owned Make(int64_t rows, int64_t width, int32_t tag, TimePoint deadline = kNoDeadline) {
  Owned owned;
  owned.data.assign(static_cast<size_t>(rows * width), tag);
  owned.request = std::make_unique<InferRequest>();
  owned.request->model_name = "m";
  owned.request->id = std::to_string(tag);
  owned.request->batch_size = rows;
  owned.request->deadline = deadline;
  owned.request->inputs.push_back({"x", DataType::kInt32, {rows, width},
                                   reinterpret_cast<const char*>(owned.data.data()),
                                   owned.data.size() * sizeof(int32_t)});
  return owned;
}

class BatchQueueTest : public ::testing::Test {
 protected:
  BatchQueue::Options Options() {
    BatchQueue::Options options;
    options.max_batch_size = 8;
    options.max_queue_delay = 100us;
    return options;
  }

  // Adds a request; keeps its data alive for the test.
  Status Add(BatchQueue& queue, int64_t rows, int64_t width = 2, TimePoint deadline = kNoDeadline) {
    Owned owned = Make(rows, width, next_tag_++, deadline);
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(), owned.data.size() * 4};
    data_.push_back(std::move(owned.data));
    return queue.Add(pending);
  }

  static std::vector<std::string> Ids(const FormedBatch& batch) {
    std::vector<std::string> ids;
    for (const auto& pending : batch.requests) ids.push_back(pending.request->id);
    return ids;
  }

  FakeTimeSource clock_;
  int32_t next_tag_ = 1;
  std::vector<std::vector<int32_t>> data_;
};

TEST_F(BatchQueueTest, DelayExpiryFormsPartialBatch) {
  BatchQueue queue(Options());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 2).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(queue.NextBatchTime(), clock_.Now() + 100us);
  EXPECT_EQ(queue.NextDeadline(), kNoDeadline);
  clock_.Advance(99us);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  clock_.Advance(1us);
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "2"));
  EXPECT_EQ(batch->rows, 3);
  EXPECT_EQ(batch->padded_rows, 3);
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.bytes(), 0u);
  EXPECT_EQ(queue.NextBatchTime(), kNoDeadline);
}

TEST_F(BatchQueueTest, MaxBatchSizeCutsAtOnce) {
  BatchQueue queue(Options());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 3).ok());  // 9 rows > 8
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 6);  // the third does not fit: the batch is as full as it gets
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // the rest waits for its delay
  ASSERT_TRUE(Add(queue, 5).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 8);  // exactly max
}

TEST_F(BatchQueueTest, PreferredSizeCutsBeforeTheDelay) {
  auto options = Options();
  options.preferred_batch_sizes = {2, 4};
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 3 rows waiting: the prefix of 2 is preferred
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 2);
  ASSERT_TRUE(Add(queue, 3).ok());  // 1 + 3 = 4, preferred
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
}

TEST_F(BatchQueueTest, ZeroDelayBatchesWhateverWaits) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 2).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 3);
}

TEST_F(BatchQueueTest, BatchSizeLadderCutsAtTheLargestSizeReached) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
  queue.SetBatchSizeLadder({1, 2, 4});
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  std::vector<int64_t> rows;
  while (auto batch = queue.TakeReadyBatch(clock_.Now())) rows.push_back(batch->rows);
  EXPECT_THAT(rows, ElementsAre(4, 2, 1));  // not 7: sizes 5-8 serve fewer rows per second

  // Requests of several rows: the longest prefix within the size reached, at least one request.
  ASSERT_TRUE(Add(queue, 3).ok());
  ASSERT_TRUE(Add(queue, 3).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 3 rows reach 2 only; the first runs alone
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 3);
  ASSERT_TRUE(Add(queue, 1).ok());
  batch = queue.TakeReadyBatch(clock_.Now());  // 3 + 1 = 4, a ladder size
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
  // A request larger than the ladder's largest size (within max_batch_size) runs, alone.
  ASSERT_TRUE(Add(queue, 6).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 6);
  EXPECT_EQ(queue.size(), 1u);
}

TEST_F(BatchQueueTest, BatchSizeLadderLargestSizeIsFull) {
  BatchQueue queue(Options());  // 100 us delay
  queue.SetBatchSizeLadder({1, 2, 4});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // 3 rows wait for company
  ASSERT_TRUE(Add(queue, 1).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());  // 4 rows: as full as the ladder goes
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(queue, 1).ok());
  clock_.Advance(100us);
  batch = queue.TakeReadyBatch(clock_.Now());  // the delay passed: 3 rows reach 2
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->rows, 2);
}

TEST_F(BatchQueueTest, ShapeGroupsDoNotDisturbEachOther) {
  BatchQueue queue(Options());
  ASSERT_TRUE(Add(queue, 1, /*width=*/2).ok());
  clock_.Advance(50us);
  ASSERT_TRUE(Add(queue, 1, /*width=*/3).ok());
  ASSERT_TRUE(Add(queue, 1, /*width=*/2).ok());
  EXPECT_EQ(queue.groups(), 2u);
  clock_.Advance(50us);  // the width-2 group's oldest has waited 100us; the width-3 one 50us
  auto batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("1", "3"));  // a different shape never flushed it early
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());  // the other keeps its own timer
  EXPECT_EQ(queue.NextBatchTime(), clock_.Now() + 50us);
  clock_.Advance(50us);
  batch = queue.TakeReadyBatch(clock_.Now());
  ASSERT_TRUE(batch.has_value());
  EXPECT_THAT(Ids(*batch), ElementsAre("2"));
}

TEST_F(BatchQueueTest, OldestReadyGroupGoesFirst) {
  auto options = Options();
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 1, 5).ok());
  clock_.Advance(1us);
  ASSERT_TRUE(Add(queue, 1, 2).ok());
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("1"));
  EXPECT_THAT(Ids(*queue.TakeReadyBatch(clock_.Now())), ElementsAre("2"));
}

TEST_F(BatchQueueTest, CapsReject) {
  auto options = Options();
  options.max_requests = 2;
  options.max_groups = 1;
  options.max_bytes = 40;  // 5 rows of 2 INT32
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 1).ok());
  Status groups = Add(queue, 1, /*width=*/3);
  EXPECT_EQ(groups.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(groups.message(), HasSubstr("sluice.max_shape_groups"));
  Status bytes = Add(queue, 5);
  EXPECT_THAT(bytes.message(), HasSubstr("sluice.max_queued_bytes=40"));
  ASSERT_TRUE(Add(queue, 2).ok());
  Status requests = Add(queue, 1);
  EXPECT_THAT(requests.message(), HasSubstr("max_queue_size"));
  EXPECT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue.bytes(), 24u);
}

TEST_F(BatchQueueTest, ARequestOverTheByteCapWaitsOnlyAlone) {
  auto options = Options();
  options.max_bytes = 40;
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 6).ok());  // 48 bytes: nothing else waits, so it may
  EXPECT_THAT(Add(queue, 1).message(), HasSubstr("sluice.max_queued_bytes=40"));
  ASSERT_TRUE(queue.TakeReadyBatch(clock_.Now() + 1s).has_value());
  EXPECT_TRUE(Add(queue, 1).ok());
}

TEST_F(BatchQueueTest, ServerWideByteBudgetIsSharedAndReleased) {
  auto budget = std::make_shared<ByteBudget>(32);
  auto options = Options();
  options.server_budget = budget;
  BatchQueue a(options), b(options);
  ASSERT_TRUE(Add(a, 2).ok());  // 16 bytes
  ASSERT_TRUE(Add(b, 2).ok());  // 32
  Status full = Add(a, 1);
  EXPECT_THAT(full.message(), HasSubstr("--max-queued-bytes"));
  EXPECT_EQ(budget->used(), 32u);
  clock_.Advance(100us);
  ASSERT_TRUE(a.TakeReadyBatch(clock_.Now()).has_value());
  EXPECT_EQ(budget->used(), 16u);
  ASSERT_TRUE(Add(a, 1).ok());
}

TEST_F(BatchQueueTest, DeadlinesAndCancellationExpireQueuedRequests) {
  BatchQueue queue(Options());
  ASSERT_TRUE(Add(queue, 1, 2, clock_.Now() + 30us).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  EXPECT_EQ(queue.NextDeadline(), clock_.Now() + 30us);
  EXPECT_TRUE(queue.TakeExpired(clock_.Now()).empty());
  clock_.Advance(30us);
  auto expired = queue.TakeExpired(clock_.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].request->id, "1");
  // Cancel "3" while it waits.
  clock_.Advance(70us);
  std::vector<std::string> left;
  auto all = queue.TakeReadyBatch(clock_.Now());  // (consume to inspect, then re-add)
  ASSERT_TRUE(all.has_value());
  EXPECT_THAT(Ids(*all), ElementsAre("2", "3"));
  all->requests[1].request->cancelled = std::make_shared<std::atomic<bool>>(true);
  ASSERT_TRUE(queue.Add(all->requests[1]).ok());
  expired = queue.TakeExpired(clock_.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_TRUE(expired[0].request->IsCancelled());
  EXPECT_EQ(queue.size(), 0u);
}

TEST_F(BatchQueueTest, PaddingToPreferredSizes) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 3).ok());
  auto batch = queue.TakeReadyBatch(clock_.Now());
  EXPECT_EQ(batch->rows, 3);
  EXPECT_EQ(batch->padded_rows, 4);
  ASSERT_TRUE(Add(queue, 5).ok());
  batch = queue.TakeReadyBatch(clock_.Now());
  EXPECT_EQ(batch->padded_rows, 8);  // above every preferred size: max_batch_size
}

TEST_F(BatchQueueTest, AssembleAndDeliverRoundTripWithPadding) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
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

TEST_F(BatchQueueTest, StringRowsConcatenateAndSplitBackByElementCount) {
  auto options = Options();
  options.preferred_batch_sizes = {4};
  options.pad_to_preferred = true;
  options.max_queue_delay = 0us;
  BatchQueue queue(options);
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
    request->inputs.push_back({"s", DataType::kBytes, {i + 1, 1}, buffers[i].data(), buffers[i].size()});
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
  EXPECT_THAT(SplitBytesTensor(staged), ElementsAre("a", "bbbb", "", ""));  // the padding row: empty

  // The batch's output splits back by rows, whatever each row's byte length.
  const std::string name = "out";
  std::string out;
  for (const char* element : {"x", "yyyyyy", "zz", "pad"}) AppendBytesElement(element, &out);
  const HostOutput strings{&name, DataType::kBytes, {4, 1}, out.data(), out.size(), MemoryType::kCpu};
  TensorSink first, second;
  const std::vector<OutputTarget> targets = {{1, nullptr, &first}, {2, nullptr, &second}};
  ASSERT_TRUE(DeliverOutputs({&strings, 1}, targets, /*batched=*/true).ok());
  EXPECT_THAT(first.outputs()[0].shape, ElementsAre(1, 1));
  EXPECT_THAT(SplitBytesTensor(first.outputs()[0].data), ElementsAre("x"));
  EXPECT_THAT(second.outputs()[0].shape, ElementsAre(2, 1));
  EXPECT_THAT(SplitBytesTensor(second.outputs()[0].data), ElementsAre("yyyyyy", "zz"));
}

TEST_F(BatchQueueTest, DeliverRejectsOutputsWithoutBatchDimension) {
  const std::string name = "y";
  const std::string data(12, '\0');
  const HostOutput wrong{&name, DataType::kFp32, {1, 3}, data.data(), data.size(), MemoryType::kCpu};
  TensorSink a, b;
  const std::vector<OutputTarget> targets = {{1, nullptr, &a}, {1, nullptr, &b}};
  EXPECT_THAT(DeliverOutputs({&wrong, 1}, targets, /*batched=*/true).message(),
              HasSubstr("does not start with the batch dimension (2 rows)"));
  EXPECT_TRUE(a.outputs().empty());
}

TEST_F(BatchQueueTest, OneRequestPerBatchKeepsArrivalOrderAcrossShapes) {
  auto options = Options();
  options.one_request_per_batch = true;
  options.max_groups = 1;  // never reached: every shape waits in the one queue
  options.max_queue_delay = 1s;  // ignored: a lone request needs no company
  BatchQueue queue(options);
  ASSERT_TRUE(Add(queue, 2).ok());
  ASSERT_TRUE(Add(queue, 3, /*width=*/5).ok());
  ASSERT_TRUE(Add(queue, 1).ok());
  for (int64_t rows : {2, 3, 1}) {
    auto batch = queue.TakeReadyBatch(clock_.Now());
    ASSERT_TRUE(batch.has_value());
    ASSERT_EQ(batch->requests.size(), 1u);
    EXPECT_EQ(batch->rows, rows);
    EXPECT_EQ(batch->padded_rows, rows);
  }
  EXPECT_FALSE(queue.TakeReadyBatch(clock_.Now()).has_value());
}

}  // namespace
}  // namespace sluice
