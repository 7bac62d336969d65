// The KServe messages both front ends answer model queries with.
#include "server/frontend/model_queries.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::ElementsAre;

TEST(ModelQueriesTest, MetadataShowsBatchDimension) {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 4;
  spec.inputs = {{"x", DataType::kFp16, {3, -1}}};
  spec.outputs = {{"y", DataType::kBf16, {2}}};
  inference::ModelMetadataResponse proto;
  FillModelMetadata(spec, {1, 2}, &proto);
  EXPECT_THAT(proto.versions(), ElementsAre("1", "2"));
  EXPECT_EQ(proto.platform(), "pytorch_libtorch");
  EXPECT_EQ(proto.inputs(0).datatype(), "FP16");
  EXPECT_THAT(proto.inputs(0).shape(), ElementsAre(-1, 3, -1));
  EXPECT_THAT(proto.outputs(0).shape(), ElementsAre(-1, 2));
  spec.max_batch_size = 0;
  proto.Clear();
  FillModelMetadata(spec, {1}, &proto);
  EXPECT_THAT(proto.inputs(0).shape(), ElementsAre(3, -1));
}

TEST(ModelQueriesTest, ModelConfigCarriesTheMeasuredBatchSizes) {
  inference::ModelConfig config;
  (*config.mutable_parameters())["INTRA_OP_THREAD_COUNT"].set_string_value("1");
  BatchSizeChoice choice;
  choice.off_reason = "preferred_batch_size is set";
  AddBatchSizeChoice(choice, &config);
  EXPECT_EQ(config.parameters().size(), 1);  // not measured: nothing added
  choice.measured = true;
  choice.sizes = {1, 2};
  choice.rates = {{1, 1000.4, true}, {2, 2500.6, true}, {3, 2000, false}};
  AddBatchSizeChoice(choice, &config);
  EXPECT_EQ(config.parameters().at("sluice.auto_batch_sizes.chosen").string_value(), "1,2");
  EXPECT_EQ(config.parameters().at("sluice.auto_batch_sizes.rows_per_second").string_value(),
            "1:1000,2:2501,3:2000");
  EXPECT_EQ(config.parameters().at("INTRA_OP_THREAD_COUNT").string_value(), "1");
}

// Triton's load parameter rules, the same over gRPC and HTTP.
TEST(ModelQueriesTest, LoadAndUnloadParametersFollowTritonsRules) {
  ModelManager manager({}, {});
  ModelControl::Options options;
  options.mode = ModelControlMode::kExplicit;
  ModelControl control(&manager, /*loader=*/nullptr, options);
  using Kind = ControlParameter::Kind;
  auto check = [&](std::vector<ControlParameter> parameters, bool unload = false) {
    return CheckModelControl(&control, "gRPC", "", "m", parameters, unload);
  };
  StatusOr<ControlRequest> plain = check({});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->override.empty());
  StatusOr<ControlRequest> config = check({{"config", Kind::kString, R"({"max_batch_size": 16})"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->override.config_json, std::optional<std::string>(R"({"max_batch_size": 16})"));
  StatusOr<ControlRequest> dependents =
      check({{"unload_dependents", Kind::kBool, "true"}}, /*unload=*/true);
  ASSERT_TRUE(dependents.ok()) << dependents.status();
  EXPECT_TRUE(dependents->unload_dependents);
  EXPECT_FALSE(check({{"unload_dependents", Kind::kBool, "false"}}, true)->unload_dependents);
  EXPECT_FALSE(check({}, /*unload=*/true)->unload_dependents);
  EXPECT_THAT(
      std::string(check({{"unload_dependents", Kind::kString, "yes"}}, true).status().message()),
      ::testing::HasSubstr("'unload_dependents' must have bool type"));

  const std::vector<std::pair<std::vector<ControlParameter>, std::string>> refused = {
      {{{"config", Kind::kBytes, "{}"}},
       "Config parameter 'config' must have string type for its value"},
      {{{"colour", Kind::kString, "red"}},
       "Unrecognized load parameter 'colour' with type 'string'"},
      {{{"unload_dependents", Kind::kBool, "true"}},
       "Unrecognized load parameter 'unload_dependents'"},
      {{{"config", Kind::kString, "{}"}, {"file:1/model.pt", Kind::kBytes, "x"}},
       "model files sent with a load are not accepted"},
  };
  for (const auto& [parameters, words] : refused) {
    StatusOr<ControlRequest> result = check(parameters);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << words;
    EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr(words));
  }
  EXPECT_EQ(check({{"config", Kind::kString, "{}"}}, /*unload=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
  // With load files accepted (--allow-load-files): bytes, with a config, plain relative paths,
  // within the per-load cap.
  options.accept_load_files = true;
  options.max_load_file_bytes = 10;
  ModelControl files(&manager, nullptr, options);
  auto with_files = [&](std::vector<ControlParameter> parameters) {
    return CheckModelControl(&files, "HTTP", "", "m", parameters, false);
  };
  StatusOr<ControlRequest> accepted = with_files({{"config", Kind::kString, "{}"},
                                                  {"file:1/model.pt", Kind::kBytes, "12345"},
                                                  {"file:1/a/b", Kind::kBytes, "x"}});
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->override.files.size(), 2u);
  EXPECT_EQ(accepted->override.files.at("1/model.pt"), "12345");
  const std::string long_name(256, 'A');
  const std::vector<std::pair<std::vector<ControlParameter>, std::string>> bad_files = {
      {{{"file:1/model.pt", Kind::kBytes, "x"}},
       "Load parameter 'config' must be specified for model file override"},
      {{{"config", Kind::kString, "{}"}, {"file:1/model.pt", Kind::kString, "x"}},
       "must have bytes type"},
      {{{"config", Kind::kString, "{}"}, {"file:../m/1/model.pt", Kind::kBytes, "x"}},
       "stay within the model directory"},
      {{{"config", Kind::kString, "{}"}, {"file:1/../../x", Kind::kBytes, "x"}},
       "stay within the model directory"},
      {{{"config", Kind::kString, "{}"}, {"file:/etc/passwd", Kind::kBytes, "x"}},
       "must be relative"},
      {{{"config", Kind::kString, "{}"}, {"file:1//model.pt", Kind::kBytes, "x"}},
       "no '', '.' or '..'"},
      {{{"config", Kind::kString, "{}"}, {"file:", Kind::kBytes, "x"}}, "no path after 'file:'"},
      {{{"config", Kind::kString, "{}"}, {"file:" + long_name, Kind::kBytes, "x"}},
       "longer than 255 bytes"},
      {{{"config", Kind::kString, "{}"}, {"file:config.pbtxt", Kind::kBytes, "x"}},
       "is the model's configuration"},
      {{{"config", Kind::kString, "{}"},
        {"file:1/model.pt", Kind::kBytes, "123456"},
        {"file:2/model.pt", Kind::kBytes, "123456"}},
       "12 bytes, more than --load-files-max-bytes 10"},
  };
  for (const auto& [parameters, words] : bad_files) {
    StatusOr<ControlRequest> result = with_files(parameters);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << words;
    EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr(words));
  }

  ModelControl polling(&manager, nullptr, ModelControl::Options{});
  EXPECT_EQ(CheckModelControl(&polling, "HTTP", "", "m", {}, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sluice
