// The device policy and the device a model instance runs on (server/core/device.h).
#include "server/core/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, Rule) {
  // cpu: always the CPU.
  EXPECT_FALSE(DecideDevice(DevicePolicy::kCpu, InstanceKind::kGpu, true)->use_cuda);
  // auto: the GPU for KIND_GPU/KIND_AUTO when usable.
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, true)->use_cuda);
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, true)->use_cuda);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kCpu, true)->use_cuda);
  // auto without a GPU: the CPU, with a warning for KIND_GPU only.
  auto fallback = DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, false);
  EXPECT_FALSE(fallback->use_cuda);
  EXPECT_TRUE(fallback->fell_back_to_cpu);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, false)->fell_back_to_cpu);
  // cuda: an error without a GPU.
  auto required = DecideDevice(DevicePolicy::kCuda, InstanceKind::kCpu, false);
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(required.status().message(), HasSubstr("--gpus all"));
  EXPECT_TRUE(DecideDevice(DevicePolicy::kCuda, InstanceKind::kGpu, true)->use_cuda);
}

TEST(DeviceTest, ParsePolicy) {
  EXPECT_EQ(*ParseDevicePolicy("auto"), DevicePolicy::kAuto);
  EXPECT_EQ(*ParseDevicePolicy("cpu"), DevicePolicy::kCpu);
  EXPECT_EQ(*ParseDevicePolicy("cuda"), DevicePolicy::kCuda);
  EXPECT_EQ(ParseDevicePolicy("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
