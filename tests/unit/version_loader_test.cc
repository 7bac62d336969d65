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

// Staging ahead is on where a model has one instance, on a GPU: not on the CPU, not with several
// instances (they overlap each other's assembly already, and a batch staged behind one would wait
// while another is free), not without dynamic batching; the model's parameter wins.
TEST(VersionLoaderTest, StagesAheadWithOneGpuInstanceUnlessTheModelSays) {
  FakeBackendFactory factory(/*cuda=*/true, /*gpus=*/2);
  VersionLoader loader(&factory, {});
  auto load = [&](const std::string& name, const std::function<void(ModelSpec&)>& edit) {
    auto model = std::make_shared<const RepositoryModel>(Model(name, {1}, edit));
    LoadedVersion loaded = loader.Load(model, 1, nullptr);
    EXPECT_TRUE(loaded.status.ok()) << loaded.status;
    if (loaded.handle) loaded.handle->Stop();
    return std::make_pair(loaded.tuning.stage_ahead, loaded.tuning.stage_ahead_reason);
  };
  auto group = [](InstanceKind kind, int count, std::vector<int> gpus, bool batching) {
    return [=](ModelSpec& spec) {
      spec.dynamic_batching.enabled = batching;
      spec.instance_groups = {{kind, count, gpus}};
    };
  };
  using Decision = std::pair<bool, std::string>;
  EXPECT_EQ(load("one", group(InstanceKind::kGpu, 1, {1}, true)),
            Decision(true, "one GPU instance"));
  EXPECT_EQ(load("two", group(InstanceKind::kGpu, 2, {0}, true)),
            Decision(false, "several instances"));
  EXPECT_EQ(load("spread", group(InstanceKind::kGpu, 1, {}, true)),  // one on each GPU
            Decision(false, "several instances"));
  EXPECT_EQ(load("cpu", group(InstanceKind::kCpu, 1, {}, true)), Decision(false, "a CPU instance"));
  EXPECT_EQ(load("alone", group(InstanceKind::kGpu, 1, {0}, false)),
            Decision(false, "no dynamic batching"));
  EXPECT_EQ(load("forced",
                 [&](ModelSpec& spec) {
                   group(InstanceKind::kGpu, 2, {0}, true)(spec);
                   spec.dynamic_batching.stage_ahead = true;
                 }),
            Decision(true, "set for this model (sluice.stage_ahead)"));
  EXPECT_EQ(load("refused",
                 [&](ModelSpec& spec) {
                   group(InstanceKind::kGpu, 1, {0}, true)(spec);
                   spec.dynamic_batching.stage_ahead = false;
                 }),
            Decision(false, "set for this model (sluice.stage_ahead)"));
}

// Under the auto rule a TorchScript model with fixed shapes on a GPU is timed with cuDNN
// benchmark mode off (its first serving instance) and on (a probe instance), and keeps the mode
// only where it is at least 5 % faster: here the fake's forward reads the flag it was loaded with.
struct CudnnCase {
  Duration per_row_off, per_row_on;
};

class CudnnByMeasurementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    factory_.configure = [this](const ModelSpec& spec, const Device& device,
                                testing::FakeBackend* backend) {
      if (!with_convolutions_) return;
      backend->tuning.convolutions = backend->tuning.rewritten = 2;
      const Duration per_row = spec.cudnn_benchmark ? per_row_on_ : per_row_off_;
      backend->forward_time = [per_row](const InferRequest& request) {
        return per_row * request.batch_size;
      };
    };
  }

  LoadedVersion Load(const std::function<void(ModelSpec&)>& edit = nullptr,
                     VersionLoader::Options options = {}) {
    // A loaded version's scheduler reads the loader's clock: every loader outlives the test.
    loaders_.push_back(std::make_unique<VersionLoader>(&factory_, std::move(options)));
    auto model = std::make_shared<const RepositoryModel>(Model("m", {1}, edit));
    return loaders_.back()->Load(model, 1, nullptr);
  }

  std::vector<std::unique_ptr<VersionLoader>> loaders_;

  testing::FakeBackendFactory factory_{/*cuda=*/true, /*gpus=*/1};
  bool with_convolutions_ = true;
  Duration per_row_off_ = std::chrono::microseconds(100);
  Duration per_row_on_ = std::chrono::microseconds(80);
};

TEST_F(CudnnByMeasurementTest, FasterWithTheModeKeepsItAndReloadsWithIt) {
  LoadedVersion loaded = Load();
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_TRUE(loaded.tuning.cudnn_benchmark);
  EXPECT_THAT(loaded.tuning.cudnn_reason,
              HasSubstr("measured: on 1.25x as fast as off over 4 of 4 shapes (kept)"));
  ASSERT_EQ(loaded.tuning.cudnn_timings.size(), 4u);  // batch sizes 1 to 4
  EXPECT_EQ(loaded.tuning.cudnn_timings[3].off, std::chrono::microseconds(400));
  EXPECT_EQ(loaded.tuning.cudnn_timings[3].on, std::chrono::microseconds(320));
  EXPECT_GT(loaded.tuning.cudnn_measure_time.count(), 0);
  EXPECT_TRUE(loaded.tuning.cudnn_device_timed);  // the fakes report device phases
  // The serving instance with the mode off, the probe with it on, then the serving one again.
  ASSERT_EQ(factory_.loads.size(), 3u);
  EXPECT_FALSE(factory_.loads[0].cudnn_benchmark);
  EXPECT_TRUE(factory_.loads[1].cudnn_benchmark);
  EXPECT_TRUE(factory_.loads[2].cudnn_benchmark);
  EXPECT_EQ(loaded.handle->device(), "cuda:0 x1");
  loaded.handle->Stop();
}

TEST_F(CudnnByMeasurementTest, SlowerOrMarginalWithTheModeKeepsTheInstancesLoadedWithout) {
  per_row_on_ = std::chrono::microseconds(130);
  LoadedVersion loaded = Load();
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_FALSE(loaded.tuning.cudnn_benchmark);
  EXPECT_THAT(loaded.tuning.cudnn_reason, HasSubstr("0.77x"));
  ASSERT_EQ(factory_.loads.size(), 2u);  // no reload: the serving instance already has it off
  EXPECT_FALSE(factory_.loads[0].cudnn_benchmark);
  loaded.handle->Stop();

  per_row_on_ = std::chrono::microseconds(97);  // 3 % faster
  loaded = Load();
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_FALSE(loaded.tuning.cudnn_benchmark);
  EXPECT_THAT(loaded.tuning.cudnn_reason, HasSubstr("not 5 % faster, so off"));
  loaded.handle->Stop();
}

TEST_F(CudnnByMeasurementTest, NothingIsMeasuredWhereTheRuleOrTheOperatorDecides) {
  auto expect_unmeasured = [&](const LoadedVersion& loaded, bool benchmark, const char* reason) {
    ASSERT_TRUE(loaded.status.ok()) << loaded.status;
    EXPECT_EQ(loaded.tuning.cudnn_benchmark, benchmark);
    EXPECT_THAT(loaded.tuning.cudnn_reason, HasSubstr(reason));
    EXPECT_TRUE(loaded.tuning.cudnn_timings.empty());
    EXPECT_EQ(factory_.loads.size(), 1u);  // no probe
    EXPECT_EQ(factory_.loads[0].cudnn_benchmark, benchmark);
    loaded.handle->Stop();
    factory_.loads.clear();
  };
  VersionLoader::Options on;
  on.cudnn_benchmark = CudnnBenchmarkMode::kOn;
  expect_unmeasured(Load(nullptr, on), true, "--cudnn-benchmark=on");
  expect_unmeasured(
      Load([](ModelSpec& spec) { spec.cudnn_benchmark_override = CudnnBenchmarkMode::kOff; }),
      false, "sluice.cudnn_benchmark=off");
  expect_unmeasured(Load(Groups({{InstanceKind::kCpu, 1, {}}})), true, "fixed shapes");
  expect_unmeasured(Load([](ModelSpec& spec) { spec.inputs[0].dims = {-1}; }), false,
                    "variable shapes");
  VersionLoader::Options no_warmup;
  no_warmup.warmup = false;
  factory_.loads.clear();
  LoadedVersion cold = Load(nullptr, no_warmup);
  ASSERT_TRUE(cold.status.ok()) << cold.status;
  EXPECT_TRUE(cold.tuning.cudnn_timings.empty());
  cold.handle->Stop();
  factory_.loads.clear();

  // A graph without convolutions: the mode changes nothing, and no probe is loaded.
  with_convolutions_ = false;
  LoadedVersion plain = Load();
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  EXPECT_THAT(plain.tuning.cudnn_reason, HasSubstr("fixed shapes"));
  EXPECT_TRUE(plain.tuning.cudnn_timings.empty());
  EXPECT_EQ(factory_.loads.size(), 1u);
  plain.handle->Stop();
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
