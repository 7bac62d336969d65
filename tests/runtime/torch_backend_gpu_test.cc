// The LibTorch runtime on a GPU. Every test skips (and ctest reports it skipped) without CUDA.
#include <algorithm>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <c10/cuda/CUDACachingAllocator.h>
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
  auto backend = factory->Load(spec, testing::SaveModule("conv_benchmark", testing::kConvSource),
                               Device{true, 0});
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
    // The phases from CUDA events on the instance's stream: every one measured, the
    // convolution's the largest.
    const std::optional<DevicePhases> phases = (*backend)->LastPhases();
    ASSERT_TRUE(phases.has_value());
    EXPECT_GT(phases->to_device, Duration::zero());
    EXPECT_GT(phases->forward, Duration::zero());
    EXPECT_GT(phases->to_host, Duration::zero());
  }
}

TEST_F(TorchBackendGpuTest, RunsOnCudaAndReturnsHostBytes) {
  auto factory = MakeTorchBackendFactory();
  ASSERT_TRUE(factory->CudaUsable());
  auto backend = factory->Load(testing::ConvSpec(),
                               testing::SaveModule("conv", testing::kConvSource), Device{true, 0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto conv = testing::MakeConvRequest();
  auto response = testing::Run(**backend, conv->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].data, testing::ExpectedConvOutput());
}

// kConvSource's answer for a 1x1x4x4 image of `value`s, compared as floats (cuDNN's algorithm
// may round differently from the CPU's).
void ExpectConvOf(const testing::Executed& got, float value) {
  const std::string ones = testing::ExpectedConvOutput();
  ASSERT_EQ(got.outputs[0].data.size(), ones.size());
  for (size_t offset = 0; offset < ones.size(); offset += 4) {
    float have = 0, want = 0;
    std::memcpy(&have, got.outputs[0].data.data() + offset, 4);
    std::memcpy(&want, ones.data() + offset, 4);
    EXPECT_NEAR(have, want * value, 1e-3) << "element " << offset / 4;
  }
}

// `passes` passes of one conv request, the image filled with pass + 1 each time.
void ExpectEachPassAnswersItsInput(ModelBackend& backend, int passes) {
  auto conv = testing::MakeConvRequest();
  for (int pass = 0; pass < passes; ++pass) {
    const float value = static_cast<float>(pass + 1);
    std::fill(conv->ones.begin(), conv->ones.end(), value);
    auto response = testing::Run(backend, conv->request);
    ASSERT_TRUE(response.ok()) << "pass " << pass << ": " << response.status();
    ExpectConvOf(*response, value);
  }
}

// What LibTorch's caching allocator holds from the driver on GPU 0, after giving back what it can.
int64_t ReservedBytes(BackendFactory& factory) {
  factory.ReleaseCachedMemory();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

TEST_F(TorchBackendGpuTest, CudaGraphsReplayTheNewInputsAndAnswerAsEagerDoes) {
  auto factory = MakeTorchBackendFactory();
  const auto model = testing::SaveModule("conv_graphs", testing::kConvSource);
  {  // an eager instance first: whatever LibTorch keeps for good after a first conv is in `before`
    auto eager = factory->Load(testing::ConvSpec(), model, Device{true, 0});
    ASSERT_TRUE(eager.ok()) << eager.status();
    ExpectEachPassAnswersItsInput(**eager, 1);
  }
  const int64_t before = ReservedBytes(*factory);
  {
    ModelSpec spec = testing::ConvSpec();
    spec.cuda_graphs = true;
    auto backend = factory->Load(spec, model, Device{true, 0});
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_THAT((*backend)->Warnings(), ::testing::IsEmpty());
    // Two eager passes, the capture pass (answered eagerly, then captured and checked), then
    // replays: each must answer for the bytes it was given, not the captured ones.
    ExpectEachPassAnswersItsInput(**backend, 8);
    EXPECT_EQ((*backend)->LastGraphRun(), ModelBackend::GraphRun::kReplayed);
    EXPECT_GT(ReservedBytes(*factory), before);  // the graph's private pool
  }
  // Unloading gives the graph's pool back with the instance.
  EXPECT_EQ(ReservedBytes(*factory), before);
}

// A forward pass that reads a value back to the host cannot be captured: that shape runs eagerly
// and keeps answering right.
constexpr char kSyncingConvSource[] = R"(
def forward(self, INPUT__0):
    w = torch.ones([2, 1, 3, 3], device=INPUT__0.device)
    y = torch.conv2d(INPUT__0, w, None, [1, 1], [1, 1])
    if float(y.max()) > 1.0e30:
        return y * 0.0
    return y
)";

// ...and the failed capture leaves nothing behind: another model's graphs still capture and
// replay in the same process, and the caching allocator can still be emptied.
TEST_F(TorchBackendGpuTest, AForwardPassThatSynchronisesRunsWithoutAGraphAndOthersKeepTheirs) {
  auto factory = MakeTorchBackendFactory();
  ModelSpec spec = testing::ConvSpec();
  spec.cuda_graphs = true;
  auto graphed = factory->Load(spec, testing::SaveModule("conv_graphed", testing::kConvSource),
                               Device{true, 0});
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  ExpectEachPassAnswersItsInput(**graphed,
                                4);  // captured on its third pass, replayed on its fourth
  EXPECT_EQ((*graphed)->LastGraphRun(), ModelBackend::GraphRun::kReplayed);

  auto syncing =
      factory->Load(spec, testing::SaveModule("conv_syncing", kSyncingConvSource), Device{true, 0});
  ASSERT_TRUE(syncing.ok()) << syncing.status();
  ExpectEachPassAnswersItsInput(**syncing, 6);
  EXPECT_EQ((*syncing)->LastGraphRun(), ModelBackend::GraphRun::kNone);

  ExpectEachPassAnswersItsInput(**graphed, 3);
  EXPECT_EQ((*graphed)->LastGraphRun(), ModelBackend::GraphRun::kReplayed);
  factory->ReleaseCachedMemory();
  ExpectEachPassAnswersItsInput(**graphed, 2);
  EXPECT_EQ((*graphed)->LastGraphRun(), ModelBackend::GraphRun::kReplayed);
}

}  // namespace
}  // namespace sluice
