#include "server/http/http_codec.h"

#include <gtest/gtest.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>

#include "grpc_service.pb.h"
#include "server/core/bytes_tensor.h"
#include "server/core/message_text.h"
#include "model_config.pb.h"

namespace sluice {
namespace {

template <typename T>
std::vector<T> Values(const TensorView& view) {
  std::vector<T> values(view.byte_size / sizeof(T));
  std::memcpy(values.data(), view.data, view.byte_size);
  return values;
}

StatusOr<JsonInferRequest> Parse(const std::string& body,
                                 std::optional<size_t> header = std::nullopt) {
  return InferRequestFromJson(body, header);
}

TEST(HttpCodecTest, FlatAndNestedDataBecomeTheSameRowMajorBytes) {
  for (const char* data : {"[1, 2.5, -3, 4, 5, 6]", "[[1, 2.5, -3], [4, 5, 6]]",
                           "[[[1], [2.5], [-3]], [[4], [5], [6]]]"}) {
    StatusOr<JsonInferRequest> parsed =
        Parse(std::string(R"({"id": "r1", "inputs": [{"name": "x", "shape": [2, 3],
        "datatype": "FP32", "data": )") +
              data + "}]}");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const InferRequest& request = *parsed->request;
    EXPECT_EQ(request.id, "r1");
    ASSERT_EQ(request.inputs.size(), 1u);
    EXPECT_EQ(request.inputs[0].shape, (Shape{2, 3}));
    EXPECT_EQ(request.inputs[0].dtype, DataType::kFp32);
    EXPECT_EQ(Values<float>(request.inputs[0]), (std::vector<float>{1, 2.5f, -3, 4, 5, 6}));
    EXPECT_TRUE(request.requested_outputs.empty());
    EXPECT_FALSE(parsed->binary_default);
  }
}

TEST(HttpCodecTest, EveryJsonDatatypeConverts) {
  auto one = [](const std::string& datatype, const std::string& data) {
    return Parse(R"({"inputs": [{"name": "x", "shape": [2], "datatype": ")" + datatype +
                 R"(", "data": )" + data + "}]}");
  };
  StatusOr<JsonInferRequest> b = one("BOOL", "[true, false]");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Values<uint8_t>(b->request->inputs[0]), (std::vector<uint8_t>{1, 0}));
  StatusOr<JsonInferRequest> u8 = one("UINT8", "[0, 255]");
  ASSERT_TRUE(u8.ok());
  EXPECT_EQ(Values<uint8_t>(u8->request->inputs[0]), (std::vector<uint8_t>{0, 255}));
  StatusOr<JsonInferRequest> i8 = one("INT8", "[-128, 127]");
  ASSERT_TRUE(i8.ok());
  EXPECT_EQ(Values<int8_t>(i8->request->inputs[0]), (std::vector<int8_t>{-128, 127}));
  StatusOr<JsonInferRequest> i16 = one("INT16", "[-32768, 32767]");
  ASSERT_TRUE(i16.ok());
  EXPECT_EQ(Values<int16_t>(i16->request->inputs[0]), (std::vector<int16_t>{-32768, 32767}));
  StatusOr<JsonInferRequest> i32 = one("INT32", "[-2147483648, 2147483647]");
  ASSERT_TRUE(i32.ok());
  EXPECT_EQ(Values<int32_t>(i32->request->inputs[0]), (std::vector<int32_t>{INT32_MIN, INT32_MAX}));
  StatusOr<JsonInferRequest> i64 = one("INT64", "[-9223372036854775808, 9223372036854775807]");
  ASSERT_TRUE(i64.ok());
  EXPECT_EQ(Values<int64_t>(i64->request->inputs[0]), (std::vector<int64_t>{INT64_MIN, INT64_MAX}));
  StatusOr<JsonInferRequest> strings = one("BYTES", R"(["ab", "\u00e9"])");
  ASSERT_TRUE(strings.ok()) << strings.status();
  const TensorView& text = strings->request->inputs[0];
  EXPECT_EQ(std::string(text.data, text.byte_size),
            std::string("\x02\0\0\0ab\x02\0\0\0\xc3\xa9", 12));
  StatusOr<JsonInferRequest> f64 = one("FP64", "[0.1, NaN]");
  ASSERT_TRUE(f64.ok()) << f64.status();
  EXPECT_EQ(Values<double>(f64->request->inputs[0])[0], 0.1);
  EXPECT_TRUE(std::isnan(Values<double>(f64->request->inputs[0])[1]));

  // Out of range, wrong kinds, and the types JSON cannot carry.
  for (const auto& [datatype, data, words] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"UINT8", "[0, 256]", "does not fit UINT8"},
           {"UINT8", "[-1, 0]", "does not fit UINT8"},
           {"INT8", "[128, 0]", "does not fit INT8"},
           {"INT32", "[2147483648, 0]", "does not fit INT32"},
           {"INT64", "[9223372036854775808, 0]", "does not fit INT64"},
           {"INT32", "[1.5, 0]", "not an integer"},
           {"BOOL", "[1, 0]", "not true or false"},
           {"FP32", "[\"1\", 0]", "not a number"},
           {"FP16", "[1, 0]", "no JSON form"},
           {"BF16", "[1, 0]", "no JSON form"},
           {"BYTES", "[\"a\", 2]", "datatype BYTES has a value that is not a string"},
           {"STRING", "[\"a\", \"b\"]", "datatype 'STRING' is not supported"},
       }) {
    StatusOr<JsonInferRequest> parsed = one(datatype, data);
    ASSERT_FALSE(parsed.ok()) << datatype << " " << data;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(words), std::string::npos) << parsed.status();
  }
}

TEST(HttpCodecTest, BinaryInputsAreViewsOfTheBodyAfterTheHeader) {
  const std::string json = R"({"inputs": [{"name": "a", "shape": [2], "datatype": "FP32",
      "parameters": {"binary_data_size": 8}}, {"name": "b", "shape": [1], "datatype": "INT64", "data": [7]},
      {"name": "c", "shape": [3], "datatype": "UINT8", "parameters": {"binary_data_size": 3}}],
      "outputs": [{"name": "y", "parameters": {"binary_data": true}}, {"name": "z"}],
      "parameters": {"timeout": 2500, "something_else": "ignored"}})";
  const float a[2] = {1.5f, -2.0f};
  std::string body = json;
  body.append(reinterpret_cast<const char*>(a), sizeof(a));
  body.append("\x01\x02\x03", 3);
  StatusOr<JsonInferRequest> parsed = Parse(body, json.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const InferRequest& request = *parsed->request;
  ASSERT_EQ(request.inputs.size(), 3u);
  EXPECT_EQ(request.inputs[0].data, body.data() + json.size());  // no copy
  EXPECT_EQ(Values<float>(request.inputs[0]), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(Values<int64_t>(request.inputs[1]), (std::vector<int64_t>{7}));
  EXPECT_EQ(request.inputs[2].data, body.data() + json.size() + 8);
  EXPECT_EQ(request.parameters.timeout_us, 2500);
  EXPECT_EQ(request.requested_outputs, (std::vector<std::string>{"y", "z"}));
  EXPECT_TRUE(parsed->Binary("y"));
  EXPECT_FALSE(parsed->Binary("z"));

  // binary_data_output sets the default for outputs that do not say.
  StatusOr<JsonInferRequest> all =
      Parse(R"({"inputs": [], "parameters": {"binary_data_output": true},
      "outputs": [{"name": "p"}, {"name": "q", "parameters": {"binary_data": false}}]})");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->Binary("p"));
  EXPECT_FALSE(all->Binary("q"));
  EXPECT_TRUE(all->Binary("unnamed"));
}

TEST(HttpCodecTest, SequenceParameters) {
  StatusOr<JsonInferRequest> numbered = Parse(
      R"({"inputs": [], "parameters": {"sequence_id": 18446744073709551615, "sequence_start": true}})");
  ASSERT_TRUE(numbered.ok()) << numbered.status();
  const SequenceControl& sequence = numbered->request->parameters.sequence;
  EXPECT_EQ(sequence.id.number, 18446744073709551615u);
  EXPECT_FALSE(sequence.id.is_text);
  EXPECT_TRUE(sequence.start);
  EXPECT_FALSE(sequence.end);
  StatusOr<JsonInferRequest> named =
      Parse(R"({"inputs": [], "parameters": {"sequence_id": "user-7", "sequence_end": true}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->request->parameters.sequence.id.text, "user-7");
  EXPECT_TRUE(named->request->parameters.sequence.id.is_text);
  EXPECT_TRUE(named->request->parameters.sequence.end);
  for (const char* body : {R"({"inputs": [], "parameters": {"sequence_id": -3}})",
                           R"({"inputs": [], "parameters": {"sequence_id": 1.5}})",
                           R"({"inputs": [], "parameters": {"sequence_start": "yes"}})"}) {
    StatusOr<JsonInferRequest> bad = Parse(body);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("sequence_"), std::string::npos) << bad.status();
  }
}

TEST(HttpCodecTest, MalformedBodiesSayWhatIsWrong) {
  const std::string binary_header = R"({"inputs": [{"name": "a", "shape": [2], "datatype": "FP32",
      "parameters": {"binary_data_size": 8}}]})";
  const std::vector<std::tuple<std::string, std::optional<size_t>, std::string>> cases = {
      {"{\"inputs\": [", std::nullopt, "not valid JSON"},
      {"[1, 2]", std::nullopt, "not a JSON object"},
      {"{}", std::nullopt, "no 'inputs' array"},
      {R"({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]})", std::nullopt,
       "no 'name'"},
      {R"({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]})", std::nullopt,
       "no 'shape'"},
      {R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]})",
       std::nullopt, "non-negative integers"},
      {R"({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]})",
       std::nullopt, "has 2 values in 'data', but shape [3] needs 3"},
      // Triton's rule and words: exactly one of data, binary_data_size, shared_memory_region.
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]})", std::nullopt,
       "input 'x': Input must set only one of the following fields: 'data', 'binary_data_size' in "
       "'parameters', "
       "'shared_memory_region' in 'parameters'. But no field is set"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
          "parameters": {"binary_data_size": 4}}]})",
       std::nullopt, "But set 'data' 'binary_data_size'"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
          "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]})",
       std::nullopt, "But set 'data' 'shared_memory_region'"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
          "parameters": {"shared_memory_region": "r"}}]})",
       std::nullopt, "without shared_memory_byte_size"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
          "parameters": {"shared_memory_offset": 4}}]})",
       std::nullopt, "but no shared_memory_region"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
          "parameters": {"shared_memory_region": 7, "shared_memory_byte_size": 4}}]})",
       std::nullopt, "shared_memory_region must be a region name"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
          "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": -4}}]})",
       std::nullopt, "shared_memory_byte_size must be a non-negative integer"},
      {R"({"inputs": [], "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r",
          "shared_memory_byte_size": 4, "binary_data": true}}]})",
       std::nullopt, "output 'y': Output can't set both 'shared_memory_region' and 'binary_data'"},
      {binary_header, std::nullopt, "no Inference-Header-Content-Length"},
      {binary_header + "1234", binary_header.size(), "only 4 bytes of binary data are left"},
      {binary_header + "123456789", binary_header.size(), "1 bytes after the JSON header"},
      {binary_header, binary_header.size() + 1, "Inference-Header-Content-Length is"},
      {R"({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": -3}}]})",
       std::nullopt, "the parameter 'classification' must be a non-negative integer"},
      {R"({"inputs": [], "parameters": {"timeout": "soon"}})", std::nullopt, "'timeout' must be"},
      {R"({"inputs": [], "parameters": {"binary_data_output": 1}})", std::nullopt,
       "must be true or false"},
      {R"({"id": 5, "inputs": []})", std::nullopt, "'id' must be a string"},
      // A huge shape with one value: refused on the count, nothing allocated for the shape.
      {R"({"inputs": [{"name": "x", "shape": [1000000000000], "datatype": "FP32", "data": [1]}]})",
       std::nullopt, "has 1 values in 'data', but shape [1000000000000] needs 1000000000000"},
  };
  for (const auto& [body, header, words] : cases) {
    StatusOr<JsonInferRequest> parsed = Parse(body, header);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_NE(parsed.status().message().find(words), std::string::npos) << parsed.status() << "\n"
                                                                        << body;
  }
  // Hostile nesting: refused, not a stack overflow (the parser is iterative, the flattening
  // capped).
  std::string deep = R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": )";
  deep += std::string(100000, '[') + "1" + std::string(100000, ']') + "}]}";
  StatusOr<JsonInferRequest> nested = Parse(deep);
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("nested more than"), std::string::npos)
      << nested.status();
}

TEST(HttpCodecTest, ResponsePrintsJsonOutputsAndMovesBinaryOnes) {
  JsonInferRequest request;
  request.outputs = {{"json", false, std::nullopt}, {"bin", true, std::nullopt}};
  std::deque<HttpOutputSink::Output> outputs(2);
  outputs[0].name = "json";
  outputs[0].dtype = DataType::kInt32;
  outputs[0].shape = {1, 2};
  outputs[0].data.resize(8);
  const int32_t values[2] = {-5, 7};
  std::memcpy(outputs[0].data.data(), values, 8);
  outputs[1].name = "bin";
  outputs[1].dtype = DataType::kFp32;
  outputs[1].shape = {4096};
  outputs[1].data.assign(4096 * 4, '\x7f');
  const char* binary_bytes = outputs[1].data.data();
  size_t header_length = 0;
  std::vector<std::string> body =
      InferResponseToJson("m", 3, "id-1", request, &outputs, &header_length);
  ASSERT_EQ(body.size(), 2u);
  EXPECT_EQ(header_length, body[0].size());
  EXPECT_EQ(body[1].data(), binary_bytes);  // moved, not copied
  EXPECT_EQ(
      body[0],
      R"({"model_name":"m","model_version":"3","id":"id-1","outputs":[{"name":"json","datatype":"INT32",)"
      R"("shape":[1,2],"data":[-5,7]},{"name":"bin","datatype":"FP32","shape":[4096],)"
      R"("parameters":{"binary_data_size":16384}}]})");

  // All JSON: no binary part, no header length, no id when the request had none.
  JsonInferRequest plain;
  std::deque<HttpOutputSink::Output> one(1);
  one[0].name = "b";
  one[0].dtype = DataType::kBool;
  one[0].shape = {2};
  one[0].data = std::string("\x01\x00", 2);
  body = InferResponseToJson("m", 1, "", plain, &one, &header_length);
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(header_length, 0u);
  EXPECT_EQ(
      body[0],
      R"({"model_name":"m","model_version":"1","outputs":[{"name":"b","datatype":"BOOL","shape":[2],)"
      R"("data":[true,false]}]})");
}

TEST(HttpCodecTest, StringOutputsPrintAsJsonStringsOrGoBinary) {
  JsonInferRequest request;
  request.outputs = {{"json", false, std::nullopt}, {"bin", true, std::nullopt}};
  std::deque<HttpOutputSink::Output> outputs(2);
  std::string serialized;
  for (const char* element : {"ab", "", "q\"\n\xc3\xa9"}) AppendBytesElement(element, &serialized);
  for (auto* output : {&outputs[0], &outputs[1]}) {
    output->dtype = DataType::kBytes;
    output->shape = {3};
    output->data = serialized;
  }
  outputs[0].name = "json";
  outputs[1].name = "bin";
  size_t header_length = 0;
  std::vector<std::string> body =
      InferResponseToJson("m", 1, "", request, &outputs, &header_length);
  ASSERT_EQ(body.size(), 2u);
  EXPECT_EQ(body[1], serialized);  // binary: Triton's serialized form, as gRPC's raw contents
  EXPECT_EQ(body[0],
            R"({"model_name":"m","model_version":"1","outputs":[{"name":"json","datatype":"BYTES",)"
            R"("shape":[3],"data":["ab","","q\"\n)"
            "\xc3\xa9"
            R"("]},{"name":"bin","datatype":"BYTES",)"
            R"("shape":[3],"parameters":{"binary_data_size":)" +
                std::to_string(serialized.size()) + "}}]}");
}

TEST(HttpCodecTest, Fp32ValuesRoundTripExactlyThroughJson) {
  std::mt19937 random(7);
  std::vector<float> values = {0.1f,
                               1.0f / 3.0f,
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               -0.0f,
                               16777217.0f};
  std::uniform_int_distribution<uint32_t> bits;
  while (values.size() < 2000) {
    const uint32_t pattern = bits(random);
    float value;
    std::memcpy(&value, &pattern, 4);
    if (std::isfinite(value)) values.push_back(value);
  }
  JsonInferRequest request;
  std::deque<HttpOutputSink::Output> outputs(1);
  outputs[0].name = "y";
  outputs[0].dtype = DataType::kFp32;
  outputs[0].shape = {static_cast<int64_t>(values.size())};
  outputs[0].data.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  size_t header_length = 0;
  std::vector<std::string> body =
      InferResponseToJson("m", 1, "", request, &outputs, &header_length);
  rapidjson::Document document;
  document.Parse(body[0].c_str());
  ASSERT_FALSE(document.HasParseError());
  const auto& data = document["outputs"][0]["data"];
  ASSERT_EQ(data.Size(), values.size());
  for (rapidjson::SizeType i = 0; i < data.Size(); ++i) {
    const float back = static_cast<float>(data[i].GetDouble());
    EXPECT_EQ(std::memcmp(&back, &values[i], 4), 0) << values[i];
  }

  // And the way in: the printed values parse into the same floats.
  const std::string in = R"({"inputs": [{"name": "x", "shape": [)" + std::to_string(values.size()) +
                         R"(], "datatype": "FP32", "data": )" +
                         [&] {
                           rapidjson::StringBuffer printed;
                           rapidjson::Writer<rapidjson::StringBuffer> writer(printed);
                           data.Accept(writer);
                           return std::string(printed.GetString());
                         }() +
                         "}]}";
  StatusOr<JsonInferRequest> parsed = Parse(in);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(std::memcmp(parsed->request->inputs[0].data, values.data(), values.size() * 4), 0);
}

TEST(HttpCodecTest, ProtocolMessagesPrintAsTritonsHttpJson) {
  inference::ModelMetadataResponse metadata;
  metadata.set_name("mlp");
  metadata.add_versions("1");
  auto* input = metadata.add_inputs();
  input->set_name("INPUT__0");
  input->set_datatype("FP32");
  input->add_shape(-1);
  input->add_shape(784);
  EXPECT_EQ(
      ProtoToJson(metadata),
      R"({"name":"mlp","versions":["1"],"platform":"","inputs":[{"name":"INPUT__0","datatype":"FP32",)"
      R"("shape":[-1,784]}],"outputs":[]})");

  inference::ModelConfig config;
  config.set_name("m");
  config.set_max_batch_size(8);
  config.mutable_version_policy()->mutable_latest()->set_num_versions(2);
  auto* tensor = config.add_input();
  tensor->set_data_type(inference::TYPE_FP16);
  tensor->add_dims(3);
  (*config.mutable_parameters())["k"].set_string_value("v");
  rapidjson::Document document;
  const std::string json = ProtoToJson(config);
  document.Parse(json.c_str());
  ASSERT_FALSE(document.HasParseError()) << json;
  EXPECT_EQ(document["max_batch_size"].GetInt(), 8);
  EXPECT_EQ(document["version_policy"]["latest"]["num_versions"].GetInt(), 2);
  EXPECT_FALSE(document["version_policy"].HasMember("all"));  // unset oneof members stay out
  EXPECT_STREQ(document["input"][0]["data_type"].GetString(), "TYPE_FP16");
  EXPECT_TRUE(document["input"][0]["dims"][0].IsInt64());  // numbers, not proto3 JSON's strings
  EXPECT_STREQ(document["parameters"]["k"]["string_value"].GetString(), "v");
  EXPECT_FALSE(document.HasMember("dynamic_batching"));  // unset message
  EXPECT_TRUE(document["output"].IsArray());             // empty repeated fields print

  inference::RepositoryIndexResponse index;
  auto* model = index.add_models();
  model->set_name("a");
  model->set_version("1");
  model->set_state("READY");
  EXPECT_EQ(RepeatedProtoToJson(index, "models"),
            R"([{"name":"a","version":"1","state":"READY","reason":""}])");
  EXPECT_EQ(RepeatedProtoToJson(inference::RepositoryIndexResponse(), "models"), "[]");
  EXPECT_EQ(ErrorJson("a \"quoted\"\nline"), R"({"error":"a \"quoted\"\nline"})");
  // Health bodies as KServe's REST client reads them.
  EXPECT_EQ(ConditionJson("live", true), R"({"live":true})");
  EXPECT_EQ(ConditionJson("ready", false), R"({"ready":false})");
  EXPECT_EQ(ConditionJson("ready", true, "m\"1"), R"({"name":"m\"1","ready":true})");
}

// A client's model name with invalid UTF-8 (a percent-encoded %FF in the path) reaches the error
// message; the body must still be JSON a strict parser takes, and short.
TEST(HttpCodecTest, AnErrorBodyIsValidJsonWhateverTheMessageHolds) {
  EXPECT_EQ(ErrorJson("unknown model 'a\xff\xfe'"), R"({"error":"unknown model 'a\\xFF\\xFE'"})");
  const std::string long_message =
      "Request for unknown model: '" + std::string(20000, '\xff') + "' is not found";
  const std::string body = ErrorJson(long_message);
  rapidjson::Document document;
  document.Parse<rapidjson::kParseValidateEncodingFlag>(body.data(), body.size());
  ASSERT_FALSE(document.HasParseError()) << rapidjson::GetParseError_En(document.GetParseError());
  const std::string error = document["error"].GetString();
  EXPECT_EQ(error.size(), kStatusMessageBytes);
  EXPECT_EQ(error.rfind("Request for unknown model: '\\xFF\\xFF", 0), 0u);
  EXPECT_EQ(error.substr(error.size() - 16), "...(20042 bytes)");
}

TEST(HttpCodecTest, TraceSettingBodies) {
  EXPECT_TRUE(ParseTraceSettingsJson("")->empty());
  StatusOr<TraceSettingsMap> update = ParseTraceSettingsJson(
      R"({"trace_level": ["TIMESTAMPS"], "trace_rate": "10", "trace_count": 5, "log_frequency": null})");
  ASSERT_TRUE(update.ok()) << update.status();
  EXPECT_EQ((*update)["trace_level"], std::vector<std::string>{"TIMESTAMPS"});
  EXPECT_EQ((*update)["trace_rate"], std::vector<std::string>{"10"});
  EXPECT_EQ((*update)["trace_count"], std::vector<std::string>{"5"});
  EXPECT_TRUE((*update)["log_frequency"].empty());  // null clears
  EXPECT_FALSE(ParseTraceSettingsJson(R"({"trace_rate": 1.5})").ok());
  EXPECT_FALSE(ParseTraceSettingsJson(R"({"trace_level": []})").ok());
  EXPECT_FALSE(ParseTraceSettingsJson(R"({"trace_level": [true]})").ok());
  EXPECT_FALSE(ParseTraceSettingsJson("[]").ok());
  EXPECT_EQ(TraceSettingsJson({{"trace_level", {"TIMESTAMPS"}}, {"trace_rate", {"1"}}}),
            R"({"trace_level":["TIMESTAMPS"],"trace_rate":"1"})");
}

TEST(HttpCodecTest, RepositoryRequestBodies) {
  EXPECT_EQ(*ParseIndexRequest(""), false);
  EXPECT_EQ(*ParseIndexRequest(R"({"ready": true})"), true);
  EXPECT_FALSE(ParseIndexRequest(R"({"ready": "yes"})").ok());
  EXPECT_FALSE(ParseIndexRequest("nope").ok());
  EXPECT_TRUE(ParseControlRequest("")->empty());
  StatusOr<std::vector<ControlParameter>> parameters = ParseControlRequest(
      R"({"parameters": {"unload_dependents": true, "config": "{}", "file:1/model.pt": "aGVsbG8=", "n": 3}})");
  ASSERT_TRUE(parameters.ok()) << parameters.status();
  ASSERT_EQ(parameters->size(), 4u);
  EXPECT_EQ((*parameters)[0].key, "unload_dependents");
  EXPECT_EQ((*parameters)[0].kind, ControlParameter::Kind::kBool);
  EXPECT_EQ((*parameters)[1].kind, ControlParameter::Kind::kString);
  EXPECT_EQ((*parameters)[1].value, "{}");
  EXPECT_EQ((*parameters)[2].kind, ControlParameter::Kind::kBytes);  // base64, decoded
  EXPECT_EQ((*parameters)[2].value, "hello");
  EXPECT_EQ((*parameters)[3].kind, ControlParameter::Kind::kInt64);
  EXPECT_FALSE(ParseControlRequest(R"({"parameters": 3})").ok());
  EXPECT_FALSE(ParseControlRequest(R"({"parameters": {"file:1/model.pt": "not base64!"}})").ok());
  EXPECT_FALSE(ParseControlRequest(R"({"parameters": {"config": [1]}})").ok());
}

// A POSIX shared memory object of `size` bytes, registered as `name`, unlinked at the end.
class ShmObject {
 public:
  ShmObject(SharedMemoryManager* registry, const std::string& name, size_t size)
      : key_("/sluice_http_codec_test_" + std::to_string(getpid()) + "_" + name) {
    const int fd = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* mapping = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    data_ = static_cast<char*>(mapping);
    size_ = size;
    EXPECT_TRUE(registry->Register(name, key_, 0, size).ok());
  }
  ~ShmObject() {
    munmap(data_, size_);
    shm_unlink(key_.c_str());
  }
  char* data() { return data_; }

 private:
  std::string key_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

TEST(HttpCodecTest, InputsAndOutputsInSharedMemory) {
  SharedMemoryManager::Options keys;
  keys.key_prefixes = {"/sluice_http_codec_test_"};  // ShmObject's
  SharedMemoryManager registry(keys);
  ShmObject region(&registry, "r", 64);
  const float values[3] = {1.5f, -2.f, 4.f};
  std::memcpy(region.data() + 16, values, sizeof(values));
  SharedMemoryRefs refs(&registry);
  const std::string body = R"({"inputs": [
      {"name": "x", "shape": [3], "datatype": "FP32",
       "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 12, "shared_memory_offset": 16}},
      {"name": "s", "shape": [1], "datatype": "BYTES",
       "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 6}},
      {"name": "z", "shape": [1], "datatype": "INT32", "data": [9]}],
    "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8,
                 "shared_memory_offset": 32}}, {"name": "w"}]})";
  std::string element;
  AppendBytesElement("hi", &element);  // 4-byte length, then the bytes: 6 bytes
  std::memcpy(region.data(), element.data(), element.size());
  StatusOr<JsonInferRequest> parsed = InferRequestFromJson(body, std::nullopt, &refs);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const InferRequest& request = *parsed->request;
  ASSERT_EQ(request.inputs.size(), 3u);
  EXPECT_EQ(Values<float>(request.inputs[0]), (std::vector<float>{1.5f, -2.f, 4.f}));
  EXPECT_EQ(std::string(request.inputs[1].data, request.inputs[1].byte_size), element);
  // Numbers are viewed where they lie (the server's own mapping of the object); strings are
  // copied (checked once, split later): a client writing meanwhile changes only the former.
  region.data()[16 + 3] = 0;
  region.data()[4] = 'X';
  EXPECT_NE(Values<float>(request.inputs[0])[0], 1.5f);
  EXPECT_EQ(std::string(request.inputs[1].data, request.inputs[1].byte_size), element);
  EXPECT_EQ(Values<int32_t>(request.inputs[2]), (std::vector<int32_t>{9}));
  ASSERT_EQ(parsed->outputs.size(), 2u);
  ASSERT_TRUE(parsed->outputs[0].shared_memory.has_value());
  EXPECT_EQ(parsed->outputs[0].shared_memory->region, "r");
  EXPECT_EQ(parsed->outputs[0].shared_memory->offset, 32u);
  EXPECT_EQ(parsed->outputs[0].shared_memory->byte_size, 8u);
  EXPECT_TRUE(parsed->InSharedMemory("y"));
  EXPECT_FALSE(parsed->InSharedMemory("w"));

  // A slice past the region, an unknown region, and shared memory off: refused with the words.
  auto refused = [&](const std::string& parameters, SharedMemoryRefs* with) {
    const std::string one =
        R"({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "parameters": )" +
        parameters + "}]}";
    StatusOr<JsonInferRequest> result = InferRequestFromJson(one, std::nullopt, with);
    EXPECT_FALSE(result.ok()) << parameters;
    return result.status();
  };
  Status past = refused(
      R"({"shared_memory_region": "r", "shared_memory_byte_size": 12, "shared_memory_offset": 60})",
      &refs);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("Invalid offset + byte size for shared memory region: 'r'"),
            std::string::npos)
      << past;
  Status unknown =
      refused(R"({"shared_memory_region": "q", "shared_memory_byte_size": 12})", &refs);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "Unable to find shared memory region: 'q' (input 'x')");
  SharedMemoryRefs off(nullptr);
  Status disabled =
      refused(R"({"shared_memory_region": "r", "shared_memory_byte_size": 12})", &off);
  EXPECT_EQ(disabled.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(disabled.message().find("--allow-client-shm=true"), std::string::npos) << disabled;
}

TEST(HttpCodecTest, SharedMemoryOutputsAreDescribedWithoutData) {
  JsonInferRequest request;
  request.binary_default = true;  // binary_data_output does not apply to an output in shared memory
  request.outputs = {{"y", false, SharedMemoryReference{"r", 0, 8}}};
  HttpOutputSink sink;
  sink.Describe({"y", DataType::kFp16, {2, 2}, 8, MemoryType::kCpu});
  size_t header_length = 0;
  std::vector<std::string> body =
      InferResponseToJson("m", 1, "", request, &sink.outputs(), &header_length);
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(header_length, 0u);
  EXPECT_EQ(body[0],
            R"({"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":"FP16",)"
            R"("shape":[2,2]}]})");
}

TEST(HttpCodecTest, SharedMemoryControlBodies) {
  EXPECT_EQ(SharedMemoryStatusJson({}), "[]");
  EXPECT_EQ(SharedMemoryStatusJson({{"a", "/k", 8, 64}}),
            R"([{"name":"a","key":"/k","offset":8,"byte_size":64}])");
  StatusOr<SystemSharedMemoryRegistration> full =
      ParseSystemSharedMemoryRegister(R"({"key": "/k", "offset": 16, "byte_size": 64})");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->key, "/k");
  EXPECT_EQ(full->offset, 16u);
  EXPECT_EQ(full->byte_size, 64u);
  EXPECT_EQ(ParseSystemSharedMemoryRegister(R"({"key": "/k", "byte_size": 4})")->offset, 0u);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"byte_size": 4})", "Shared memory register request has no 'key' field"},
      {R"({"key": "/k"})", "Shared memory register request has no 'byte_size' field"},
      {R"({"key": 3, "byte_size": 4})", "'key' must be a string"},
      {R"({"key": "/k", "byte_size": -4})", "'byte_size' must be a non-negative integer"},
      {R"({"key": "/k", "byte_size": 4, "offset": "x"})",
       "'offset' must be a non-negative integer"},
      {"", "not valid JSON"},
  };
  for (const auto& [body, words] : refused) {
    StatusOr<SystemSharedMemoryRegistration> parsed = ParseSystemSharedMemoryRegister(body);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(words), std::string::npos) << parsed.status();
  }
}

TEST(HttpCodecTest, SinkKeepsEachOutputWithItsDescription) {
  HttpOutputSink sink;
  const std::string name = "y";
  const Shape shape = {2, 3};
  StatusOr<char*> memory = sink.Allocate({name, DataType::kInt16, shape, 12, MemoryType::kCpu});
  ASSERT_TRUE(memory.ok());
  std::memset(*memory, 1, 12);
  ASSERT_EQ(sink.outputs().size(), 1u);
  EXPECT_EQ(sink.outputs()[0].name, "y");
  EXPECT_EQ(sink.outputs()[0].shape, shape);
  EXPECT_EQ(sink.outputs()[0].data, std::string(12, '\x01'));
}

}  // namespace
}  // namespace sluice
