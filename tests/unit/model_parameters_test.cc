// The table of Sluice's model parameters (model_parameters.h): the parser reads every one through
// it, refuses what the table does not know, and the guide's reference is the table's.
//
// When the table changes, regenerate the guide's section:
//   SLUICE_UPDATE_DOCS=1 build/bin/model_parameters_test
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/repository/model_config_parser.h"
#include "server/repository/model_parameters.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A model whose config sets `key` to `value`: what ParseModelConfig answers.
Status ParseWith(const std::string& key, const std::string& value) {
  const std::string text = absl::StrCat(
      "name: \"m\"\nplatform: \"pytorch_libtorch\"\nmax_batch_size: 8\n"
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
      "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
      "dynamic_batching { }\n"
      "parameters { key: \"",
      key, "\" value { string_value: \"", value, "\" } }\n");
  StatusOr<inference::ModelConfig> config = ParseModelConfigText(text, "config.pbtxt");
  if (!config.ok()) return config.status();
  return BuildModelSpec("m", &*config).status();
}

TEST(ModelParametersTest, EveryNumberAndSwitchIsReadThroughTheTable) {
  for (const ModelParameter& parameter : ModelParameters()) {
    const std::string name(parameter.name);
    if (parameter.kind == ParameterKind::kInt) {
      const Status below = ParseWith(name, absl::StrCat(parameter.min - 1));
      EXPECT_THAT(below.message(),
                  HasSubstr(absl::StrCat("parameter ", name, " must be an integer in [",
                                         parameter.min, ", ", parameter.max)))
          << name;
      EXPECT_TRUE(ParseWith(name, absl::StrCat(parameter.max)).ok()) << name;
    } else if (parameter.kind == ParameterKind::kBool) {
      EXPECT_THAT(ParseWith(name, "yes").message(),
                  HasSubstr(absl::StrCat("parameter ", name, " must be \"true\" or \"false\"")))
          << name;
      EXPECT_TRUE(ParseWith(name, "false").ok()) << name;
    }
  }
}

TEST(ModelParametersTest, DefaultsComeFromTheTable) {
  const std::map<std::string, std::string> none;
  EXPECT_EQ(*ReadInt(none, "sluice.max_shape_groups"),
            ModelParameterNamed("sluice.max_shape_groups").default_value);
  EXPECT_EQ(*ReadInt(none, "sluice.warmup_runs"), 3);
  EXPECT_TRUE(*ReadBool(none, "sluice.auto_batch_sizes"));
  EXPECT_FALSE(*ReadBool(none, "sluice.pinned"));
  EXPECT_FALSE(*ReadBool(none, "sluice.warmup", /*fallback=*/false));  // the model's own default
  EXPECT_EQ(ReadText(none, "sluice.buckets"), nullptr);
  const std::map<std::string, std::string> set = {{"sluice.cuda_wait", "blocking"}};
  ASSERT_NE(ReadText(set, "sluice.cuda_wait"), nullptr);
  EXPECT_EQ(*ReadText(set, "sluice.cuda_wait"), "blocking");
}

TEST(ModelParametersTest, UnknownKeysAreRefusedWithTheNearestName) {
  EXPECT_THAT(CheckModelParameterNames({{"sluice.warmup_run", "3"}}).message(),
              HasSubstr("did you mean 'sluice.warmup_runs'?"));
  EXPECT_TRUE(CheckModelParameterNames({{"sluice.auto_batch_sizes.chosen", "1,2"}}).ok());
  EXPECT_TRUE(CheckModelParameterNames({{"INTRA_OP_THREAD_COUNT", "2"}}).ok());
  for (const ModelParameter& parameter : ModelParameters())
    EXPECT_TRUE(CheckModelParameterNames({{std::string(parameter.name), "x"}}).ok());
}

TEST(ModelParametersTest, AnUndeclaredNameIsAProgrammingError) {
  EXPECT_DEATH(ModelParameterNamed("sluice.not_declared"), "");
  EXPECT_DEATH((void)ReadInt({}, "sluice.pinned"), "");  // declared as a switch, read as a number
}

TEST(ModelParametersTest, TheGuidesReferenceIsTheTable) {
  const std::string path = std::string(SLUICE_SOURCE_DIR) + "/docs/guide/model-repository.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string page = buffer.str();
  const size_t begin = page.find(std::string(kReferenceBegin));
  const size_t end = page.find(std::string(kReferenceEnd));
  ASSERT_NE(begin, std::string::npos) << path << " lacks the marker " << kReferenceBegin;
  ASSERT_NE(end, std::string::npos) << path << " lacks the marker " << kReferenceEnd;
  const size_t end_of_line = page.find('\n', end);
  const size_t stop = end_of_line == std::string::npos ? page.size() : end_of_line + 1;
  const std::string reference = ModelParameterReference();
  if (std::getenv("SLUICE_UPDATE_DOCS") != nullptr) {
    page.replace(begin, stop - begin, reference);
    std::ofstream(path) << page;
    return;
  }
  EXPECT_EQ(page.substr(begin, stop - begin), reference)
      << "the reference differs from the table: SLUICE_UPDATE_DOCS=1 "
         "build/bin/model_parameters_test rewrites it";
}

}  // namespace
}  // namespace sluice
