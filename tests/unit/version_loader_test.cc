// Loading one version: instances per device, composition, warm-up, runtime warnings.
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/version_loader.h"
#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using testing::FakeBackendFactory;
using testing::Groups;
using ::testing::HasSubstr;
using testing::Model;
using testing::Send;

TEST(VersionLoaderTest, LoadsComposesAndWarmsUpOneVersion) {
  FakeBackendFactory factory;
  VersionLoader loader(&factory, {});
  auto model = std::make_shared<const RepositoryModel>(
      Model("m", {1, 2}, Groups({{InstanceKind::kCpu, 2, {}}})));
  EXPECT_EQ(loader.SplitCpuThreads({model}),
            std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / 4));
  LoadedVersion loaded = loader.Load(model, 2, nullptr);
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  ASSERT_NE(loaded.handle, nullptr);
  EXPECT_EQ(loaded.handle->version(), 2);
  EXPECT_EQ(loaded.handle->device(), "cpu x2");
  EXPECT_EQ(loaded.tuning.name, "m");
  EXPECT_EQ(loaded.tuning.warmup.size(), 8u);  // 4 batch sizes on 2 instances
  ASSERT_EQ(factory.loads.size(), 2u);
  EXPECT_EQ(factory.loads[0].file, "/repo/m/2/model.pt");
  EXPECT_EQ(Send(loaded.handle.get(), "9").get()->outputs[0].data, "9");
  loaded.handle->Stop();

  factory.failures["m/1"] = "bad archive";
  LoadedVersion failed = loader.Load(model, 1, nullptr);
  EXPECT_EQ(failed.handle, nullptr);
  EXPECT_THAT(failed.status.message(), HasSubstr("bad archive"));

  std::atomic<bool> abandon{true};
  LoadedVersion abandoned = loader.Load(model, 2, &abandon);
  EXPECT_EQ(abandoned.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(factory.loads.size(), 3u);  // nothing more loaded
}

TEST(VersionLoaderTest, OneLoadPerDeviceAndTheRuntimesWarningsReachTheTuning) {
  FakeBackendFactory factory(/*cuda=*/true, /*gpus=*/2);
  factory.warnings = {"lone requests are padded"};
  VersionLoader loader(&factory, {});
  // Two groups on the CPU and one on both GPUs: the runtime is asked once per device, so that it
  // can share what instances on one device share (an AOTInductor package's weights).
  auto model =
      std::make_shared<const RepositoryModel>(Model("m", {1},
                                                    Groups({{InstanceKind::kCpu, 2, {}},
                                                            {InstanceKind::kGpu, 1, {}},
                                                            {InstanceKind::kCpu, 1, {}}})));
  LoadedVersion loaded = loader.Load(model, 1, nullptr);
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_THAT(factory.calls, ElementsAre(std::make_pair(std::string("cpu"), 3),
                                         std::make_pair(std::string("cuda:0"), 1),
                                         std::make_pair(std::string("cuda:1"), 1)));
  EXPECT_EQ(loaded.handle->device(), "cpu,cuda:0,cuda:1 x5");
  EXPECT_THAT(loaded.tuning.warnings, ElementsAre("lone requests are padded"));
  loaded.handle->Stop();
}

TEST(VersionLoaderTest, DevicePolicyCuda) {
  FakeBackendFactory without_gpu(false, 0);
  VersionLoader::Options options;
  options.device_policy = DevicePolicy::kCuda;
  EXPECT_EQ(VersionLoader(&without_gpu, options).CheckDevicePolicy().code(),
            absl::StatusCode::kFailedPrecondition);
  FakeBackendFactory with_gpu(true, 1);
  EXPECT_TRUE(VersionLoader(&with_gpu, options).CheckDevicePolicy().ok());
}

// The table on its own: a swap installs at once and hands back what served before.

}  // namespace
}  // namespace sluice
