// The model manager: versions it serves, lookups, readiness, devices, swap and removal.
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_manager.h"
#include "server/manager/version_loader.h"
#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using testing::Broken;
using ::testing::ElementsAre;
using testing::FakeBackendFactory;
using testing::Groups;
using ::testing::HasSubstr;
using testing::ManagerParts;
using testing::Model;
using testing::Models;
using testing::Send;
using ::testing::StartsWith;

TEST(ModelManagerTest, BrokenModelsAreUnavailableWhileOthersServe) {
  FakeBackendFactory factory;
  factory.failures["corrupt"] = "cannot load /repo/corrupt/1/model.pt: bad archive";
  ManagerParts parts(
      Models({Model("good", {1}), Model("corrupt", {1}), Broken("badconfig", "line 1: oops")}),
      &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  EXPECT_FALSE(manager.AllReady());  // before loading
  EXPECT_EQ(manager.Find("good", "").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_FALSE(manager.AllReady());
  auto good = manager.Find("good", "");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->version(), 1);
  EXPECT_EQ((*good)->device(), "cpu x1");

  auto corrupt = manager.Find("corrupt", "");
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("bad archive"));
  // Triton's wording (model_errors.h), which clients match on; the reason after it.
  EXPECT_THAT(std::string(corrupt.status().message()),
              StartsWith("Request for unknown model: 'corrupt' has no available versions ("));
  auto bad = manager.Find("badconfig", "1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("line 1: oops"));
  EXPECT_EQ(manager.Find("nope", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.Find("nope", "").status().message(),
            "Request for unknown model: 'nope' is not found");
  EXPECT_EQ(manager.FindModel("nope").status().message(),
            "Request for unknown model: 'nope' is not found");

  auto index = manager.Index();  // by name, as the repository scan sorts them
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0].name, "badconfig");
  EXPECT_EQ(index[0].version, "");
  EXPECT_EQ(std::string(ModelStateName(index[0].state)), "UNAVAILABLE");
  EXPECT_EQ(index[1].state, ModelState::kUnavailable);
  EXPECT_THAT(index[1].reason, HasSubstr("bad archive"));
  EXPECT_EQ(index[2].name, "good");
  EXPECT_EQ(index[2].state, ModelState::kReady);
}

TEST(ModelManagerTest, ReadinessWaitsForWarmUpOfEveryShapeOnEveryInstance) {
  FakeBackendFactory factory;
  factory.closed_gates = true;  // the first warm-up run blocks until the test opens the gate
  ManagerParts parts(Models({Model("m", {1}, Groups({{InstanceKind::kCpu, 2, {}}}))}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  std::thread loader([&] { ASSERT_TRUE(control.LoadAll().ok()); });
  ASSERT_NE(factory.WaitBackend(1), nullptr);
  factory.backend(0)->WaitStarted(1);
  factory.backend(1)->WaitStarted(1);
  // Warming up: not ready, and requests are told so.
  EXPECT_FALSE(manager.AllReady());
  auto during = manager.Find("m", "");
  EXPECT_EQ(during.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(during.status().message(), HasSubstr("still loading"));
  EXPECT_TRUE(manager.Tunings().empty());
  factory.backend(0)->OpenGate();
  factory.backend(1)->OpenGate();
  loader.join();
  EXPECT_TRUE(manager.AllReady());
  ASSERT_TRUE(manager.Find("m", "").ok());

  // max_batch_size 4 with fixed dims: batch sizes 1..4, each run 3 times on each of 2 instances.
  std::vector<ModelTuning> tunings = manager.Tunings();
  ASSERT_EQ(tunings.size(), 1u);
  EXPECT_TRUE(tunings[0].shapes_finite);
  EXPECT_EQ(tunings[0].shape_count, 4u);
  EXPECT_TRUE(tunings[0].cudnn_benchmark);
  std::set<std::pair<int, std::string>> pairs;
  for (const WarmupPass& pass : tunings[0].warmup) pairs.insert({pass.instance, pass.label});
  EXPECT_EQ(pairs.size(), 8u);
  EXPECT_TRUE(pairs.count({1, "batch=4 INPUT__0[4,2]"}));
  EXPECT_EQ(factory.backend(0)->executed() + factory.backend(1)->executed(), 2 * 4 * 3);
}

TEST(ModelManagerTest, WarmupSwitchAndBenchmarkModes) {
  FakeBackendFactory factory;
  VersionLoader::Options options;
  options.warmup = false;
  options.cudnn_benchmark = CudnnBenchmarkMode::kOff;
  ManagerParts parts(Models({Model("m", {1})}), &factory, options);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_EQ(factory.backend(0)->executed(), 0);
  ASSERT_EQ(manager.Tunings().size(), 1u);
  EXPECT_TRUE(manager.Tunings()[0].warmup.empty());
  EXPECT_FALSE(manager.Tunings()[0].cudnn_benchmark);
  EXPECT_THAT(manager.Tunings()[0].cudnn_reason, HasSubstr("--cudnn-benchmark=off"));
}

TEST(ModelManagerTest, AModelWhoseWarmUpFailsIsUnavailable) {
  FakeBackendFactory factory;
  // A model_warmup sample whose data file does not exist.
  ManagerParts parts(
      Models({Model(
          "m", {1},
          [](ModelSpec& spec) {
            WarmupSampleSpec sample;
            sample.name = "w";
            sample.inputs.push_back(
                {"INPUT__0", DataType::kFp32, {2}, WarmupInputSpec::Source::kFile, "none.bin"});
            spec.warmup_samples.push_back(sample);
          })}),
      &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto found = manager.Find("m", "");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(found.status().message(),
              HasSubstr("model_warmup 'w' input 'INPUT__0': cannot read"));
}

TEST(ModelManagerTest, VersionResolution) {
  FakeBackendFactory factory;
  factory.failures["m/3"] = "version 3 is broken";
  ManagerParts parts(Models({Model("m", {1, 2, 3})}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_EQ((*manager.Find("m", ""))->version(), 2);  // newest *ready* version
  EXPECT_EQ((*manager.Find("m", "1"))->version(), 1);
  EXPECT_EQ(manager.Find("m", "3").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(manager.Find("m", "3").status().message(), HasSubstr("version 3 is broken"));
  EXPECT_THAT(std::string(manager.Find("m", "3").status().message()),
              StartsWith("Request for unknown model: 'm' version 3 is not at ready state ("));
  EXPECT_EQ(manager.Find("m", "4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(manager.Find("m", "4").status().message()),
              StartsWith("Request for unknown model: 'm' version 4 is not found"));
  EXPECT_EQ(manager.Find("m", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(manager.Find("m", "x").status().message()),
              StartsWith("Request for unknown model: 'm' version x is not found"));
  // Digits only: no sign, space, or zero (SimpleAtoi alone would read these as 1, or 0 as "all").
  for (const char* text : {" 1", "1 ", "+1", "0", "-1", "1e0", "0x1", "1234567890123456789"}) {
    EXPECT_EQ(manager.Find("m", text).status().code(), absl::StatusCode::kNotFound) << text;
    EXPECT_EQ(manager.Statistics("m", text).status().code(), absl::StatusCode::kNotFound) << text;
  }
  EXPECT_EQ((*manager.Find("m", "01"))->version(), 1);
  EXPECT_THAT(manager.ReadyVersions("m"), ElementsAre(1, 2));
  EXPECT_FALSE(manager.AllReady());
}

TEST(ModelManagerTest, InstancesPerGroupAndDevice) {
  FakeBackendFactory factory(/*cuda=*/true, /*gpus=*/2);
  ManagerParts parts(
      Models({Model("m", {1}, Groups({{InstanceKind::kCpu, 2, {}}, {InstanceKind::kGpu, 1, {}}}))}),
      &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  ASSERT_TRUE(manager.AllReady());
  std::vector<std::string> devices;
  for (const auto& load : factory.loads) devices.push_back(load.device);
  EXPECT_THAT(devices, ElementsAre("cpu", "cpu", "cuda:0", "cuda:1"));
  EXPECT_EQ((*manager.Find("m", ""))->device(), "cpu,cuda:0,cuda:1 x4");
}

TEST(ModelManagerTest, CpuInstancesOfAllModelsShareTheCores) {
  FakeBackendFactory factory;
  ManagerParts parts(
      Models({Model("a", {1}, Groups({{InstanceKind::kCpu, 2, {}}})), Model("b", {1}),
              Model("c", {1}, [](ModelSpec& spec) { spec.intra_op_threads = 3; })}),
      &factory);
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / 4);  // 2 + 1 + 1 CPU instances
  ASSERT_EQ(factory.loads.size(), 4u);
  EXPECT_EQ(factory.loads[0].intra_op_threads, share);
  EXPECT_EQ(factory.loads[2].intra_op_threads, share);
  EXPECT_EQ(factory.loads[3].intra_op_threads, 3);  // the config wins
}

TEST(ModelManagerTest, GpuIdBeyondVisibleDevicesMakesModelUnavailable) {
  FakeBackendFactory factory(true, 1);
  ManagerParts parts(Models({Model("m", {1}, Groups({{InstanceKind::kGpu, 1, {3}}}))}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_THAT(manager.Find("m", "").status().message(),
              HasSubstr("asks for GPU 3 but 1 GPU(s) are visible"));
}

TEST(ModelManagerTest, DevicePolicies) {
  {
    FakeBackendFactory factory(false, 0);
    VersionLoader::Options options;
    options.device_policy = DevicePolicy::kCuda;
    ManagerParts parts(Models({Model("m", {1})}), &factory, options);
    ModelControl& control = parts.control;
    EXPECT_EQ(control.LoadAll().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    FakeBackendFactory factory(true, 1);
    VersionLoader::Options options;
    options.device_policy = DevicePolicy::kCpu;
    ManagerParts parts(Models({Model("m", {1}, Groups({{InstanceKind::kGpu, 1, {}}}))}), &factory,
                       options);
    ModelControl& control = parts.control;
    ASSERT_TRUE(control.LoadAll().ok());
    EXPECT_EQ(factory.loads.at(0).device, "cpu");
  }
  {
    FakeBackendFactory factory(false, 0);
    ManagerParts parts(Models({Model("m", {1}, Groups({{InstanceKind::kGpu, 1, {}}}))}), &factory);
    ModelManager& manager = parts.manager;
    ModelControl& control = parts.control;
    ASSERT_TRUE(control.LoadAll().ok());
    EXPECT_EQ(factory.loads.at(0).device, "cpu");  // auto falls back
    EXPECT_TRUE(manager.AllReady());
  }
}

TEST(ModelManagerTest, ServesThroughSchedulerAndStops) {
  FakeBackendFactory factory;
  ManagerParts parts(Models({Model("m", {1})}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto servable = manager.Find("m", "");
  ASSERT_TRUE(servable.ok());
  auto result = Send(&**servable, "7").get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outputs[0].data, "7");
  manager.Stop();
  EXPECT_EQ(Send(&**servable, "8").get().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ModelManagerTest, SwapAndRemoveHandBackTheOldVersions) {
  FakeBackendFactory factory;
  VersionLoader loader(&factory, {});
  auto v1 = std::make_shared<const RepositoryModel>(Model("m", {1}));
  ModelManager manager({*v1}, {});
  EXPECT_THAT(manager.Find("m", "").status().message(), HasSubstr("not loaded yet"));
  EXPECT_EQ(manager.TriedFingerprint("m"), std::string());
  EXPECT_EQ(manager.TriedFingerprint("zzz"), std::nullopt);
  EXPECT_TRUE(manager.BeginLoad(v1).empty());
  EXPECT_THAT(manager.Find("m", "").status().message(), HasSubstr("still loading"));
  std::vector<LoadedVersion> first;
  first.push_back(loader.Load(v1, 1, nullptr));
  EXPECT_TRUE(manager.Swap(v1, &first).handles.empty());
  EXPECT_FALSE(manager.AllReady());  // start-up not over
  manager.SetStarted();
  EXPECT_TRUE(manager.AllReady());

  auto v2 = std::make_shared<const RepositoryModel>(Model("m", {2}));
  EXPECT_THAT(manager.BeginLoad(v2), ElementsAre(1));  // version 1 keeps serving meanwhile
  EXPECT_EQ((*manager.Find("m", ""))->version(), 1);
  std::vector<LoadedVersion> second;
  second.push_back(loader.Load(v2, 2, nullptr));
  RetiredVersions retired = manager.Swap(v2, &second);
  ASSERT_EQ(retired.handles.size(), 1u);
  EXPECT_EQ(retired.handles[0]->version(), 1);
  EXPECT_FALSE(retired.stopped);
  EXPECT_EQ((*manager.Find("m", ""))->version(), 2);
  retired.handles[0]->Stop();

  manager.Stop();
  auto v3 = std::make_shared<const RepositoryModel>(Model("m", {3}));
  std::vector<LoadedVersion> third;
  third.push_back(loader.Load(v3, 3, nullptr));
  RetiredVersions after_stop = manager.Swap(v3, &third);
  EXPECT_TRUE(after_stop.stopped);
  EXPECT_EQ(third[0].handle, nullptr);  // stopped and not installed
  EXPECT_THAT(manager.Find("m", "3").status().message(), HasSubstr("shutting down"));

  auto removed = manager.Remove("m", "unloaded", /*forget=*/true);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(manager.Find("m", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.Remove("m", "unloaded", false).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice
