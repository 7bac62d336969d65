#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "server/manager/version_loader.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

ModelOverride ConfigOverride(std::string json) {
  ModelOverride override;
  override.config_json = std::move(json);
  return override;
}

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::FakeBackend;
using testing::FakeBackendFactory;
using testing::Outputs;

// INPUT__0 FP32 [2] -> OUTPUT__0 FP32 [2], max_batch_size 4, one KIND_AUTO instance, as the
// repository would build it from a config.pbtxt with nothing else in it. `edit` changes the spec
// as more config would (the parser's own tests cover the config side).
RepositoryModel Model(const std::string& name, std::vector<int64_t> versions,
                      const std::function<void(ModelSpec&)>& edit = nullptr) {
  RepositoryModel model;
  model.name = name;
  model.directory = "/repo/" + name;
  ModelSpec& spec = model.spec;
  spec.name = name;
  spec.max_batch_size = 4;
  spec.inputs.push_back({"INPUT__0", DataType::kFp32, {2}});
  spec.outputs.push_back({"OUTPUT__0", DataType::kFp32, {2}});
  spec.instance_groups.push_back({InstanceKind::kAuto, 1, {}});
  if (edit) edit(spec);
  for (int64_t v : versions) model.versions[v] = model.directory / std::to_string(v) / "model.pt";
  return model;
}

std::function<void(ModelSpec&)> Groups(std::vector<InstanceGroupSpec> groups) {
  return [groups](ModelSpec& spec) { spec.instance_groups = groups; };
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
  std::optional<std::string> last_override() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_override_;
  }
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
  StatusOr<RepositoryModel> Read(const std::string& name, const ModelOverride& override) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    last_override_ = override.config_json;
    auto it = models_.find(name);
    if (it == models_.end()) return absl::NotFoundError("no model '" + name + "'");
    return it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, RepositoryModel> models_;
  mutable std::optional<std::string> last_override_;
};

// Submits a request with id `id` (one row of INPUT__0) and returns where its answer will be.
std::future<StatusOr<Outputs>> Send(ModelHandle* model, const std::string& id) {
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
    FakeBackend* backend, ModelHandle* servable) {
  const int warmup_runs = backend->started();
  backend->CloseGate();
  auto running = Send(servable, "1");
  backend->WaitStarted(warmup_runs + 1);
  return {std::move(running), Send(servable, "2")};
}

// The manager's three parts wired as the server wires them.
struct ManagerParts {
  ManagerParts(std::vector<RepositoryModel> models, FakeBackendFactory* factory, VersionLoader::Options loader_options = {},
          ModelControl::Options control_options = {})
      : loader(factory, std::move(loader_options)),
        manager(std::move(models), {}),
        control(&manager, &loader, std::move(control_options)) {}
  VersionLoader loader;
  ModelManager manager;
  ModelControl control;
};

ModelControl::Options Control(ModelControlMode mode, const ModelSource* source,
                              std::vector<std::string> startup = {}) {
  ModelControl::Options options;
  options.mode = mode;
  options.source = source;
  options.startup_models = std::move(startup);
  return options;
}

TEST(ModelManagerTest, BrokenModelsAreUnavailableWhileOthersServe) {
  FakeBackendFactory factory;
  factory.failures["corrupt"] = "cannot load /repo/corrupt/1/model.pt: bad archive";
  ManagerParts parts(Models({Model("good", {1}), Model("corrupt", {1}), Broken("badconfig", "line 1: oops")}), &factory);
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
  EXPECT_EQ(manager.Find("nope", "").status().message(), "Request for unknown model: 'nope' is not found");
  EXPECT_EQ(manager.FindModel("nope").status().message(), "Request for unknown model: 'nope' is not found");

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
      Models({Model("m", {1}, [](ModelSpec& spec) {
        WarmupSampleSpec sample;
        sample.name = "w";
        sample.inputs.push_back({"INPUT__0", DataType::kFp32, {2}, WarmupInputSpec::Source::kFile, "none.bin"});
        spec.warmup_samples.push_back(sample);
      })}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto found = manager.Find("m", "");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(found.status().message(), HasSubstr("model_warmup 'w' input 'INPUT__0': cannot read"));
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
  EXPECT_THAT(manager.ReadyVersions("m"), ElementsAre(1, 2));
  EXPECT_FALSE(manager.AllReady());
}

TEST(ModelManagerTest, InstancesPerGroupAndDevice) {
  FakeBackendFactory factory(/*cuda=*/true, /*gpus=*/2);
  ManagerParts parts(
      Models({Model("m", {1}, Groups({{InstanceKind::kCpu, 2, {}}, {InstanceKind::kGpu, 1, {}}}))}), &factory);
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
              Model("c", {1}, [](ModelSpec& spec) { spec.intra_op_threads = 3; })}), &factory);
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
  EXPECT_THAT(manager.Find("m", "").status().message(), HasSubstr("asks for GPU 3 but 1 GPU(s) are visible"));
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
    ManagerParts parts(Models({Model("m", {1}, Groups({{InstanceKind::kGpu, 1, {}}}))}), &factory, options);
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

TEST(ModelHandleTest, SubmitValidatesAndAppliesTheQueueTimeout) {
  FakeBackendFactory factory;
  ManagerParts parts(Models({Model("m", {1}, [](ModelSpec& spec) {
    spec.dynamic_batching.enabled = true;
    spec.dynamic_batching.default_timeout_us = 60000000;
    spec.dynamic_batching.allow_timeout_override = true;
  })}), &factory);
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
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
  auto running = Send(&**model, "1");
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

// A scheduler that holds the sequences it is told about (for routing tests).
class HeldSequences final : public SequenceScheduler {
 public:
  explicit HeldSequences(std::set<uint64_t> ids) : ids_(std::move(ids)) {}
  void Enqueue(std::unique_ptr<InferRequest>, OutputSink*, InferCompletion done) override { done(absl::OkStatus()); }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    return WarmupReport{};
  }
  void SetBatchSizeLadder(std::vector<int>) override {}
  void Stop() override {}
  bool HasSequence(const CorrelationId& id) const override { return !id.is_text && ids_.count(id.number) > 0; }
  size_t ActiveSequences() const override { return ids_.size(); }
  bool WaitSequencesEnded(std::chrono::steady_clock::time_point) override { return false; }
  void EndSequences(const Status&) override {}

 private:
  const std::set<uint64_t> ids_;
};

// Finds the newest version; FindSequence looks through `versions` (as the manager looks through
// ready and draining ones).
class TwoVersions final : public ModelLookup {
 public:
  StatusOr<InFlightModel> Find(const std::string&, const std::string&) const override {
    return versions.back()->Acquire();
  }
  StatusOr<InFlightModel> FindSequence(const std::string&, const CorrelationId& id) const override {
    for (const auto& version : versions) {
      if (version->HasSequence(id)) return version->Acquire();
    }
    return absl::NotFoundError("none");
  }
  std::vector<std::shared_ptr<ModelHandle>> versions;
};

TEST(ModelHandleTest, ARequestContinuingASequenceGoesToTheVersionHoldingIt) {
  SteadyTimeSource clock;
  auto model = std::make_shared<RepositoryModel>();
  model->name = "acc";
  model->spec.name = "acc";
  model->spec.sequence_batching.enabled = true;
  TwoVersions lookup;
  lookup.versions.push_back(std::make_shared<ModelHandle>(
      model, 1, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{7}), std::make_shared<ModelStats>(), &clock));
  lookup.versions.push_back(std::make_shared<ModelHandle>(
      model, 2, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{8}), std::make_shared<ModelStats>(), &clock));
  auto route = [&](uint64_t id, bool start, bool version_given) {
    InferRequest request;
    request.parameters.sequence = {{id, "", false}, start, false};
    return RouteSequence(lookup, *lookup.Find("acc", ""), request, version_given)->version();
  };
  EXPECT_EQ(route(7, false, false), 1);  // started on version 1, which still drains it
  EXPECT_EQ(route(8, false, false), 2);
  EXPECT_EQ(route(7, true, false), 2);   // a new start goes to the newest
  EXPECT_EQ(route(9, false, false), 2);  // unknown: the newest answers "not active"
  EXPECT_EQ(route(7, false, true), 2);   // a version asked for is kept
  EXPECT_EQ(route(0, false, false), 2);  // no sequence
  // A model without sequence_batching is never rerouted.
  auto plain = std::make_shared<RepositoryModel>();
  plain->name = "plain";
  TwoVersions stateless;
  stateless.versions.push_back(std::make_shared<ModelHandle>(
      plain, 1, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{7}), std::make_shared<ModelStats>(), &clock));
  stateless.versions.push_back(std::make_shared<ModelHandle>(
      plain, 2, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{}), std::make_shared<ModelStats>(), &clock));
  InferRequest request;
  request.parameters.sequence = {{7, "", false}, false, false};
  EXPECT_EQ(RouteSequence(stateless, *stateless.Find("plain", ""), request, false)->version(), 2);
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
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"a"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
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
  control.SetChangeListener([&] { ++changes; });
  ASSERT_TRUE(control.LoadModel("b").ok());
  EXPECT_EQ(changes, 1);
  auto loaded = manager.Find("b", "");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(Send(&**loaded, "3").get()->outputs[0].data, "3");
  loaded = StatusOr<InFlightModel>(absl::CancelledError("released"));

  const Status nope = control.LoadModel("nope");
  EXPECT_EQ(nope.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(nope.message(), "failed to load 'nope': no model 'nope'");  // Triton's start, then why
  // A load's config override reaches the source for that load only.
  ASSERT_TRUE(control.LoadModel("b", ConfigOverride(std::string(R"({"max_batch_size": 4})"))).ok());
  EXPECT_EQ(source.last_override(), std::optional<std::string>(R"({"max_batch_size": 4})"));
  ASSERT_TRUE(control.LoadModel("b").ok());
  EXPECT_EQ(source.last_override(), std::nullopt);
  changes = 1;  // the reloads above are changes too
  ASSERT_TRUE(control.UnloadModel("a").ok());
  EXPECT_EQ(changes, 2);  // a name the source does not have changes nothing
  auto a = manager.Find("a", "1");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.status().message(), HasSubstr("unloaded"));
  index = manager.Index();
  EXPECT_EQ(index[0].version, "1");
  EXPECT_EQ(index[0].state, ModelState::kUnavailable);
  EXPECT_EQ(index[0].reason, "unloaded");
  EXPECT_TRUE(manager.AllReady());  // an unloaded model is not asked for
  EXPECT_TRUE(control.UnloadModel("a").ok());  // again: nothing to do
  EXPECT_EQ(control.UnloadModel("zzz").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(control.LoadModel("a").ok());  // back again
  EXPECT_TRUE(manager.Find("a", "").ok());
}

TEST(ModelControlTest, StarLoadsEveryModelAndAFailedNewModelIsNotReady) {
  FakeBackendFactory factory;
  factory.failures["c"] = "cannot load c: bad archive";
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"*"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_TRUE(manager.Find("a", "").ok());
  EXPECT_TRUE(manager.Find("b", "").ok());
  EXPECT_TRUE(manager.AllReady());
  source.Put(Model("c", {1}), "c1");
  Status status = control.LoadModel("c");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("bad archive"));
  EXPECT_FALSE(manager.AllReady());  // asked for and not ready, as at start-up
  ASSERT_TRUE(control.UnloadModel("c").ok());
  EXPECT_TRUE(manager.AllReady());
}

// The heart of a live reload: a request running on the old version and one queued behind it
// both finish on it; lookups after the swap get the new version; the old one is stopped only
// when its last request is answered, and LoadModel returns only then.
TEST(ModelControlTest, ReloadSwapsVersionsAndOldRequestsFinishOnTheOld) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto old_version = manager.Find("m", "");
  ASSERT_TRUE(old_version.ok());
  FakeBackend* old_backend = factory.backend(0);
  auto [running, queued] = HoldTwoRequests(old_backend, &**old_version);

  source.Put(Model("m", {2}), "v2");  // version 2 appears; the latest policy serves only it
  auto reload = std::async(std::launch::async, [&] { return control.LoadModel("m"); });
  // The swap happens once version 2 is ready; the reload then waits for the old requests.
  for (int i = 0; i < 2000 && !(manager.Find("m", "").ok() && (*manager.Find("m", ""))->version() == 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto new_version = manager.Find("m", "");
  ASSERT_TRUE(new_version.ok());
  EXPECT_EQ((*new_version)->version(), 2);
  EXPECT_EQ(Send(&**new_version, "5").get()->outputs[0].data, "5");
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
  old_version = StatusOr<InFlightModel>(absl::CancelledError("released"));
  ASSERT_TRUE(reload.get().ok());
  // The old scheduler stopped; the new one serves.
  EXPECT_EQ(Send(&**new_version, "6").get()->outputs[0].data, "6");
}

TEST(ModelControlTest, AFailedReloadKeepsTheOldVersionServing) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());

  factory.failures["m/2"] = "cannot load /repo/m/2/model.pt: truncated";
  source.Put(Model("m", {2}), "v2");
  Status status = control.LoadModel("m");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  EXPECT_THAT(status.message(), HasSubstr("version(s) 1 keep serving"));
  auto still = manager.Find("m", "");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ((*still)->version(), 1);
  EXPECT_EQ(Send(&**still, "4").get()->outputs[0].data, "4");

  source.Put(Broken("m", "config.pbtxt line 3: oops"), "v3");
  status = control.LoadModel("m");
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
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto servable = manager.Find("m", "");
  ASSERT_TRUE(servable.ok());
  FakeBackend* backend = factory.backend(0);
  auto [running, queued] = HoldTwoRequests(backend, &**servable);
  auto unload = std::async(std::launch::async, [&] { return control.UnloadModel("m"); });
  for (int i = 0; i < 2000 && manager.Find("m", "").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(manager.Find("m", "").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(unload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  backend->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_TRUE(queued.get().ok());
  servable = StatusOr<InFlightModel>(absl::CancelledError("released"));
  EXPECT_TRUE(unload.get().ok());
}

TEST(ModelControlTest, StopEndsADrainThatWouldWaitForever) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"m"}));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  auto held = manager.Find("m", "");  // never released during the test
  ASSERT_TRUE(held.ok());
  auto unload = std::async(std::launch::async, [&] { return control.UnloadModel("m"); });
  EXPECT_EQ(unload.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  control.Stop();
  EXPECT_TRUE(unload.get().ok());
  EXPECT_EQ(Send(&**held, "1").get().status().code(), absl::StatusCode::kUnavailable);  // stopped
  EXPECT_EQ(control.LoadModel("m").code(), absl::StatusCode::kUnavailable);
}

TEST(ModelControlTest, PollLoadsNewReloadsChangedAndForgetsRemovedModels) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kPoll, &source));
  ModelManager& manager = parts.manager;
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  const size_t initial_loads = factory.loads.size();
  ASSERT_TRUE(control.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads);  // nothing changed: nothing loads

  source.Put(Model("a", {1}), "a1-touched");
  source.Put(Model("c", {1}), "c1");
  source.Remove("b");
  ASSERT_TRUE(control.PollRepository().ok());
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
  ASSERT_TRUE(control.PollRepository().ok());
  ASSERT_TRUE(control.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads + 3);
  EXPECT_TRUE(manager.Find("a", "").ok());
  factory.failures.clear();
  source.Put(Model("a", {1}), "a1-complete");
  ASSERT_TRUE(control.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), initial_loads + 4);
  EXPECT_TRUE(manager.Find("a", "").ok());
}

TEST(ModelControlTest, WithoutASourceControlIsAnError) {
  FakeBackendFactory factory;
  ManagerParts parts(Models({Model("m", {1})}), &factory);
  ModelControl& control = parts.control;
  ASSERT_TRUE(control.LoadAll().ok());
  EXPECT_EQ(control.LoadModel("m").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(control.PollRepository().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ModelControlTest, TheControlThreadLoadsAtStartThenRunsTasksInOrder) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"m"}));
  std::promise<Status> loaded;
  parts.control.Start([&](const Status& status) { loaded.set_value(status); });
  ASSERT_TRUE(loaded.get_future().get().ok());
  EXPECT_TRUE(parts.manager.AllReady());

  std::vector<int> order;
  std::promise<void> both;
  parts.control.Submit([&] { order.push_back(1); return parts.control.UnloadModel("m"); },
                       [&](const Status& status) { EXPECT_TRUE(status.ok()); });
  parts.control.Submit([&] { order.push_back(2); return absl::NotFoundError("second"); },
                       [&](const Status& status) {
                         EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
                         both.set_value();
                       });
  both.get_future().get();
  EXPECT_THAT(order, ElementsAre(1, 2));
  EXPECT_EQ(parts.manager.Find("m", "").status().code(), absl::StatusCode::kUnavailable);

  parts.control.Stop();
  std::promise<Status> late;
  parts.control.Submit([] { return absl::OkStatus(); }, [&](const Status& status) { late.set_value(status); });
  EXPECT_EQ(late.get_future().get().code(), absl::StatusCode::kUnavailable);  // answered, never lost
}

TEST(ModelControlTest, StartMarksModelsAtOnceAndLoadsAheadOfEarlierTasks) {
  FakeBackendFactory factory;
  factory.closed_gates = true;  // a's warm-up blocks until the gate opens
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ManagerParts parts(*source.Scan(), &factory, {}, Control(ModelControlMode::kExplicit, &source, {"a"}));
  std::promise<bool> a_ready_when_task_ran;
  parts.control.Submit([&] { a_ready_when_task_ran.set_value(parts.manager.Find("a", "").ok()); return absl::OkStatus(); },
                       nullptr);
  std::promise<Status> loaded;
  parts.control.Start([&](const Status& status) { loaded.set_value(status); });

  // Before the control thread gets anywhere: a is LOADING, b says why it is not loaded.
  std::map<std::string, ModelIndexEntry> index;
  for (const ModelIndexEntry& entry : parts.manager.Index()) index[entry.name] = entry;
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index["a"].state, ModelState::kLoading);
  EXPECT_EQ(index["b"].state, ModelState::kUnavailable);
  EXPECT_THAT(index["b"].reason, HasSubstr("--model-control-mode explicit"));

  for (int i = 0; i < 4000 && factory.backend(0) == nullptr; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_NE(factory.backend(0), nullptr);
  factory.backend(0)->OpenGate();
  ASSERT_TRUE(loaded.get_future().get().ok());
  // The task submitted before Start ran after the start-up load.
  EXPECT_TRUE(a_ready_when_task_ran.get_future().get());
  parts.control.Stop();
}

TEST(ModelControlTest, TasksQueuedBeforeStartAreAnsweredWhenItNeverStarts) {
  FakeBackendFactory factory;
  ManagerParts parts(Models({Model("m", {1})}), &factory);
  std::promise<Status> answer;
  parts.control.Submit([] { return absl::OkStatus(); }, [&](const Status& status) { answer.set_value(status); });
  parts.control.Stop();
  EXPECT_EQ(answer.get_future().get().code(), absl::StatusCode::kUnavailable);
}

TEST(ModelControlTest, PollModeRescansOnItsOwnThread) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  ModelControl::Options options = Control(ModelControlMode::kPoll, &source);
  options.poll_interval = std::chrono::milliseconds(5);
  ManagerParts parts(*source.Scan(), &factory, {}, options);
  std::atomic<int> changes{0};
  parts.control.SetChangeListener([&] { ++changes; });
  std::promise<Status> loaded;
  parts.control.Start([&](const Status& status) { loaded.set_value(status); });
  ASSERT_TRUE(loaded.get_future().get().ok());
  source.Put(Model("b", {1}), "b1");
  // The listener hears of the change once the pass is over.
  for (int i = 0; i < 4000 && (!parts.manager.Find("b", "").ok() || changes.load() == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(parts.manager.Find("b", "").ok());
  EXPECT_GE(changes.load(), 1);
  parts.control.Stop();  // ends polling and joins the thread
  source.Put(Model("c", {1}), "c1");
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(parts.manager.Find("c", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(VersionLoaderTest, LoadsComposesAndWarmsUpOneVersion) {
  FakeBackendFactory factory;
  VersionLoader loader(&factory, {});
  auto model = std::make_shared<const RepositoryModel>(Model("m", {1, 2}, Groups({{InstanceKind::kCpu, 2, {}}})));
  EXPECT_EQ(loader.SplitCpuThreads({model}), std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / 4));
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
  auto model = std::make_shared<const RepositoryModel>(Model(
      "m", {1}, Groups({{InstanceKind::kCpu, 2, {}}, {InstanceKind::kGpu, 1, {}}, {InstanceKind::kCpu, 1, {}}})));
  LoadedVersion loaded = loader.Load(model, 1, nullptr);
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_THAT(factory.calls, ElementsAre(std::make_pair(std::string("cpu"), 3), std::make_pair(std::string("cuda:0"), 1),
                                         std::make_pair(std::string("cuda:1"), 1)));
  EXPECT_EQ(loaded.handle->device(), "cpu,cuda:0,cuda:1 x5");
  EXPECT_THAT(loaded.tuning.warnings, ElementsAre("lone requests are padded"));
  loaded.handle->Stop();
}

TEST(VersionLoaderTest, DevicePolicyCuda) {
  FakeBackendFactory without_gpu(false, 0);
  VersionLoader::Options options;
  options.device_policy = DevicePolicy::kCuda;
  EXPECT_EQ(VersionLoader(&without_gpu, options).CheckDevicePolicy().code(), absl::StatusCode::kFailedPrecondition);
  FakeBackendFactory with_gpu(true, 1);
  EXPECT_TRUE(VersionLoader(&with_gpu, options).CheckDevicePolicy().ok());
}

// The table on its own: a swap installs at once and hands back what served before.
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
