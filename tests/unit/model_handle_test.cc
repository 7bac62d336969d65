// A served version's handle: validation, queue timeout, sequence routing.
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_handle.h"
#include "server/manager/response_cache.h"
#include "server/manager/model_manager.h"
#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using testing::Control;
using testing::FakeBackend;
using testing::FakeBackendFactory;
using testing::ManagerParts;
using testing::MemorySource;
using testing::Model;
using testing::Models;
using testing::Send;

// A sink that refuses every output, as a shared-memory slice too small for it would.
class RefusingSink final : public OutputSink {
 public:
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    return absl::InvalidArgumentError("output '" + output.name + "' does not fit");
  }
};

// Send's request (one row of ones) into a RefusingSink; its answer.
Status SendRefused(ModelHandle* model) {
  std::vector<float> data(2, 1.0f);
  auto request = std::make_unique<InferRequest>();
  request->model_name = model->spec().name;
  request->inputs.push_back(
      {"INPUT__0", DataType::kFp32, {1, 2}, reinterpret_cast<const char*>(data.data()), 8, {}});
  RefusingSink refusing;
  std::promise<Status> answered;
  model->Submit(std::move(request), &refusing, [&](Status status) { answered.set_value(status); });
  return answered.get_future().get();
}

std::function<void(ModelSpec&)> Cached() {
  return [](ModelSpec& spec) { spec.response_cache = true; };
}

// A traced request through a response cache model says how it was answered: the first runs
// ("miss"), an identical one later is a "hit".
TEST(ModelHandleTest, ATracedRequestSaysHowTheResponseCacheAnsweredIt) {
  FakeBackendFactory factory;
  VersionLoader::Options options;
  options.response_cache = std::make_shared<ResponseCache>(1 << 20);
  ManagerParts parts(Models({Model("cached", {1}, Cached())}), &factory, options);
  ASSERT_TRUE(parts.control.LoadAll().ok());
  auto cached = parts.manager.Find("cached", "");
  ASSERT_TRUE(cached.ok());
  testing::SpanRecorder spans;
  auto send = [&](const std::string& name) {
    std::vector<float> data(2, 1.0f);
    auto request = std::make_unique<InferRequest>();
    request->model_name = "cached";
    request->inputs.push_back(
        {"INPUT__0", DataType::kFp32, {1, 2}, reinterpret_cast<const char*>(data.data()), 8, {}});
    auto trace =
        std::make_shared<RequestTrace>(&spans, Duration::zero(), std::nullopt, name, Clock::now());
    request->trace = trace;
    TensorSink sink;
    std::promise<Status> answered;
    (*cached)->Submit(std::move(request), &sink,
                      [&](Status status) { answered.set_value(status); });
    const Status status = answered.get_future().get();
    trace->End(status, Clock::now());
    return status;
  };
  ASSERT_TRUE(send("first").ok());
  ASSERT_TRUE(send("second").ok());
  auto cache_attribute = [&](const std::string& name) {
    for (const SpanAttribute& attribute : spans.Named(name).attributes) {
      if (attribute.key == "sluice.response_cache") return std::get<std::string>(attribute.value);
    }
    return std::string("none");
  };
  EXPECT_EQ(cache_attribute("first"), "miss");
  EXPECT_EQ(cache_attribute("second"), "hit");
}

// The fake backend answers with the id of the request it ran ("y" = id); the cache key does not
// cover the id, so a cached answer shows as the first request's id.
TEST(ModelHandleTest, ResponseCacheAnswersIdenticalRequestsWithoutRunning) {
  FakeBackendFactory factory;
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  VersionLoader::Options options;
  options.response_cache = cache;
  ManagerParts parts(Models({Model("cached", {1}, Cached()), Model("plain", {1})}), &factory,
                     options);
  ASSERT_TRUE(parts.control.LoadAll().ok());
  auto cached = parts.manager.Find("cached", "");
  auto plain = parts.manager.Find("plain", "");
  ASSERT_TRUE(cached.ok() && plain.ok());
  EXPECT_TRUE((*cached)->caches_responses());
  EXPECT_FALSE(
      (*plain)->caches_responses());  // the server's cache serves only models that enable it
  FakeBackend* backend = factory.backend(0);
  const int runs = backend->executed();

  // A failed request is not an answer to keep (here its sink refused the output).
  EXPECT_EQ(SendRefused(&**cached).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->executed(), runs + 1);
  EXPECT_EQ(cache->Stats().entries, 0u);

  StatusOr<testing::Outputs> first = Send(&**cached, "1").get();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outputs[0].data, "1");
  EXPECT_EQ(backend->executed(), runs + 2);
  EXPECT_EQ(cache->Stats().entries, 1u);
  StatusOr<testing::Outputs> second = Send(&**cached, "2").get();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->outputs[0].data, "1");  // the first answer, from the cache
  EXPECT_EQ(second->outputs[0].name, first->outputs[0].name);
  EXPECT_EQ(second->outputs[0].shape, first->outputs[0].shape);
  EXPECT_EQ(backend->executed(), runs + 2);  // nothing ran for it

  const ModelStatsSnapshot stats = (*cached)->Statistics();
  EXPECT_EQ(stats.cache_miss.count, 2u);  // the refused request and the first
  EXPECT_EQ(stats.cache_hit.count, 1u);
  EXPECT_EQ(stats.success.count, 2u);
  EXPECT_EQ(stats.fail.count, 1u);
  EXPECT_EQ(stats.inference_count, 1u);  // a hit runs nothing (Triton counts it the same way)

  // A hit whose sink refuses is answered with the sink's reason and counted as a failure.
  const Status refused = SendRefused(&**cached);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("does not fit"));
  EXPECT_EQ((*cached)->Statistics().fail.count, 2u);

  // The model without response_cache runs every request.
  FakeBackend* plain_backend = factory.backend(1);
  const int plain_runs = plain_backend->executed();
  ASSERT_TRUE(Send(&**plain, "1").get().ok());
  StatusOr<testing::Outputs> again = Send(&**plain, "2").get();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outputs[0].data, "2");
  EXPECT_EQ(plain_backend->executed(), plain_runs + 2);
  EXPECT_EQ((*plain)->Statistics().cache_miss.count, 0u);

  // Unloading drops the version's entries.
  cached->Reset();
  plain->Reset();
  ASSERT_TRUE(parts.control.UnloadModel("cached").ok());
  EXPECT_EQ(cache->Stats().entries, 0u);
}

// Identical requests that come while one runs wait for its answer (single flight), counted in
// the queue's caps: with max_queue_size 1, one waits beside the run and the next is refused.
TEST(ModelHandleTest, IdenticalRequestsWhileOneRunsShareItsRunWithinTheQueueCaps) {
  FakeBackendFactory factory;
  VersionLoader::Options options;
  options.response_cache = std::make_shared<ResponseCache>(1 << 20);
  ManagerParts parts(Models({Model("cached", {1},
                                   [](ModelSpec& spec) {
                                     spec.response_cache = true;
                                     spec.dynamic_batching.enabled = true;
                                     spec.dynamic_batching.default_policy.max_queue_size = 1;
                                   })}),
                     &factory, options);
  ASSERT_TRUE(parts.control.LoadAll().ok());
  auto cached = parts.manager.Find("cached", "");
  ASSERT_TRUE(cached.ok());
  FakeBackend* backend = factory.backend(0);
  const int runs = backend->executed();
  const int started = backend->started();
  backend->CloseGate();
  auto running = Send(&**cached, "1");
  backend->WaitStarted(started + 1);
  auto joined = Send(&**cached, "2");
  StatusOr<testing::Outputs> refused = Send(&**cached, "3").get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("max_queue_size"));
  backend->OpenGate();
  for (auto* answer : {&running, &joined}) {
    StatusOr<testing::Outputs> outputs = answer->get();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    EXPECT_EQ(outputs->outputs[0].data, "1");  // the first request's run
  }
  EXPECT_EQ(backend->executed(), runs + 1);
  const ModelStatsSnapshot stats = (*cached)->Statistics();
  EXPECT_EQ(stats.success.count, 2u);
  EXPECT_EQ(stats.fail.count, 1u);
  EXPECT_EQ(stats.cache_miss.count, 1u);
  EXPECT_EQ(stats.inference_count, 1u);
  // The cap is free again: the next request is answered from the cache.
  StatusOr<testing::Outputs> hit = Send(&**cached, "4").get();
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->outputs[0].data, "1");
  cached->Reset();
}

// A version loaded again (same number, new files) starts with an empty cache: the old
// version's answers leave with it and never answer for the new one.
TEST(ModelHandleTest, AReloadedVersionStartsWithoutTheOldAnswers) {
  FakeBackendFactory factory;
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  VersionLoader::Options options;
  options.response_cache = cache;
  MemorySource source;
  source.Put(Model("cached", {1}, Cached()), "files-1");
  ManagerParts parts(*source.Scan(), &factory, options,
                     Control(ModelControlMode::kExplicit, &source, {"cached"}));
  ASSERT_TRUE(parts.control.LoadAll().ok());
  {
    auto old_version = parts.manager.Find("cached", "");
    ASSERT_TRUE(old_version.ok());
    StatusOr<testing::Outputs> first = Send(&**old_version, "1").get();
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(cache->Stats().entries, 1u);
  }
  source.Put(Model("cached", {1}, Cached()), "files-2");
  ASSERT_TRUE(parts.control.LoadModel("cached").ok());
  EXPECT_EQ(cache->Stats().entries, 0u);
  auto new_version = parts.manager.Find("cached", "");
  ASSERT_TRUE(new_version.ok());
  StatusOr<testing::Outputs> answer = Send(&**new_version, "2").get();
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->outputs[0].data, "2");  // run by the new version, not the old answer
  EXPECT_EQ(cache->Stats().entries, 1u);
}

TEST(ModelHandleTest, SubmitValidatesAndAppliesTheQueueTimeout) {
  FakeBackendFactory factory;
  ManagerParts parts(
      Models({Model("m", {1},
                    [](ModelSpec& spec) {
                      spec.dynamic_batching.enabled = true;
                      spec.dynamic_batching.default_policy.default_timeout_us = 60000000;
                      spec.dynamic_batching.default_policy.allow_timeout_override = true;
                    })}),
      &factory);
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
  quick->inputs.push_back({"INPUT__0",
                           DataType::kFp32,
                           {1, 2},
                           reinterpret_cast<const char*>(call.data.data()),
                           8,
                           {}});
  (*model)->Submit(std::move(quick), &call.sink,
                   [&](Status status) { call.answer.set_value(status); });
  auto answer = call.answer.get_future();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(20)),
            std::future_status::ready);  // not the 60 s default
  EXPECT_EQ(answer.get().code(), absl::StatusCode::kDeadlineExceeded);
  backend->OpenGate();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(backend->executed(), warmup_runs + 1);
}

// A scheduler that holds the sequences it is told about (for routing tests).
class HeldSequences final : public SequenceScheduler {
 public:
  explicit HeldSequences(std::set<uint64_t> ids) : ids_(std::move(ids)) {}
  void Enqueue(std::unique_ptr<InferRequest>, OutputSink*, InferCompletion done) override {
    done(absl::OkStatus());
  }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    return WarmupReport{};
  }
  void SetBatchSizeLadder(std::vector<int>) override {}
  void SetCallerRuns(bool) override {}
  void Poke() override {}
  void Stop() override {}
  bool HasSequence(const CorrelationId& id) const override {
    return !id.is_text && ids_.count(id.number) > 0;
  }
  size_t ActiveSequences() const override { return ids_.size(); }
  bool WaitSequencesEnded(TimePoint) override { return false; }
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
      model, 1, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{7}),
      std::make_shared<ModelStats>(), &clock));
  lookup.versions.push_back(std::make_shared<ModelHandle>(
      model, 2, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{8}),
      std::make_shared<ModelStats>(), &clock));
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
      plain, 1, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{7}),
      std::make_shared<ModelStats>(), &clock));
  stateless.versions.push_back(std::make_shared<ModelHandle>(
      plain, 2, "cpu", std::make_shared<HeldSequences>(std::set<uint64_t>{}),
      std::make_shared<ModelStats>(), &clock));
  InferRequest request;
  request.parameters.sequence = {{7, "", false}, false, false};
  EXPECT_EQ(RouteSequence(stateless, *stateless.Find("plain", ""), request, false)->version(), 2);
}

TEST(ModelHandleTest, AVersionWithAnActiveSequenceOrARequestInFlightIsNeverRemovedForRoom) {
  SteadyTimeSource clock;
  auto model = std::make_shared<RepositoryModel>();
  model->name = "acc";
  model->spec.name = "acc";
  model->spec.sequence_batching.enabled = true;
  model->versions[1] = "/repo/acc/1/model.pt";
  ModelManager manager({*model}, {});
  auto install = [&](std::set<uint64_t> sequences) {
    std::vector<LoadedVersion> loaded(1);
    loaded[0].version = 1;
    loaded[0].handle =
        std::make_shared<ModelHandle>(model, 1, "cpu", std::make_shared<HeldSequences>(sequences),
                                      std::make_shared<ModelStats>(), &clock);
    loaded[0].memory["cpu"] = 100;
    manager.Swap(model, &loaded);
  };
  install({7});  // sequence 7 is active
  std::vector<ResidentModel> resident = manager.Resident();
  ASSERT_EQ(resident.size(), 1u);
  EXPECT_TRUE(resident[0].busy);
  EXPECT_EQ(resident[0].memory.at("cpu"), 100u);
  EXPECT_EQ(manager.RemoveIfIdle("acc", "room").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(manager.Find("acc", "").ok());

  install({});  // no sequence, but a request in flight
  auto held = manager.Find("acc", "");
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(manager.Resident()[0].busy);
  EXPECT_EQ(manager.RemoveIfIdle("acc", "room").status().code(),
            absl::StatusCode::kFailedPrecondition);
  held = StatusOr<InFlightModel>(absl::CancelledError("answered"));
  EXPECT_FALSE(manager.Resident()[0].busy);
  auto removed = manager.RemoveIfIdle("acc", "unloaded to make room");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->handles.size(), 1u);
  EXPECT_TRUE(manager.Resident().empty());
  auto gone = manager.Find("acc", "");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(gone.status().message(), ::testing::HasSubstr("unloaded to make room"));
  EXPECT_EQ(manager.RemoveIfIdle("nope", "x").status().code(), absl::StatusCode::kNotFound);
  manager.Stop();
}

// A scheduler that keeps what it is given, for the test to answer in any order.
class HeldRequests final : public Scheduler {
 public:
  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink*, InferCompletion done) override {
    requests.push_back(std::move(request));
    completions.push_back(std::move(done));
  }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest>, const std::atomic<bool>*) override {
    return WarmupReport{};
  }
  void SetBatchSizeLadder(std::vector<int>) override {}
  void SetCallerRuns(bool) override {}
  void Poke() override {}
  void Stop() override {}
  std::vector<std::unique_ptr<InferRequest>> requests;
  std::vector<InferCompletion> completions;
};

// One row for testing::Model's INPUT__0, with `priority` and `timeout_us` as parameters.
std::unique_ptr<InferRequest> Row(const std::vector<float>& data, uint64_t priority = 0,
                                  int64_t timeout_us = 0) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = "m";
  request->parameters.priority = priority;
  request->parameters.timeout_us = timeout_us;
  request->inputs.push_back(
      {"INPUT__0", DataType::kFp32, {1, 2}, reinterpret_cast<const char*>(data.data()), 8, {}});
  return request;
}

TEST(ModelHandleTest, SubmitSetsThePriorityLevelAndAppliesThatLevelsQueuePolicy) {
  FakeTimeSource clock;
  auto model = std::make_shared<RepositoryModel>(Model("m", {1}, [](ModelSpec& spec) {
    DynamicBatchingSpec& batching = spec.dynamic_batching;
    batching.enabled = true;
    batching.priority_levels = 3;
    batching.default_priority_level = 2;
    batching.level_policies.resize(3);
    batching.level_policies[0].default_timeout_us = 1000;  // REJECT: the deadline
    batching.level_policies[1].default_timeout_us = 5000;  // DELAY: delay_after
    batching.level_policies[1].delay = true;
    batching.level_policies[2].default_timeout_us = 7000;
    batching.level_policies[2].allow_timeout_override = true;
  }));
  auto held = std::make_shared<HeldRequests>();
  auto handle =
      std::make_shared<ModelHandle>(model, 1, "cpu", held, std::make_shared<ModelStats>(), &clock);
  const std::vector<float> data(2, 1.0f);
  TensorSink sink;
  const TimePoint now = clock.Now();
  for (auto [priority, timeout] :
       std::vector<std::pair<uint64_t, int64_t>>{{1, 0}, {0, 0}, {9, 0}, {3, 300}, {1, 300}}) {
    handle->Submit(Row(data, priority, timeout), &sink, [](Status) {});
  }
  ASSERT_EQ(held->requests.size(), 5u);
  const InferRequest& first = *held->requests[0];
  EXPECT_EQ(first.priority_level, 1);
  EXPECT_EQ(first.deadline, now + std::chrono::microseconds(1000));
  EXPECT_EQ(first.delay_after, kNoDeadline);
  for (size_t i : {1, 2}) {  // no priority, or one above the levels: the default level (DELAY)
    EXPECT_EQ(held->requests[i]->priority_level, 2);
    EXPECT_EQ(held->requests[i]->deadline, kNoDeadline);
    EXPECT_EQ(held->requests[i]->delay_after, now + std::chrono::microseconds(5000));
  }
  EXPECT_EQ(held->requests[3]->priority_level, 3);
  EXPECT_EQ(held->requests[3]->deadline,
            now + std::chrono::microseconds(300));  // its level allows overrides
  EXPECT_EQ(held->requests[4]->deadline,
            now + std::chrono::microseconds(1000));  // level 1 does not
  for (auto& done : held->completions) done(absl::OkStatus());
}

}  // namespace
}  // namespace sluice
