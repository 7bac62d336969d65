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
  EXPECT_EQ(info.cudnn_loaded_version, info.cudnn_version);
  EXPECT_TRUE(info.driver_found);
  EXPECT_FALSE(info.driver_cuda_version.empty());
  ASSERT_EQ(static_cast<int>(info.gpus.size()), info.cuda_device_count);
  EXPECT_FALSE(info.gpus[0].name.empty());
  EXPECT_GE(info.gpus[0].major, 7);
  EXPECT_GT(info.gpus[0].memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(info.gpus[0].uuid.rfind("GPU-", 0), 0u);
  EXPECT_TRUE(info.gpus[0].problem.empty()) << info.gpus[0].problem;
  EXPECT_TRUE(EnvironmentProblems(info, true).empty());
}

TEST_F(TorchBackendGpuTest, BenchmarkOnConvolutionMatchesTheCpu) {
  auto factory = MakeTorchBackendFactory();
  ModelSpec spec = testing::ConvSpec();
  spec.cudnn_benchmark = true;
  auto backend = factory->Load(spec, testing::SaveModule("conv_benchmark", testing::kConvSource), Device{true, 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Tuning().rewritten, 1);
  auto conv = testing::MakeConvRequest();
  for (int i = 0; i < 3; ++i) {  // the first run searches; the others use the cached algorithm
    auto response = testing::Run(**backend, conv->request);
    ASSERT_TRUE(response.ok()) << response.status();
    // The algorithm cuDNN picks (Winograd, FFT) may round differently: compare as floats.
    const std::string expected = testing::ExpectedConvOutput();
    ASSERT_EQ(response->outputs[0].data.size(), expected.size());
    for (size_t offset = 0; offset < expected.size(); offset += 4) {
      float got = 0, want = 0;
      std::memcpy(&got, response->outputs[0].data.data() + offset, 4);
      std::memcpy(&want, expected.data() + offset, 4);
      EXPECT_NEAR(got, want, 1e-3) << "element " << offset / 4;
    }
  }
}

TEST_F(TorchBackendGpuTest, RunsOnCudaAndReturnsHostBytes) {
  auto factory = MakeTorchBackendFactory();
  ASSERT_TRUE(factory->CudaUsable());
  auto backend = factory->Load(testing::ConvSpec(), testing::SaveModule("conv", testing::kConvSource), Device{true, 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto conv = testing::MakeConvRequest();
  auto response = testing::Run(**backend, conv->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].data, testing::ExpectedConvOutput());
}

}  // namespace
}  // namespace sluice
