#include <filesystem>
#include <fstream>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/core/data_type.h"
#include "server/core/device.h"
#include "server/core/pem.h"
#include "server/core/tensor.h"
#include "server/core/validation.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(DataTypeTest, NamesRoundTripAndSizes) {
  for (DataType type : kAllDataTypes) {
    ASSERT_EQ(ParseDataTypeName(DataTypeName(type)), type);
  }
  EXPECT_EQ(ElementSize(DataType::kBool), 1u);
  EXPECT_EQ(ElementSize(DataType::kBf16), 2u);
  EXPECT_EQ(ElementSize(DataType::kFp32), 4u);
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
  EXPECT_FALSE(ParseDataTypeName("BYTES").has_value());
  EXPECT_FALSE(ParseDataTypeName("fp32").has_value());
  EXPECT_FALSE(ParseDataTypeName("UINT16").has_value());
}

TEST(TensorTest, ElementCountRejectsNegativeAndOverflow) {
  EXPECT_EQ(*ElementCount({2, 3, 4}), 24);
  EXPECT_EQ(*ElementCount({}), 1);
  EXPECT_EQ(*ElementCount({5, 0}), 0);
  EXPECT_THAT(ElementCount({2, -1}).status().message(), HasSubstr("negative"));
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THAT(ElementCount({big, 3}).status().message(), HasSubstr("too many elements"));
  EXPECT_EQ(ShapeToString({1, 2, 3}), "[1,2,3]");
}

TEST(PemTest, ReadsPemAndNamesTheFlagOnErrors) {
  const auto directory = std::filesystem::temp_directory_path() / "sluice_pem_test";
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "good.pem") << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  std::ofstream(directory / "bad.pem") << "not a certificate";
  auto good = ReadPemFile((directory / "good.pem").string(), "--grpc-server-cert");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(*good, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(ReadPemFile((directory / "bad.pem").string(), "--grpc-server-cert").status().message(),
              ::testing::HasSubstr("--grpc-server-cert: " + (directory / "bad.pem").string() + " is not a PEM file"));
  EXPECT_THAT(ReadPemFile((directory / "none.pem").string(), "--grpc-root-cert").status().message(),
              ::testing::HasSubstr("--grpc-root-cert: cannot read"));
  EXPECT_THAT(ReadPemFile("", "--grpc-server-key").status().message(), ::testing::HasSubstr("--grpc-server-key is required"));
  std::filesystem::remove_all(directory);
}

TEST(DeviceTest, Rule) {
  // cpu: always the CPU.
  EXPECT_FALSE(DecideDevice(DevicePolicy::kCpu, InstanceKind::kGpu, true)->use_cuda);
  // auto: the GPU for KIND_GPU/KIND_AUTO when usable.
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, true)->use_cuda);
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, true)->use_cuda);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kCpu, true)->use_cuda);
  // auto without a GPU: the CPU, with a warning for KIND_GPU only.
  auto fallback = DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, false);
  EXPECT_FALSE(fallback->use_cuda);
  EXPECT_TRUE(fallback->fell_back_to_cpu);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, false)->fell_back_to_cpu);
  // cuda: an error without a GPU.
  auto required = DecideDevice(DevicePolicy::kCuda, InstanceKind::kCpu, false);
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(required.status().message(), HasSubstr("--gpus all"));
  EXPECT_TRUE(DecideDevice(DevicePolicy::kCuda, InstanceKind::kGpu, true)->use_cuda);
}

TEST(DeviceTest, ParsePolicy) {
  EXPECT_EQ(*ParseDevicePolicy("auto"), DevicePolicy::kAuto);
  EXPECT_EQ(*ParseDevicePolicy("cpu"), DevicePolicy::kCpu);
  EXPECT_EQ(*ParseDevicePolicy("cuda"), DevicePolicy::kCuda);
  EXPECT_EQ(ParseDevicePolicy("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

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
    request.inputs.push_back({"a", DataType::kFp32, {batch, 3}, buffer_, static_cast<size_t>(batch * 3 * 4)});
    request.inputs.push_back({"b", DataType::kInt64, {batch, 5, 2}, buffer_, static_cast<size_t>(batch * 10 * 8)});
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
      {"extra", [](InferRequest& r) { r.inputs.push_back(r.inputs[0]); r.inputs.back().name = "c"; },
       "unexpected input 'c' for model 'm'; it takes: a, b"},
      {"duplicate", [](InferRequest& r) { r.inputs.push_back(r.inputs[0]); }, "input 'a' is given more than once"},
      {"dtype", [](InferRequest& r) { r.inputs[0].dtype = DataType::kFp64; },
       "input 'a' has datatype FP64, model 'm' expects FP32"},
      {"rank", [](InferRequest& r) { r.inputs[0].shape = {2}; }, "rank 1 where the model takes rank 2"},
      {"dims", [](InferRequest& r) { r.inputs[0].shape = {2, 4}; }, "dimension 1 is 4"},
      {"bytes", [](InferRequest& r) { r.inputs[0].byte_size -= 1; }, "has 23 bytes of data, but shape [2,3] of FP32 needs 24"},
      {"batch mismatch", [](InferRequest& r) { r.inputs[1].shape[0] = 1; r.inputs[1].byte_size = 80; },
       "inputs disagree on the batch dimension"},
      {"batch too big", [this](InferRequest& r) { r = Request(5); }, "batch size 5 is outside [1, 4]"},
      {"zero batch", [this](InferRequest& r) { r = Request(0); }, "batch size 0 is outside [1, 4]"},
      {"unknown output", [](InferRequest& r) { r.requested_outputs = {"z"}; }, "unknown requested output 'z'"},
      {"output twice", [](InferRequest& r) { r.requested_outputs = {"y", "y"}; }, "output 'y' is requested more than once"},
  };
  for (const Case& c : cases) {
    InferRequest request = Request();
    c.mutate(request);
    Status status = Validate(std::move(request));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
}

TEST_F(ValidationTest, ModelWithoutBatchingTakesExactShape) {
  spec_.max_batch_size = 0;
  spec_.inputs = {{"a", DataType::kFp32, {2, 3}}};
  InferRequest request;
  request.inputs.push_back({"a", DataType::kFp32, {2, 3}, buffer_, 24});
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 1);
  request.inputs[0].shape = {1, 2, 3};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(), HasSubstr("rank 3 where the model takes rank 2"));
}

}  // namespace
}  // namespace sluice
