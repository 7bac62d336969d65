// Request validation against a model's inputs and outputs (server/core/validation.h).
#include "server/core/validation.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::Serialize;

class ValidationTest : public ::testing::Test {
 protected:
  ValidationTest() {
    spec_.name = "m";
    spec_.max_batch_size = 4;
    spec_.inputs = {{"a", DataType::kFp32, {3}}, {"b", DataType::kInt64, {-1, 2}}};
    spec_.outputs = {{"y", DataType::kFp32, {3}}};
  }

  // A valid request with batch `batch`; byte sizes match shapes (data itself is not read).
  InferRequest Request(int64_t batch = 2) {
    InferRequest request;
    request.inputs.push_back(
        {"a", DataType::kFp32, {batch, 3}, buffer_, static_cast<size_t>(batch * 3 * 4), {}});
    request.inputs.push_back(
        {"b", DataType::kInt64, {batch, 5, 2}, buffer_, static_cast<size_t>(batch * 10 * 8), {}});
    return request;
  }

  Status Validate(InferRequest request) { return ValidateRequest(spec_, &request); }

  ModelSpec spec_;
  char buffer_[1024] = {};
};

TEST_F(ValidationTest, AcceptsValidRequestAndSetsBatchSize) {
  InferRequest request = Request(3);
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 3);
}

TEST_F(ValidationTest, EachErrorNamesTheTensor) {
  struct Case {
    std::string what;
    std::function<void(InferRequest&)> mutate;
    std::string message;
  };
  std::vector<Case> cases = {
      {"missing", [](InferRequest& r) { r.inputs.pop_back(); }, "missing input 'b'"},
      {"extra",
       [](InferRequest& r) {
         r.inputs.push_back(r.inputs[0]);
         r.inputs.back().name = "c";
       },
       "unexpected input 'c' for model 'm'; it takes: a, b"},
      {"duplicate", [](InferRequest& r) { r.inputs.push_back(r.inputs[0]); },
       "input 'a' is given more than once"},
      {"dtype", [](InferRequest& r) { r.inputs[0].dtype = DataType::kFp64; },
       "input 'a' has datatype FP64, model 'm' expects FP32"},
      {"rank", [](InferRequest& r) { r.inputs[0].shape = {2}; },
       "rank 1 where the model takes rank 2"},
      {"dims",
       [](InferRequest& r) {
         r.inputs[0].shape = {2, 4};
       },
       "dimension 1 is 4"},
      {"bytes", [](InferRequest& r) { r.inputs[0].byte_size -= 1; },
       "has 23 bytes of data, but shape [2,3] of FP32 needs 24"},
      {"batch mismatch",
       [](InferRequest& r) {
         r.inputs[1].shape[0] = 1;
         r.inputs[1].byte_size = 80;
       },
       "inputs disagree on the batch dimension"},
      {"batch too big", [this](InferRequest& r) { r = Request(5); },
       "batch size 5 is outside [1, 4]"},
      {"zero batch", [this](InferRequest& r) { r = Request(0); }, "batch size 0 is outside [1, 4]"},
      {"unknown output", [](InferRequest& r) { r.requested_outputs = {"z"}; },
       "unknown requested output 'z'"},
      {"output twice",
       [](InferRequest& r) {
         r.requested_outputs = {"y", "y"};
       },
       "output 'y' is requested more than once"},
  };
  for (const Case& c : cases) {
    InferRequest request = Request();
    c.mutate(request);
    Status status = Validate(std::move(request));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
}

TEST_F(ValidationTest, StringInputsAreCheckedElementByElement) {
  spec_.inputs = {{"s", DataType::kBytes, {1}}};
  const std::string good = Serialize({"one", "two"});
  InferRequest request;
  request.inputs.push_back({"s", DataType::kBytes, {2, 1}, good.data(), good.size(), {}});
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 2);
  EXPECT_EQ(request.InputBytes(), good.size());  // what the queued-bytes budget counts
  request.inputs[0].shape = {3, 1};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("input 's' has 2 BYTES elements but its shape needs 3"));
  const std::string bad = Serialize({"one", "\xff"});
  request.inputs[0] = {"s", DataType::kBytes, {2, 1}, bad.data(), bad.size(), {}};
  const Status status = ValidateRequest(spec_, &request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("input 's': BYTES element 1 is not valid UTF-8"));
  request.inputs[0] = {"s", DataType::kFp32, {2, 1}, buffer_, 8, {}};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("has datatype FP32, model 'm' expects BYTES"));
}

TEST_F(ValidationTest, ModelWithoutBatchingTakesExactShape) {
  spec_.max_batch_size = 0;
  spec_.inputs = {{"a", DataType::kFp32, {2, 3}}};
  InferRequest request;
  request.inputs.push_back({"a", DataType::kFp32, {2, 3}, buffer_, 24, {}});
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 1);
  request.inputs[0].shape = {1, 2, 3};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("rank 3 where the model takes rank 2"));
}

TEST_F(ValidationTest, ClassificationsNameRequestedOutputsOfAClassifiableType) {
  spec_.outputs = {
      {"y", DataType::kFp32, {3}}, {"flag", DataType::kBool, {1}}, {"text", DataType::kBytes, {1}}};
  InferRequest request = Request();
  request.requested_outputs = {"y"};
  request.classifications = {{"y", 2}};
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());

  struct Case {
    std::vector<std::string> requested;
    std::vector<ClassificationRequest> classifications;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"y"}, {{"flag", 1}}, "classification of output 'flag', which the request does not ask for"},
      {{"y"}, {{"nope", 1}}, "classification of output 'nope', which the request does not ask for"},
      {{"y"}, {{"y", 0}}, "output 'y': the class count must be at least 1"},
      {{"y"}, {{"y", 1}, {"y", 2}}, "output 'y' is classified more than once"},
      {{"flag"},
       {{"flag", 1}},
       "output 'flag': class result not available for output due to unsupported type 'BOOL'"},
      {{"text"},
       {{"text", 1}},
       "output 'text': class result not available for output due to unsupported type 'BYTES'"},
  };
  for (const Case& each : cases) {
    SCOPED_TRACE(each.message);
    InferRequest refused = Request();
    refused.requested_outputs = each.requested;
    refused.classifications = each.classifications;
    const Status status = ValidateRequest(spec_, &refused);
    EXPECT_TRUE(absl::IsInvalidArgument(status));
    EXPECT_EQ(status.message(), each.message);
  }
}

}  // namespace
}  // namespace sluice
