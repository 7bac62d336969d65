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
using testing::FakeBackend;
using testing::FakeBackendFactory;
using testing::Outputs;

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

// A repository in memory for model control: what LoadModel and PollRepository read.
class MemorySource final : public ModelSource {
 public:
  void Put(RepositoryModel model, const std::string& fingerprint) {
    std::lock_guard<std::mutex> lock(mutex_);
    model.fingerprint = fingerprint;
    models_[model.name] = std::move(model);
  }
  void Remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    models_.erase(name);
  }
  StatusOr<std::vector<RepositoryModel>> Scan() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RepositoryModel> models;
    for (const auto& [name, model] : models_) models.push_back(model);
    return models;
  }
  StatusOr<RepositoryModel> Read(const std::string& name) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = models_.find(name);
    if (it == models_.end()) return absl::NotFoundError("no model '" + name + "'");
    return it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, RepositoryModel> models_;
};

// Submits a request with id `id` (one row of INPUT__0) and returns where its answer will be.
std::future<StatusOr<Outputs>> Send(const std::shared_ptr<ModelHandle>& model, const std::string& id) {
  struct Call {
    std::vector<float> data = std::vector<float>(2, 1.0f);
    TensorSink sink;
    std::promise<StatusOr<Outputs>> answer;
  };
  auto call = std::make_shared<Call>();
  auto request = std::make_unique<InferRequest>();
  request->model_name = model->spec().name;
  request->id = id;
  request->inputs.push_back({"INPUT__0", DataType::kFp32, {1, 2}, reinterpret_cast<const char*>(call->data.data()), 8});
  auto answer = call->answer.get_future();
  model->Submit(std::move(request), &call->sink,
                [call](Status status) { call->answer.set_value(testing::Collected(status, call->sink)); });
  return answer;
}

// Closes `backend`'s gate and sends request "1", which starts and blocks there, and request "2",
// which waits in the queue behind it. Both are answered once the gate opens.
std::pair<std::future<StatusOr<Outputs>>, std::future<StatusOr<Outputs>>> HoldTwoRequests(
    FakeBackend* backend, const std::shared_ptr<ModelHandle>& servable) {
  const int warmup_runs = backend->started();
  backend->CloseGate();
  auto running = Send(servable, "1");
  backend->WaitStarted(warmup_runs + 1);
  return {std::move(running), Send(servable, "2")};
}

ModelManager::Options Control(ModelControlMode mode, const ModelSource* source,
                              std::vector<std::string> startup = {}) {
  ModelManager::Options options;
  options.control_mode = mode;
  options.source = source;
  options.startup_models = std::move(startup);
  return options;
}

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
  EXPECT_EQ((*good)->version(), 1);
  EXPECT_EQ((*good)->device(), "cpu x1");

  auto corrupt = manager.Find("corrupt", "");
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("bad archive"));
  auto bad = manager.Find("badconfig", "1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("line 1: oops"));
  EXPECT_EQ(manager.Find("nope", "").status().code(), absl::StatusCode::kNotFound);

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
  EXPECT_EQ((*manager.Find("m", ""))->version(), 2);  // newest *ready* version
  EXPECT_EQ((*manager.Find("m", "1"))->version(), 1);
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
  EXPECT_EQ((*manager.Find("m", ""))->device(), "cpu,cuda:0,cuda:1 x4");
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
  auto result = Send(*servable, "7").get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outputs[0].data, "7");
  manager.Stop();
  EXPECT_EQ(Send(*servable, "8").get().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ModelHandleTest, SubmitValidatesAndAppliesTheQueueTimeout) {
  FakeBackendFactory factory;
  ModelManager manager(Models({Model("m", {1},
                                     "dynamic_batching { default_queue_policy { default_timeout_microseconds: "
                                     "60000000 allow_timeout_override: true } }")}),
                       &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  auto model = manager.Find("m", "");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->in_flight(), 1);  // this lookup's reference
  {
    auto another = manager.Find("m", "");
    EXPECT_EQ((*model)->in_flight(), 2);
  }
  EXPECT_EQ((*model)->in_flight(), 1);

  // A request that does not fit the model is answered at once and counted as a failure.
  auto wrong = std::make_unique<InferRequest>();
  wrong->model_name = "m";
  std::promise<Status> invalid;
  TensorSink unused;
  (*model)->Submit(std::move(wrong), &unused, [&](Status status) { invalid.set_value(status); });
  EXPECT_EQ(invalid.get_future().get().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->Statistics().fail.count, 1u);

  // The request's own timeout (allowed by the config) replaces the 60 s default: it expires in
  // the queue behind a request held in the model.
  FakeBackend* backend = factory.backend(0);
  const int warmup_runs = backend->started();
  backend->CloseGate();
  auto running = Send(*model, "1");
  backend->WaitStarted(warmup_runs + 1);
  struct Call {
    std::vector<float> data = std::vector<float>(2, 0.0f);
    TensorSink sink;
    std::promise<Status> answer;
  } call;
  auto quick = std::make_unique<InferRequest>();
  quick->model_name = "m";
  quick->parameters.timeout_us = 1000;
  quick->inputs.push_back({"INPUT__0", DataType::kFp32, {1, 2}, reinterpret_cast<const char*>(call.data.data()), 8});
  (*model)->Submit(std::move(quick), &call.sink, [&](Status status) { call.answer.set_value(status); });
  auto answer = call.answer.get_future();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(20)), std::future_status::ready);  // not the 60 s default
  EXPECT_EQ(answer.get().code(), absl::StatusCode::kDeadlineExceeded);
  backend->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(backend->executed(), warmup_runs + 1);
}

TEST(ModelControlTest, ParsesModes) {
  EXPECT_EQ(*ParseModelControlMode("explicit"), ModelControlMode::kExplicit);
  EXPECT_EQ(*ParseModelControlMode("poll"), ModelControlMode::kPoll);
  EXPECT_EQ(*ParseModelControlMode("none"), ModelControlMode::kNone);
  EXPECT_THAT(ParseModelControlMode("sometimes").status().message(), HasSubstr("none, poll or explicit"));
}

TEST(ModelControlTest, ExplicitModeLoadsStartupModelsThenOnRequest) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"a"}));
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_TRUE(manager.Find("a", "").ok());
  auto b = manager.Find("b", "");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.status().message(), HasSubstr("not loaded"));
  EXPECT_TRUE(manager.AllReady());  // readiness counts the models asked for
  auto index = manager.Index();
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[1].name, "b");
  EXPECT_EQ(index[1].version, "");
  EXPECT_THAT(index[1].reason, HasSubstr("RepositoryModelLoad"));

  int changes = 0;
  manager.SetChangeListener([&] { ++changes; });
  ASSERT_TRUE(manager.LoadModel("b").ok());
  EXPECT_EQ(changes, 1);
  auto loaded = manager.Find("b", "");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(Send(*loaded, "3").get()->outputs[0].data, "3");
  loaded = StatusOr<std::shared_ptr<ModelHandle>>(absl::CancelledError("released"));

  EXPECT_EQ(manager.LoadModel("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(manager.UnloadModel("a").ok());
  EXPECT_EQ(changes, 2);  // a name the source does not have changes nothing
  auto a = manager.Find("a", "1");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.status().message(), HasSubstr("unloaded"));
  index = manager.Index();
  EXPECT_EQ(index[0].version, "1");
  EXPECT_EQ(index[0].state, ModelState::kUnavailable);
  EXPECT_EQ(index[0].reason, "unloaded");
  EXPECT_TRUE(manager.AllReady());  // an unloaded model is not asked for
  EXPECT_TRUE(manager.UnloadModel("a").ok());  // again: nothing to do
  EXPECT_EQ(manager.UnloadModel("zzz").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(manager.LoadModel("a").ok());  // back again
  EXPECT_TRUE(manager.Find("a", "").ok());
}

TEST(ModelControlTest, StarLoadsEveryModelAndAFailedNewModelIsNotReady) {
  FakeBackendFactory factory;
  factory.failures["c"] = "cannot load c: bad archive";
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"*"}));
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_TRUE(manager.Find("a", "").ok());
  EXPECT_TRUE(manager.Find("b", "").ok());
  EXPECT_TRUE(manager.AllReady());
  source.Put(Model("c", {1}), "c1");
  Status status = manager.LoadModel("c");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("bad archive"));
  EXPECT_FALSE(manager.AllReady());  // asked for and not ready, as at start-up
  ASSERT_TRUE(manager.UnloadModel("c").ok());
  EXPECT_TRUE(manager.AllReady());
}

// The heart of a live reload: a request running on the old version and one queued behind it
// both finish on it; lookups after the swap get the new version; the old one is stopped only
// when its last request is answered, and LoadModel returns only then.
TEST(ModelControlTest, ReloadSwapsVersionsAndOldRequestsFinishOnTheOld) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ASSERT_TRUE(manager.LoadAll().ok());
  auto old_version = manager.Find("m", "");
  ASSERT_TRUE(old_version.ok());
  FakeBackend* old_backend = factory.backend(0);
  auto [running, queued] = HoldTwoRequests(old_backend, *old_version);

  source.Put(Model("m", {2}), "v2");  // version 2 appears; the latest policy serves only it
  auto reload = std::async(std::launch::async, [&] { return manager.LoadModel("m"); });
  // The swap happens once version 2 is ready; the reload then waits for the old requests.
  for (int i = 0; i < 2000 && !(manager.Find("m", "").ok() && (*manager.Find("m", ""))->version() == 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto new_version = manager.Find("m", "");
  ASSERT_TRUE(new_version.ok());
  EXPECT_EQ((*new_version)->version(), 2);
  EXPECT_EQ(Send(*new_version, "5").get()->outputs[0].data, "5");
  EXPECT_EQ(manager.Find("m", "1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);

  old_backend->OpenGate();
  auto first = running.get();
  auto second = queued.get();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->outputs[0].data, "1");
  EXPECT_EQ(second->outputs[0].data, "2");
  EXPECT_EQ(reload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);  // still held here
  old_version = StatusOr<std::shared_ptr<ModelHandle>>(absl::CancelledError("released"));
  ASSERT_TRUE(reload.get().ok());
  // The old scheduler stopped; the new one serves.
  EXPECT_EQ(Send(*new_version, "6").get()->outputs[0].data, "6");
}

TEST(ModelControlTest, AFailedReloadKeepsTheOldVersionServing) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ASSERT_TRUE(manager.LoadAll().ok());

  factory.failures["m/2"] = "cannot load /repo/m/2/model.pt: truncated";
  source.Put(Model("m", {2}), "v2");
  Status status = manager.LoadModel("m");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  EXPECT_THAT(status.message(), HasSubstr("version(s) 1 keep serving"));
  auto still = manager.Find("m", "");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ((*still)->version(), 1);
  EXPECT_EQ(Send(*still, "4").get()->outputs[0].data, "4");

  source.Put(Broken("m", "config.pbtxt line 3: oops"), "v3");
  status = manager.LoadModel("m");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("line 3: oops"));
  EXPECT_TRUE(manager.Find("m", "1").ok());
  EXPECT_TRUE(manager.AllReady());
  auto index = manager.Index();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].state, ModelState::kReady);
}

TEST(ModelControlTest, UnloadRefusesNewRequestsAtOnceAndWaitsForAdmittedOnes) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ASSERT_TRUE(manager.LoadAll().ok());
  auto servable = manager.Find("m", "");
  ASSERT_TRUE(servable.ok());
  FakeBackend* backend = factory.backend(0);
  auto [running, queued] = HoldTwoRequests(backend, *servable);
  auto unload = std::async(std::launch::async, [&] { return manager.UnloadModel("m"); });
  for (int i = 0; i < 2000 && manager.Find("m", "").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(manager.Find("m", "").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(unload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  backend->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_TRUE(queued.get().ok());
  servable = StatusOr<std::shared_ptr<ModelHandle>>(absl::CancelledError("released"));
  EXPECT_TRUE(unload.get().ok());
}

TEST(ModelControlTest, StopEndsADrainThatWouldWaitForever) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ASSERT_TRUE(manager.LoadAll().ok());
  auto held = manager.Find("m", "");  // never released during the test
  ASSERT_TRUE(held.ok());
  auto unload = std::async(std::launch::async, [&] { return manager.UnloadModel("m"); });
  EXPECT_EQ(unload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  manager.Stop();
  EXPECT_TRUE(unload.get().ok());
  EXPECT_EQ(Send(*held, "1").get().status().code(), absl::StatusCode::kUnavailable);  // stopped
  EXPECT_EQ(manager.LoadModel("m").code(), absl::StatusCode::kUnavailable);
}

TEST(ModelControlTest, PollLoadsNewReloadsChangedAndForgetsRemovedModels) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ModelManager manager(*source.Scan(), &factory, Control(ModelControlMode::kPoll, &source));
  ASSERT_TRUE(manager.LoadAll().ok());
  const size_t initial_loads = factory.loads.size();
  ASSERT_TRUE(manager.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads);  // nothing changed: nothing loads

  source.Put(Model("a", {1}), "a1-touched");
  source.Put(Model("c", {1}), "c1");
  source.Remove("b");
  ASSERT_TRUE(manager.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads + 2);  // a again, and c
  EXPECT_TRUE(manager.Find("a", "").ok());
  EXPECT_TRUE(manager.Find("c", "").ok());
  EXPECT_EQ(manager.Find("b", "").status().code(), absl::StatusCode::kNotFound);
  auto index = manager.Index();
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0].name, "a");
  EXPECT_EQ(index[1].name, "c");
  EXPECT_TRUE(manager.AllReady());

  // A change that fails to load keeps the old version, and is not retried until the files
  // change again.
  factory.failures["a"] = "cannot load: half-copied file";
  source.Put(Model("a", {1}), "a1-half-copied");
  ASSERT_TRUE(manager.PollRepository().ok());
  ASSERT_TRUE(manager.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads + 3);
  EXPECT_TRUE(manager.Find("a", "").ok());
  factory.failures.clear();
  source.Put(Model("a", {1}), "a1-complete");
  ASSERT_TRUE(manager.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads + 4);
  EXPECT_TRUE(manager.Find("a", "").ok());
}

TEST(ModelControlTest, WithoutASourceControlIsAnError) {
  FakeBackendFactory factory;
  ModelManager manager(Models({Model("m", {1})}), &factory, {});
  ASSERT_TRUE(manager.LoadAll().ok());
  EXPECT_EQ(manager.LoadModel("m").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.PollRepository().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sluice
