#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_manager.h"
#include "server/repository/model_config_parser.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::FakeBackendFactory;

RepositoryModel Model(const std::string& name, std::vector<int64_t> versions,
                      const std::string& extra_config = "") {
  RepositoryModel model;
  model.name = name;
  model.directory = "/repo/" + name;
  auto config = ParseModelConfigText(
      "max_batch_size: 4\n"
      "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n" + extra_config, name);
  EXPECT_TRUE(config.ok()) << config.status();
  model.config = *config;
  auto spec = BuildModelSpec(name, &model.config);
  EXPECT_TRUE(spec.ok()) << spec.status();
  model.spec = *spec;
  for (int64_t v : versions) model.versions[v] = model.directory / std::to_string(v) / "model.pt";
  return model;
}

RepositoryModel Broken(const std::string& name, const std::string& why) {
  RepositoryModel model;
  model.name = name;
  model.status = absl::InvalidArgumentError(why);
  return model;
}

std::vector<RepositoryModel> Models(std::vector<RepositoryModel> models) { return models; }

TEST(ModelManagerTest, BrokenModelsAreUnavailableWhileOthersServe) {
  FakeBackendFactory factory;
  factory.failures["corrupt"] = "cannot load /repo/corrupt/1/model.pt: bad archive";
  ModelManager manager(Models({Model("good", {1}), Model("corrupt", {1}), Broken("badconfig", "line 1: oops")}),
                       &factory, {});
  EXPECT_FALSE(manager.AllReady());  // before loading
  EXPECT_EQ(manager.Find("good", "").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_FALSE(manager.AllReady());
  auto good = manager.Find("good", "");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->version, 1);
  EXPECT_EQ(good->device, "cpu x1");

  auto corrupt = manager.Find("corrupt", "");
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("bad archive"));
  auto bad = manager.Find("badconfig", "1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("line 1: oops"));
  EXPECT_EQ(manager.Find("nope", "").status().code(), absl::StatusCode::kNotFound);

  auto index = manager.Index();
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0].name, "good");
  EXPECT_EQ(index[0].state, ModelState::kReady);
  EXPECT_EQ(index[1].state, ModelState::kUnavailable);
  EXPECT_THAT(index[1].reason, HasSubstr("bad archive"));
  EXPECT_EQ(index[2].version, "");
  EXPECT_EQ(std::string(ModelStateName(index[2].state)), "UNAVAILABLE");
}

TEST(ModelManagerTest, ReadinessWaitsForWarmUpOfEveryShapeOnEveryInstance) {
  FakeBackendFactory factory;
  factory.closed_gates = true;  // the first warm-up run blocks until the test opens the gate
  ModelManager manager(Models({Model("m", {1}, "instance_group [ { kind: KIND_CPU count: 2 } ]")}), &factory, {});
  std::thread loader([&] { ASSERT_TRUE(manager.LoadAll().ok()); });
  while (factory.backend(1) == nullptr) std::this_thread::yield();
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
  ModelManager::Options options;
  options.warmup = false;
  options.cudnn_benchmark = CudnnBenchmarkMode::kOff;
  ModelManager manager(Models({Model("m", {1})}), &factory, options);
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_EQ(factory.backend(0)->executed(), 0);
  ASSERT_EQ(manager.Tunings().size(), 1u);
  EXPECT_TRUE(manager.Tunings()[0].warmup.empty());
  EXPECT_FALSE(manager.Tunings()[0].cudnn_benchmark);
  EXPECT_THAT(manager.Tunings()[0].cudnn_reason, HasSubstr("--cudnn-benchmark=off"));
}

TEST(ModelManagerTest, AModelWhoseWarmUpFailsIsUnavailable) {
  FakeBackendFactory factory;
  // A model_warmup sample whose data file does not exist.
  ModelManager manager(
      Models({Model("m", {1}, "model_warmup [ { name: \"w\" batch_size: 1 inputs { key: \"INPUT__0\" "
                              "value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: \"none.bin\" } } } ]")}),
      &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  auto found = manager.Find("m", "");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(found.status().message(), HasSubstr("model_warmup 'w' input 'INPUT__0': cannot read"));
}

TEST(ModelManagerTest, VersionResolution) {
  FakeBackendFactory factory;
  factory.failures["m/3"] = "version 3 is broken";
  ModelManager manager(Models({Model("m", {1, 2, 3})}), &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_EQ(manager.Find("m", "")->version, 2);  // newest *ready* version
  EXPECT_EQ(manager.Find("m", "1")->version, 1);
  EXPECT_EQ(manager.Find("m", "3").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(manager.Find("m", "3").status().message(), HasSubstr("version 3 is broken"));
  EXPECT_EQ(manager.Find("m", "4").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.Find("m", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(manager.ReadyVersions("m"), ElementsAre(1, 2));
  EXPECT_FALSE(manager.AllReady());
}

TEST(ModelManagerTest, InstancesPerGroupAndDevice) {
  FakeBackendFactory factory(/*cuda=*/true, /*gpus=*/2);
  ModelManager manager(
      Models({Model("m", {1}, "instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_GPU count: 1 } ]")}),
      &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  ASSERT_TRUE(manager.AllReady());
  std::vector<std::string> devices;
  for (const auto& load : factory.loads) devices.push_back(load.device);
  EXPECT_THAT(devices, ElementsAre("cpu", "cpu", "cuda:0", "cuda:1"));
  EXPECT_EQ(manager.Find("m", "")->device, "cpu,cuda:0,cuda:1 x4");
}

TEST(ModelManagerTest, CpuInstancesOfAllModelsShareTheCores) {
  FakeBackendFactory factory;
  ModelManager manager(
      Models({Model("a", {1}, "instance_group [ { kind: KIND_CPU count: 2 } ]"), Model("b", {1}),
              Model("c", {1}, "parameters { key: \"INTRA_OP_THREAD_COUNT\" value { string_value: \"3\" } }")}),
      &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / 4);  // 2 + 1 + 1 CPU instances
  ASSERT_EQ(factory.loads.size(), 4u);
  EXPECT_EQ(factory.loads[0].intra_op_threads, share);
  EXPECT_EQ(factory.loads[2].intra_op_threads, share);
  EXPECT_EQ(factory.loads[3].intra_op_threads, 3);  // the config wins
}

TEST(ModelManagerTest, GpuIdBeyondVisibleDevicesMakesModelUnavailable) {
  FakeBackendFactory factory(true, 1);
  ModelManager manager(Models({Model("m", {1}, "instance_group [ { kind: KIND_GPU gpus: [ 3 ] } ]")}), &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_THAT(manager.Find("m", "").status().message(), HasSubstr("asks for GPU 3 but 1 GPU(s) are visible"));
}

TEST(ModelManagerTest, DevicePolicies) {
  {
    FakeBackendFactory factory(false, 0);
    ModelManager::Options options;
    options.device_policy = DevicePolicy::kCuda;
    ModelManager manager(Models({Model("m", {1})}), &factory, options);
    EXPECT_EQ(manager.LoadAll().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    FakeBackendFactory factory(true, 1);
    ModelManager::Options options;
    options.device_policy = DevicePolicy::kCpu;
    ModelManager manager(Models({Model("m", {1}, "instance_group [ { kind: KIND_GPU } ]")}), &factory, options);
    ASSERT_TRUE(manager.LoadAll().ok());
    EXPECT_EQ(factory.loads.at(0).device, "cpu");
  }
  {
    FakeBackendFactory factory(false, 0);
    ModelManager manager(Models({Model("m", {1}, "instance_group [ { kind: KIND_GPU } ]")}), &factory, {});
    ASSERT_TRUE(manager.LoadAll().ok());
    EXPECT_EQ(factory.loads.at(0).device, "cpu");  // auto falls back
    EXPECT_TRUE(manager.AllReady());
  }
}

TEST(ModelManagerTest, ServesThroughSchedulerAndStops) {
  FakeBackendFactory factory;
  ModelManager manager(Models({Model("m", {1})}), &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  auto servable = manager.Find("m", "");
  ASSERT_TRUE(servable.ok());
  std::promise<StatusOr<InferResponse>> answer;
  auto request = std::make_unique<InferRequest>();
  request->id = "7";
  servable->scheduler->Enqueue(std::move(request), [&](StatusOr<InferResponse> r) { answer.set_value(std::move(r)); });
  auto result = answer.get_future().get();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outputs[0].data, "7");
  manager.Stop();
  std::promise<StatusOr<InferResponse>> late;
  servable->scheduler->Enqueue(std::make_unique<InferRequest>(), [&](StatusOr<InferResponse> r) { late.set_value(std::move(r)); });
  EXPECT_EQ(late.get_future().get().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice
