// Padding to buckets, the unpadding sink and the padding scheduler.
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/shape_padding.h"
#include "server/batching/shape_plan.h"
#include "tests/unit/batching_fixtures.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using testing::FixedSpec;
using testing::OneAtATime;
using testing::PaddedSpec;
using testing::ThreadRecordingEcho;

// A request for PaddedSpec: `rows` rows of `length` positions, values 1, 2, 3, ...
struct SeqCall {
  std::vector<int32_t> data;
  std::unique_ptr<InferRequest> request;
};
SeqCall SeqRequest(int64_t rows, int64_t length) {
  SeqCall call;
  for (int64_t i = 0; i < rows * length * 2; ++i) call.data.push_back(static_cast<int32_t>(i + 1));
  call.request = std::make_unique<InferRequest>();
  call.request->model_name = "seq";
  call.request->batch_size = rows;
  call.request->inputs.push_back({"x",
                                  DataType::kInt32,
                                  {rows, length, 2},
                                  reinterpret_cast<const char*>(call.data.data()),
                                  call.data.size() * 4,
                                  {}});
  return call;
}

std::vector<int32_t> Ints(const char* data, size_t bytes) {
  std::vector<int32_t> values(bytes / 4);
  std::memcpy(values.data(), data, bytes);
  return values;
}

TEST(ShapePaddingTest, PadsToTheNextBucketAndFillsLengths) {
  const ModelSpec spec = PaddedSpec();
  SeqCall call = SeqRequest(2, 3);
  auto padded = PadRequest(spec, call.request.get());
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_THAT(padded->lengths, ElementsAre(3));
  EXPECT_THAT(padded->buckets, ElementsAre(4));
  ASSERT_EQ(call.request->inputs.size(), 2u);
  const TensorView& x = call.request->inputs[0];
  EXPECT_EQ(x.shape, (Shape{2, 4, 2}));
  // Row 0 keeps 1..6 then one padded position of -1s; row 1 keeps 7..12.
  EXPECT_THAT(Ints(x.data, x.byte_size),
              ElementsAre(1, 2, 3, 4, 5, 6, -1, -1, 7, 8, 9, 10, 11, 12, -1, -1));
  const TensorView& lengths = call.request->inputs[1];
  EXPECT_EQ(lengths.name, "lengths");
  EXPECT_EQ(lengths.shape, (Shape{2, 1}));
  std::vector<int64_t> values(2);
  std::memcpy(values.data(), lengths.data, 16);
  EXPECT_THAT(values, ElementsAre(3, 3));
}

// An ensemble step's held input is brought to the host to be padded (and counted so).
TEST(ShapePaddingTest, AHeldInputIsPaddedOnTheHost) {
  const ModelSpec spec = PaddedSpec();
  SeqCall call = SeqRequest(2, 3);
  TensorView& x = call.request->inputs[0];
  auto held = std::make_shared<testing::HostHeldTensor>(
      x.dtype, x.shape, std::string(x.data, x.byte_size), /*device=*/0);
  auto ledger = std::make_shared<CopyLedger>();
  held->set_ledger(ledger);
  x.data = nullptr;
  x.held = {HeldRows{0, held}};
  auto padded = PadRequest(spec, call.request.get());
  ASSERT_TRUE(padded.ok()) << padded.status();
  const TensorView& now = call.request->inputs[0];
  EXPECT_TRUE(now.held.empty());
  EXPECT_THAT(Ints(now.data, now.byte_size),
              ElementsAre(1, 2, 3, 4, 5, 6, -1, -1, 7, 8, 9, 10, 11, 12, -1, -1));
  EXPECT_EQ(ledger->through_host.load(), 48u);
}

TEST(ShapePaddingTest, AboveTheLargestBucketIsRejected) {
  SeqCall call = SeqRequest(1, 9);
  auto padded = PadRequest(PaddedSpec(), call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      padded.status().message(),
      HasSubstr("input 'x' dimension 1 is 9, above the largest bucket (8) of padded axis 'seq'"));
}

TEST(ShapePaddingTest, AnEmptyPaddedAxisIsRejected) {
  SeqCall call = SeqRequest(1, 0);
  auto padded = PadRequest(PaddedSpec(), call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(padded.status().message(),
              HasSubstr("is 0; padded axis 'seq' needs at least one position"));
}

TEST(ShapePaddingTest, InputsMustAgreeOnAnAxis) {
  ModelSpec spec = PaddedSpec();
  spec.inputs.push_back({"mask", DataType::kInt32, {-1}});
  spec.padding.dims.push_back({"mask", true, 0, 0});
  SeqCall call = SeqRequest(1, 3);
  std::vector<int32_t> mask(5, 1);
  call.request->inputs.push_back(
      {"mask", DataType::kInt32, {1, 5}, reinterpret_cast<const char*>(mask.data()), 20, {}});
  auto padded = PadRequest(spec, call.request.get());
  EXPECT_EQ(padded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(padded.status().message(), HasSubstr("inputs disagree on padded axis 'seq'"));
}

// Writes `bytes` as output `name` through `sink`, as a backend does.
Status Write(OutputSink& sink, const std::string& name, const Shape& shape,
             const std::string& bytes) {
  SLUICE_ASSIGN_OR_RETURN(
      char* memory, sink.Allocate({name, DataType::kInt32, shape, bytes.size(), MemoryType::kCpu}));
  std::memcpy(memory, bytes.data(), bytes.size());
  return absl::OkStatus();
}

TEST(ShapePaddingTest, UnpaddingSinkCutsOutputsBackAndChecksTheyFollowTheAxis) {
  ModelSpec spec = PaddedSpec();
  spec.outputs.push_back({"n", DataType::kInt32, {1}});  // follows no padded axis
  auto shared = std::make_shared<const ModelSpec>(spec);
  const PaddedLengths padded{{3}, {4}};
  std::vector<int32_t> y = {1, 2, 3, 4, 5, 6, 0, 0};
  const std::string n(4, '\x07');

  TensorSink caller;
  UnpaddingSink sink(shared, padded, &caller);
  ASSERT_TRUE(Write(sink, "y", {1, 4, 2}, std::string(reinterpret_cast<char*>(y.data()), 32)).ok());
  ASSERT_TRUE(Write(sink, "n", {1, 1}, n).ok());
  EXPECT_TRUE(caller.outputs().empty());  // "y" waits to be cut, and "n" behind it keeps the order
  ASSERT_TRUE(sink.Finish().ok());
  ASSERT_EQ(caller.outputs().size(), 2u);
  EXPECT_EQ(caller.outputs()[0].shape, (Shape{1, 3, 2}));
  EXPECT_THAT(Ints(caller.outputs()[0].data.data(), caller.outputs()[0].data.size()),
              ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(caller.outputs()[1].name, "n");
  EXPECT_EQ(caller.outputs()[1].data, n);

  TensorSink direct_caller;
  UnpaddingSink direct(shared, padded, &direct_caller);
  ASSERT_TRUE(Write(direct, "n", {1, 1}, n).ok());
  EXPECT_EQ(direct_caller.outputs().size(),
            1u);  // nothing to cut: straight to the caller, one copy

  TensorSink wrong_caller;
  UnpaddingSink wrong(shared, padded, &wrong_caller);
  ASSERT_TRUE(Write(wrong, "y", {1, 5, 2}, std::string(40, '\0')).ok());
  Status status = wrong.Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("follows padded axis 'seq' (padded to 4)"));
}

TEST(ShapePaddingTest, PaddingSchedulerServesTrueLengths) {
  const ModelSpec spec = PaddedSpec();
  PaddingScheduler scheduler(spec, OneAtATime(spec, std::make_unique<ThreadRecordingEcho>()),
                             nullptr);
  SeqCall call = SeqRequest(2, 5);  // padded to 8, cut back to 5
  TensorSink sink;
  std::promise<Status> answer;
  scheduler.Enqueue(std::move(call.request), &sink,
                    [&](Status status) { answer.set_value(status); });
  const Status status = answer.get_future().get();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(sink.outputs().size(), 1u);
  EXPECT_EQ(sink.outputs()[0].shape, (Shape{2, 5, 2}));
  EXPECT_EQ(Ints(sink.outputs()[0].data.data(), sink.outputs()[0].data.size()), call.data);

  SeqCall too_long = SeqRequest(1, 20);
  TensorSink unused;
  std::promise<Status> rejected;
  scheduler.Enqueue(std::move(too_long.request), &unused,
                    [&](Status status) { rejected.set_value(status); });
  EXPECT_EQ(rejected.get_future().get().code(), absl::StatusCode::kInvalidArgument);
  scheduler.Stop();
}

}  // namespace
}  // namespace sluice
