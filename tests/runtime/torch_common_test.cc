// What the two LibTorch runtimes share (server/runtime/torch_common.h), on the CPU: datatype and
// device mapping, LibTorch exceptions sorted into statuses, the CPU thread count per thread, and
// the phase marks of one Execute read from the clock.
#include "server/runtime/torch_common.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(TorchCommonTest, EveryDatatypeButBytesMapsToAScalarTypeAndBack) {
  for (DataType type : kAllDataTypes) {
    if (type == DataType::kBytes) continue;
    const std::optional<DataType> back = FromScalarType(ToScalarType(type));
    ASSERT_TRUE(back.has_value()) << DataTypeName(type);
    EXPECT_EQ(*back, type) << DataTypeName(type);
  }
  EXPECT_EQ(ToScalarType(DataType::kFp16), at::kHalf);
  EXPECT_EQ(ToScalarType(DataType::kBf16), at::kBFloat16);
  EXPECT_EQ(FromScalarType(at::kComplexFloat), std::nullopt);  // nothing on the wire carries it
  EXPECT_EQ(FromScalarType(at::kQInt8), std::nullopt);
}

TEST(TorchCommonTest, DevicesMapToTorchDevices) {
  EXPECT_EQ(ToTorchDevice(Device{}), at::Device(at::kCPU));
  EXPECT_EQ(ToTorchDevice(Device{/*cuda=*/true, 1}), at::Device(at::kCUDA, 1));
}

TEST(TorchCommonTest, TryTorchReturnsTheValueOrSortsTheException) {
  ForwardFailure failure;
  EXPECT_EQ(TryTorch([] { return 7; }, &failure), 7);
  EXPECT_EQ(failure.message, "");

  EXPECT_EQ(TryTorch(
                []() -> int {
                  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried 2 GiB");
                  return 0;
                },
                &failure),
            std::nullopt);
  EXPECT_TRUE(failure.out_of_memory_type);
  EXPECT_THAT(failure.message, HasSubstr("Tried 2 GiB"));
  EXPECT_THAT(failure.message, ::testing::Not(HasSubstr("Exception raised from")));  // no trace

  failure = {};
  EXPECT_EQ(TryTorch(
                []() -> int {
                  TORCH_CHECK(false, "shape '[2, 3]' is invalid");
                  return 0;
                },
                &failure),
            std::nullopt);
  EXPECT_FALSE(failure.out_of_memory_type);
  EXPECT_THAT(failure.message, HasSubstr("shape '[2, 3]' is invalid"));

  failure = {};
  EXPECT_EQ(TryTorch([]() -> int { throw std::runtime_error("from the interpreter"); }, &failure),
            std::nullopt);
  EXPECT_EQ(failure.message, "from the interpreter");
}

TEST(TorchCommonTest, CatchTorchTurnsExceptionsIntoStatusesLeadByWhat) {
  const StatusOr<int> fine = CatchTorch("loading m", []() -> StatusOr<int> { return 3; });
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(*fine, 3);

  const StatusOr<int> oom = CatchTorch("warming m", []() -> StatusOr<int> {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory");
    return 0;
  });
  EXPECT_EQ(oom.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.status().message(), HasSubstr("warming m: out of memory: CUDA out of memory"));

  const Status other = CatchTorch("loading m", []() -> Status {
    TORCH_CHECK(false, "unknown builtin op: torchvision::nms");
    return absl::OkStatus();
  });
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(other.message(), HasSubstr("loading m: unknown builtin op: torchvision::nms"));
}

TEST(TorchCommonTest, IntraOpThreadsAreSetOnTheCallingThreadAndZeroLeavesThem) {
  const int before = at::get_num_threads();
  ApplyIntraOpThreads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  ApplyIntraOpThreads(0);
  EXPECT_EQ(at::get_num_threads(), 1);
  ApplyIntraOpThreads(before);
  EXPECT_EQ(at::get_num_threads(), before);
}

// Spins until the steady clock has moved `at_least` on.
void Spin(std::chrono::microseconds at_least) {
  const auto until = std::chrono::steady_clock::now() + at_least;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(TorchCommonTest, PhaseMarksOnTheCpuReadTheClockOnlyOnceEveryMarkIsSet) {
  PhaseMarks marks(/*stream=*/nullptr);
  EXPECT_EQ(marks.Read(), std::nullopt);
  marks.Set(PhaseMarks::kBegin);
  marks.Set(PhaseMarks::kInputsQueued);
  Spin(std::chrono::milliseconds(2));
  marks.Set(PhaseMarks::kForwardQueued);
  EXPECT_EQ(marks.Read(), std::nullopt);  // outputs not marked
  marks.Set(PhaseMarks::kOutputsQueued);
  const std::optional<DevicePhases> phases = marks.Read();
  ASSERT_TRUE(phases.has_value());
  EXPECT_GE(phases->forward, std::chrono::milliseconds(2));
  EXPECT_GE(phases->to_device.count(), 0);
  EXPECT_LT(phases->to_device, phases->forward);
  EXPECT_GE(phases->to_host.count(), 0);

  marks.Clear();
  EXPECT_EQ(marks.Read(), std::nullopt);
}

}  // namespace
}  // namespace sluice
