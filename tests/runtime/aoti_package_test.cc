// The AOTInductor package checks, on metadata maps: no package is compiled here (the integration
// tests serve real ones).
#include "server/runtime/aoti_package.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// What inductor writes on this kind of host, plus the export recipe's keys for one input
// x: FP32 [batch 1..64, 784] and one output FP32 [batch, 10].
std::map<std::string, std::string> Metadata() {
  return {{"AOTI_DEVICE_KEY", "cpu"},
          {"AOTI_MACHINE", "x86_64"},
          {"AOTI_CPU_ISA", "AVX2"},
          {"AOTI_COMPUTE_CAPABILITY", ""},
          {"sluice.format", "1"},
          {"sluice.torch_version", "2.11.0+cu130"},
          {"sluice.batch", "[1, 64]"},
          {"sluice.inputs", R"([{"name": "x", "dtype": "FP32", "shape": [[1, 64], 784]}])"},
          {"sluice.outputs", R"([{"name": "output", "dtype": "FP32", "shape": [[1, 64], 10]}])"}};
}

ModelSpec Spec(int max_batch_size = 64) {
  ModelSpec spec;
  spec.name = "mlp";
  spec.platform = "torch_aoti";
  spec.format = ModelFormat::kAotInductor;
  spec.max_batch_size = max_batch_size;
  spec.inputs.push_back({"INPUT__0", DataType::kFp32, {784}});
  spec.outputs.push_back({"OUTPUT__0", DataType::kFp32, {10}});
  return spec;
}

AotiHost Host() {
  AotiHost host;
  host.torch_version = "2.11.0+cu130";
  host.machine = "x86_64";
  host.cpu_flags = {"sse4_2", "avx2", "fma"};
  host.gpu_compute_capabilities = {{0, "90"}};
  return host;
}

AotiPackageInfo Parsed(const std::map<std::string, std::string>& metadata) {
  StatusOr<AotiPackageInfo> info = ParseAotiMetadata(metadata);
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? *info : AotiPackageInfo{};
}

// A call spec side of `keys.size()` leaves with those keys, at `paths` (default: "[i]" each).
CallSpecSide Side(std::vector<std::string> keys, std::vector<std::string> paths = {}) {
  CallSpecSide side;
  side.leaves = keys.size();
  if (paths.empty()) {
    for (size_t i = 0; i < keys.size(); ++i) paths.push_back("[" + std::to_string(i) + "]");
  }
  side.keys = std::move(keys);
  side.paths = std::move(paths);
  return side;
}

StatusOr<AotiBinding> Bind(const std::map<std::string, std::string>& metadata,
                           const ModelSpec& spec, std::vector<std::string>* warnings,
                           size_t inputs = 1, size_t outputs = 1) {
  return BindAotiPackage(Parsed(metadata), Side(std::vector<std::string>(inputs)),
                         Side(std::vector<std::string>(outputs)), spec, warnings);
}

TEST(AotiPackageTest, ParsesInductorAndRecipeMetadata) {
  AotiPackageInfo info = Parsed(Metadata());
  EXPECT_EQ(info.device_key, "cpu");
  EXPECT_THAT(info.cpu_isa, ElementsAre("AVX2"));
  EXPECT_TRUE(info.described);
  EXPECT_TRUE(info.batched);
  EXPECT_EQ(info.batch_min, 2);  // AOTInductor's dynamic dimensions start at 2
  EXPECT_EQ(info.inputs[0].shape[0].min, 2);
  EXPECT_EQ(info.batch_max, 64);
  ASSERT_EQ(info.inputs.size(), 1u);
  EXPECT_EQ(info.inputs[0].name, "x");
  ASSERT_EQ(info.inputs[0].shape.size(), 2u);
  EXPECT_FALSE(info.inputs[0].shape[0].fixed());
  EXPECT_TRUE(info.inputs[0].shape[1].fixed());

  auto metadata = Metadata();
  metadata["sluice.inputs"] = R"([{"name": "x", "dtype": "FP33", "shape": [1]}])";
  EXPECT_THAT(ParseAotiMetadata(metadata).status().message(), HasSubstr("unknown dtype 'FP33'"));
  metadata = Metadata();
  metadata["sluice.batch"] = "[1,";
  EXPECT_THAT(ParseAotiMetadata(metadata).status().message(),
              HasSubstr("sluice.batch is not valid JSON"));
  metadata = Metadata();
  metadata["sluice.format"] = "2";
  EXPECT_THAT(ParseAotiMetadata(metadata).status().message(), HasSubstr("sluice.format '2'"));
  metadata = Metadata();
  metadata["sluice.inputs"] = R"([{"name": "x", "dtype": "FP32", "shape": [[4, 2]]}])";
  EXPECT_THAT(ParseAotiMetadata(metadata).status().message(), HasSubstr("a dimension must be"));
  // Inductor's keys alone: served, validated by warm-up.
  EXPECT_FALSE(Parsed({{"AOTI_DEVICE_KEY", "cpu"}}).described);
}

TEST(AotiPackageTest, HostChecksNameTheMismatch) {
  std::vector<std::string> warnings;
  const AotiPackageInfo cpu = Parsed(Metadata());
  EXPECT_TRUE(CheckPackageHost(cpu, Device{}, Host(), &warnings).ok());

  Status status = CheckPackageHost(cpu, Device{true, 0}, Host(), &warnings);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("compiled for cpu but this instance runs on cuda:0"));

  auto metadata = Metadata();
  metadata["AOTI_CPU_ISA"] = "AVX512 AVX512_VNNI";
  status = CheckPackageHost(Parsed(metadata), Device{}, Host(), &warnings);
  EXPECT_THAT(status.message(), HasSubstr("CPU instruction set AVX512 but this CPU lacks avx512f"));

  metadata = Metadata();
  metadata["sluice.torch_version"] = "2.10.0";
  status = CheckPackageHost(Parsed(metadata), Device{}, Host(), &warnings);
  EXPECT_THAT(status.message(),
              HasSubstr("compiled by torch 2.10.0 but this server runs LibTorch 2.11.0+cu130"));
  metadata["sluice.torch_version"] = "2.11.1";  // a patch release loads
  EXPECT_TRUE(CheckPackageHost(Parsed(metadata), Device{}, Host(), &warnings).ok());

  metadata = Metadata();
  metadata["AOTI_MACHINE"] = "aarch64";
  status = CheckPackageHost(Parsed(metadata), Device{}, Host(), &warnings);
  EXPECT_THAT(status.message(), HasSubstr("compiled for aarch64 but this host is x86_64"));

  metadata = Metadata();
  metadata["AOTI_DEVICE_KEY"] = "cuda";
  metadata["AOTI_COMPUTE_CAPABILITY"] = "80";
  status = CheckPackageHost(Parsed(metadata), Device{true, 0}, Host(), &warnings);
  EXPECT_THAT(status.message(), HasSubstr("GPU architecture sm_80 but GPU 0 is sm_90"));
  metadata["AOTI_COMPUTE_CAPABILITY"] = "90";
  EXPECT_TRUE(CheckPackageHost(Parsed(metadata), Device{true, 0}, Host(), &warnings).ok());

  EXPECT_THAT(warnings, IsEmpty());
  metadata = Metadata();
  metadata["AOTI_CPU_ISA"] = "VSX";
  EXPECT_TRUE(CheckPackageHost(Parsed(metadata), Device{}, Host(), &warnings).ok());
  EXPECT_THAT(warnings,
              ElementsAre(HasSubstr("instruction set VSX, which this server cannot check")));
}

TEST(AotiPackageTest, BindsAndChecksTheConfig) {
  std::vector<std::string> warnings;
  StatusOr<AotiBinding> binding = Bind(Metadata(), Spec(), &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->input_package_index, ElementsAre(0));
  EXPECT_EQ(binding->pad_batch_to, 2);  // lone requests are padded to the package's smallest batch
  EXPECT_THAT(warnings, IsEmpty());

  struct Case {
    std::function<void(ModelSpec&, std::map<std::string, std::string>&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](ModelSpec& spec, auto&) { spec.inputs[0].dtype = DataType::kFp16; },
       "input 'INPUT__0' is FP16 in config.pbtxt but FP32 in the package"},
      {[](ModelSpec& spec, auto&) {
         spec.inputs[0].dims = {28, 28};
       },
       "has shape [-1,28,28] in config.pbtxt (batch dimension included) but [2..64,784] in the "
       "package"},
      {[](ModelSpec& spec, auto&) { spec.inputs[0].dims = {-1}; },
       "dimension 1 is variable (-1) in config.pbtxt but 784 in the package"},
      {[](ModelSpec& spec, auto&) { spec.inputs[0].dims = {100}; },
       "dimension 1 is 100 in config.pbtxt but 784"},
      {[](ModelSpec& spec, auto&) { spec.max_batch_size = 128; },
       "max_batch_size 128 but the package's batch dimension ends at 64"},
      {[](ModelSpec& spec, auto&) { spec.max_batch_size = 0; },
       "max_batch_size 0 (no batch dimension)"},
      {[](ModelSpec& spec, auto&) { spec.outputs[0].dtype = DataType::kFp64; },
       "output 'OUTPUT__0' is FP64 in config.pbtxt but FP32 in the package"},
      {[](ModelSpec& spec, auto&) {
         spec.inputs.push_back({"INPUT__1", DataType::kFp32, {1}});
       },
       "the package takes 1 input(s) but config.pbtxt declares 2"},
      {[](ModelSpec&, auto& metadata) { metadata["sluice.batch"] = "null"; },
       "exported without a batch dimension"},
      {[](ModelSpec&, auto& metadata) { metadata["sluice.batch"] = "[1, 1]"; },
       "batch fixed to 1 but config.pbtxt has max_batch_size 64: set max_batch_size 1"},
  };
  for (const Case& each : cases) {
    ModelSpec spec = Spec();
    auto metadata = Metadata();
    each.edit(spec, metadata);
    binding = Bind(metadata, spec, &warnings);
    EXPECT_EQ(binding.status().code(), absl::StatusCode::kInvalidArgument) << each.message;
    EXPECT_THAT(binding.status().message(), HasSubstr(each.message));
  }
}

TEST(AotiPackageTest, SmallBatchesAndUndescribedPackages) {
  std::vector<std::string> warnings;
  auto metadata = Metadata();
  metadata["sluice.batch"] = "[4, 64]";
  StatusOr<AotiBinding> binding = Bind(metadata, Spec(), &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_EQ(binding->pad_batch_to, 4);
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("smallest batch is 4: smaller batches are padded")));

  warnings.clear();
  metadata["sluice.batch"] = "[1, 1]";
  binding = Bind(metadata, Spec(1), &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("batch fixed to 1, so requests never batch")));

  warnings.clear();
  binding = Bind({{"AOTI_DEVICE_KEY", "cpu"}}, Spec(), &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("no Sluice metadata")));
  EXPECT_EQ(binding->pad_batch_to, 2);  // a dynamic batch starts at 2
  binding = Bind({{"AOTI_DEVICE_KEY", "cpu"}}, Spec(1), &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_EQ(binding->pad_batch_to, 1);  // batches of 1 only: nothing to pad to
  // Counts are checked even without metadata.
  binding = Bind({}, Spec(), &warnings, /*inputs=*/2);
  EXPECT_THAT(binding.status().message(),
              HasSubstr("takes 2 input(s) but config.pbtxt declares 1"));
}

TEST(AotiPackageTest, InputsBindByNameThenSuffixThenOrder) {
  ModelSpec spec = Spec(0);
  spec.inputs = {{"b", DataType::kFp32, {2}}, {"a", DataType::kInt32, {2}}};
  std::vector<std::string> warnings;
  // Keyword arguments name the package's inputs.
  auto binding = BindAotiPackage(AotiPackageInfo{}, Side({"a", "b"}), Side({""}), spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->input_package_index, ElementsAre(1, 0));
  spec.inputs = {{"IN__1", DataType::kFp32, {2}}, {"IN__0", DataType::kInt32, {2}}};
  binding = BindAotiPackage(AotiPackageInfo{}, Side({"", ""}), Side({""}), spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->input_package_index, ElementsAre(1, 0));
  spec.inputs = {{"p", DataType::kFp32, {2}}, {"q", DataType::kInt32, {2}}};
  binding = BindAotiPackage(AotiPackageInfo{}, Side({"", ""}), Side({""}), spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->input_package_index, ElementsAre(0, 1));
}

TEST(AotiPackageTest, DictOutputsBindByKey) {
  ModelSpec spec = Spec(0);
  spec.outputs = {{"twice", DataType::kFp32, {2}}, {"total", DataType::kFp32, {2}}};
  std::vector<std::string> warnings;
  auto binding =
      BindAotiPackage(AotiPackageInfo{}, Side({""}), Side({"total", "twice"}), spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->output_package_index, ElementsAre(1, 0));
  spec.outputs[0].name = "thrice";
  binding =
      BindAotiPackage(AotiPackageInfo{}, Side({""}), Side({"total", "twice"}), spec, &warnings);
  EXPECT_THAT(binding.status().message(), HasSubstr("returns a dict with keys total, twice"));
}

TEST(AotiPackageTest, TritonsCallNamesBindInputsAndOutputs) {
  // forward(hdata, vdata, options: dict, *, kwarg1) -> {"AAA": t, "ZZZ": t, "BBB": (t, t)}, as
  // Triton's PyTorch backend names them: ARGS[...] / KWARGS[...] and RESULT[...].
  const CallSpecSide in = Side({"", "", "keyA", "key2", "kwarg1"},
                               {"[0][0]", "[0][1]", "[0][2][keyA]", "[0][2][key2]", "[1][kwarg1]"});
  const CallSpecSide out = Side({"AAA", "ZZZ", "", ""}, {"[AAA]", "[ZZZ]", "[BBB][0]", "[BBB][1]"});
  EXPECT_THAT(TritonCallNames(in, true), ElementsAre("ARGS[0]", "ARGS[1]", "ARGS[2][keyA]",
                                                     "ARGS[2][key2]", "KWARGS[kwarg1]"));
  EXPECT_THAT(TritonCallNames(out, false),
              ElementsAre("RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]"));
  EXPECT_THAT(TritonCallNames(Side({""}, {""}), false), ElementsAre("RESULT"));

  ModelSpec spec = Spec(0);
  spec.inputs.clear();
  for (const char* name :
       {"KWARGS[kwarg1]", "ARGS[2][key2]", "ARGS[0]", "ARGS[1]", "ARGS[2][keyA]"})
    spec.inputs.push_back({name, DataType::kFp32, {2}});
  spec.outputs.clear();
  // Listed in another order than the call's (as Triton's example sorts them by name).
  for (const char* name : {"RESULT[AAA]", "RESULT[BBB][0]", "RESULT[BBB][1]", "RESULT[ZZZ]"})
    spec.outputs.push_back({name, DataType::kFp32, {2}});
  std::vector<std::string> warnings;
  auto binding = BindAotiPackage(AotiPackageInfo{}, in, out, spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->input_package_index, ElementsAre(4, 3, 0, 1, 2));
  EXPECT_THAT(binding->output_package_index, ElementsAre(0, 2, 3, 1));

  // Triton's ordinal names are the flat positions.
  spec.outputs = {{"OUTPUT__1", DataType::kFp32, {2}},
                  {"OUTPUT__0", DataType::kFp32, {2}},
                  {"OUTPUT__3", DataType::kFp32, {2}},
                  {"OUTPUT__2", DataType::kFp32, {2}}};
  binding = BindAotiPackage(AotiPackageInfo{}, in, out, spec, &warnings);
  ASSERT_TRUE(binding.ok()) << binding.status();
  EXPECT_THAT(binding->output_package_index, ElementsAre(1, 0, 3, 2));
}

TEST(AotiPackageTest, ADescribedPackageTellsWhatAConfigNeeds) {
  std::map<std::string, std::string> metadata = Metadata();
  metadata["sluice.inputs"] =
      R"([{"name": "x", "dtype": "FP16", "shape": [[1, 64], [2, null], 8]}])";
  StatusOr<ModelDescription> description = DescribePackage(Parsed(metadata), "model.pt2");
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(description->platform, "torch_aoti");
  EXPECT_TRUE(description->batched);
  EXPECT_EQ(description->batch_max, 64);
  ASSERT_EQ(description->inputs.size(), 1u);
  EXPECT_EQ(description->inputs[0].name, "x");  // forward's argument: binds by name
  EXPECT_EQ(description->inputs[0].dtype, DataType::kFp16);
  EXPECT_EQ(description->inputs[0].dims, (Shape{-1, 8}));  // after the batch; dynamic is -1
  EXPECT_EQ(description->outputs[0].name, "OUTPUT__0");    // not the graph node's name
  EXPECT_EQ(description->outputs[0].dims, (Shape{10}));

  metadata["sluice.batch"] = "null";
  metadata["sluice.inputs"] = R"([{"name": "x", "dtype": "FP32", "shape": [784]}])";
  metadata["sluice.outputs"] = R"([{"name": "y", "dtype": "FP32", "shape": [10]}])";
  description = DescribePackage(Parsed(metadata), "model.pt2");
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_FALSE(description->batched);
  EXPECT_EQ(description->inputs[0].dims, (Shape{784}));

  const StatusOr<ModelDescription> undescribed = DescribePackage(AotiPackageInfo{}, "model.pt2");
  EXPECT_TRUE(absl::IsFailedPrecondition(undescribed.status()));
  EXPECT_THAT(undescribed.status().message(),
              HasSubstr("model.pt2 has no Sluice metadata (sluice.*), and LibTorch's loader "
                        "cannot tell a package's inputs and outputs"));
}

TEST(AotiPackageTest, CallSpecs) {
  // forward(x) -> tensor
  auto in = ParseCallSpec(
      R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->leaves, 1u);
  EXPECT_THAT(in->keys, ElementsAre(""));
  auto out = ParseCallSpec(
      R"([1, {"type": "builtins.dict", "context": "[\"sum\", \"twice\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}])");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->keys, ElementsAre("sum", "twice"));
  EXPECT_THAT(out->paths, ElementsAre("[sum]", "[twice]"));
  EXPECT_THAT(in->paths, ElementsAre("[0][0]"));
  EXPECT_THAT(ParseCallSpec("[1, 2]").status().message(), HasSubstr("unexpected call spec"));
  EXPECT_THAT(ParseCallSpec("{").status().message(), HasSubstr("not valid JSON"));
}

TEST(AotiPackageTest, CpuFlagsAndPackageFiles) {
  EXPECT_EQ(ParseCpuFlags(
                "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"),
            (std::set<std::string>{"fpu", "sse", "avx2", "fma"}));
  EXPECT_EQ(ParseCpuFlags("processor\t: 0\nFeatures\t: fp asimd sve\n"),
            (std::set<std::string>{"fp", "asimd", "sve"}));

  // Not std::filesystem::remove_all: libtorch.so exports its own copy of it, which crashes when
  // called from this binary (it calls through a null pointer in 2.11). unlink/rmdir instead.
  char pattern[] = "/tmp/sluice_aoti_files.XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path dir = pattern;
  const std::string plain = (dir / "model.pt2").string();
  EXPECT_EQ(PackageFileFor(plain, Device{}), plain);
  std::ofstream(dir / "model.cpu.pt2") << "x";
  EXPECT_EQ(PackageFileFor(plain, Device{}), (dir / "model.cpu.pt2").string());
  EXPECT_EQ(PackageFileFor(plain, Device{true, 0}), plain);
  unlink((dir / "model.cpu.pt2").c_str());
  rmdir(dir.c_str());
}

UnpackDirectoryState State(bool exists, bool read_only, bool noexec) {
  UnpackDirectoryState state;
  state.exists = exists;
  state.read_only = read_only;
  state.noexec = noexec;
  return state;
}

TEST(AotiPackageTest, UnpackDirectoryMustBeWritableAndAllowExec) {
  EXPECT_TRUE(CheckUnpackDirectory("/tmp", {}).ok());
  const Status noexec = CheckUnpackDirectory("/tmp", State(true, false, true));
  EXPECT_EQ(noexec.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(noexec.message(), testing::HasSubstr("/tmp is mounted noexec"));
  EXPECT_THAT(noexec.message(), testing::HasSubstr("--tmpfs /tmp:exec"));
  EXPECT_THAT(noexec.message(), testing::HasSubstr("TMPDIR"));
  const Status read_only = CheckUnpackDirectory("/tmp", State(true, true, true));
  EXPECT_EQ(read_only.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read_only.message(), testing::HasSubstr("read-only file system"));
  EXPECT_THAT(read_only.message(), testing::HasSubstr("emptyDir"));
  const Status missing = CheckUnpackDirectory("/nowhere", State(false, false, false));
  EXPECT_THAT(missing.message(), testing::HasSubstr("/nowhere does not exist"));

  // The real file systems: this machine's temporary directory works, a missing one is named.
  const std::string here = AotiUnpackDirectory();
  EXPECT_TRUE(CheckUnpackDirectory(here, StatUnpackDirectory(here)).ok()) << here;
  EXPECT_FALSE(StatUnpackDirectory("/no/such/directory").exists);
  setenv("TMPDIR", "/no/such/directory", 1);
  EXPECT_EQ(AotiUnpackDirectory(), "/no/such/directory");
  unsetenv("TMPDIR");
}

}  // namespace
}  // namespace sluice
