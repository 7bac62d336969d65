// Model control: modes, explicit loads, reloads, unloads, polling and the control thread.
#include <chrono>
#include <future>
#include <set>
#include <thread>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using testing::Broken;
using testing::ConfigOverride;
using testing::Control;
using ::testing::ElementsAre;
using testing::FakeBackend;
using testing::FakeBackendFactory;
using ::testing::HasSubstr;
using testing::HoldTwoRequests;
using testing::ManagerParts;
using testing::MemorySource;
using testing::Model;
using testing::Models;
using testing::Send;

TEST(ModelControlTest, ParsesModes) {
  EXPECT_EQ(*ParseModelControlMode("explicit"), ModelControlMode::kExplicit);
  EXPECT_EQ(*ParseModelControlMode("poll"), ModelControlMode::kPoll);
  EXPECT_EQ(*ParseModelControlMode("none"), ModelControlMode::kNone);
  EXPECT_THAT(ParseModelControlMode("sometimes").status().message(),
              HasSubstr("none, poll or explicit"));
}

TEST(ModelControlTest, ExplicitModeLoadsStartupModelsThenOnRequest) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"a"}));
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
  EXPECT_TRUE(manager.AllReady());             // an unloaded model is not asked for
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
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"*"}));
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

// Version 1 of "m" loaded in explicit mode, with two requests held on it: one running (its
// worker held at the backend's gate) and one queued. The versions' batchers and workers, and a
// drain, wait on a fake clock, so the test can see when they wait.
class HeldVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_.Put(Model("m", {1}), "v1");
    VersionLoader::Options loader_options;
    loader_options.clock = &clock_;
    parts_ = std::make_unique<ManagerParts>(*source_.Scan(), &factory_, loader_options,
                                            Control(ModelControlMode::kExplicit, &source_, {"m"}));
    ASSERT_TRUE(parts_->control.LoadAll().ok());
    held_ = parts_->manager.Find("m", "");
    ASSERT_TRUE(held_.ok());
    backend_ = factory_.backend(0);
    std::tie(running_, queued_) = HoldTwoRequests(backend_, &**held_);
  }

  FakeBackendFactory factory_;
  MemorySource source_;
  FakeTimeSource clock_;
  std::unique_ptr<ManagerParts> parts_;
  StatusOr<InFlightModel> held_ = absl::UnknownError("not yet");  // version 1, held by the test
  FakeBackend* backend_ = nullptr;
  std::future<StatusOr<testing::Outputs>> running_, queued_;
};

// The heart of a live reload: a request running on the old version and one queued behind it
// both finish on it; lookups after the swap get the new version; the old one is stopped only
// when its last request is answered, and LoadModel returns only then.
TEST_F(HeldVersionTest, ReloadSwapsVersionsAndOldRequestsFinishOnTheOld) {
  ModelManager& manager = parts_->manager;
  source_.Put(Model("m", {2}), "v2");  // version 2 appears; the latest policy serves only it
  auto reload = std::async(std::launch::async, [&] { return parts_->control.LoadModel("m"); });
  // The swap happens once version 2 is ready; the reload then waits for the old requests: four
  // threads wait on the clock (version 1's batcher, not its held worker; version 2's batcher and
  // worker; the reload's drain).
  ASSERT_TRUE(clock_.AwaitWaiting(4));
  auto new_version = manager.Find("m", "");
  ASSERT_TRUE(new_version.ok());
  EXPECT_EQ((*new_version)->version(), 2);
  EXPECT_EQ(Send(&**new_version, "5").get()->outputs[0].data, "5");
  EXPECT_EQ(manager.Find("m", "1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reload.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);

  backend_->OpenGate();
  auto first = running_.get();
  auto second = queued_.get();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->outputs[0].data, "1");
  EXPECT_EQ(second->outputs[0].data, "2");
  ASSERT_TRUE(clock_.AwaitWaiting(
      5));  // the drain still waits (the test holds version 1); both workers idle
  EXPECT_EQ(reload.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  held_ = StatusOr<InFlightModel>(absl::CancelledError("released"));
  ASSERT_TRUE(reload.get().ok());
  // The old scheduler stopped; the new one serves.
  EXPECT_EQ(Send(&**new_version, "6").get()->outputs[0].data, "6");
}

TEST_F(HeldVersionTest, UnloadRefusesNewRequestsAtOnceAndWaitsForAdmittedOnes) {
  auto unload = std::async(std::launch::async, [&] { return parts_->control.UnloadModel("m"); });
  ASSERT_TRUE(clock_.AwaitWaiting(
      2));  // the version's batcher (its worker is held), and the unload's drain
  EXPECT_EQ(parts_->manager.Find("m", "").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(unload.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  backend_->OpenGate();
  EXPECT_TRUE(running_.get().ok());
  EXPECT_TRUE(queued_.get().ok());
  held_ = StatusOr<InFlightModel>(absl::CancelledError("released"));
  EXPECT_TRUE(unload.get().ok());
}

TEST(ModelControlTest, AFailedReloadKeepsTheOldVersionServing) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"m"}));
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

TEST(ModelControlTest, StopEndsADrainThatWouldWaitForever) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("m", {1}), "v1");
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"m"}));
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
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"m"}));
  std::promise<Status> loaded;
  parts.control.Start([&](const Status& status) { loaded.set_value(status); });
  ASSERT_TRUE(loaded.get_future().get().ok());
  EXPECT_TRUE(parts.manager.AllReady());

  std::vector<int> order;
  std::promise<void> both;
  parts.control.Submit(
      [&] {
        order.push_back(1);
        return parts.control.UnloadModel("m");
      },
      [&](const Status& status) { EXPECT_TRUE(status.ok()); });
  parts.control.Submit(
      [&] {
        order.push_back(2);
        return absl::NotFoundError("second");
      },
      [&](const Status& status) {
        EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
        both.set_value();
      });
  both.get_future().get();
  EXPECT_THAT(order, ElementsAre(1, 2));
  EXPECT_EQ(parts.manager.Find("m", "").status().code(), absl::StatusCode::kUnavailable);

  parts.control.Stop();
  std::promise<Status> late;
  parts.control.Submit([] { return absl::OkStatus(); },
                       [&](const Status& status) { late.set_value(status); });
  EXPECT_EQ(late.get_future().get().code(),
            absl::StatusCode::kUnavailable);  // answered, never lost
}

TEST(ModelControlTest, StartMarksModelsAtOnceAndLoadsAheadOfEarlierTasks) {
  FakeBackendFactory factory;
  factory.closed_gates = true;  // a's warm-up blocks until the gate opens
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ManagerParts parts(*source.Scan(), &factory, {},
                     Control(ModelControlMode::kExplicit, &source, {"a"}));
  std::promise<bool> a_ready_when_task_ran;
  parts.control.Submit(
      [&] {
        a_ready_when_task_ran.set_value(parts.manager.Find("a", "").ok());
        return absl::OkStatus();
      },
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

  ASSERT_NE(factory.WaitBackend(0), nullptr);
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
  parts.control.Submit([] { return absl::OkStatus(); },
                       [&](const Status& status) { answer.set_value(status); });
  parts.control.Stop();
  EXPECT_EQ(answer.get_future().get().code(), absl::StatusCode::kUnavailable);
}

TEST(ModelControlTest, PollModeRescansOnItsOwnThread) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  ModelControl::Options options = Control(ModelControlMode::kPoll, &source);
  FakeTimeSource clock;  // the control thread's: only it waits on this clock
  options.clock = &clock;
  options.poll_interval = std::chrono::seconds(5);
  ManagerParts parts(*source.Scan(), &factory, {}, options);
  std::atomic<int> changes{0};
  parts.control.SetChangeListener([&] { ++changes; });
  std::promise<Status> loaded;
  parts.control.Start([&](const Status& status) { loaded.set_value(status); });
  ASSERT_TRUE(loaded.get_future().get().ok());
  ASSERT_TRUE(clock.AwaitWaiting(1));  // for its first poll
  const int before = changes.load();
  source.Put(Model("b", {1}), "b1");
  clock.Advance(std::chrono::seconds(4));
  ASSERT_TRUE(clock.AwaitWaiting(1));
  EXPECT_EQ(parts.manager.Find("b", "").status().code(), absl::StatusCode::kNotFound);  // not yet
  EXPECT_EQ(changes.load(), before);
  clock.Advance(std::chrono::seconds(1));
  // It polled, loaded b, told the listener once the pass was over, and waits for the next poll.
  ASSERT_TRUE(clock.AwaitWaiting(1));
  EXPECT_TRUE(parts.manager.Find("b", "").ok());
  EXPECT_EQ(changes.load(), before + 1);
  parts.control.Stop();            // ends polling and joins the thread
  EXPECT_EQ(clock.Waiting(), 0u);  // nothing waits for a poll any more
  source.Put(Model("c", {1}), "c1");
  clock.Advance(std::chrono::seconds(10));
  EXPECT_EQ(parts.manager.Find("c", "").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice
