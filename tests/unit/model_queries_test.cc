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

}  // namespace
}  // namespace sluice
