// What the batch queue and batch assembly tests share: requests of INT32 rows, and a fixture
// that adds them to a queue on a fake clock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/batching/batch_former.h"
#include "server/core/clock.h"

namespace sluice::testing {

// A request for input "x" of INT32 with `rows` rows of `width` values, each value = `tag`.
struct Owned {
  std::vector<int32_t> data;
  std::unique_ptr<InferRequest> request;
};
inline Owned Make(int64_t rows, int64_t width, int32_t tag, TimePoint deadline = kNoDeadline) {
  Owned owned;
  owned.data.assign(static_cast<size_t>(rows * width), tag);
  owned.request = std::make_unique<InferRequest>();
  owned.request->model_name = "m";
  owned.request->id = std::to_string(tag);
  owned.request->batch_size = rows;
  owned.request->deadline = deadline;
  owned.request->inputs.push_back({"x",
                                   DataType::kInt32,
                                   {rows, width},
                                   reinterpret_cast<const char*>(owned.data.data()),
                                   owned.data.size() * sizeof(int32_t),
                                   {}});
  return owned;
}

// Requests added to a BatchFormer on a fake clock, their data kept alive for the test.
class BatchFormerFixture : public ::testing::Test {
 protected:
  BatchFormer::Options Options() {
    BatchFormer::Options options;
    options.max_batch_size = 8;
    options.max_queue_delay = std::chrono::microseconds(100);
    return options;
  }

  // Adds a request; keeps its data alive for the test. `why` (may be null) and `busy`:
  // BatchFormer::Add's.
  Status Add(BatchFormer& queue, int64_t rows, int64_t width = 2, TimePoint deadline = kNoDeadline,
             EarlyRefusal* why = nullptr, int busy = -1) {
    Owned owned = Make(rows, width, next_tag_++, deadline);
    PendingRequest pending{std::move(owned.request), nullptr, nullptr, clock_.Now(),
                           owned.data.size() * 4};
    data_.push_back(std::move(owned.data));
    return queue.Add(pending, why, busy);
  }

  static std::vector<std::string> Ids(const FormedBatch& batch) {
    std::vector<std::string> ids;
    for (const auto& pending : batch.requests) ids.push_back(pending.request->id);
    return ids;
  }

  FakeTimeSource clock_;
  int32_t next_tag_ = 1;
  std::vector<std::vector<int32_t>> data_;
};

}  // namespace sluice::testing
