// The model repository (server/repository/model_repository.h): scanning it, reading one model
// (with a load's config override and files), and the store of files sent with a load.
#include "server/repository/model_repository.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

ModelOverride ConfigOverride(std::string json) {
  ModelOverride override;
  override.config_json = std::move(json);
  return override;
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::kMinimal;

class RepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("sluice_repo_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }

  fs::path root_;
};

TEST_F(RepositoryTest, ScansModelsVersionsAndBrokenOnes) {
  Write("good/config.pbtxt",
        std::string(kMinimal) + "version_policy: { latest: { num_versions: 2 } }");
  Write("good/1/model.pt", "x");
  Write("good/2/model.pt", "x");
  Write("good/10/model.pt", "x");
  Write("good/notaversion/model.pt", "x");
  Write("noconfig/1/model.pt", "x");
  Write("noversions/config.pbtxt", kMinimal);
  Write("badconfig/config.pbtxt", "max_batch_size: [");
  Write("specific/config.pbtxt",
        std::string(kMinimal) + "version_policy: { specific: { versions: [ 1, 4 ] } }");
  Write("specific/1/model.pt", "x");
  Write(".hidden/config.pbtxt", kMinimal);
  Write("__pycache__/generate_models.cpython-311.pyc", "x");
  Write("a_file_not_a_model", "x");

  auto models = ScanModelRepository(root_);
  ASSERT_TRUE(models.ok()) << models.status();
  std::map<std::string, RepositoryModel> by_name;
  for (auto& model : *models) by_name[model.name] = model;
  ASSERT_EQ(by_name.size(), 5u);

  const RepositoryModel& good = by_name["good"];
  ASSERT_TRUE(good.status.ok()) << good.status;
  ASSERT_EQ(good.versions.size(), 2u);
  EXPECT_EQ(good.versions.begin()->first, 2);  // latest 2 of {1, 2, 10}: numeric, not lexical
  EXPECT_EQ(good.versions.rbegin()->first, 10);
  EXPECT_EQ(good.versions.at(10), root_ / "good" / "10" / "model.pt");

  EXPECT_THAT(by_name["noconfig"].status.message(), HasSubstr("no config.pbtxt"));
  EXPECT_THAT(by_name["noversions"].status.message(), HasSubstr("no version directory"));
  EXPECT_THAT(by_name["badconfig"].status.message(), HasSubstr("not a valid model config"));
  EXPECT_THAT(by_name["specific"].status.message(),
              HasSubstr("version(s) 4 which have no directory"));
}

TEST_F(RepositoryTest, LabelFilesAreReadFromTheModelsDirectory) {
  constexpr char kClassifier[] = R"pb(
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
  )pb";
  Write("classifier/config.pbtxt", kClassifier);
  Write("classifier/labels.txt", "cat\r\ndog\n\neel");  // CRLF, an empty line, no final newline
  Write("classifier/1/model.pt", "x");
  RepositoryModel model = ReadModelDirectory(root_ / "classifier");
  ASSERT_TRUE(model.status.ok()) << model.status;
  ASSERT_NE(model.spec.outputs[0].labels, nullptr);
  EXPECT_THAT(*model.spec.outputs[0].labels, ::testing::ElementsAre("cat", "dog", "", "eel"));

  Write("unlabelled/config.pbtxt", kClassifier);
  Write("unlabelled/1/model.pt", "x");
  model = ReadModelDirectory(root_ / "unlabelled");
  EXPECT_TRUE(absl::IsNotFound(model.status));
  EXPECT_THAT(model.status.message(),
              HasSubstr("output 'OUTPUT__0': cannot read its label_filename " +
                        (root_ / "unlabelled" / "labels.txt").string() + ": No such file"));
}

// Describes every file as a batched package with one input and one output, or refuses.
class FakeDescriber final : public ModelDescriber {
 public:
  StatusOr<ModelDescription> Describe(const fs::path& file) const override {
    described.push_back(file.filename().string());
    if (!refusal.ok()) return refusal;
    ModelDescription description;
    description.platform = kTorchAotiPlatform;
    description.batched = batch_max != 0;
    description.batch_max = batch_max;
    description.inputs = {{"x", DataType::kFp16, {3, -1}}};
    description.outputs = {{"OUTPUT__0", DataType::kInt64, {2}}};
    return description;
  }
  int64_t batch_max = 16;  // 0: not batched; -1: unbounded
  Status refusal;
  mutable std::vector<std::string> described;
};

TEST_F(RepositoryTest, APackageWithoutConfigIsConfiguredFromItsDescription) {
  Write("pkg/1/model.pt2", "x");
  Write("pkg/3/model.pt2", "x");  // the newest version describes the model
  FakeDescriber describer;
  RepositoryModel model = ReadModelDirectory(root_ / "pkg", {}, "", &describer);
  ASSERT_TRUE(model.status.ok()) << model.status;
  EXPECT_EQ(describer.described, std::vector<std::string>{"model.pt2"});
  EXPECT_EQ(model.config->platform(), "torch_aoti");
  EXPECT_EQ(model.config->max_batch_size(), 16);
  EXPECT_TRUE(model.config->has_dynamic_batching());
  ASSERT_EQ(model.config->input_size(), 1);
  EXPECT_EQ(model.config->input(0).name(), "x");
  EXPECT_EQ(model.config->input(0).data_type(), inference::TYPE_FP16);
  EXPECT_EQ(std::vector<int64_t>(model.config->input(0).dims().begin(),
                                 model.config->input(0).dims().end()),
            (std::vector<int64_t>{3, -1}));
  EXPECT_EQ(model.config->output(0).data_type(), inference::TYPE_INT64);
  EXPECT_EQ(model.spec.max_batch_size, 16);
  EXPECT_EQ(model.spec.inputs[0].dims, (Shape{3, -1}));

  describer.batch_max = -1;  // unbounded: Triton's default-max-batch-size
  model = ReadModelDirectory(root_ / "pkg", {}, "", &describer);
  ASSERT_TRUE(model.status.ok()) << model.status;
  EXPECT_EQ(model.config->max_batch_size(), kDefaultMaxBatchSize);

  describer.batch_max = 0;  // no batch dimension: no batching
  model = ReadModelDirectory(root_ / "pkg", {}, "", &describer);
  ASSERT_TRUE(model.status.ok()) << model.status;
  EXPECT_EQ(model.config->max_batch_size(), 0);
  EXPECT_FALSE(model.config->has_dynamic_batching());

  // Auto-complete off: a missing config.pbtxt is what it was.
  model = ReadModelDirectory(root_ / "pkg");
  EXPECT_THAT(model.status.message(), HasSubstr("no config.pbtxt"));
}

TEST_F(RepositoryTest, WhatTheConfigSaysStaysAndOnlyTheTensorsAreFilledIn) {
  Write("pkg/config.pbtxt",
        "max_batch_size: 2\nsequence_batching { }\n"
        "instance_group [ { kind: KIND_CPU count: 3 } ]\n");
  Write("pkg/1/model.pt2", "x");
  FakeDescriber describer;
  RepositoryModel model = ReadModelDirectory(root_ / "pkg", {}, "", &describer);
  ASSERT_TRUE(model.status.ok()) << model.status;
  EXPECT_EQ(model.config->max_batch_size(), 2);
  EXPECT_FALSE(model.config->has_dynamic_batching());  // the sequence batcher schedules it
  EXPECT_EQ(model.config->instance_group(0).count(), 3);
  EXPECT_EQ(model.config->input_size(), 1);

  // A config that declares its tensors is not completed (the package is not read).
  Write("declared/config.pbtxt", std::string(kMinimal) + "platform: \"torch_aoti\"\n");
  Write("declared/1/model.pt2", "x");
  describer.described.clear();
  model = ReadModelDirectory(root_ / "declared", {}, "", &describer);
  EXPECT_TRUE(describer.described.empty());
}

TEST_F(RepositoryTest, ATorchScriptFileOrAnUndescribedPackageIsRefusedSayingWhatToDeclare) {
  Write("ts/1/model.pt", "x");
  FakeDescriber describer;
  RepositoryModel model = ReadModelDirectory(root_ / "ts", {}, "", &describer);
  EXPECT_TRUE(absl::IsInvalidArgument(model.status));
  EXPECT_THAT(model.status.message(),
              HasSubstr("a TorchScript file (model.pt) cannot tell their datatypes and shapes: "
                        "declare them in config.pbtxt"));
  EXPECT_TRUE(describer.described.empty());

  Write("pkg/1/model.pt2", "x");
  describer.refusal = absl::FailedPreconditionError("model.pt2 has no Sluice metadata");
  model = ReadModelDirectory(root_ / "pkg", {}, "", &describer);
  EXPECT_EQ(model.status, describer.refusal);
}

TEST_F(RepositoryTest, MissingRootIsNotFound) {
  auto models = ScanModelRepository(root_ / "absent");
  EXPECT_EQ(models.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(models.status().message(), HasSubstr("--model-repository"));
}

TEST_F(RepositoryTest, FingerprintChangesWithAnyFileAndSourceReadsOneModel) {
  Write("m/config.pbtxt", kMinimal);
  Write("m/1/model.pt", "x");
  const std::string first = ReadModelDirectory(root_ / "m").fingerprint;
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(ReadModelDirectory(root_ / "m").fingerprint, first);  // nothing changed
  Write("m/1/model.pt", "xy");
  const std::string resized = ReadModelDirectory(root_ / "m").fingerprint;
  EXPECT_NE(resized, first);
  Write("m/2/model.pt", "xy");
  EXPECT_NE(ReadModelDirectory(root_ / "m").fingerprint, resized);
  // A broken model has a fingerprint too, so that fixing it is noticed.
  Write("broken/config.pbtxt", "max_batch_size: [");
  EXPECT_FALSE(ReadModelDirectory(root_ / "broken").fingerprint.empty());

  DirectoryModelSource source(root_);
  auto model = source.Read("m", {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->versions.size(), 1u);
  EXPECT_EQ(model->versions.begin()->first, 2);
  EXPECT_EQ(source.Read("absent", {}).status().code(), absl::StatusCode::kNotFound);
  // A client-supplied name never leaves the repository.
  for (const std::string& name :
       std::vector<std::string>{"", ".", "..", "../m", "m/1", ".hidden", std::string("m\0x", 3)}) {
    EXPECT_EQ(source.Read(name, {}).status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
  auto all = source.Scan();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
}

// A load's config override (Triton's "config" load parameter): JSON instead of config.pbtxt,
// completed from config.pbtxt only where Triton would complete from the model file.
TEST_F(RepositoryTest, ConfigOverrideReplacesTheConfigForOneRead) {
  Write("m/config.pbtxt", kMinimal);
  Write("m/1/model.pt", "x");
  DirectoryModelSource source(root_);

  // Numbers may be quoted (Triton's example sends "16"); tensors and platform come from
  // config.pbtxt.
  auto overridden = source.Read("m", ConfigOverride(std::string(R"({"max_batch_size": "16"})")));
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  ASSERT_TRUE(overridden->status.ok()) << overridden->status;
  EXPECT_EQ(overridden->config->max_batch_size(), 16);
  EXPECT_EQ(overridden->spec.max_batch_size, 16);
  EXPECT_EQ(overridden->config->input(0).name(), "INPUT__0");
  EXPECT_EQ(overridden->config->platform(), "pytorch_libtorch");
  EXPECT_NE(overridden->fingerprint, ReadModelDirectory(root_ / "m").fingerprint);

  // An override with its own tensors keeps them: nothing of config.pbtxt is merged in.
  auto own = source.Read("m", ConfigOverride(std::string(
                                  R"({"platform": "pytorch_libtorch", "max_batch_size": 2,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]})")));
  ASSERT_TRUE(own.ok() && own->status.ok()) << own->status;
  EXPECT_EQ(own->config->input(0).name(), "X");
  EXPECT_EQ(own->spec.max_batch_size, 2);

  // Without an override, config.pbtxt again.
  EXPECT_EQ(source.Read("m", {})->spec.max_batch_size, 8);

  // A malformed override, or an unknown field: the model's status says why.
  for (const std::string& bad :
       {std::string(R"("parameters": {"config": {{"max_batch_size": "16"}}})"),
        std::string(R"({"max_batch_sise": 4})")}) {
    auto broken = source.Read("m", ConfigOverride(bad));
    ASSERT_TRUE(broken.ok());
    EXPECT_EQ(broken->status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(broken->status.message()),
                ::testing::HasSubstr("Invalid config override"))
        << bad;
  }
}

// Operator libraries come from the operator: an override may name one relative to the model's
// directory (or an --operator-library-dir), not by absolute path; files sent with a load bring
// none.
TEST_F(RepositoryTest, OverridesCannotBringOperatorLibraries) {
  Write("m/config.pbtxt", kMinimal);
  Write("m/1/model.pt", "x");
  const std::string tensors = R"("platform": "pytorch_libtorch", "max_batch_size": 2,
      "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
      "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}])";
  auto with = [&](const std::string& key, const std::string& path) {
    return ConfigOverride("{" + tensors + R"(, "parameters": {")" + key +
                          R"(": {"string_value": ")" + path + R"("}}})");
  };
  DirectoryModelSource source(root_);
  auto relative = source.Read("m", with("sluice.operator_libraries", "ops/libdetect.so"));
  ASSERT_TRUE(relative.ok());
  EXPECT_TRUE(relative->status.ok()) << relative->status;
  for (const char* key : {"sluice.operator_libraries", "MODEL_INIT_LIBRARY"}) {
    auto absolute = source.Read("m", with(key, "/tmp/libevil.so"));
    ASSERT_TRUE(absolute.ok());
    EXPECT_EQ(absolute->status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(std::string(absolute->status.message()),
                HasSubstr("cannot name an operator library by absolute path"));
  }
  // The same absolute path in config.pbtxt on disk is the operator's word: the runtime decides
  // whether it lies in an allowed directory.
  Write(
      "m/config.pbtxt",
      std::string(kMinimal) +
          R"pb(parameters { key: "MODEL_INIT_LIBRARY" value { string_value: "/opt/libinit.so" } })pb");
  EXPECT_TRUE(source.Read("m", {})->status.ok());

  LoadedFileStore::Options options;
  options.root = root_ / ".." / (root_.filename().string() + "_store");
  auto store = LoadedFileStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  DirectoryModelSource with_files(root_, store->get());
  ModelOverride load = with("sluice.operator_libraries", "libops.so");
  load.files["1/model.pt"] = "x";
  load.files["libops.so"] = "ELF";
  auto sent = with_files.Read("fresh", load);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sent->status.message()),
              HasSubstr("files sent in the request cannot name operator libraries"));
  store->reset();
  fs::remove_all(options.root);
}

// Model files sent with a load: written to the store (never the repository), read with the
// override's config alone, kept while that load serves, removed otherwise.
TEST_F(RepositoryTest, LoadFilesGoToThePrivateStoreAndLeaveWhenNotServed) {
  Write("m/config.pbtxt", kMinimal);
  Write("m/1/model.pt", "x");
  const fs::path store_root = root_ / ".." / "store";
  fs::create_directories(store_root / "left_by_a_crash");
  LoadedFileStore::Options options;
  options.root = store_root;
  options.disk_bytes = 100;
  auto store = LoadedFileStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(fs::exists(store_root / "left_by_a_crash"));  // emptied at start
  DirectoryModelSource source(root_, store->get());

  ModelOverride load = ConfigOverride(R"({"platform": "pytorch_libtorch", "max_batch_size": 2,
      "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
      "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]})");
  load.files["1/model.pt"] = std::string(40, 'a');
  load.files["1/extra/data.bin"] = "bb";
  auto first = source.Read("fresh", load);  // a model the repository does not have
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->status.ok()) << first->status;
  EXPECT_EQ(first->name, "fresh");
  EXPECT_EQ(first->directory.parent_path(), store_root);
  EXPECT_EQ(first->versions.at(1), first->directory / "1" / "model.pt");
  EXPECT_TRUE(fs::exists(first->directory / "1" / "extra" / "data.bin"));
  EXPECT_FALSE(fs::exists(root_ / "fresh"));  // nothing goes into the repository
  EXPECT_EQ((*store)->bytes_in_use(), 42u);

  // A second load of it: both kept until model control says which one serves.
  auto second = source.Read("fresh", load);
  ASSERT_TRUE(second.ok() && second->status.ok());
  EXPECT_NE(second->directory, first->directory);
  EXPECT_EQ((*store)->bytes_in_use(), 84u);
  // Past the disk cap (100 bytes): refused, nothing written.
  auto full = source.Read("fresh", load);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("--load-files-disk-bytes 100"));
  source.Retain("fresh", second->directory);
  EXPECT_FALSE(fs::exists(first->directory));
  EXPECT_TRUE(fs::exists(second->directory));
  EXPECT_EQ((*store)->bytes_in_use(), 42u);

  // Files whose config does not load are removed at once; the serving load's stay.
  ModelOverride broken = load;
  broken.config_json =
      R"({"max_batch_size": 2})";  // no tensors, and no config.pbtxt to complete from
  auto refused = source.Read("fresh", broken);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(refused->status.ok());
  EXPECT_FALSE(fs::exists(refused->directory));
  EXPECT_TRUE(fs::exists(second->directory));

  // Unloaded: nothing of it stays. Without a store, files are refused.
  source.Retain("fresh", {});
  EXPECT_FALSE(fs::exists(second->directory));
  EXPECT_EQ((*store)->bytes_in_use(), 0u);
  DirectoryModelSource without(root_);
  EXPECT_EQ(without.Read("fresh", load).status().code(), absl::StatusCode::kFailedPrecondition);
  store->reset();
  EXPECT_FALSE(fs::exists(store_root));  // removed at exit
}

}  // namespace
}  // namespace sluice
