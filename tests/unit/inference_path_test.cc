// The inference path every front end shares, driven with a fake call and a fake lookup whose
// models run on fake backends: the order of its steps, what it stamps on a request, what counts as
// a rejection, and that the version is released before the answer.
#include "server/frontend/inference_path.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <future>

#include "server/core/retry_after.h"
#include "tests/unit/fakes.h"
#include "tests/unit/handle_factory.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

// Records every step the path takes; the answer fulfils a promise. Input "x" INT32 [1, n].
class FakeCall final : public InferenceCall {
 public:
  FakeCall(std::string model, std::vector<int32_t> values, Status decode_refusal = absl::OkStatus())
      : model_(std::move(model)), values_(std::move(values)), refusal_(std::move(decode_refusal)) {}

  const std::string& model_name() const override { return model_; }
  const std::string& model_version() const override { return version_; }
  absl::string_view request_id() const override { return "id-7"; }
  OutputSink* sink() override { return &sink_; }

  StatusOr<std::unique_ptr<InferRequest>> Decode(const ModelHandle& model) override {
    steps.push_back("decode " + model.spec().name);
    if (!refusal_.ok()) return refusal_;
    auto request = std::make_unique<InferRequest>();
    request->id = id;
    request->inputs.push_back(TensorView{"x",
                                         DataType::kInt32,
                                         {1, static_cast<int64_t>(values_.size())},
                                         reinterpret_cast<const char*>(values_.data()),
                                         values_.size() * 4,
                                         {}});
    return request;
  }
  void Accepted(const InferRequest& request, const InFlightModel& model) override {
    steps.push_back("accepted version " + std::to_string(model->version()));
    stamped_name = request.model_name;
    stamped_protocol = request.protocol;
    stamped_deadline = request.deadline;
    stamped_cancelled = request.cancelled.get();
  }
  void Answer(const Status& status) override {
    steps.push_back("answer");
    held_at_answer = static_cast<bool>(hold.Get());
    answered.set_value(status);
  }

  Status Wait() {
    auto future = answered.get_future();
    EXPECT_EQ(future.wait_for(10s), std::future_status::ready);
    return future.get();
  }
  std::vector<int32_t> Output() {
    EXPECT_EQ(sink_.outputs().size(), 1u);
    const std::string& bytes = sink_.outputs().at(0).data;
    std::vector<int32_t> values(bytes.size() / 4);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }

  std::string id = "id-7";  // the decoded request's
  std::vector<std::string> steps;
  std::string stamped_name;
  Protocol stamped_protocol = Protocol::kGrpc;
  TimePoint stamped_deadline{};
  const std::atomic<bool>* stamped_cancelled = nullptr;
  bool held_at_answer = true;
  std::promise<Status> answered;

 private:
  const std::string model_;
  const std::string version_;
  std::vector<int32_t> values_;
  const Status refusal_;
  TensorSink sink_;
};

class InferencePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lookup_.models["echo"] =
        testing::MakeEchoModel("echo", std::make_unique<testing::EchoBackend>(), &clock_,
                               /*with_sum=*/false, /*max_queue=*/8);
  }
  void TearDown() override {
    for (auto& [name, model] : lookup_.models) model->Stop();
  }

  SteadyTimeSource clock_;
  testing::FakeLookup lookup_;
};

TEST_F(InferencePathTest, RunsDecodeAcceptSubmitAnswerInOrderAndStampsTheRequest) {
  FakeCall call("echo", {4, 5, 6});
  call.protocol = Protocol::kHttp;
  call.deadline = clock_.Now() + 30s;
  call.cancelled = std::make_shared<std::atomic<bool>>(false);
  RunInference(lookup_, &call);
  ASSERT_TRUE(call.Wait().ok());
  EXPECT_EQ(call.steps, (std::vector<std::string>{"decode echo", "accepted version 1", "answer"}));
  EXPECT_EQ(call.stamped_name, "echo");
  EXPECT_EQ(call.stamped_protocol, Protocol::kHttp);
  EXPECT_EQ(call.stamped_deadline, call.deadline);
  EXPECT_EQ(call.stamped_cancelled, call.cancelled.get());
  EXPECT_EQ(call.Output(), (std::vector<int32_t>{4, 5, 6}));
  // The version was released before the answer: an unload waits for answers, not transports.
  EXPECT_FALSE(call.held_at_answer);
  EXPECT_EQ(lookup_.models["echo"]->in_flight(), 0);
}

TEST_F(InferencePathTest, ALookupFailureIsAnsweredAsItIsWithoutDecoding) {
  for (const auto& [name, code] :
       {std::pair<std::string, absl::StatusCode>{"nope", absl::StatusCode::kNotFound},
        {"loading", absl::StatusCode::kUnavailable}}) {
    FakeCall call(name, {1});
    RunInference(lookup_, &call);
    EXPECT_EQ(call.Wait().code(), code) << name;
    EXPECT_EQ(call.steps, (std::vector<std::string>{"answer"})) << name;
  }
}

TEST_F(InferencePathTest, ADecodeRefusalIsTheModelsRejectionAndNothingIsSubmitted) {
  FakeCall call("echo", {1}, absl::InvalidArgumentError("input 'x' is not a tensor"));
  RunInference(lookup_, &call);
  const Status answer = call.Wait();
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(answer.message(), "input 'x' is not a tensor");
  EXPECT_EQ(call.steps, (std::vector<std::string>{"decode echo", "answer"}));
  const ModelStatsSnapshot stats = lookup_.models["echo"]->Statistics();
  EXPECT_EQ(stats.fail.count, 1u);
  EXPECT_EQ(stats.inference_count, 0u);
  EXPECT_EQ(lookup_.models["echo"]->in_flight(), 0);
}

// Both protocols decode the id as the client sent it; the path bounds it once for both.
TEST_F(InferencePathTest, AnIdPastTheBoundIsRefusedLikeADecodeRefusalWithAShortMessage) {
  FakeCall at_bound("echo", {1});
  at_bound.id = std::string(kMaxRequestIdBytes, 'i');
  RunInference(lookup_, &at_bound);
  EXPECT_TRUE(at_bound.Wait().ok());

  FakeCall over("echo", {1});
  over.id = std::string(2 << 20, 'i');
  RunInference(lookup_, &over);
  const Status answer = over.Wait();
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(answer.message(),
            "the request id '" + std::string(64 - 18, 'i') +
                "...(2097152 bytes)' is longer than the 1024 bytes this server takes; send a "
                "shorter id (a UUID or a counter)");
  EXPECT_EQ(over.steps, (std::vector<std::string>{"decode echo", "answer"}));
  EXPECT_EQ(lookup_.models["echo"]->Statistics().fail.count, 1u);
}

TEST_F(InferencePathTest, AModelLevelRefusalComesBackThroughTheSamePath) {
  FakeCall call("echo", {1});
  call.deadline = clock_.Now() - 1s;  // already passed: answered by the scheduler without running
  RunInference(lookup_, &call);
  EXPECT_EQ(call.Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(call.steps, (std::vector<std::string>{"decode echo", "accepted version 1", "answer"}));
  EXPECT_FALSE(call.held_at_answer);
}

// Loads on demand as a test drives them: Await keeps each waiter until the test answers it.
class FakeLoads final : public OnDemandLoads {
 public:
  bool LoadsOnDemand(const std::string& name) const override { return name.rfind("later", 0) == 0; }
  void Await(const std::string& name, TimePoint deadline,
             std::shared_ptr<std::atomic<bool>> /*cancelled*/,
             std::function<void(const Status&)> then) override {
    std::lock_guard<std::mutex> lock(mutex_);
    awaited.push_back(name);
    deadlines.push_back(deadline);
    waiters.push_back(std::move(then));
  }
  void RecordColdStart(const std::string& name, Duration waited) override {
    std::lock_guard<std::mutex> lock(mutex_);
    cold_starts.emplace_back(name, waited);
  }
  std::function<void(const Status&)> Take() {
    std::lock_guard<std::mutex> lock(mutex_);
    auto then = std::move(waiters.front());
    waiters.erase(waiters.begin());
    return then;
  }
  std::vector<std::string> awaited;
  std::vector<TimePoint> deadlines;
  std::vector<std::function<void(const Status&)>> waiters;
  std::vector<std::pair<std::string, Duration>> cold_starts;

 private:
  std::mutex mutex_;
};

TEST_F(InferencePathTest, ARequestForAModelThatLoadsOnDemandWaitsThenRunsAndCountsAsAColdStart) {
  FakeLoads loads;
  lookup_.loads = &loads;
  FakeCall call("later", {7, 8});
  call.deadline = clock_.Now() + 30s;
  call.caller_may_run = true;
  RunInference(lookup_, &call);
  ASSERT_EQ(loads.awaited, std::vector<std::string>{"later"});
  EXPECT_EQ(loads.deadlines.at(0), call.deadline);
  EXPECT_TRUE(call.steps.empty());  // nothing decoded, nothing answered: it waits
  {
    std::lock_guard<std::mutex> lock(lookup_.mutex);
    lookup_.models["later"] =
        testing::MakeEchoModel("later", std::make_unique<testing::EchoBackend>(), &clock_,
                               /*with_sum=*/false, /*max_queue=*/8);
  }
  loads.Take()(absl::OkStatus());  // loaded: the request goes on from the lookup
  ASSERT_TRUE(call.Wait().ok());
  EXPECT_EQ(call.steps, (std::vector<std::string>{"decode later", "accepted version 1", "answer"}));
  EXPECT_EQ(call.Output(), (std::vector<int32_t>{7, 8}));
  EXPECT_FALSE(
      call.caller_may_run);  // the thread that answered the wait never runs the model itself
  ASSERT_EQ(loads.cold_starts.size(), 1u);
  EXPECT_EQ(loads.cold_starts[0].first, "later");
  lookup_.models["later"]->Stop();
}

TEST_F(InferencePathTest, AFailedLoadIsTheAnswerAndAModelEvictedAgainIsWaitedForOnceMore) {
  FakeLoads loads;
  lookup_.loads = &loads;
  FakeCall failed("later_broken", {1});
  RunInference(lookup_, &failed);
  loads.Take()(absl::InternalError("failed to load 'later_broken' on demand: bad archive"));
  Status status = failed.Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "failed to load 'later_broken' on demand: bad archive");
  EXPECT_EQ(failed.steps, (std::vector<std::string>{"answer"}));

  // Loaded, but gone again before the request looked (evicted for another): it waits once more,
  // then takes Find's answer.
  FakeCall gone("later_gone", {1});
  RunInference(lookup_, &gone);
  loads.Take()(absl::OkStatus());
  ASSERT_EQ(loads.awaited.size(), 3u);
  loads.Take()(absl::OkStatus());
  status = gone.Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(loads.awaited.size(), 3u);
  EXPECT_TRUE(loads.cold_starts.empty());

  // A model that does not load on demand, or an unknown one, is answered as before.
  FakeCall unknown("nope", {1});
  RunInference(lookup_, &unknown);
  EXPECT_EQ(unknown.Wait().code(), absl::StatusCode::kNotFound);
  FakeCall loading("loading", {1});
  RunInference(lookup_, &loading);
  EXPECT_EQ(loading.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(loads.awaited.size(), 3u);
}

// Counts Submitted, as a stream does before it reads its next request.
class CountingObserver final : public SubmissionObserver {
 public:
  void Submitted() override { told.fetch_add(1); }
  std::atomic<int> told{0};
};

// With quotas on, admission is step 0: a refused request is answered with the quota's status
// before any lookup or decoding, the observer is told, and an admitted request's ticket is back
// before its answer (the client's in-flight count is 0 when it hears).
TEST_F(InferencePathTest, AClientOverItsQuotaIsRefusedFirstAndAnAdmittedOneIsReleasedByTheAnswer) {
  FakeTimeSource clock;
  ClientQuotas::Options options;
  options.quota.rate = 1;
  options.quota.burst = 1;
  options.clock = &clock;
  std::unique_ptr<ClientQuotas> quotas = ClientQuotas::Create(options).value();

  CountingObserver observer;
  FakeCall admitted("echo", {1});
  admitted.quotas = quotas.get();
  admitted.client = "10.0.0.7";
  admitted.submission_observer = &observer;
  RunInference(lookup_, &admitted);
  ASSERT_TRUE(admitted.Wait().ok());
  EXPECT_FALSE(static_cast<bool>(admitted.quota_ticket));
  EXPECT_EQ(quotas->Report().other.in_flight, 0);

  FakeCall refused("nope", {1});  // no such model: the quota answers before the lookup would
  refused.quotas = quotas.get();
  refused.client = "10.0.0.7";
  refused.submission_observer = &observer;
  RunInference(lookup_, &refused);
  const Status answer = refused.Wait();
  EXPECT_EQ(answer.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(answer.message().find("client '10.0.0.7' is over its rate of 1"), std::string::npos)
      << answer.message();
  ASSERT_TRUE(RetryAfter(answer).has_value());
  EXPECT_EQ(RetryAfter(answer)->count(), 1000);
  EXPECT_EQ(refused.steps, (std::vector<std::string>{"answer"}));
  EXPECT_EQ(observer.told.load(), 2);

  // Another client has its own bucket; quotas off (null) admit anything.
  FakeCall other("echo", {2});
  other.quotas = quotas.get();
  other.client = "10.0.0.8";
  RunInference(lookup_, &other);
  EXPECT_TRUE(other.Wait().ok());
  const ClientQuotaReport report = quotas->Report();
  EXPECT_EQ(report.clients.size(), 2u);  // both named (10 metric names by default)
  FakeCall unlimited("echo", {3});
  RunInference(lookup_, &unlimited);
  EXPECT_TRUE(unlimited.Wait().ok());
}

TEST_F(InferencePathTest, TheObserverIsToldOnceTheRequestIsHandedOnAndOnlyThen) {
  // Submitted to its model: told before RunInference returns, once.
  CountingObserver submitted;
  FakeCall call("echo", {1, 2});
  call.submission_observer = &submitted;
  RunInference(lookup_, &call);
  EXPECT_EQ(submitted.told.load(), 1);
  ASSERT_TRUE(call.Wait().ok());
  EXPECT_EQ(submitted.told.load(), 1);

  // Answered before any model has it (no such model, a decode refusal): told as well.
  CountingObserver refused;
  FakeCall unknown("nope", {1});
  unknown.submission_observer = &refused;
  RunInference(lookup_, &unknown);
  EXPECT_EQ(refused.told.load(), 1);
  FakeCall undecodable("echo", {1}, absl::InvalidArgumentError("bad"));
  undecodable.submission_observer = &refused;
  RunInference(lookup_, &undecodable);
  EXPECT_EQ(refused.told.load(), 2);

  // Waiting for its model to load on demand: told only after the wait, by the run that follows it
  // (a stream's next request must not reach the model first).
  FakeLoads loads;
  lookup_.loads = &loads;
  CountingObserver waited;
  FakeCall later("later", {3});
  later.submission_observer = &waited;
  RunInference(lookup_, &later);
  EXPECT_EQ(waited.told.load(), 0);
  {
    std::lock_guard<std::mutex> lock(lookup_.mutex);
    lookup_.models["later"] =
        testing::MakeEchoModel("later", std::make_unique<testing::EchoBackend>(), &clock_,
                               /*with_sum=*/false, /*max_queue=*/8);
  }
  loads.Take()(absl::OkStatus());
  EXPECT_EQ(waited.told.load(), 1);
  ASSERT_TRUE(later.Wait().ok());

  // A failed load, and a model gone again after its load (waited for twice): told once, at the end.
  CountingObserver failed;
  FakeCall broken("later_broken", {1});
  broken.submission_observer = &failed;
  RunInference(lookup_, &broken);
  EXPECT_EQ(failed.told.load(), 0);
  loads.Take()(absl::InternalError("bad archive"));
  EXPECT_EQ(failed.told.load(), 1);
  CountingObserver evicted;
  FakeCall gone("later_gone", {1});
  gone.submission_observer = &evicted;
  RunInference(lookup_, &gone);
  loads.Take()(absl::OkStatus());
  EXPECT_EQ(evicted.told.load(), 0);  // waits once more
  loads.Take()(absl::OkStatus());
  EXPECT_EQ(gone.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(evicted.told.load(), 1);
  lookup_.models["later"]->Stop();
}

// A call whose input "x" (INT32 [1, n]) lies in a shared memory region, resolved as the front
// ends resolve it, with its references handed to the path.
class ShmCall final : public InferenceCall {
 public:
  ShmCall(const SharedMemoryManager* registry, uint64_t byte_size)
      : refs_(registry), byte_size_(byte_size) {
    shared_memory_refs = &refs_;
  }
  const std::string& model_name() const override { return model_; }
  const std::string& model_version() const override { return version_; }
  absl::string_view request_id() const override { return "shm"; }
  OutputSink* sink() override { return &sink_; }
  StatusOr<std::unique_ptr<InferRequest>> Decode(const ModelHandle&) override {
    auto request = std::make_unique<InferRequest>();
    request->inputs.push_back(TensorView{
        "x", DataType::kInt32, {1, static_cast<int64_t>(byte_size_ / 4)}, nullptr, 0, {}});
    SLUICE_RETURN_IF_ERROR(
        refs_.ResolveInput({"r", 0, byte_size_}, &request->inputs.back(), request.get()));
    request->shared_memory = refs_.used();
    return request;
  }
  void Answer(const Status& status) override { answered.set_value(status); }

  Status Wait() {
    auto future = answered.get_future();
    EXPECT_EQ(future.wait_for(10s), std::future_status::ready);
    return future.get();
  }
  std::promise<Status> answered;

 private:
  const std::string model_ = "echo";
  const std::string version_;
  SharedMemoryRefs refs_;
  const uint64_t byte_size_;
  TensorSink sink_;
};

// The client shrinks its object after registering it and before (or while) its request runs: the
// model's read of the input faults, the guard gives it zero pages, and the path answers
// INVALID_ARGUMENT instead of the result computed from them. The server goes on serving.
TEST_F(InferencePathTest, ARequestWhoseRegionIsTruncatedInFlightIsRefusedInsteadOfAnswered) {
  const std::string key = "/sluice_path_test_" + std::to_string(getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  const int32_t values[3] = {4, 5, 6};
  ASSERT_EQ(pwrite(fd, values, sizeof(values), 0), static_cast<ssize_t>(sizeof(values)));
  SharedMemoryManager::Options keys;
  keys.key_prefixes = {"/sluice_path_test_"};
  SharedMemoryManager registry(keys);
  ASSERT_TRUE(registry.Register("r", key, 0, 8192).ok());

  ShmCall healthy(&registry, sizeof(values));
  RunInference(lookup_, &healthy);
  EXPECT_TRUE(healthy.Wait().ok());

  ASSERT_EQ(ftruncate(fd, 0), 0);  // the attack: the region's pages are gone
  ShmCall attacked(&registry, sizeof(values));
  RunInference(lookup_, &attacked);
  const Status answer = attacked.Wait();
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      answer.message().find("shared memory region 'r' was truncated while the request used it"),
      absl::string_view::npos)
      << answer;
  EXPECT_TRUE(registry.Regions("").value().empty());  // dropped by the check

  FakeCall after("echo", {1, 2});
  RunInference(lookup_, &after);
  ASSERT_TRUE(after.Wait().ok());
  EXPECT_EQ(after.Output(), (std::vector<int32_t>{1, 2}));
  close(fd);
  shm_unlink(key.c_str());
}

}  // namespace
}  // namespace sluice
