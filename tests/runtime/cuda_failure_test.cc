// ClassifyForwardFailure and ForwardFailureStatus on the codes and messages a failed forward pass
// leaves behind: no GPU needed.
#include "server/runtime/cuda_failure.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/core/backend.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSuccess = 0;
constexpr int kNotReady = 600;
constexpr int kIllegalAddress = 700;
constexpr int kLaunchOutOfResources = 701;
constexpr int kAssert = 710;
constexpr int kLaunchFailure = 719;
constexpr int kUnknown = 999;

ForwardFailure Failure(std::string message, std::optional<int> code = std::nullopt,
                       bool counter = false) {
  ForwardFailure failure;
  failure.message = std::move(message);
  failure.cuda_error = code;
  failure.allocator_out_of_memory = counter;
  return failure;
}

TEST(CudaFailureTest, StickyCodesAreTheOnesThatLeaveTheContextUnusable) {
  for (int code : {214, 220, 700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 721, 911, 999}) {
    EXPECT_TRUE(IsStickyCudaError(code)) << code;
  }
  for (int code : {kSuccess, 1, 2, kNotReady, kLaunchOutOfResources, 98, 12345}) {
    EXPECT_FALSE(IsStickyCudaError(code)) << code;
  }
  EXPECT_EQ(CudaErrorName(kIllegalAddress), "cudaErrorIllegalAddress");
  EXPECT_EQ(CudaErrorName(kAssert), "cudaErrorAssert");
  EXPECT_EQ(CudaErrorName(12345), "cudaError 12345");
}

// AOTInductor's runner rewraps every error: the code queried afterwards is what tells.
TEST(CudaFailureTest, AStickyCodeIsFatalWhateverTheMessageSays) {
  const std::string rewrapped =
      "run_func_( container_handle_, ...) API call failed at model_container_runner.cpp, line 147";
  for (int code : {kIllegalAddress, kAssert, kLaunchFailure, kUnknown}) {
    EXPECT_EQ(ClassifyForwardFailure(Failure(rewrapped, code)), ForwardFailureKind::kStickyCuda)
        << code;
  }
  // Even when the allocator also failed: an allocation can fail because the context is broken.
  EXPECT_EQ(ClassifyForwardFailure(Failure("CUDA out of memory", kIllegalAddress, true)),
            ForwardFailureKind::kStickyCuda);
}

TEST(CudaFailureTest, TheAllocatorsCounterMakesARewrappedOutOfMemoryResourceExhausted) {
  const std::string rewrapped =
      "run_func_( container_handle_, ...) API call failed at model_container_runner.cpp";
  EXPECT_EQ(ClassifyForwardFailure(Failure(rewrapped, kSuccess, true)),
            ForwardFailureKind::kOutOfMemory);
  EXPECT_EQ(ClassifyForwardFailure(Failure(rewrapped, kSuccess, false)),
            ForwardFailureKind::kOther);
  ForwardFailure typed = Failure("anything", kSuccess);
  typed.out_of_memory_type = true;
  EXPECT_EQ(ClassifyForwardFailure(typed), ForwardFailureKind::kOutOfMemory);
}

TEST(CudaFailureTest, AllocatorMessagesAreOutOfMemoryWithoutACode) {
  for (const char* message :
       {"The following operation failed in the TorchScript interpreter ... CUDA out of memory. "
        "Tried to allocate 200.00 GiB",
        "torch.OutOfMemoryError: ...", "CUDA error: out of memory",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4611686018427387904 "
        "bytes",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes"}) {
    EXPECT_EQ(ClassifyForwardFailure(Failure(message)), ForwardFailureKind::kOutOfMemory)
        << message;
  }
}

// Without a code (a CPU instance whose model ran CUDA work anyway) the known texts still count,
// including the forms the message list used to miss.
TEST(CudaFailureTest, KnownStickyMessagesCountWhenNoCodeWasQueried) {
  for (const char* message : {"CUDA error: an illegal memory access was encountered",
                              "CUDA error: device-side assert triggered",
                              "CUDA driver error: an illegal memory access was encountered",
                              "CUDA driver error: unknown error",
                              "CUDA error: unspecified launch failure", "CUDA error: unknown error",
                              "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
                              "`cublasSgemm( handle, opa, opb, m, n, k, ...)`",
                              "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"}) {
    EXPECT_EQ(ClassifyForwardFailure(Failure(message)), ForwardFailureKind::kStickyCuda) << message;
  }
  for (const char* message :
       {"index 12 is out of bounds for dimension 0 with size 4", "unknown error in my model",
        "CUDA error: too many resources requested for launch",
        "CUDA error: invalid configuration argument"}) {
    EXPECT_EQ(ClassifyForwardFailure(Failure(message)), ForwardFailureKind::kOther) << message;
  }
}

// A queried code that is clean overrules a scary text: the context still works.
TEST(CudaFailureTest, ACleanCodeOverrulesAStickyLookingMessage) {
  EXPECT_EQ(ClassifyForwardFailure(Failure("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED", kSuccess)),
            ForwardFailureKind::kOther);
  EXPECT_EQ(ClassifyForwardFailure(
                Failure("CUDA error: an illegal memory access was encountered", kNotReady)),
            ForwardFailureKind::kOther);
  EXPECT_EQ(ClassifyForwardFailure(
                Failure("CUDA error: too many resources requested", kLaunchOutOfResources)),
            ForwardFailureKind::kOther);
}

TEST(CudaFailureTest, StatusesCarryTheCodeTheMessageAndTheFatalMark) {
  const Status sticky = ForwardFailureStatus(
      "model 'm' failed", Failure("run_func_(...) API call failed", kIllegalAddress));
  EXPECT_EQ(sticky.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsFatal(sticky));
  EXPECT_THAT(sticky.message(), HasSubstr("model 'm' failed: run_func_(...) API call failed"));
  EXPECT_THAT(sticky.message(), HasSubstr("CUDA reports cudaErrorIllegalAddress"));
  EXPECT_THAT(sticky.message(), HasSubstr("no longer live"));

  const Status oom = ForwardFailureStatus(
      "model 'm' failed", Failure("run_func_(...) API call failed", kSuccess, true));
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsFatal(oom));
  EXPECT_THAT(oom.message(), HasSubstr("model 'm' failed: out of memory: run_func_"));

  const Status other =
      ForwardFailureStatus("model 'm' failed", Failure("shape mismatch", kSuccess));
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(IsFatal(other));
  EXPECT_THAT(other.message(), Not(HasSubstr("CUDA")));

  // Torch's messages are truncated, the statuses stay bounded.
  const Status long_one = ForwardFailureStatus("w", Failure(std::string(100000, 'x'), kAssert));
  EXPECT_LT(long_one.message().size(), 2000u);
  EXPECT_THAT(long_one.message(), HasSubstr("cudaErrorAssert"));
}

}  // namespace
}  // namespace sluice
