// Triton's classification extension: the classes of an output (TopClasses) and the sink that
// hands them on in place of the tensor (server/frontend/classification.h).
#include "server/frontend/classification.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::string Raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::vector<std::string> Elements(const std::string& bytes) {
  std::vector<std::string> elements;
  for (std::string_view element : SplitBytesTensor(bytes)) elements.emplace_back(element);
  return elements;
}

TEST(TopClassesTest, EachBatchRowGetsItsTopClassesHighestFirstWithLabels) {
  const std::vector<float> scores = {0.1f, 0.7f,  0.2f,   // row 0
                                     0.5f, 0.25f, 0.9f};  // row 1
  const std::vector<std::string> labels = {"cat", "dog", "eel"};
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp32, {2, 3}, Raw(scores), /*batched=*/true, 2, &labels);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_EQ(classes->shape, (Shape{2, 2}));
  EXPECT_THAT(Elements(classes->bytes),
              ElementsAre("0.700000:1:dog", "0.200000:2:eel", "0.900000:2:eel", "0.500000:0:cat"));
}

TEST(TopClassesTest, WithoutBatchingTheWholeOutputIsOneRowAndTheShapeIsK) {
  const std::vector<float> scores = {0.1f, 0.7f, 0.2f, 0.5f};
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp32, {2, 2}, Raw(scores), /*batched=*/false, 3, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_EQ(classes->shape, (Shape{3}));
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("0.700000:1", "0.500000:3", "0.200000:2"));
}

TEST(TopClassesTest, KIsAtMostTheElementsOfARowAndARowOfManyDimsIsFlattened) {
  const std::vector<float> scores = {1, 4, 3, 2};  // one row of [2, 2]
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp32, {1, 2, 2}, Raw(scores), /*batched=*/true, 10, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_EQ(classes->shape, (Shape{1, 4}));
  EXPECT_THAT(Elements(classes->bytes),
              ElementsAre("4.000000:1", "3.000000:2", "2.000000:3", "1.000000:0"));
}

TEST(TopClassesTest, EqualScoresGoByIndexAndNanRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {nan, 0.5f, -1.0f, 0.5f, nan};
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp32, {1, 5}, Raw(scores), /*batched=*/true, 5, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes),
              ElementsAre("0.500000:1", "0.500000:3", "-1.000000:2", "nan:0", "nan:4"));
}

TEST(TopClassesTest, IntegerScoresPrintAsIntegers) {
  const std::vector<int64_t> int64s = {-7, 12, 3};
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kInt64, {3}, Raw(int64s), /*batched=*/false, 2, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("12:1", "3:2"));

  const std::vector<uint8_t> uint8s = {200, 7};
  classes = TopClasses(DataType::kUint8, {1, 2}, Raw(uint8s), /*batched=*/true, 1, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("200:0"));

  const std::vector<int8_t> int8s = {-3, -2};
  classes = TopClasses(DataType::kInt8, {2}, Raw(int8s), /*batched=*/false, 1, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("-2:1"));
}

TEST(TopClassesTest, HalfAndBfloat16AreClassifiedAsFloats) {
  // 0x3c00 = 1.0, 0x3800 = 0.5, 0xc000 = -2.0 in FP16; 0x3f80 = 1.0, 0x3f00 = 0.5 in BF16.
  const std::vector<uint16_t> halves = {0x3800, 0xc000, 0x3c00};
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp16, {1, 3}, Raw(halves), /*batched=*/true, 3, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("1.000000:2", "0.500000:0", "-2.000000:1"));

  const std::vector<uint16_t> bfloats = {0x3f00, 0x3f80};
  classes = TopClasses(DataType::kBf16, {2}, Raw(bfloats), /*batched=*/false, 1, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("1.000000:1"));

  const std::vector<double> doubles = {0.25, 0.125};
  classes = TopClasses(DataType::kFp64, {2}, Raw(doubles), /*batched=*/false, 1, nullptr);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes), ElementsAre("0.250000:0"));
}

TEST(TopClassesTest, AnEmptyOrMissingLabelAddsNothing) {
  const std::vector<float> scores = {0.1f, 0.2f, 0.3f};
  const std::vector<std::string> labels = {"first", ""};  // index 1 empty, index 2 beyond
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kFp32, {3}, Raw(scores), /*batched=*/false, 3, &labels);
  ASSERT_TRUE(classes.ok()) << classes.status();
  EXPECT_THAT(Elements(classes->bytes),
              ElementsAre("0.300000:2", "0.200000:1", "0.100000:0:first"));
}

TEST(TopClassesTest, RefusesWhatCannotBeClassified) {
  const std::string bools(2, '\1');
  StatusOr<ClassifiedOutput> classes =
      TopClasses(DataType::kBool, {2}, bools, /*batched=*/false, 1, nullptr);
  EXPECT_EQ(classes.status().message(),
            "class result not available for output due to unsupported type 'BOOL'");
  classes = TopClasses(DataType::kFp32, {3}, std::string(8, '\0'), false, 1, nullptr);
  EXPECT_THAT(classes.status().message(), HasSubstr("has 8 bytes"));
  classes = TopClasses(DataType::kFp32, {2}, std::string(8, '\0'), false, 0, nullptr);
  EXPECT_FALSE(classes.ok());
}

// Keeps what it is given, as the gRPC response message does.
class KeepingSink final : public OutputSink {
 public:
  struct Kept {
    std::string name;
    DataType dtype;
    Shape shape;
    std::string bytes;
  };
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    if (refuse) return absl::ResourceExhaustedError("no room");
    kept.push_back({output.name, output.dtype, output.shape, std::string(output.byte_size, '\0')});
    return kept.back().bytes.data();
  }
  std::shared_ptr<AnswerConnection> Connection() override { return connection; }
  std::vector<Kept> kept;
  bool refuse = false;
  std::shared_ptr<AnswerConnection> connection;
};

ModelSpec Classifier() {
  ModelSpec spec;
  spec.name = "classifier";
  spec.max_batch_size = 4;
  spec.outputs.push_back({"LOGITS", DataType::kFp32, {3}});
  spec.outputs.push_back({"EMBEDDING", DataType::kFp32, {2}});
  spec.outputs[0].labels = std::make_shared<const std::vector<std::string>>(
      std::vector<std::string>{"cat", "dog", "eel"});
  return spec;
}

// Writes `values` as the backend does: Allocate, then the bytes.
template <typename T>
Status Write(OutputSink* sink, const std::string& name, const Shape& shape,
             const std::vector<T>& values, DataType dtype = DataType::kFp32) {
  const std::string bytes = Raw(values);
  SLUICE_ASSIGN_OR_RETURN(char* memory,
                          sink->Allocate({name, dtype, shape, bytes.size(), MemoryType::kCpu}));
  std::memcpy(memory, bytes.data(), bytes.size());
  return absl::OkStatus();
}

TEST(ClassifyingSinkTest, HandsOnClassesInTheOrderOutputsAreWrittenAndOtherOutputsAsTheyAre) {
  KeepingSink inner;
  ClassifyingSink sink(&inner, Classifier(), {{"LOGITS", 1}});
  ASSERT_TRUE(Write(&sink, "LOGITS", {2, 3}, std::vector<float>{0, 1, 2, 5, 4, 3}).ok());
  ASSERT_TRUE(Write(&sink, "EMBEDDING", {2, 2}, std::vector<float>{1, 2, 3, 4}).ok());
  ASSERT_TRUE(sink.Finish().ok());
  ASSERT_EQ(inner.kept.size(), 2u);
  EXPECT_EQ(inner.kept[0].name, "LOGITS");
  EXPECT_EQ(inner.kept[0].dtype, DataType::kBytes);
  EXPECT_EQ(inner.kept[0].shape, (Shape{2, 1}));
  EXPECT_THAT(Elements(inner.kept[0].bytes), ElementsAre("2.000000:2:eel", "5.000000:0:cat"));
  EXPECT_EQ(inner.kept[1].name, "EMBEDDING");
  EXPECT_EQ(inner.kept[1].dtype, DataType::kFp32);
  EXPECT_EQ(inner.kept[1].bytes, Raw(std::vector<float>{1, 2, 3, 4}));
}

TEST(ClassifyingSinkTest, TheLastOutputIsHandedOnByFinishOnlyOnce) {
  KeepingSink inner;
  ClassifyingSink sink(&inner, Classifier(), {{"EMBEDDING", 2}, {"LOGITS", 3}});
  ASSERT_TRUE(Write(&sink, "EMBEDDING", {1, 2}, std::vector<float>{1, 2}).ok());
  ASSERT_TRUE(Write(&sink, "LOGITS", {1, 3}, std::vector<float>{3, 1, 2}).ok());
  EXPECT_EQ(inner.kept.size(), 1u);  // LOGITS waits for Finish: its bytes come after Allocate
  ASSERT_TRUE(sink.Finish().ok());
  ASSERT_TRUE(sink.Finish().ok());
  ASSERT_EQ(inner.kept.size(), 2u);
  EXPECT_THAT(Elements(inner.kept[0].bytes), ElementsAre("2.000000:1", "1.000000:0"));
  EXPECT_THAT(Elements(inner.kept[1].bytes),
              ElementsAre("3.000000:0:cat", "2.000000:2:eel", "1.000000:1:dog"));
}

TEST(ClassifyingSinkTest, TheInnerSinksRefusalIsTheAnswerAndItsConnectionIsForwarded) {
  KeepingSink inner;
  inner.refuse = true;
  ClassifyingSink sink(&inner, Classifier(), {{"LOGITS", 1}});
  EXPECT_EQ(sink.Connection(), nullptr);
  ASSERT_TRUE(Write(&sink, "LOGITS", {1, 3}, std::vector<float>{0, 1, 2}).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(sink.Finish()));
  EXPECT_TRUE(
      absl::IsResourceExhausted(Write(&sink, "EMBEDDING", {1, 2}, std::vector<float>{1, 2})));
}

}  // namespace
}  // namespace sluice
