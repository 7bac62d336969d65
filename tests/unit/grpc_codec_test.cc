// The gRPC codec: ModelInferRequest <-> domain types, and the response sink.
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/grpc/grpc_codec.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::vector<T> Values(const TensorView& view) {
  std::vector<T> values(view.byte_size / sizeof(T));
  std::memcpy(values.data(), view.data, view.byte_size);
  return values;
}

TEST(GrpcCodecTest, RawInputsAreViewedNotCopied) {
  inference::ModelInferRequest proto;
  proto.set_model_name("m");
  proto.set_id("abc");
  auto* input = proto.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  input->add_shape(1);
  input->add_shape(2);
  float data[2] = {1.5f, -2.0f};
  proto.add_raw_input_contents(std::string(reinterpret_cast<char*>(data), sizeof(data)));
  proto.add_outputs()->set_name("y");

  auto request = InferRequestFromProto(proto);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ((*request)->model_name, "m");
  EXPECT_EQ((*request)->id, "abc");
  ASSERT_EQ((*request)->inputs.size(), 1u);
  const TensorView& view = (*request)->inputs[0];
  EXPECT_EQ(view.data, proto.raw_input_contents(0).data());
  EXPECT_EQ(view.dtype, DataType::kFp32);
  EXPECT_THAT(view.shape, ElementsAre(1, 2));
  EXPECT_THAT(Values<float>(view), ElementsAre(1.5f, -2.0f));
  EXPECT_THAT((*request)->requested_outputs, ElementsAre("y"));
}

inference::ModelInferRequest Typed(const std::string& datatype, std::vector<int64_t> shape) {
  inference::ModelInferRequest proto;
  auto* input = proto.add_inputs();
  input->set_name("x");
  input->set_datatype(datatype);
  for (int64_t dim : shape) input->add_shape(dim);
  return proto;
}

TEST(GrpcCodecTest, TypedContentsConvertPerDatatype) {
  {
    auto proto = Typed("INT8", {3});
    for (int v : {-128, 0, 127}) proto.mutable_inputs(0)->mutable_contents()->add_int_contents(v);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<int8_t>((*request)->inputs[0]), ElementsAre(-128, 0, 127));
  }
  {
    auto proto = Typed("UINT8", {2});
    for (unsigned v : {0u, 255u}) proto.mutable_inputs(0)->mutable_contents()->add_uint_contents(v);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<uint8_t>((*request)->inputs[0]), ElementsAre(0, 255));
  }
  {
    auto proto = Typed("INT16", {2});
    for (int v : {-32768, 32767}) proto.mutable_inputs(0)->mutable_contents()->add_int_contents(v);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<int16_t>((*request)->inputs[0]), ElementsAre(-32768, 32767));
  }
  {
    auto proto = Typed("BOOL", {3});
    for (bool v : {true, false, true})
      proto.mutable_inputs(0)->mutable_contents()->add_bool_contents(v);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<uint8_t>((*request)->inputs[0]), ElementsAre(1, 0, 1));
  }
  {
    auto proto = Typed("INT64", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_int64_contents(int64_t{1} << 40);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<int64_t>((*request)->inputs[0]), ElementsAre(int64_t{1} << 40));
  }
  {
    // bytes_contents: one element each, serialized as the raw form is (length, bytes).
    auto proto = Typed("BYTES", {3});
    for (const char* v : {"ab", "", "\xc3\xa9"})
      proto.mutable_inputs(0)->mutable_contents()->add_bytes_contents(v);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    const TensorView& view = (*request)->inputs[0];
    EXPECT_EQ(view.dtype, DataType::kBytes);
    EXPECT_EQ(std::string(view.data, view.byte_size),
              std::string("\x02\0\0\0ab\0\0\0\0\x02\0\0\0\xc3\xa9", 16));
  }
  {
    auto proto = Typed("FP64", {2});
    proto.mutable_inputs(0)->mutable_contents()->add_fp64_contents(0.1);
    proto.mutable_inputs(0)->mutable_contents()->add_fp64_contents(-1e300);
    auto request = InferRequestFromProto(proto);
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_THAT(Values<double>((*request)->inputs[0]), ElementsAre(0.1, -1e300));
  }
}

TEST(GrpcCodecTest, SequenceParametersAsTritonClientsSendThem) {
  inference::ModelInferRequest proto = Typed("INT32", {1});
  proto.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
  auto& parameters = *proto.mutable_parameters();
  parameters["sequence_id"].set_int64_param(42);  // tritonclient sends integers as int64_param
  parameters["sequence_start"].set_bool_param(true);
  parameters["timeout"].set_int64_param(900);
  auto request = InferRequestFromProto(proto);
  ASSERT_TRUE(request.ok()) << request.status();
  const SequenceControl& sequence = (*request)->parameters.sequence;
  EXPECT_EQ(sequence.id.number, 42u);
  EXPECT_TRUE(sequence.start);
  EXPECT_FALSE(sequence.end);
  EXPECT_EQ((*request)->parameters.timeout_us, 900);

  parameters["sequence_id"].set_string_param("session-1");
  parameters["sequence_end"].set_bool_param(true);
  parameters.erase("sequence_start");
  request = InferRequestFromProto(proto);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ((*request)->parameters.sequence.id.text, "session-1");
  EXPECT_TRUE((*request)->parameters.sequence.end);
  EXPECT_FALSE((*request)->parameters.sequence.start);

  parameters["sequence_id"].set_uint64_param(18446744073709551615u);
  request = InferRequestFromProto(proto);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ((*request)->parameters.sequence.id.number, 18446744073709551615u);

  parameters["sequence_id"].set_int64_param(-1);
  EXPECT_THAT(InferRequestFromProto(proto).status().message(),
              HasSubstr("'sequence_id' must not be negative"));
  parameters["sequence_id"].set_bool_param(true);
  EXPECT_THAT(InferRequestFromProto(proto).status().message(),
              HasSubstr("must be an integer or a string"));
  parameters["sequence_id"].set_int64_param(1);
  parameters["sequence_end"].set_int64_param(1);
  EXPECT_THAT(InferRequestFromProto(proto).status().message(),
              HasSubstr("'sequence_end' must be a boolean"));
}

TEST(GrpcCodecTest, Errors) {
  struct Case {
    std::string what;
    inference::ModelInferRequest proto;
    std::string message;
  };
  std::vector<Case> cases;
  {
    auto proto = Typed("STRING", {1});
    cases.push_back({"unknown datatype", proto, "datatype 'STRING' is not supported"});
  }
  {
    auto proto = Typed("BYTES", {2});
    proto.mutable_inputs(0)->mutable_contents()->add_bytes_contents("one");
    cases.push_back({"bytes count", proto, "has 1 typed values, but shape [2] needs 2"});
  }
  {
    auto proto = Typed("BYTES", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
    cases.push_back({"bytes in the wrong field", proto,
                     "has values in a typed field that does not belong to it"});
  }
  {
    auto proto = Typed("INT8", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_int_contents(128);
    cases.push_back({"int8 range", proto, "value 128 does not fit INT8"});
  }
  {
    auto proto = Typed("UINT8", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_uint_contents(256);
    cases.push_back({"uint8 range", proto, "value 256 does not fit UINT8"});
  }
  {
    auto proto = Typed("FP16", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
    cases.push_back({"fp16 typed", proto, "FP16 has no typed contents field"});
  }
  {
    auto proto = Typed("FP32", {3});
    proto.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
    cases.push_back({"count", proto, "has 1 typed values, but shape [3] needs 3"});
  }
  {
    auto proto = Typed("FP32", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
    cases.push_back(
        {"wrong field", proto, "has values in a typed field that does not belong to it"});
  }
  {
    auto proto = Typed("FP32", {2});
    cases.push_back({"no data", proto, "has no data"});
  }
  {
    auto proto = Typed("FP32", {1});
    proto.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
    proto.add_raw_input_contents(std::string(4, '\0'));
    proto.set_model_name("simple");
    cases.push_back({"mixed", proto,
                     "contents field must not be specified when using raw_input_contents for 'x' "
                     "for model 'simple'"});
  }
  {
    auto proto = Typed("FP32", {1});
    proto.add_raw_input_contents(std::string(4, '\0'));
    proto.add_raw_input_contents(std::string(4, '\0'));
    cases.push_back({"raw count", proto, "raw_input_contents has 2 entries for 1 inputs"});
  }
  {
    auto proto = Typed("FP32", {-3});
    proto.add_raw_input_contents("");
    cases.push_back({"negative", proto, "negative dimension"});
  }
  for (const Case& c : cases) {
    auto request = InferRequestFromProto(c.proto);
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(request.status().message(), HasSubstr(c.message)) << c.what;
  }
}

TEST(GrpcCodecTest, ResponseEchoesAndTheSinkWritesIntoTheMessage) {
  InferRequest request;
  request.model_name = "m";
  request.id = "req-1";
  inference::ModelInferResponse proto;
  FillInferResponseHeader(request, 3, &proto);
  ResponseSink sink(&proto);
  const std::string name = "y";
  const Shape shape = {1, 2};
  StatusOr<char*> memory = sink.Allocate({name, DataType::kInt32, shape, 8, MemoryType::kCpu});
  ASSERT_TRUE(memory.ok());
  std::memset(*memory, 1, 8);  // the backend's one copy lands in raw_output_contents itself
  EXPECT_EQ(*memory, proto.raw_output_contents(0).data());
  EXPECT_EQ(proto.model_name(), "m");
  EXPECT_EQ(proto.model_version(), "3");
  EXPECT_EQ(proto.id(), "req-1");
  ASSERT_EQ(proto.outputs_size(), 1);
  EXPECT_EQ(proto.outputs(0).datatype(), "INT32");
  EXPECT_THAT(proto.outputs(0).shape(), ElementsAre(1, 2));
  EXPECT_EQ(proto.raw_output_contents(0), std::string(8, '\x01'));
}

}  // namespace
}  // namespace sluice
