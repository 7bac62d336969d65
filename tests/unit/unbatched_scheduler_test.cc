#include <future>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/unbatched_scheduler.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::FakeBackend;

std::unique_ptr<InferRequest> Request(const std::string& id) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = "m";
  request->id = id;
  return request;
}

// Collects completions; each id must be answered exactly once.
class Answers {
 public:
  InferCompletion For(const std::string& id) {
    return [this, id](StatusOr<InferResponse> result) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++count_[id];
      results_.emplace(id, std::move(result));
      cv_.notify_all();
    };
  }
  void WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return results_.size() >= n; }));
  }
  std::map<std::string, int> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }
  StatusOr<InferResponse> Get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return results_.find(id)->second;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, int> count_;
  std::multimap<std::string, StatusOr<InferResponse>> results_;
};

TEST(UnbatchedSchedulerTest, NeedsInstances) {
  EXPECT_EQ(UnbatchedScheduler::Create({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UnbatchedSchedulerTest, ManyThreadsEveryRequestAnsweredOnceWithItsOwnResult) {
  std::vector<std::unique_ptr<ModelBackend>> instances;
  for (int i = 0; i < 3; ++i) instances.push_back(std::make_unique<FakeBackend>());
  UnbatchedScheduler::Options options;
  options.max_queue_size = 100000;
  auto scheduler = UnbatchedScheduler::Create(std::move(instances), options);
  ASSERT_TRUE(scheduler.ok());
  Answers answers;
  constexpr int kThreads = 8, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = std::to_string(t * kPerThread + i);
        (*scheduler)->Enqueue(Request(id), answers.For(id));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  answers.WaitFor(kThreads * kPerThread);
  auto counts = answers.counts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& [id, count] : counts) {
    ASSERT_EQ(count, 1) << id;
    auto result = answers.Get(id);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->outputs[0].data, id);
  }
}

TEST(UnbatchedSchedulerTest, FullQueueRejectsAtOnceWithUnavailable) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  fake->CloseGate();
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::move(backend));
  UnbatchedScheduler::Options options;
  options.max_queue_size = 2;
  auto scheduler = *UnbatchedScheduler::Create(std::move(instances), options);
  Answers answers;
  scheduler->Enqueue(Request("running"), answers.For("running"));
  fake->WaitStarted(1);  // now in flight, off the queue
  scheduler->Enqueue(Request("q1"), answers.For("q1"));
  scheduler->Enqueue(Request("q2"), answers.For("q2"));
  scheduler->Enqueue(Request("rejected"), answers.For("rejected"));
  answers.WaitFor(1);
  auto rejected = answers.Get("rejected");
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(rejected.status().message(), HasSubstr("the queue limit"));
  fake->OpenGate();
  answers.WaitFor(4);
  EXPECT_TRUE(answers.Get("q2").ok());
}

TEST(UnbatchedSchedulerTest, FailedExecutionFailsOnlyThatRequest) {
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::make_unique<FakeBackend>([](const InferRequest& request) -> StatusOr<InferResponse> {
    if (request.id == "bad") return absl::InternalError("model exploded");
    return InferResponse{};
  }));
  auto scheduler = *UnbatchedScheduler::Create(std::move(instances), {});
  Answers answers;
  scheduler->Enqueue(Request("bad"), answers.For("bad"));
  scheduler->Enqueue(Request("good"), answers.For("good"));
  answers.WaitFor(2);
  EXPECT_EQ(answers.Get("bad").status().message(), "model exploded");
  EXPECT_TRUE(answers.Get("good").ok());
}

TEST(UnbatchedSchedulerTest, ExpiredAndCancelledRequestsNeverRun) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  fake->CloseGate();
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::move(backend));
  FakeTimeSource clock;
  UnbatchedScheduler::Options options;
  options.clock = &clock;
  auto scheduler = *UnbatchedScheduler::Create(std::move(instances), options);
  Answers answers;
  scheduler->Enqueue(Request("running"), answers.For("running"));
  fake->WaitStarted(1);
  auto late = Request("late");
  late->deadline = clock.Now() + std::chrono::milliseconds(5);
  scheduler->Enqueue(std::move(late), answers.For("late"));
  auto gone = Request("gone");
  gone->cancelled = std::make_shared<std::atomic<bool>>(true);
  scheduler->Enqueue(std::move(gone), answers.For("gone"));
  clock.Advance(std::chrono::milliseconds(5));
  fake->OpenGate();
  answers.WaitFor(3);
  EXPECT_EQ(answers.Get("late").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answers.Get("gone").status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(fake->executed(), 1);
}

TEST(UnbatchedSchedulerTest, StopAnswersQueuedRequestsAndFinishesTheRunningOne) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  fake->CloseGate();
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::move(backend));
  auto scheduler = *UnbatchedScheduler::Create(std::move(instances), {});
  Answers answers;
  scheduler->Enqueue(Request("running"), answers.For("running"));
  fake->WaitStarted(1);
  scheduler->Enqueue(Request("queued"), answers.For("queued"));
  std::thread stopper([&] { scheduler->Stop(); });
  answers.WaitFor(1);
  EXPECT_EQ(answers.Get("queued").status().code(), absl::StatusCode::kUnavailable);
  fake->OpenGate();
  stopper.join();
  EXPECT_TRUE(answers.Get("running").ok());
  scheduler->Enqueue(Request("late"), answers.For("late"));
  EXPECT_THAT(answers.Get("late").status().message(), HasSubstr("shutting down"));
  scheduler->Stop();  // idempotent
  EXPECT_EQ(fake->executed(), 1);
}

}  // namespace
}  // namespace sluice
