// The request parameters through both codecs: one value, one answer over gRPC and over HTTP
// (request_parameters.h's table), down to the words of a refusal.
#include "server/frontend/request_parameters.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "server/grpc/grpc_codec.h"
#include "server/http/http_codec.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string key;
  std::string json;                                       // the value as JSON
  std::function<void(inference::InferParameter*)> proto;  // the same value as an InferParameter
  std::string refusal;                                    // empty: accepted
  std::function<void(const RequestParameters&)> check;    // what an accepted value sets
};

StatusOr<RequestParameters> ViaGrpc(const Case& each) {
  inference::ModelInferRequest proto;
  proto.set_model_name("m");
  each.proto(&(*proto.mutable_parameters())[each.key]);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<InferRequest> request, InferRequestFromProto(proto));
  return request->parameters;
}

StatusOr<RequestParameters> ViaHttp(const Case& each) {
  const std::string body =
      R"({"inputs": [], "parameters": {")" + each.key + R"(": )" + each.json + "}}";
  SLUICE_ASSIGN_OR_RETURN(JsonInferRequest parsed, InferRequestFromJson(body, std::nullopt));
  return parsed.request->parameters;
}

TEST(RequestParametersTest, BothCodecsGiveTheSameAnswer) {
  const std::vector<Case> cases = {
      {"timeout", "2500", [](auto* p) { p->set_int64_param(2500); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.timeout_us, 2500); }},
      {"timeout", "0", [](auto* p) { p->set_uint64_param(0); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.timeout_us, 0); }},
      // Silently ignored over gRPC before the codecs shared a reader, refused over HTTP.
      {"timeout", "-5", [](auto* p) { p->set_int64_param(-5); },
       "the request parameter 'timeout' must be a non-negative integer (microseconds), found -5",
       nullptr},
      {"timeout", "\"soon\"", [](auto* p) { p->set_string_param("soon"); },
       "'timeout' must be a non-negative integer (microseconds), found the string \"soon\"",
       nullptr},
      {"timeout", "1.5", [](auto* p) { p->set_double_param(1.5); },
       "'timeout' must be a non-negative integer", nullptr},
      {"timeout", "true", [](auto* p) { p->set_bool_param(true); },
       "'timeout' must be a non-negative integer", nullptr},
      {"timeout", "9223372036854775808", [](auto* p) { p->set_uint64_param(9223372036854775808u); },
       "'timeout' must be a non-negative integer (microseconds), found 9223372036854775808",
       nullptr},
      {"priority", "2", [](auto* p) { p->set_uint64_param(2); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.priority, 2u); }},
      {"priority", "3", [](auto* p) { p->set_int64_param(3); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.priority, 3u); }},
      {"priority", "-1", [](auto* p) { p->set_int64_param(-1); },
       "the request parameter 'priority' must be a non-negative integer (1 is the highest level",
       nullptr},
      {"priority", "\"high\"", [](auto* p) { p->set_string_param("high"); },
       "'priority' must be a non-negative integer (1 is the highest level; 0: the model's "
       "default), found the "
       "string \"high\"",
       nullptr},
      {"sequence_id", "7", [](auto* p) { p->set_int64_param(7); }, "",
       [](const RequestParameters& r) {
         EXPECT_FALSE(r.sequence.id.is_text);
         EXPECT_EQ(r.sequence.id.number, 7u);
       }},
      {"sequence_id", "18446744073709551615",
       [](auto* p) { p->set_uint64_param(18446744073709551615u); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.sequence.id.number, 18446744073709551615u); }},
      {"sequence_id", "\"session-1\"", [](auto* p) { p->set_string_param("session-1"); }, "",
       [](const RequestParameters& r) {
         EXPECT_TRUE(r.sequence.id.is_text);
         EXPECT_EQ(r.sequence.id.text, "session-1");
       }},
      {"sequence_id", "-1", [](auto* p) { p->set_int64_param(-1); },
       "the request parameter 'sequence_id' must not be negative, found -1", nullptr},
      {"sequence_id", "false", [](auto* p) { p->set_bool_param(false); },
       "the request parameter 'sequence_id' must be an integer or a string, found false", nullptr},
      {"sequence_start", "true", [](auto* p) { p->set_bool_param(true); }, "",
       [](const RequestParameters& r) { EXPECT_TRUE(r.sequence.start); }},
      {"sequence_end", "1", [](auto* p) { p->set_int64_param(1); },
       "the request parameter 'sequence_end' must be a boolean, found 1", nullptr},
      // Not in the table: left alone by both (Triton ignores parameters it does not know).
      {"priority_of_another_server", "\"high\"", [](auto* p) { p->set_string_param("high"); }, "",
       [](const RequestParameters& r) { EXPECT_EQ(r.timeout_us, 0); }},
  };
  for (const Case& each : cases) {
    SCOPED_TRACE(each.key + " = " + each.json);
    const StatusOr<RequestParameters> grpc = ViaGrpc(each);
    const StatusOr<RequestParameters> http = ViaHttp(each);
    if (each.refusal.empty()) {
      ASSERT_TRUE(grpc.ok()) << grpc.status();
      ASSERT_TRUE(http.ok()) << http.status();
      each.check(*grpc);
      each.check(*http);
      continue;
    }
    ASSERT_FALSE(grpc.ok());
    ASSERT_FALSE(http.ok());
    EXPECT_EQ(grpc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(grpc.status(), http.status());  // same code, same words
    EXPECT_THAT(grpc.status().message(), HasSubstr(each.refusal));
  }
}

TEST(RequestParametersTest, ReadsOnlyWhatTheRequestCarries) {
  RequestParameters parameters;
  parameters.timeout_us = 40;
  std::map<std::string, ParameterValue, std::less<>> given;
  ParameterValue start;
  start.kind = ParameterValue::Kind::kBool;
  start.boolean = true;
  given["sequence_start"] = start;
  std::vector<std::string> asked;
  ASSERT_TRUE(ReadRequestParameters(
                  [&](absl::string_view key) -> std::optional<ParameterValue> {
                    asked.emplace_back(key);
                    auto found = given.find(key);
                    if (found == given.end()) return std::nullopt;
                    return found->second;
                  },
                  &parameters)
                  .ok());
  EXPECT_EQ(parameters.timeout_us, 40);  // absent: kept
  EXPECT_TRUE(parameters.sequence.start);
  EXPECT_FALSE(parameters.sequence.end);
  EXPECT_THAT(asked, ::testing::ElementsAre("timeout", "priority", "sequence_id", "sequence_start",
                                            "sequence_end"));
}

// An output's "classification" parameter, the same over both codecs.
struct OutputCase {
  std::string json;                                       // the output's parameters, as JSON
  std::function<void(inference::InferParameter*)> proto;  // its "classification" value
  bool in_shared_memory = false;                          // shared_memory_region beside it
  std::string refusal;                                    // empty: accepted
  int64_t count = 0;                                      // accepted: the classes (0: the tensor)
};

StatusOr<std::vector<ClassificationRequest>> OutputViaGrpc(const OutputCase& each) {
  inference::ModelInferRequest proto;
  proto.set_model_name("m");
  auto* output = proto.add_outputs();
  output->set_name("PROBS");
  each.proto(&(*output->mutable_parameters())["classification"]);
  if (each.in_shared_memory)
    (*output->mutable_parameters())["shared_memory_region"].set_string_param("r");
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<InferRequest> request, InferRequestFromProto(proto));
  return request->classifications;
}

StatusOr<std::vector<ClassificationRequest>> OutputViaHttp(const OutputCase& each) {
  std::string parameters = R"("classification": )" + each.json;
  if (each.in_shared_memory)
    parameters += R"(, "shared_memory_region": "r", "shared_memory_byte_size": 16)";
  const std::string body =
      R"({"inputs": [], "outputs": [{"name": "PROBS", "parameters": {)" + parameters + "}}]}";
  SLUICE_ASSIGN_OR_RETURN(JsonInferRequest parsed, InferRequestFromJson(body, std::nullopt));
  return parsed.request->classifications;
}

TEST(RequestParametersTest, ClassificationIsReadTheSameByBothCodecs) {
  const std::vector<OutputCase> cases = {
      {"3", [](auto* p) { p->set_int64_param(3); }, false, "", 3},
      {"2", [](auto* p) { p->set_uint64_param(2); }, false, "", 2},
      {"0", [](auto* p) { p->set_int64_param(0); }, false, "", 0},  // the tensor, as absent
      {"-1", [](auto* p) { p->set_int64_param(-1); }, false,
       "output 'PROBS': the parameter 'classification' must be a non-negative integer (the "
       "classes to answer per batch row), found -1",
       0},
      {"\"top\"", [](auto* p) { p->set_string_param("top"); }, false, "found the string \"top\"",
       0},
      {"3", [](auto* p) { p->set_int64_param(3); }, true,
       "output 'PROBS': classification cannot be written to shared memory", 0},
  };
  for (const OutputCase& each : cases) {
    SCOPED_TRACE(each.json + (each.in_shared_memory ? " in shared memory" : ""));
    const StatusOr<std::vector<ClassificationRequest>> grpc = OutputViaGrpc(each);
    const StatusOr<std::vector<ClassificationRequest>> http = OutputViaHttp(each);
    if (each.refusal.empty()) {
      ASSERT_TRUE(grpc.ok()) << grpc.status();
      ASSERT_TRUE(http.ok()) << http.status();
      for (const auto* classifications : {&*grpc, &*http}) {
        if (each.count == 0) {
          EXPECT_TRUE(classifications->empty());
          continue;
        }
        ASSERT_EQ(classifications->size(), 1u);
        EXPECT_EQ(classifications->front().output, "PROBS");
        EXPECT_EQ(classifications->front().count, each.count);
      }
      continue;
    }
    ASSERT_FALSE(grpc.ok());
    ASSERT_FALSE(http.ok());
    EXPECT_EQ(grpc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(grpc.status(), http.status());
    EXPECT_THAT(grpc.status().message(), HasSubstr(each.refusal));
  }
}

}  // namespace
}  // namespace sluice
