// preserve_ordering's answer order (ResponseOrder) on its own; DynamicBatcherTest covers it in the
// batcher.
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/batching/response_order.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;

// Answers finish on many threads at once; each leaves exactly once, in order.
TEST(ResponseOrderTest, ConcurrentFinishersDeliverEveryAnswerOnceInOrder) {
  ResponseOrder order;
  constexpr int kRequests = 2000;
  std::vector<InferCompletion> completions;
  std::vector<int> delivered;
  for (int i = 0; i < kRequests; ++i) {
    // Only one thread delivers at a time, so `delivered` needs no lock of its own.
    completions.push_back(order.InLine([&delivered, i](Status) { delivered.push_back(i); }));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = kRequests - 1 - t; i >= 0; i -= 4)
        completions[static_cast<size_t>(i)](absl::OkStatus());
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(delivered.size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) ASSERT_EQ(delivered[static_cast<size_t>(i)], i);
  EXPECT_EQ(order.held(), 0u);
}

// A completion that submits the next request (a stream's next read) may finish it at once.
TEST(ResponseOrderTest, ACompletionMayFinishAnotherWhileDelivering) {
  ResponseOrder order;
  std::vector<int> delivered;
  InferCompletion second;
  InferCompletion first = order.InLine([&](Status) {
    delivered.push_back(0);
    second = order.InLine([&](Status) { delivered.push_back(1); });
    second(absl::OkStatus());  // its turn has come: it leaves right after this one
  });
  first(absl::OkStatus());
  EXPECT_THAT(delivered, ElementsAre(0, 1));
}

}  // namespace
}  // namespace sluice
