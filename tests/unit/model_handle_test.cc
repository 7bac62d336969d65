// A served version's handle: validation, queue timeout, sequence routing.
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_handle.h"
#include "server/manager/model_manager.h"
#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using testing::FakeBackend;
using testing::FakeBackendFactory;
using testing::ManagerParts;
using testing::Model;
using testing::Models;
using testing::Send;

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

}  // namespace
}  // namespace sluice
