// What server/core/model_spec.h computes rather than holds: binding declared tensors to positions
// by their `__<index>` suffix, and the names of the cuDNN benchmark modes and control kinds.
#include "server/core/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<TensorSpec> Named(std::initializer_list<const char*> names) {
  std::vector<TensorSpec> tensors;
  for (const char* name : names) {
    tensors.emplace_back();
    tensors.back().name = name;
  }
  return tensors;
}

TEST(ModelSpecTest, IndexSuffixReadsTheLastDoubleUnderscoreNumber) {
  EXPECT_EQ(IndexSuffix("INPUT__3"), 3);
  EXPECT_EQ(IndexSuffix("a__b__0"), 0);
  EXPECT_EQ(IndexSuffix("__12"), 12);
  EXPECT_EQ(IndexSuffix("INPUT3"), std::nullopt);
  EXPECT_EQ(IndexSuffix("INPUT_3"), std::nullopt);
  EXPECT_EQ(IndexSuffix("INPUT__"), std::nullopt);
  EXPECT_EQ(IndexSuffix("INPUT__x"), std::nullopt);
  EXPECT_EQ(IndexSuffix("INPUT__-1"), std::nullopt);
  EXPECT_EQ(IndexSuffix("INPUT__2__x"), std::nullopt);  // the last `__` decides
}

TEST(ModelSpecTest, PositionsBySuffixOnlyWhenEveryNameHasADistinctIndexBelowTheCount) {
  EXPECT_THAT(*PositionsBySuffix(Named({"OUTPUT__1", "OUTPUT__0"}), 2), ElementsAre(1, 0));
  EXPECT_THAT(*PositionsBySuffix(Named({"b__2"}), 3), ElementsAre(2));  // fewer names than slots
  EXPECT_EQ(PositionsBySuffix(Named({"OUTPUT__0", "OUTPUT__0"}), 2), std::nullopt);  // repeated
  EXPECT_EQ(PositionsBySuffix(Named({"OUTPUT__0", "OUTPUT__2"}), 2), std::nullopt);  // too high
  EXPECT_EQ(PositionsBySuffix(Named({"OUTPUT__0", "probs"}), 2), std::nullopt);      // one unnamed
  EXPECT_THAT(*PositionsBySuffix({}, 0), ElementsAre());
}

TEST(ModelSpecTest, DeclaredIndexFindsTheNameAndFallsBackToTheFirst) {
  const std::vector<TensorSpec> inputs = Named({"x", "y", "z"});
  EXPECT_EQ(DeclaredIndex(inputs, "z"), 2u);
  EXPECT_EQ(DeclaredIndex(inputs, "x"), 0u);
  EXPECT_EQ(DeclaredIndex(inputs, "absent"), 0u);  // requests are validated before
}

TEST(ModelSpecTest, ReshapeMovesTheBatchAndEachVariableSizeInOrder) {
  ModelSpec spec;
  spec.max_batch_size = 8;
  TensorSpec scalar{"s", DataType::kFp32, {1}};
  scalar.reshape = Shape{};
  EXPECT_EQ(spec.ToModelShape(scalar, {5, 1}), (Shape{5}));
  EXPECT_EQ(spec.ToClientShape(scalar, {5}), (Shape{5, 1}));

  TensorSpec variable{"v", DataType::kFp32, {-1, 3, -1}};
  variable.reshape = Shape{2, -1, -1, 3};
  EXPECT_EQ(spec.ToModelShape(variable, {4, 7, 3, 9}), (Shape{4, 2, 7, 9, 3}));
  EXPECT_EQ(spec.ToClientShape(variable, {4, 2, 7, 9, 3}), (Shape{4, 7, 3, 9}));

  TensorSpec plain{"p", DataType::kFp32, {-1, 2}};  // no reshape: the shape itself
  EXPECT_EQ(spec.ToModelShape(plain, {3, 6, 2}), (Shape{3, 6, 2}));
  EXPECT_EQ(spec.ToClientShape(plain, {3, 6, 2}), (Shape{3, 6, 2}));

  spec.max_batch_size = 0;  // no batch dimension to carry over
  EXPECT_EQ(spec.ToModelShape(variable, {7, 3, 9}), (Shape{2, 7, 9, 3}));
  EXPECT_EQ(spec.ModelFullShape(variable), (Shape{2, -1, -1, 3}));
}

TEST(ModelSpecTest, CudnnBenchmarkModesRoundTripAndAnUnknownOneIsNamed) {
  for (CudnnBenchmarkMode mode :
       {CudnnBenchmarkMode::kAuto, CudnnBenchmarkMode::kOn, CudnnBenchmarkMode::kOff}) {
    auto parsed = ParseCudnnBenchmarkMode(CudnnBenchmarkModeName(mode));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode);
  }
  auto bad = ParseCudnnBenchmarkMode("On");  // case matters, as in the config
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("must be \"auto\", \"on\" or \"off\", found 'On'"));
}

TEST(ModelSpecTest, ControlKindsHaveTritonsNames) {
  EXPECT_STREQ(SequenceControlKindName(SequenceControlKind::kStart), "CONTROL_SEQUENCE_START");
  EXPECT_STREQ(SequenceControlKindName(SequenceControlKind::kEnd), "CONTROL_SEQUENCE_END");
  EXPECT_STREQ(SequenceControlKindName(SequenceControlKind::kReady), "CONTROL_SEQUENCE_READY");
  EXPECT_STREQ(SequenceControlKindName(SequenceControlKind::kCorrId), "CONTROL_SEQUENCE_CORRID");
}

}  // namespace
}  // namespace sluice
