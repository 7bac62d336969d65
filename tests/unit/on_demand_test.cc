// Loading on demand within a memory budget: model control, the manager and the waiters together,
// on fake backends whose loads allocate fake bytes (FakeBackendFactory::instance_bytes).
#include "server/manager/on_demand.h"

#include <chrono>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"
#include "tests/unit/manager_fixtures.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using testing::Control;
using testing::FakeBackend;
using testing::FakeBackendFactory;
using ::testing::HasSubstr;
using testing::ManagerParts;
using testing::MemorySource;
using testing::Model;
using testing::Send;

constexpr uint64_t kMiB = 1 << 20;

// Collects the answer of one Await.
struct Answer {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::function<void(const Status&)> Then() {
    return [this](const Status& status) { promise.set_value(status); };
  }
  Status Get() {
    EXPECT_EQ(future.wait_for(10s), std::future_status::ready);
    return future.get();
  }
};

// Models a, b, c, d in explicit mode with loading on demand, "a" loaded at start-up (pinned).
// Each instance takes 10 MiB of host memory; `budget_mib` 0: no budget.
class OnDemandTest : public ::testing::Test {
 protected:
  // With `clock` (null: the steady clock) every part reads and waits on it: the tests that need
  // distinct ready and last-use times advance it instead of sleeping.
  void Start(uint64_t budget_mib, std::vector<std::string> startup = {"a"},
             Duration min_residency = Duration(0), const TimeSource* clock = nullptr) {
    for (const char* name : {"a", "b", "c", "d"}) {
      source_.Put(Model(name, {1}), std::string(name) + "1");
      factory_.instance_bytes[name] = 10 * kMiB;
    }
    ModelControl::Options options =
        Control(ModelControlMode::kExplicit, &source_, std::move(startup));
    options.load_on_demand = true;
    options.eviction.min_residency = min_residency;
    options.room_wait = Duration(0);
    options.no_room_retry = Duration(0);
    if (budget_mib > 0) options.eviction.budget["cpu"] = budget_mib * kMiB;
    options.clock = clock;
    VersionLoader::Options loader;
    loader.clock = clock;
    ModelManager::Options manager;
    manager.clock = clock;
    parts_ = std::make_unique<ManagerParts>(*source_.Scan(), &factory_, std::move(loader), options,
                                            manager);
    OnDemandLoader::Options on_demand;
    on_demand.clock = clock;
    loads_ = std::make_unique<OnDemandLoader>(&parts_->control, on_demand);
    parts_->manager.SetOnDemand(loads_.get());
    std::promise<Status> started;
    parts_->control.Start([&](const Status& status) { started.set_value(status); });
    ASSERT_TRUE(started.get_future().get().ok());
  }
  void TearDown() override {
    if (parts_) parts_->control.Stop();
    if (loads_) loads_->Stop();
  }
  Status Await(const std::string& name, TimePoint deadline = kNoDeadline,
               std::shared_ptr<std::atomic<bool>> cancelled = nullptr) {
    Answer answer;
    loads_->Await(name, deadline, std::move(cancelled), answer.Then());
    return answer.Get();
  }
  size_t LoadsOf(const std::string& name) {
    size_t count = 0;
    for (const auto& load : factory_.loads) count += load.model == name ? 1 : 0;
    return count;
  }
  std::set<std::string> Ready() {
    std::set<std::string> ready;
    for (const ModelIndexEntry& entry : parts_->manager.Index()) {
      if (entry.state == ModelState::kReady) ready.insert(entry.name);
    }
    return ready;
  }
  ModelManager& manager() { return parts_->manager; }
  ModelControl& control() { return parts_->control; }

  FakeBackendFactory factory_;
  MemorySource source_;
  FakeTimeSource fake_clock_;  // for Start's `clock`: outlives the parts that wait on it
  std::unique_ptr<ManagerParts> parts_;
  std::unique_ptr<OnDemandLoader> loads_;
};

TEST_F(OnDemandTest, RequestsForAModelNotLoadedShareOneLoadAndFindItReady) {
  Start(0);
  EXPECT_EQ(Ready(), (std::set<std::string>{"a"}));
  auto b = manager().Find("b", "");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.status().message(), HasSubstr("loads on its first request"));
  EXPECT_TRUE(manager().AllReady());  // readiness waits only for the models asked for at start-up
  EXPECT_TRUE(control().LoadsOnDemand("b"));
  EXPECT_FALSE(control().LoadsOnDemand("zzz"));

  std::promise<void> release;  // the control thread held until all five wait
  std::shared_future<void> released = release.get_future().share();
  control().Submit(
      [released] {
        released.wait();
        return absl::OkStatus();
      },
      nullptr);
  std::vector<std::unique_ptr<Answer>> answers;
  for (int i = 0; i < 5; ++i) {
    answers.push_back(std::make_unique<Answer>());
    loads_->Await("b", kNoDeadline, nullptr, answers.back()->Then());
  }
  EXPECT_EQ(loads_->waiting(), 5u);
  release.set_value();
  for (auto& answer : answers) EXPECT_TRUE(answer->Get().ok());
  EXPECT_EQ(LoadsOf("b"), 1u);
  auto found = manager().Find("b", "");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(Send(&**found, "1").get()->outputs[0].data, "1");
  found = StatusOr<InFlightModel>(absl::CancelledError("released"));
  EXPECT_TRUE(manager().AllReady());  // readiness never waits for a model loaded on demand
  // Ready already: answered without loading again.
  EXPECT_TRUE(Await("b").ok());
  EXPECT_EQ(LoadsOf("b"), 1u);
  // The memory each ready version took is in the index and the statistics.
  for (const ModelIndexEntry& entry : manager().Index()) {
    if (entry.state == ModelState::kReady)
      EXPECT_EQ(entry.memory.at("cpu"), 10 * kMiB) << entry.name;
  }
  auto statistics = manager().Statistics("b", "");
  ASSERT_TRUE(statistics.ok());
  EXPECT_EQ(statistics->at(0).memory.at("cpu"), 10 * kMiB);
}

TEST_F(OnDemandTest, AFailedLoadAnswersEveryWaiterWithItsReasonAndIsNotRetriedDuringTheBackoff) {
  factory_.failures["c"] = "cannot load c: bad archive";
  Start(0);
  // The control thread held until both wait, so that they share the one load.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  control().Submit(
      [released] {
        released.wait();
        return absl::OkStatus();
      },
      nullptr);
  Answer first, second;
  loads_->Await("c", kNoDeadline, nullptr, first.Then());
  loads_->Await("c", kNoDeadline, nullptr, second.Then());
  release.set_value();
  for (Answer* answer : {&first, &second}) {
    const Status status = answer->Get();
    EXPECT_EQ(status.code(),
              absl::StatusCode::kUnavailable);  // the model's fault, not the request's
    EXPECT_THAT(status.message(), HasSubstr("failed to load 'c' on demand"));
    EXPECT_THAT(status.message(), HasSubstr("bad archive"));
  }
  const size_t loads = LoadsOf("c");
  const Status again = Await("c");
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.message(), HasSubstr("is not loaded on demand again for another"));
  EXPECT_THAT(again.message(), HasSubstr("bad archive"));
  EXPECT_EQ(LoadsOf("c"), loads);  // not tried again
  // The index shows why; the server stays ready and the other models serve.
  bool listed = false;
  for (const ModelIndexEntry& entry : manager().Index()) {
    if (entry.name != "c") continue;
    listed = true;
    EXPECT_EQ(entry.state, ModelState::kUnavailable);
    EXPECT_THAT(entry.reason, HasSubstr("failed to load on demand"));
  }
  EXPECT_TRUE(listed);
  EXPECT_TRUE(manager().AllReady());
  EXPECT_TRUE(Await("b").ok());
}

// Every model here loaded well within the (default) minimum residency of 10 s: the budget still
// makes room for each request, unloading the idle model ready longest, and refuses nothing.
TEST_F(OnDemandTest, YoungIdleModelsMakeRoomRatherThanARequestBeingRefused) {
  FakeTimeSource& clock = fake_clock_;
  Start(/*budget_mib=*/30, {"a"},
        /*min_residency=*/std::chrono::seconds(10), &clock);  // a (pinned) + two more
  ASSERT_TRUE(Await("b").ok());
  clock.Advance(2ms);  // distinct ready times
  ASSERT_TRUE(Await("c").ok());
  clock.Advance(2ms);
  {
    auto b = manager().Find("b", "");  // used after c, but ready longer: b goes
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->MarkUsed();
  }
  ASSERT_TRUE(Await("d").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "c", "d"}));
  // And on: each request is served, never more than the budget resident.
  for (const char* name : {"b", "c", "d", "b"}) {
    ASSERT_TRUE(Await(name).ok()) << name;
    EXPECT_EQ(Ready().size(), 3u) << name;
    EXPECT_EQ(Ready().count("a"), 1u);
  }
}

TEST_F(OnDemandTest, TheBudgetUnloadsTheLeastRecentlyUsedIdleModelAndNeverAPinnedOrBusyOne) {
  FakeTimeSource& clock = fake_clock_;
  Start(/*budget_mib=*/30, {"a"}, Duration(0), &clock);  // a (pinned) + two more
  ASSERT_TRUE(Await("b").ok());
  clock.Advance(2ms);  // distinct last-use times
  ASSERT_TRUE(Await("c").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "c"}));
  clock.Advance(2ms);
  {
    auto b = manager().Find("b", "");  // b is now used more recently than c
    ASSERT_TRUE(b.ok());
    (*b)->MarkUsed();
  }
  clock.Advance(2ms);
  ASSERT_TRUE(Await("d").ok());  // 40 > 30: c goes
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "d"}));
  auto c = manager().Find("c", "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("unloaded to make room for 'd'"));
  EXPECT_LE(ResidentBytes(manager().Resident()).at("cpu"), 30 * kMiB);

  // With b and d held by requests in flight, and a pinned, nothing can go for c.
  auto held_b = manager().Find("b", "");
  auto held_d = manager().Find("d", "");
  ASSERT_TRUE(held_b.ok() && held_d.ok());
  const Status refused = Await("c");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("a (pinned)"));
  EXPECT_THAT(refused.message(), HasSubstr("b (requests in flight or active sequences)"));
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "d"}));
  // No back-off for a full budget: once one is idle the next request loads c.
  held_b = StatusOr<InFlightModel>(absl::CancelledError("released"));
  ASSERT_TRUE(Await("c").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "c", "d"}));
  EXPECT_LE(ResidentBytes(manager().Resident()).at("cpu"), 30 * kMiB);
  // c's second load was expected at its measured 10 MiB and made room before loading.
  EXPECT_EQ(LoadsOf("c"), 2u);
}

// An ensemble and the models its steps run load together within the budget, none of them
// evicting another; evicting a model an ensemble runs unloads the ensemble too, and its next
// request loads them together again.
TEST_F(OnDemandTest, AnEnsembleAndItsModelsLoadAndGoTogether) {
  FakeTimeSource& clock = fake_clock_;
  source_.Put(testing::Ensemble("e", {"b", "c"}), "e1");
  Start(/*budget_mib=*/30, {"a"}, Duration(0), &clock);  // a (pinned) + two more
  ASSERT_TRUE(Await("e").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "c", "e"}));
  clock.Advance(2ms);
  ASSERT_TRUE(Await("d").ok());  // b or c goes, and e with it
  EXPECT_EQ(Ready().count("e"), 0u);
  EXPECT_EQ(Ready().count("d"), 1u);
  auto e = manager().Find("e", "");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(e.status().message(), HasSubstr("was unloaded to make room for 'd'"));
  EXPECT_TRUE(control().LoadsOnDemand("e"));
  clock.Advance(2ms);
  ASSERT_TRUE(Await("e").ok());  // d goes: the one of b and c still loaded stays for e
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "c", "e"}));
  EXPECT_LE(ResidentBytes(manager().Resident()).at("cpu"), 30 * kMiB);
  // A step model that grew to 20 MiB finds no room beside a (pinned) and c, which e's load keeps;
  // the refusal names the step and says why c stays.
  factory_.instance_bytes["b"] = 20 * kMiB;
  ASSERT_TRUE(control().UnloadModel("b").ok());
  const Status refused = control().LoadModel("e");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("its step model 'b' did not load"));
  EXPECT_THAT(refused.message(), HasSubstr("c (loads with 'e')"));
}

// The models a pinned ensemble runs are not evicted for room (the ensemble would go with them).
TEST_F(OnDemandTest, APinnedEnsemblesModelsStay) {
  RepositoryModel e = testing::Ensemble("e", {"b", "c"});
  e.spec.pinned = true;
  source_.Put(e, "e1");
  Start(/*budget_mib=*/20, {});
  ASSERT_TRUE(Await("e").ok());
  const Status refused = Await("d");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("b (runs in pinned ensemble 'e')"));
  EXPECT_EQ(Ready(), (std::set<std::string>{"b", "c", "e"}));
}

// unload_dependents unloads the models an ensemble runs that no other loaded ensemble runs and
// that are not pinned; without it they stay.
TEST_F(OnDemandTest, UnloadingAnEnsembleWithItsDependentsKeepsWhatOthersRun) {
  source_.Put(testing::Ensemble("e", {"b", "c"}), "e1");
  source_.Put(testing::Ensemble("f", {"c", "a"}), "f1");
  Start(0, {"a"});
  const uint64_t generation = manager().Generation("b");
  ASSERT_TRUE(control().LoadModel("e").ok());
  EXPECT_GT(manager().Generation("b"), generation);  // what an ensemble's cached answers follow
  EXPECT_GT(manager().Generation("e"), manager().Generation("b"));  // loaded after its models
  ASSERT_TRUE(control().LoadModel("f").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "c", "e", "f"}));
  ASSERT_TRUE(control().UnloadModel("e", /*unload_dependents=*/true).ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "c", "f"}));  // f runs c
  ASSERT_TRUE(control().UnloadModel("f", /*unload_dependents=*/true).ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a"}));  // a is pinned
  // What went with it was unloaded as if on its own: not loaded on demand, until an explicit
  // load (of it, or of an ensemble that runs it).
  EXPECT_FALSE(control().LoadsOnDemand("b"));
  ASSERT_TRUE(control().LoadModel("e").ok());
  EXPECT_TRUE(control().LoadsOnDemand("b"));
  ASSERT_TRUE(control().UnloadModel("e").ok());
  EXPECT_EQ(Ready(), (std::set<std::string>{"a", "b", "c"}));
}

TEST_F(OnDemandTest, AModelLargerThanTheWholeBudgetIsRefusedAndUnloaded) {
  Start(/*budget_mib=*/30, {});
  factory_.instance_bytes["d"] = 50 * kMiB;
  const Status status = Await("d");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("measured more than expected"));
  EXPECT_TRUE(Ready().empty());
  // Next time it is expected at what it measured and refused before loading.
  const size_t loads = LoadsOf("d");
  const Status again = Await("d");
  EXPECT_THAT(again.message(), HasSubstr("more than the whole budget"));
  EXPECT_EQ(LoadsOf("d"), loads);
}

TEST_F(OnDemandTest, AVersionThatFailsLeavesTheOthersServing) {
  Start(0);
  source_.Put(Model("b", {1, 2}), "b2");  // what the load on demand reads
  factory_.failures["b/2"] = "cannot load b version 2";
  EXPECT_TRUE(Await("b").ok());
  EXPECT_TRUE(manager().Find("b", "1").ok());
  auto two = manager().Find("b", "2");
  EXPECT_EQ(two.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(two.status().message(), HasSubstr("cannot load b version 2"));
  EXPECT_TRUE(manager().AllReady());
}

TEST_F(OnDemandTest, AnExplicitUnloadWinsUntilAnExplicitLoad) {
  Start(0);
  ASSERT_TRUE(Await("b").ok());
  ASSERT_TRUE(control().UnloadModel("b").ok());
  EXPECT_FALSE(control().LoadsOnDemand("b"));
  const Status status = control().LoadOnDemand("b");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("unloaded with RepositoryModelUnload"));
  ASSERT_TRUE(control().LoadModel("b").ok());
  EXPECT_TRUE(control().LoadsOnDemand("b"));
  ASSERT_TRUE(control().UnloadModel("a").ok());  // pinned models can be unloaded explicitly too
  EXPECT_FALSE(control().LoadsOnDemand("a"));
}

TEST_F(OnDemandTest, AWaiterPastItsDeadlineOrCancelledIsAnsweredWhileTheLoadGoesOnForTheOthers) {
  Start(0);
  factory_.closed_gates = true;  // b's warm-up blocks in its backend until the gate opens
  const size_t backends = factory_.backends.size();
  Answer late, cancelled_answer, patient;
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  loads_->Await("b", Clock::now() + 30ms, nullptr, late.Then());
  loads_->Await("b", kNoDeadline, cancelled, cancelled_answer.Then());
  loads_->Await("b", kNoDeadline, nullptr, patient.Then());
  const Status deadline = late.Get();
  EXPECT_EQ(deadline.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(deadline.message(), HasSubstr("deadline passed after"));
  cancelled->store(true);
  EXPECT_EQ(cancelled_answer.Get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(loads_->waiting(), 1u);
  factory_.WaitBackend(backends)->OpenGate();
  EXPECT_TRUE(patient.Get().ok());
  EXPECT_EQ(loads_->waiting(), 0u);
}

TEST_F(OnDemandTest, StopAnswersTheWaitersAndLaterAwaits) {
  Start(0);
  factory_.closed_gates = true;
  const size_t backends = factory_.backends.size();
  Answer waiting;
  loads_->Await("b", kNoDeadline, nullptr, waiting.Then());
  FakeBackend* blocked = factory_.WaitBackend(backends);
  ASSERT_NE(blocked, nullptr);
  loads_->Stop();
  EXPECT_EQ(waiting.Get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Await("c").code(), absl::StatusCode::kUnavailable);
  blocked->OpenGate();
}

TEST(MemoryBudgetTest, InExplicitModeABudgetMakesRoomForExplicitLoadsAndKeepsTheStartupModels) {
  FakeBackendFactory factory;
  MemorySource source;
  for (const char* name : {"a", "b", "c", "d"}) {
    source.Put(Model(name, {1}), std::string(name) + "1");
    factory.instance_bytes[name] = 10 * kMiB;
  }
  ModelControl::Options options = Control(ModelControlMode::kExplicit, &source, {"a"});
  options.eviction.budget["cpu"] = 30 * kMiB;
  options.eviction.min_residency = Duration(0);
  options.room_wait = Duration(0);
  // Distinct ready and last-use times: one clock for every part, advanced by the test.
  FakeTimeSource clock;
  options.clock = &clock;
  VersionLoader::Options loader;
  loader.clock = &clock;
  ModelManager::Options manager;
  manager.clock = &clock;
  ManagerParts parts(*source.Scan(), &factory, std::move(loader), options, manager);
  ASSERT_TRUE(parts.control.LoadAll().ok());
  ASSERT_TRUE(parts.control.LoadModel("b").ok());
  clock.Advance(2ms);
  ASSERT_TRUE(parts.control.LoadModel("c").ok());
  clock.Advance(2ms);
  {
    auto b = parts.manager.Find("b", "");  // b used after c: c is the least recently used
    ASSERT_TRUE(b.ok());
    (*b)->MarkUsed();
  }
  ASSERT_TRUE(parts.control.LoadModel("d").ok());
  EXPECT_TRUE(parts.manager.Find("a", "").ok());  // --load-model: pinned
  EXPECT_TRUE(parts.manager.Find("b", "").ok());
  EXPECT_TRUE(parts.manager.Find("d", "").ok());
  auto c = parts.manager.Find("c", "");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("unloaded to make room for 'd'"));
  EXPECT_FALSE(parts.control.LoadsOnDemand(
      "c"));  // no loading on demand: RepositoryModelLoad brings it back
  EXPECT_LE(ResidentBytes(parts.manager.Resident()).at("cpu"), 30 * kMiB);
  parts.control.Stop();
}

TEST(OnDemandPollTest, PollRecordsChangedModelsThatDoNotServeAndReloadsThoseThatDo) {
  FakeBackendFactory factory;
  MemorySource source;
  source.Put(Model("a", {1}), "a1");
  source.Put(Model("b", {1}), "b1");
  ModelControl::Options options = Control(ModelControlMode::kPoll, &source, {"a"});
  options.load_on_demand = true;
  ManagerParts parts(*source.Scan(), &factory, {}, options);
  ASSERT_TRUE(parts.control.LoadAll().ok());
  EXPECT_TRUE(parts.manager.Find("a", "").ok());
  EXPECT_FALSE(parts.manager.Find("b", "").ok());
  source.Put(Model("a", {1}), "a2");
  source.Put(Model("b", {1, 2}), "b2");
  source.Put(Model("c", {1}), "c1");
  const size_t before = factory.loads.size();
  ASSERT_TRUE(parts.control.PollRepository().ok());
  EXPECT_EQ(factory.loads.size(), before + 1);  // a reloaded; b and c wait for a request
  EXPECT_EQ(factory.loads.back().model, "a");
  EXPECT_FALSE(parts.manager.Find("c", "").ok());
  EXPECT_TRUE(parts.control.LoadsOnDemand("c"));
  ASSERT_TRUE(parts.control.LoadOnDemand("b").ok());
  EXPECT_EQ(parts.manager.ReadyVersions("b"), (std::vector<int64_t>{1, 2}));  // the new files
  source.Remove("c");
  ASSERT_TRUE(parts.control.PollRepository().ok());
  EXPECT_FALSE(parts.control.LoadsOnDemand("c"));
  parts.control.Stop();
}

}  // namespace
}  // namespace sluice
