// The LibTorch runtime on a GPU. Every test skips (and ctest reports it skipped) without CUDA.
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "server/runtime/torch_backend.h"
#include "tests/runtime/test_modules.h"

namespace sluice {
namespace {

class TorchBackendGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA GPU";
  }
};

TEST_F(TorchBackendGpuTest, ProbeSeesGpuAndCudnn) {
  RuntimeInfo info = ProbeRuntime();
  EXPECT_TRUE(info.cuda_usable);
  EXPECT_GE(info.cuda_device_count, 1);
  EXPECT_FALSE(info.cudnn_version.empty());
}

TEST_F(TorchBackendGpuTest, RunsOnCudaAndReturnsHostBytes) {
  auto factory = MakeTorchBackendFactory();
  ASSERT_TRUE(factory->CudaUsable());
  auto backend = factory->Load(testing::ConvSpec(), testing::SaveModule("conv", testing::kConvSource), Device{true, 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto conv = testing::MakeConvRequest();
  auto response = (*backend)->Execute(conv->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].data, testing::ExpectedConvOutput());
}

}  // namespace
}  // namespace sluice
