// Model configurations (server/repository/model_config_parser.h): parsing config.pbtxt, building
// a ModelSpec from it with every error named, and the version policy.
#include "server/repository/model_config_parser.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kMinimal;
using ::testing::Not;

StatusOr<ModelSpec> Build(const std::string& text, const std::string& name = "m") {
  SLUICE_ASSIGN_OR_RETURN(inference::ModelConfig config,
                          ParseModelConfigText(text, "config.pbtxt"));
  return BuildModelSpec(name, &config);
}

TEST(ModelConfigParserTest, ParsesAndFillsDefaults) {
  auto config = ParseModelConfigText(kMinimal, "config.pbtxt");
  ASSERT_TRUE(config.ok()) << config.status();
  auto spec = BuildModelSpec("m", &*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "m");
  EXPECT_EQ(spec->max_batch_size, 8);
  ASSERT_EQ(spec->inputs.size(), 1u);
  EXPECT_EQ(spec->inputs[0].dtype, DataType::kFp32);
  EXPECT_THAT(spec->inputs[0].dims, ElementsAre(3, -1));
  EXPECT_EQ(spec->outputs[0].dtype, DataType::kInt64);
  EXPECT_EQ(spec->model_filename, "model.pt");
  ASSERT_EQ(spec->instance_groups.size(), 1u);
  EXPECT_EQ(spec->instance_groups[0].kind, InstanceKind::kAuto);
  EXPECT_EQ(spec->instance_groups[0].count, 1);
  // Defaults written back, so that the ModelConfig RPC shows what runs.
  EXPECT_EQ(config->name(), "m");
  EXPECT_EQ(config->backend(), "pytorch");
  EXPECT_EQ(config->instance_group_size(), 1);
  EXPECT_EQ(config->version_policy().latest().num_versions(), 1u);
  EXPECT_EQ(spec->FullShape(spec->inputs[0]), (Shape{-1, 3, -1}));
}

TEST(ModelConfigParserTest, SyntaxErrorNamesSourceAndLine) {
  auto config = ParseModelConfigText("max_batch_size: 4\ninput [ { name: \"x\" bogus: 1 } ]\n",
                                     "repo/m/config.pbtxt");
  ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("repo/m/config.pbtxt"));
  EXPECT_THAT(config.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(config.status().message(), HasSubstr("bogus"));
}

// A config as Triton users write it, for a sequence model: every field parses (our proto carries
// the whole schema) and Sluice rejects the unsupported ones by name.
constexpr char kRealTritonSequenceConfig[] = R"pb(
  name: "seq"
  backend: "pytorch"
  max_batch_size: 16
  version_policy: { specific: { versions: [ 1, 3 ] } }
  input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1 ] format: FORMAT_NONE } ]
  output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
  sequence_batching {
    max_sequence_idle_microseconds: 5000000
    oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100 }
    control_input [
      { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
      { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
    ]
    state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ -1 ]
              initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "init" } } ]
  }
  instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
  parameters: { key: "INFERENCE_MODE" value: { string_value: "true" } }
  model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
  optimization { cuda { graphs: true } input_pinned_memory { enable: true }
                 execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }
  response_cache { enable: true }
  model_transaction_policy { decoupled: false }
)pb";

TEST(ModelConfigParserTest, RealTritonConfigParsesAndUnsupportedFieldsAreNamed) {
  auto config = ParseModelConfigText(kRealTritonSequenceConfig, "seq/config.pbtxt");
  ASSERT_TRUE(config.ok()) << config.status();
  auto spec = BuildModelSpec("seq", &*config);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("unsupported configuration field: optimization.execution_accelerators"));
}

TEST(ModelConfigParserTest, CudaGraphsAndTheirCapPerInstance) {
  constexpr char kGraphs[] = R"pb(
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    optimization { cuda { graphs: true } }
  )pb";
  auto config = ParseModelConfigText(kGraphs, "g/config.pbtxt");
  ASSERT_TRUE(config.ok()) << config.status();
  auto spec = BuildModelSpec("g", &*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->cuda_graphs);
  EXPECT_EQ(spec->cuda_graphs_max, 16);

  const auto with_cap = [&](const char* cap) {
    auto capped = ParseModelConfigText(
        absl::StrCat(kGraphs,
                     R"pb(parameters { key: "sluice.cuda_graphs_max" value { string_value: ")pb",
                     cap, R"pb(" } })pb"),
        "g/config.pbtxt");
    EXPECT_TRUE(capped.ok()) << capped.status();
    return BuildModelSpec("g", &*capped);
  };
  spec = with_cap("4");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->cuda_graphs_max, 4);
  spec = with_cap("0");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("sluice.cuda_graphs_max"));

  auto off = ParseModelConfigText(R"pb(
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
  )pb",
                                  "g/config.pbtxt");
  ASSERT_TRUE(off.ok()) << off.status();
  spec = BuildModelSpec("g", &*off);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->cuda_graphs);
}

// Triton's sequence_batching, direct strategy: control inputs become inputs the server fills.
constexpr char kSequenceModel[] = R"pb(
  max_batch_size: 4
  input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
  output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
  sequence_batching {
    max_sequence_idle_microseconds: 5000000
    direct { max_queue_delay_microseconds: 100 minimum_slot_utilization: 0.5 }
    control_input [
      { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
      { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
      { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 5, 7 ] } ] },
      { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
    ]
  }
)pb";

TEST(ModelConfigParserTest, SequenceBatchingDirect) {
  auto spec = Build(kSequenceModel);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SequenceBatchingSpec& sequences = spec->sequence_batching;
  EXPECT_TRUE(sequences.enabled);
  EXPECT_FALSE(spec->dynamic_batching.enabled);
  EXPECT_EQ(sequences.max_sequence_idle_us, 5000000);
  EXPECT_EQ(sequences.max_queue_delay_us, 100);
  EXPECT_FLOAT_EQ(sequences.minimum_slot_utilization, 0.5f);
  ASSERT_EQ(sequences.controls.size(), 4u);
  EXPECT_EQ(sequences.controls[0].dtype, DataType::kFp32);
  EXPECT_EQ(sequences.controls[1].dtype, DataType::kBool);
  EXPECT_EQ(sequences.controls[1].true_value, 1);
  EXPECT_EQ(sequences.controls[2].kind, SequenceControlKind::kReady);
  EXPECT_EQ(sequences.controls[2].false_value, 5);
  EXPECT_EQ(sequences.controls[2].true_value, 7);
  EXPECT_EQ(sequences.correlation_id_type, DataType::kBytes);
  ASSERT_EQ(spec->inputs.size(), 5u);
  EXPECT_FALSE(spec->inputs[0].filled_by_server);
  EXPECT_EQ(spec->inputs[4].name, "CORRID");
  EXPECT_TRUE(spec->inputs[4].filled_by_server);
  EXPECT_EQ(spec->inputs[4].dims, (Shape{1}));
  EXPECT_THAT(spec->inputs[4].filled_with, HasSubstr("CONTROL_SEQUENCE_CORRID"));
  EXPECT_TRUE(spec->warmup);  // a string CORRID is the server's, not a string input of the client's

  auto minimal = Build(
      "max_batch_size: 0\n"
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "sequence_batching { }\n");
  ASSERT_TRUE(minimal.ok()) << minimal.status();
  EXPECT_EQ(minimal->sequence_batching.max_sequence_idle_us, 1000000);  // Triton's default
  EXPECT_FALSE(minimal->sequence_batching.correlation_id_type.has_value());
}

// platform "ensemble": the steps and what the configuration alone can tell about them.
TEST(ModelConfigParserTest, EnsembleStepsAndTheirChecks) {
  const std::string io =
      "platform: \"ensemble\"\nmax_batch_size: 4\n"
      "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n";
  auto step = [](const std::string& model, const std::string& in, const std::string& out) {
    return "{ model_name: \"" + model + "\" model_version: -1 input_map { key: \"x\" value: \"" +
           in + "\" } output_map { key: \"y\" value: \"" + out + "\" } }";
  };
  auto spec = Build(io + "ensemble_scheduling { step [ " + step("b", "mid", "OUT") + ", " +
                    step("a", "IN", "mid") + " ] }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->is_ensemble());
  ASSERT_EQ(spec->ensemble.steps.size(), 2u);
  EXPECT_EQ(spec->ensemble.steps[0].model, "b");
  EXPECT_EQ(spec->ensemble.steps[0].version, -1);
  EXPECT_EQ(spec->ensemble.steps[0].inputs,
            (std::vector<std::pair<std::string, std::string>>{{"x", "mid"}}));
  EXPECT_EQ(spec->platform, "ensemble");
  // The ensemble's answers may be cached whole.
  auto cached = Build(io + "response_cache { enable: true } ensemble_scheduling { step [ " +
                      step("a", "IN", "OUT") + " ] }");
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(cached->response_cache);
  EXPECT_EQ(cached->ensemble.max_inflight_requests, 0u);  // no limit unless set
  auto limited = Build(io + "ensemble_scheduling { max_inflight_requests: 3 step [ " +
                       step("a", "IN", "OUT") + " ] }");
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->ensemble.max_inflight_requests, 3u);

  const std::vector<std::pair<std::string, std::string>> refused = {
      {"ensemble_scheduling { }", "has no step in ensemble_scheduling"},
      {"ensemble_scheduling { step [ " + step("a", "IN", "OUT") + ", " + step("b", "IN", "OUT") +
           " ] }",
       "ensemble tensor 'OUT' is written by step 1 (model 'a') and by step 2 (model 'b')"},
      {"ensemble_scheduling { step [ " + step("a", "IN", "IN") + " ] }",
       "ensemble tensor 'IN' is written by the ensemble's inputs and by step 1"},
      {"ensemble_scheduling { step [ " + step("a", "nothing", "OUT") + " ] }",
       "step 1 (model 'a') reads 'nothing' (for its input 'x'), which is neither an ensemble "
       "input nor written by any step"},
      {"ensemble_scheduling { step [ " + step("a", "p", "q") + ", " + step("b", "q", "p") + ", " +
           step("c", "IN", "OUT") + " ] }",
       "its steps form a cycle (each waits for another's output): step 1 (model 'a'), step 2 "
       "(model 'b')"},
      {"ensemble_scheduling { step [ " + step("a", "IN", "mid") + " ] }",
       "its output 'OUT' is not written by any step"},
      {"ensemble_scheduling { step [ " + step("m", "IN", "OUT") + " ] }",
       "step 1 names the ensemble itself"},
      {"ensemble_scheduling { step [ { model_name: \"a\" input_map { key: \"x\" value: \"IN\" } "
       "} ] }",
       "needs an input_map and an output_map"},
      {"optimization { cuda { graphs: true } } ensemble_scheduling { step [ " +
           step("a", "IN", "OUT") + " ] }",
       "optimization.cuda.graphs cannot be set on an ensemble"},
  };
  for (const auto& [extra, message] : refused) {
    auto bad = Build(io + extra);
    ASSERT_FALSE(bad.ok()) << extra;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << extra;
  }
  auto no_steps = Build(
      "platform: \"ensemble\"\n"
      "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n");
  EXPECT_THAT(no_steps.status().message(), HasSubstr("needs an ensemble_scheduling block"));
  auto misplaced = Build(
      "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "ensemble_scheduling { step [ " +
      step("a", "IN", "OUT") + " ] }");
  EXPECT_THAT(misplaced.status().message(),
              HasSubstr("ensemble_scheduling belongs to a model with platform: \"ensemble\""));
}

// Implicit state: the state input is the server's to fill, the state output the server's to keep
// unless `output` lists it; TorchScript names follow Triton's <name>__<index> rule.
TEST(ModelConfigParserTest, SequenceStatesAndTheOldestStrategy) {
  const std::string io =
      "max_batch_size: 4\n"
      "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n";
  auto state = [](const std::string& input, const std::string& output, const std::string& extra) {
    return "state [ { input_name: \"" + input + "\" output_name: \"" + output +
           "\" data_type: TYPE_FP32 dims: [ 2, 3 ] " + extra + " } ]";
  };
  auto spec = Build(io +
                    "sequence_batching { oldest { max_candidate_sequences: 6 preferred_batch_size: "
                    "[ 4, 2 ] max_queue_delay_microseconds: 50 } " +
                    state("STATE__1", "STATE__1",
                          "initial_state [ { name: \"i\" data_type: TYPE_FP32 dims: [ 2, 3 ] "
                          "data_file: \"sub/init.bin\" } ]") +
                    " }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SequenceBatchingSpec& batching = spec->sequence_batching;
  EXPECT_EQ(batching.strategy, SequenceStrategy::kOldest);
  EXPECT_EQ(batching.SlotsPerInstance(spec->max_batch_size), 6);
  EXPECT_EQ(batching.preferred_batch_sizes, (std::vector<int>{2, 4}));
  EXPECT_EQ(batching.max_queue_delay_us, 50);
  ASSERT_EQ(batching.states.size(), 1u);
  EXPECT_EQ(batching.states[0].dims, (Shape{2, 3}));
  EXPECT_EQ(batching.states[0].initial_file, "sub/init.bin");
  ASSERT_EQ(spec->inputs.size(), 2u);
  EXPECT_TRUE(spec->inputs[1].filled_by_server);
  EXPECT_TRUE(spec->inputs[1].sequence_state);
  ASSERT_EQ(spec->outputs.size(), 2u);
  EXPECT_TRUE(spec->outputs[1].state_only);  // not listed in `output`: the server's

  // Listed in `output`, the state output is the client's too, with the state's type and dims.
  const std::string listed =
      "max_batch_size: 4\n"
      "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 3 ] }, { name: \"S__1\" "
      "data_type: TYPE_FP32 dims: [ 2, 3 ] } ]\n";
  auto visible = Build(listed + "sequence_batching { " + state("S__1", "S__1", "") + " }");
  ASSERT_TRUE(visible.ok()) << visible.status();
  ASSERT_EQ(visible->outputs.size(), 2u);
  EXPECT_FALSE(visible->outputs[1].state_only);
  EXPECT_EQ(visible->sequence_batching.SlotsPerInstance(4), 4);  // direct: max_batch_size

  // A .pt2 binds by name: no naming rule.
  auto aoti = Build(
      "platform: \"torch_aoti\"\nmax_batch_size: 4\n"
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n"
      "sequence_batching { " +
      state("state", "new_state", "") + " }");
  ASSERT_TRUE(aoti.ok()) << aoti.status();

  const std::vector<std::pair<std::string, std::string>> refused = {
      {state("STATE", "STATE__1", ""),
       "is using sequence batching with state but state 'STATE' does not follow the "
       "<name>__<index> naming convention"},
      {state("INPUT__0", "S__1", ""), "input_name is already an input of the model"},
      {"state [ { input_name: \"S__1\" output_name: \"S__1\" data_type: TYPE_STRING dims: [ 1 ] } "
       "]",
       "TYPE_STRING has none"},
      {"state [ { input_name: \"S__1\" output_name: \"S__1\" data_type: TYPE_FP32 dims: [ -1 ] } ]",
       "a state of variable size, use_growable_memory, is not supported"},
      {"state [ { input_name: \"S__1\" output_name: \"S__1\" data_type: TYPE_FP32 } ]",
       "dims are missing"},
      {state("S__1", "S__1",
             "initial_state [ { data_type: TYPE_FP32 dims: [ 3, 2 ] zero_data: true } ]"),
       "must be the state's (FP32 [2,3])"},
      {state("S__1", "S__1", "initial_state [ { data_type: TYPE_FP32 dims: [ 2, 3 ] } ]"),
       "give zero_data: true or data_file"},
      {state("S__1", "S__1",
             "initial_state [ { data_type: TYPE_FP32 dims: [ 2, 3 ] data_file: \"../x\" } ]"),
       "must name a file inside the model's initial_state/ directory"},
      {state("S__1", "OUTPUT__0", ""), "a state output listed there must have the state's"},
  };
  for (const auto& [extra, message] : refused) {
    auto bad = Build(io + "sequence_batching { " + extra + " }");
    ASSERT_FALSE(bad.ok()) << extra;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << extra;
  }
}

TEST(ModelConfigParserTest, SequenceBatchingErrorsSayWhatIsWrong) {
  const std::string io =
      "max_batch_size: 4\n"
      "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
      "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n";
  auto control = [](const std::string& name, const std::string& body) {
    return "control_input [ { name: \"" + name + "\" control [ { " + body + " } ] } ]";
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sequence_batching { oldest { } }", "oldest.max_candidate_sequences must be in [1, 4096]"},
      {"sequence_batching { oldest { max_candidate_sequences: 4 preferred_batch_size: [ 8 ] } }",
       "oldest.preferred_batch_size 8 must be in [1, 4]"},
      {"sequence_batching { state [ { input_name: \"a\" output_name: \"b__1\" data_type: "
       "TYPE_FP32 dims: [ 1 ] } ] }",
       "model 'm' is using sequence batching with state but output 'OUTPUT' does not follow the "
       "<name>__<index> naming convention"},
      {"sequence_batching { iterative_sequence: true }", "'iterative_sequence' is not supported"},
      {"sequence_batching { " +
           control("INPUT", "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]") + " }",
       "the name is already an input"},
      {"sequence_batching { " +
           control("S", "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ]") + " }",
       "needs exactly two values"},
      {"sequence_batching { " + control("S", "kind: CONTROL_SEQUENCE_START") + " }",
       "give exactly one of int32_false_true"},
      {"sequence_batching { " +
           control("S",
                   "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] "
                   "fp32_false_true: [ 0, 1 ]") +
           " }",
       "give exactly one of int32_false_true"},
      {"sequence_batching { " +
           control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64") + " }",
       "TYPE_UINT64 has no LibTorch tensor type; use TYPE_INT64"},
      {"sequence_batching { " + control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32") +
           " }",
       "must be TYPE_INT64, TYPE_INT32 or TYPE_STRING"},
      {"sequence_batching { " +
           control("C", "kind: CONTROL_SEQUENCE_CORRID int32_false_true: [ 0, 1 ]") + " }",
       "takes a data_type, not *_false_true values"},
      {"sequence_batching { control_input [ { name: \"A\" control [ { kind: CONTROL_SEQUENCE_READY "
       "int32_false_true: [ 0, 1 ] } ] }, { name: \"B\" control [ { kind: CONTROL_SEQUENCE_READY "
       "int32_false_true: [ 0, 1 ] } ] } ] }",
       "CONTROL_SEQUENCE_READY is given by two control inputs"},
      {"sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
       "minimum_slot_utilization must be in [0, 1]"},
      {"sequence_batching { max_sequence_idle_microseconds: 100000000000 }", "at most 86400000000"},
  };
  for (const auto& [extra, message] : cases) {
    auto spec = Build(io + extra);
    ASSERT_FALSE(spec.ok()) << extra;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(spec.status().message(), HasSubstr(message)) << extra;
  }
  auto padded = Build(
      "max_batch_size: 4\n"
      "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
      "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
      "sequence_batching { } parameters { key: \"sluice.buckets\" value { string_value: \"n = 4\" "
      "} } "
      "parameters { key: \"sluice.bucket_dims\" value { string_value: \"INPUT:0=n\" } }");
  ASSERT_FALSE(padded.ok());
  EXPECT_THAT(padded.status().message(), HasSubstr("cannot be combined with sequence_batching"));
  // (dynamic_batching and sequence_batching are one oneof in the schema: a config with both does
  // not parse.)
  auto aoti = Build("platform: \"torch_aoti\"\n" + io + "sequence_batching { " +
                    control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING") + " }");
  ASSERT_FALSE(aoti.ok());
  EXPECT_THAT(aoti.status().message(), HasSubstr("cannot reach an AOTInductor package"));
}

constexpr char kPaddedSequenceModel[] = R"pb(
  max_batch_size: 8
  input [ { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] },
          { name: "lengths" data_type: TYPE_INT32 dims: [ 1 ] } ]
  output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1, 4 ] },
           { name: "pooled" data_type: TYPE_FP32 dims: [ 4 ] } ]
  parameters { key: "sluice.buckets" value { string_value: "seq = 64, 16,32" } }
  parameters { key: "sluice.bucket_dims" value { string_value: "tokens:0=seq, logits:0=seq" } }
  parameters { key: "sluice.pad_value" value { string_value: "-1" } }
  parameters { key: "sluice.lengths_input" value { string_value: "lengths" } }
)pb";

TEST(ModelConfigParserTest, PaddingBuckets) {
  auto spec = Build(kPaddedSequenceModel);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const PaddingSpec& padding = spec->padding;
  ASSERT_TRUE(padding.enabled());
  ASSERT_EQ(padding.axes.size(), 1u);
  EXPECT_EQ(padding.axes[0].name, "seq");
  EXPECT_THAT(padding.axes[0].sizes, ElementsAre(16, 32, 64));
  ASSERT_EQ(padding.dims.size(), 2u);
  EXPECT_EQ(padding.dims[0].tensor, "tokens");
  EXPECT_TRUE(padding.dims[0].is_input);
  EXPECT_EQ(padding.dims[1].tensor, "logits");
  EXPECT_FALSE(padding.dims[1].is_input);
  EXPECT_EQ(padding.pad_value, -1);
  EXPECT_EQ(padding.lengths_input, "lengths");
  EXPECT_TRUE(spec->inputs[1].filled_by_server);
  EXPECT_FALSE(spec->inputs[0].filled_by_server);
}

TEST(ModelConfigParserTest, PaddingErrorsSayWhatIsWrong) {
  const std::string base = R"pb(
    max_batch_size: 8
    input [ { name: "tokens" data_type: TYPE_INT64 dims: [ -1, 3 ] },
            { name: "lengths" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "out" data_type: TYPE_FP32 dims: [ -1 ] } ]
  )pb";
  auto with = [&](const std::string& parameters) { return Build(base + parameters).status(); };
  auto param = [](const std::string& key, const std::string& value) {
    return "parameters { key: \"" + key + "\" value { string_value: \"" + value + "\" } }\n";
  };
  EXPECT_THAT(with(param("sluice.buckets", "seq=16")).message(), HasSubstr("needs both"));
  EXPECT_THAT(with(param("sluice.pad_value", "0")).message(), HasSubstr("needs sluice.buckets"));
  EXPECT_THAT(
      with(param("sluice.buckets", "seq=16,x") + param("sluice.bucket_dims", "tokens:0=seq"))
          .message(),
      HasSubstr("'x' is not a positive size"));
  EXPECT_THAT(
      with(param("sluice.buckets", "seq") + param("sluice.bucket_dims", "tokens:0=seq")).message(),
      HasSubstr("is not axis=size"));
  EXPECT_THAT(with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "tokens:1=seq"))
                  .message(),
              HasSubstr("must exist and be -1"));
  EXPECT_THAT(
      with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "nope:0=seq")).message(),
      HasSubstr("no input or output 'nope'"));
  EXPECT_THAT(with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "tokens:0=len"))
                  .message(),
              HasSubstr("no axis 'len'"));
  EXPECT_THAT(
      with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "out:0=seq")).message(),
      HasSubstr("no input dimension follows axis 'seq'"));
  EXPECT_THAT(with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "tokens:0=seq") +
                   param("sluice.lengths_input", "lengths"))
                  .message(),
              HasSubstr("TYPE_INT32 or TYPE_INT64"));
  EXPECT_THAT(with(param("sluice.bucket", "seq=16")).message(),
              HasSubstr("unknown parameter 'sluice.bucket': did you mean 'sluice.buckets'?"));
  EXPECT_THAT(with(param("sluice.pad_batch_to_prefered", "true")).message(),
              HasSubstr("did you mean 'sluice.pad_batch_to_preferred'?"));
  // Nothing near: no guess, the whole list.
  const std::string far = std::string(with(param("sluice.something_else_entirely", "1")).message());
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
  EXPECT_THAT(far, HasSubstr("Sluice knows: sluice.pad_batch_to_preferred"));
  EXPECT_THAT(with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "tokens:0=seq") +
                   param("sluice.pad_value", "0.5"))
                  .message(),
              HasSubstr("sluice.pad_value 0.5 cannot be stored in input 'tokens' of type INT64"));
  EXPECT_TRUE(with(param("sluice.buckets", "seq=16") + param("sluice.bucket_dims", "tokens:0=seq") +
                   param("sluice.pad_value", "-1"))
                  .ok());
  EXPECT_THAT(with(param("sluice.cudnn_benchmark", "maybe")).message(),
              HasSubstr("\"auto\", \"on\" or \"off\""));
  EXPECT_THAT(with(param("sluice.warmup_runs", "0")).message(), HasSubstr("sluice.warmup_runs"));
  EXPECT_THAT(
      with(param("sluice.cuda_wait", "yield")).message(),
      HasSubstr("sluice.cuda_wait is \"yield\": use \"spin\" (the default) or \"blocking\""));
}

TEST(ModelConfigParserTest, WarmupAndBenchmarkParameters) {
  auto spec = Build(std::string(kMinimal) + R"pb(
    parameters { key: "sluice.warmup" value { string_value: "false" } }
    parameters { key: "sluice.warmup_runs" value { string_value: "5" } }
    parameters { key: "sluice.cudnn_benchmark" value { string_value: "off" } }
    parameters { key: "sluice.cuda_wait" value { string_value: "blocking" } }
    model_warmup [ { name: "zeros" batch_size: 2 count: 3
                     inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 3, 7 ] zero_data: true } } },
                   { name: "file" batch_size: 1
                     inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 3, 1 ] input_data_file: "x.bin" } } } ]
  )pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->warmup);
  EXPECT_EQ(spec->warmup_runs, 5);
  EXPECT_EQ(spec->cudnn_benchmark_override, CudnnBenchmarkMode::kOff);
  EXPECT_TRUE(spec->cuda_blocking_wait);
  ASSERT_EQ(spec->warmup_samples.size(), 2u);
  EXPECT_EQ(spec->warmup_samples[0].name, "zeros");
  EXPECT_EQ(spec->warmup_samples[0].batch_size, 2);
  EXPECT_EQ(spec->warmup_samples[0].count, 3);
  EXPECT_THAT(spec->warmup_samples[0].inputs[0].dims, ElementsAre(3, 7));
  EXPECT_EQ(spec->warmup_samples[1].inputs[0].source, WarmupInputSpec::Source::kFile);
  EXPECT_EQ(spec->warmup_samples[1].inputs[0].file, "x.bin");
  EXPECT_EQ(spec->warmup_samples[1].count, 1);

  auto too_big = Build(std::string(kMinimal) + R"pb(
    model_warmup [ { name: "big" batch_size: 9
                     inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 3, 1 ] zero_data: true } } } ])pb");
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("model_warmup 'big': batch_size must be in [1, max_batch_size=8]"));
  auto escape = Build(std::string(kMinimal) + R"pb(
    model_warmup [ { name: "up" batch_size: 1
                     inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 3, 1 ] input_data_file: "../x" } } } ])pb");
  EXPECT_THAT(escape.status().message(), HasSubstr("plain file name"));
}

TEST(ModelConfigParserTest, TorchAotiPlatformTakesPackages) {
  const std::string io = R"pb(max_batch_size: 8
                              input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
                              output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb";
  auto spec = Build("platform: \"torch_aoti\"\n" + io);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->format, ModelFormat::kAotInductor);
  EXPECT_EQ(spec->platform, "torch_aoti");
  EXPECT_EQ(spec->model_filename, "model.pt2");
  spec = Build(
      "platform: \"torch_aoti\" backend: \"pytorch\" default_model_filename: \"net.pt2\"\n" + io);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_filename, "net.pt2");
  spec = Build(io);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->format, ModelFormat::kTorchScript);
  EXPECT_EQ(spec->model_filename, "model.pt");
}

TEST(ModelConfigParserTest, StringTensorsAreFlatListsOfStr) {
  // Triton's layout for a batched string input: dims [1] reshaped to [] (the model takes one
  // flat List[str]; the reshape changes nothing it sees, so it is accepted for strings).
  auto spec = Build(R"pb(max_batch_size: 8
                         input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } } ]
                         output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] },
                                  { name: "SCORE" data_type: TYPE_FP32 dims: [ 2 ] } ])pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->inputs[0].dtype, DataType::kBytes);
  EXPECT_EQ(spec->inputs[0].dims, Shape({1}));
  EXPECT_EQ(spec->outputs[0].dtype, DataType::kBytes);
  EXPECT_FALSE(spec->warmup);  // shape warm-up feeds empty strings: only when asked for
  spec = Build(R"pb(input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
                    output [ { name: "LABEL" data_type: TYPE_STRING dims: [ -1 ] } ]
                    parameters { key: "sluice.warmup" value { string_value: "true" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->warmup);

  struct Case {
    std::string config;
    std::string message;
  };
  const std::string out = R"pb(output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb";
  const std::vector<Case> cases = {
      {R"pb(input [ { name: "a" data_type: TYPE_STRING dims: [ 2, 3 ] } ])pb" + out,
       "input 'a': a TYPE_STRING tensor is a flat List[str] for the model; declare at most one "
       "dimension"},
      {R"pb(input [ { name: "a" data_type: TYPE_STRING dims: [ 4 ] reshape: { shape: [ 2 ] } } ])pb" +
           out,
       "input 'a': reshape [2] must keep the element count of dims"},
      {R"pb(input [ { name: "a" data_type: TYPE_STRING dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ])pb" +
           out,
       "and have at most one dimension"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_STRING dims: [ 1, 1 ] } ])pb",
       "output 'b': a TYPE_STRING tensor is a flat List[str]"},
      {R"pb(platform: "torch_aoti"
            input [ { name: "a" data_type: TYPE_STRING dims: [ 1 ] } ])pb" +
           out,
       "'a' is TYPE_STRING, but an AOTInductor package (platform \"torch_aoti\") takes and returns "
       "tensors only"},
      {R"pb(max_batch_size: 4
            input [ { name: "a" data_type: TYPE_STRING dims: [ -1 ] } ])pb" +
           out +
           R"pb(parameters { key: "sluice.buckets" value { string_value: "n=4,8" } }
                parameters { key: "sluice.bucket_dims" value { string_value: "a:0=n" } })pb",
       "sluice.bucket_dims: 'a:0=n': 'a' is TYPE_STRING; padding buckets pad fixed-size elements"},
  };
  for (const Case& c : cases) {
    auto built = Build(c.config);
    EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument) << c.config;
    EXPECT_THAT(built.status().message(), HasSubstr(c.message)) << c.config;
  }
}

TEST(ModelConfigParserTest, ValidationErrors) {
  struct Case {
    std::string config;
    std::string message;
  };
  const std::string io = R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
                              output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb";
  std::vector<Case> cases = {
      {"name: \"other\"\n" + io, "config name 'other' differs from its directory name 'm'"},
      {"platform: \"onnxruntime_onnx\"\n" + io, "Sluice serves TorchScript models"},
      {"max_batch_size: -1\n" + io, "max_batch_size must be >= 0"},
      {"max_batch_size: 1", "needs its inputs and outputs declared"},
      {R"pb(input [ { name: "a" data_type: TYPE_UINT16 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a': data_type TYPE_UINT16 is not supported"},
      {R"pb(input [ { name: "a" dims: [ 1 ] } ] output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a': data_type is missing"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 0 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a': dims must be positive or -1"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a' is declared twice"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3, 2 ] } } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a': reshape [3,2] does not hold what dims [4] hold: both need the same element "
       "count and as many -1s"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape: { shape: [ 4 ] } } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] } ])pb",
       "input 'a': reshape [4] does not hold what dims [-1,4] hold"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 0, 4 ] } } ])pb",
       "output 'b': reshape dims must be positive or -1 (any size), found 0"},
      {io + "\ndynamic_batching { }", "dynamic_batching needs max_batch_size > 0"},
      {io + "\ninstance_group [ { kind: KIND_MODEL } ]", "kind KIND_MODEL is not supported"},
      {io + "\ninstance_group [ { count: 100 } ]", "count must be between 1 and 64"},
      {io + "\ndefault_model_filename: \"../x.pt\"",
       "default_model_filename must be a plain file name"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "../x" } ])pb",
       "output 'b': label_filename '../x' must name a file inside the model's directory"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "/etc/passwd" } ])pb",
       "output 'b': label_filename '/etc/passwd' must name a file inside the model's directory"},
      {R"pb(input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "b" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "x/../../y" } ])pb",
       "must name a file inside the model's directory (a relative path without '..')"},
  };
  for (const Case& c : cases) {
    auto spec = Build(c.config);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.config;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message)) << c.config;
  }
}

TEST(ModelConfigParserTest, ReshapeOnEveryTypeIsKeptWhereItDiffersFromDims) {
  auto spec = Build(R"pb(max_batch_size: 4
                         input [ { name: "a" data_type: TYPE_INT8 dims: [ 1 ] reshape: { shape: [ ] } },
                                 { name: "b" data_type: TYPE_FP16 dims: [ -1, 4 ]
                                   reshape: { shape: [ 2, -1, 2 ] } },
                                 { name: "c" data_type: TYPE_FP32 dims: [ 3 ] reshape: { shape: [ 3 ] } } ]
                         output [ { name: "y" data_type: TYPE_BOOL dims: [ 2, 2 ]
                                    reshape: { shape: [ 4 ] } } ])pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->inputs[0].reshape, Shape{});
  EXPECT_EQ(spec->inputs[1].reshape, (Shape{2, -1, 2}));
  EXPECT_FALSE(spec->inputs[2].reshape.has_value());  // the same as dims: nothing to do
  EXPECT_EQ(spec->outputs[0].reshape, (Shape{4}));
  EXPECT_EQ(spec->FullShape(spec->inputs[1]), (Shape{-1, -1, 4}));  // what clients see
  EXPECT_EQ(spec->ModelFullShape(spec->inputs[1]), (Shape{-1, 2, -1, 2}));
}

TEST(ModelConfigParserTest, LabelFilenameIsKeptForTheRepositoryToRead) {
  auto spec = Build(R"pb(max_batch_size: 4
                         input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] } ]
                         output [ { name: "b" data_type: TYPE_FP16 dims: [ 10 ]
                                    label_filename: "labels/imagenet.txt" },
                                  { name: "c" data_type: TYPE_FP32 dims: [ 1 ] } ])pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->outputs[0].label_filename, "labels/imagenet.txt");
  EXPECT_EQ(spec->outputs[0].labels, nullptr);  // read by the repository, which knows the directory
  EXPECT_TRUE(spec->outputs[1].label_filename.empty());
}

TEST(ModelConfigParserTest, InstanceGroupsAndParameters) {
  auto spec = Build(std::string(kMinimal) + R"pb(
      instance_group [ { kind: KIND_CPU count: 3 }, { kind: KIND_GPU gpus: [ 1, 2 ] } ]
      parameters: { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->instance_groups.size(), 2u);
  EXPECT_EQ(spec->instance_groups[0].kind, InstanceKind::kCpu);
  EXPECT_EQ(spec->instance_groups[0].count, 3);
  EXPECT_EQ(spec->instance_groups[1].kind, InstanceKind::kGpu);
  EXPECT_THAT(spec->instance_groups[1].gpus, ElementsAre(1, 2));
  EXPECT_EQ(spec->parameters.at("INTRA_OP_THREAD_COUNT"), "2");
  EXPECT_EQ(spec->intra_op_threads, 2);
  EXPECT_FALSE(spec->dynamic_batching.enabled);
}

TEST(ModelConfigParserTest, DynamicBatching) {
  auto spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching {
        preferred_batch_size: [ 8, 2, 4, 4 ]
        max_queue_delay_microseconds: 500
        default_queue_policy { max_queue_size: 7 default_timeout_microseconds: 900 allow_timeout_override: true }
      }
      parameters: { key: "sluice.pad_batch_to_preferred" value: { string_value: "true" } }
      parameters: { key: "sluice.max_shape_groups" value: { string_value: "3" } }
      parameters: { key: "sluice.max_queued_bytes" value: { string_value: "1000" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DynamicBatchingSpec& batching = spec->dynamic_batching;
  EXPECT_TRUE(batching.enabled);
  EXPECT_THAT(batching.preferred_batch_sizes, ElementsAre(2, 4, 8));
  EXPECT_EQ(batching.max_queue_delay_us, 500);
  EXPECT_EQ(batching.default_policy.max_queue_size, 7u);
  EXPECT_EQ(batching.default_policy.default_timeout_us, 900);
  EXPECT_TRUE(batching.default_policy.allow_timeout_override);
  EXPECT_TRUE(batching.pad_to_preferred);
  EXPECT_EQ(batching.max_shape_groups, 3);
  EXPECT_EQ(batching.max_queued_bytes, 1000u);
  EXPECT_TRUE(batching.auto_batch_sizes);  // on by default
}

TEST(ModelConfigParserTest, PriorityLevelsAndQueuePolicies) {
  auto spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching {
        priority_levels: 3
        default_priority_level: 2
        preserve_ordering: true
        default_queue_policy { max_queue_size: 9 default_timeout_microseconds: 100 }
        priority_queue_policy {
          key: 1
          value: { max_queue_size: 4 default_timeout_microseconds: 2000 allow_timeout_override: true
                   timeout_action: DELAY }
        }
      })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DynamicBatchingSpec& batching = spec->dynamic_batching;
  EXPECT_EQ(batching.priority_levels, 3);
  EXPECT_EQ(batching.default_priority_level, 2);
  EXPECT_TRUE(batching.preserve_ordering);
  ASSERT_EQ(batching.level_policies.size(), 3u);
  // Level 1 has its own policy; levels 2 and 3 take the default one.
  EXPECT_EQ(batching.PolicyOf(1).max_queue_size, 4u);
  EXPECT_EQ(batching.PolicyOf(1).default_timeout_us, 2000);
  EXPECT_TRUE(batching.PolicyOf(1).allow_timeout_override);
  EXPECT_TRUE(batching.PolicyOf(1).delay);
  for (int level : {2, 3}) {
    EXPECT_EQ(batching.PolicyOf(level).max_queue_size, 9u);
    EXPECT_EQ(batching.PolicyOf(level).default_timeout_us, 100);
    EXPECT_FALSE(batching.PolicyOf(level).delay);
  }
  EXPECT_TRUE(batching.AnyDelay());
  // A request's priority: 0 or above the levels means the default level.
  EXPECT_EQ(batching.LevelOf(0), 2);
  EXPECT_EQ(batching.LevelOf(1), 1);
  EXPECT_EQ(batching.LevelOf(3), 3);
  EXPECT_EQ(batching.LevelOf(4), 2);
  // Without levels every request is at level 0, under the default policy.
  auto plain = Build(std::string(kMinimal) +
                     "dynamic_batching { default_queue_policy { timeout_action: DELAY } }");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dynamic_batching.LevelOf(1), 0);
  EXPECT_TRUE(plain->dynamic_batching.PolicyOf(0).delay);
  // Without levels, the level fields mean nothing and are ignored, as Triton ignores them.
  auto ignored = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { default_priority_level: 3 priority_queue_policy { key: 9 value: { timeout_action: DELAY } } })pb");
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_EQ(ignored->dynamic_batching.priority_levels, 0);
  EXPECT_FALSE(ignored->dynamic_batching.AnyDelay());
  // With levels, every level has its own policy: the default one's DELAY counts only where a
  // level takes it.
  auto all_named = Build(std::string(kMinimal) + R"pb(
      dynamic_batching {
        priority_levels: 1 default_priority_level: 1
        default_queue_policy { timeout_action: DELAY }
        priority_queue_policy { key: 1 value: { } }
      })pb");
  ASSERT_TRUE(all_named.ok()) << all_named.status();
  EXPECT_FALSE(all_named->dynamic_batching.AnyDelay());
}

TEST(ModelConfigParserTest, TheQueuedByteCapHoldsWithoutDynamicBatchingToo) {
  // One admission policy for every scheduler: the sequence batcher and the unbatched queue read
  // the same cap.
  auto spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.max_queued_bytes" value: { string_value: "4096" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->dynamic_batching.enabled);
  EXPECT_EQ(spec->dynamic_batching.max_queued_bytes, 4096u);
  EXPECT_EQ(Build(std::string(kMinimal)).value().dynamic_batching.max_queued_bytes, 256u << 20);
  auto refused = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.max_queued_bytes" value: { string_value: "0" } })pb");
  EXPECT_FALSE(refused.ok());
}

TEST(ModelConfigParserTest, AutoBatchSizesSwitchAndReportedChoice) {
  auto spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { }
      parameters: { key: "sluice.auto_batch_sizes" value: { string_value: "false" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->dynamic_batching.auto_batch_sizes);
  // A config written back from a ModelConfig answer carries the measured choice: it loads, and
  // the choice is measured again.
  spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { }
      parameters: { key: "sluice.auto_batch_sizes.chosen" value: { string_value: "1,2" } }
      parameters: { key: "sluice.auto_batch_sizes.rows_per_second" value: { string_value: "1:10,2:30" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->dynamic_batching.auto_batch_sizes);
  spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { }
      parameters: { key: "sluice.auto_batch_sizes" value: { string_value: "sometimes" } })pb");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("sluice.auto_batch_sizes must be \"true\" or \"false\""));
}

TEST(ModelConfigParserTest, StageAheadUnsetOrSetEitherWay) {
  auto spec = Build(std::string(kMinimal) + "dynamic_batching { }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->dynamic_batching.stage_ahead.has_value());  // the loader decides
  for (const bool value : {true, false}) {
    spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { }
      parameters: { key: "sluice.stage_ahead" value: { string_value: ")pb" +
                 (value ? "true" : "false") + "\" } }");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->dynamic_batching.stage_ahead, value);
  }
  spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { }
      parameters: { key: "sluice.stage_ahead" value: { string_value: "yes" } })pb");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("sluice.stage_ahead must be \"true\" or \"false\""));
}

TEST(ModelConfigParserTest, RunOnReceivingThreadWithAndWithoutDynamicBatching) {
  auto spec = Build(std::string(kMinimal));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->dynamic_batching.run_on_receiving_thread);  // off by default
  EXPECT_EQ(spec->dynamic_batching.run_on_receiving_thread_max_us, kRunOnReceivingThreadMaxUs);
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.run_on_receiving_thread" value: { string_value: "true" } }
      parameters: { key: "sluice.run_on_receiving_thread_max_us" value: { string_value: "120" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->dynamic_batching.enabled);
  EXPECT_TRUE(spec->dynamic_batching.run_on_receiving_thread);
  EXPECT_EQ(spec->dynamic_batching.run_on_receiving_thread_max_us, 120);
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.run_on_receiving_thread_max_us" value: { string_value: "0" } })pb");
  EXPECT_THAT(spec.status().message(), HasSubstr("sluice.run_on_receiving_thread_max_us"));
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.run_on_receiving_thread" value: { string_value: "yes" } })pb");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("sluice.run_on_receiving_thread must be \"true\" or \"false\""));
}

TEST(ModelConfigParserTest, LatencyTarget) {
  auto spec = Build(std::string(kMinimal));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dynamic_batching.latency_target_us, 0);  // none by default
  spec = Build(std::string(kMinimal) + R"pb(
      dynamic_batching { max_queue_delay_microseconds: 500 }
      parameters: { key: "sluice.latency_target_us" value: { string_value: "20000" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dynamic_batching.latency_target_us, 20000);
  EXPECT_EQ(spec->dynamic_batching.max_queue_delay_us, 500);  // kept, as the wait's upper bound
  // Without dynamic_batching too (each request its own batch: only refusals apply).
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.latency_target_us" value: { string_value: "1000" } })pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dynamic_batching.latency_target_us, 1000);
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.latency_target_us" value: { string_value: "0" } })pb");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("sluice.latency_target_us must be an integer in [1, "));
  spec = Build(std::string(kMinimal) + R"pb(
      parameters: { key: "sluice.latency_target_us" value: { string_value: "20ms" } })pb");
  EXPECT_THAT(spec.status().message(), HasSubstr("found '20ms'"));
  // A stateful model's requests run in their sequence's order and slot: refused, with why.
  spec = Build(
      "max_batch_size: 0\n"
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "sequence_batching { }\n"
      "parameters: { key: \"sluice.latency_target_us\" value: { string_value: \"1000\" } }\n");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("sluice.latency_target_us cannot be combined with sequence_batching"));
}

TEST(ModelConfigParserTest, OperatorLibraries) {
  auto spec = Build(std::string(kMinimal) + R"pb(
    parameters { key: "sluice.operator_libraries" value { string_value: " ops/libdetect.so ,libshared.so" } }
    parameters { key: "MODEL_INIT_LIBRARY" value { string_value: "/opt/ops/libinit.so" } }
  )pb");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->operator_libraries, ElementsAre("ops/libdetect.so", "libshared.so"));
  EXPECT_EQ(spec->init_library, "/opt/ops/libinit.so");
  EXPECT_TRUE(Build(kMinimal)->operator_libraries.empty());

  for (const char* bad : {"../libops.so", "ops/../../libops.so", "a.so,,b.so", ""}) {
    auto refused =
        Build(std::string(kMinimal) +
              "parameters { key: \"sluice.operator_libraries\" value { string_value: \"" + bad +
              "\" } }");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto climbing = Build(std::string(kMinimal) + R"pb(
    parameters { key: "MODEL_INIT_LIBRARY" value { string_value: "../other/libinit.so" } })pb");
  EXPECT_THAT(std::string(climbing.status().message()), HasSubstr("climbs out with '..'"));
}

TEST(ModelConfigParserTest, ResponseCache) {
  auto spec = Build(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->response_cache);  // off unless the config enables it
  spec = Build(std::string(kMinimal) + "response_cache { enable: false }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->response_cache);
  spec = Build(std::string(kMinimal) + "response_cache { enable: true }\ndynamic_batching { }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->response_cache);
  // A stateful model's answer depends on its sequence: a cached one would be wrong.
  spec = Build(
      "max_batch_size: 0\n"
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
      "sequence_batching { }\n"
      "response_cache { enable: true }\n");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("response_cache cannot be enabled with sequence_batching"));
}

TEST(ModelConfigParserTest, DynamicBatchingErrors) {
  const std::string base = kMinimal;
  struct Case {
    std::string extra, message;
  };
  std::vector<Case> cases = {
      {"dynamic_batching { preferred_batch_size: [ 9 ] }",
       "preferred_batch_size 9 is outside [1, max_batch_size=8]"},
      {"dynamic_batching { priority_levels: 2 }",
       "default_priority_level must be in [1, priority_levels=2], found 0"},
      {"dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
       "found 3 (level 1 is the highest"},
      {"dynamic_batching { priority_levels: 65 default_priority_level: 1 }",
       "priority_levels must be at most 64"},
      {"dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { "
       "key: 3 value: { } } }",
       "priority_queue_policy names level 3, outside [1, priority_levels=2]"},
      {"dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n"
       "parameters: { key: \"sluice.latency_target_us\" value: { string_value: \"5000\" } }",
       "sluice.latency_target_us cannot be combined with priority_levels or timeout_action: DELAY"},
      {"dynamic_batching { default_queue_policy { timeout_action: DELAY "
       "default_timeout_microseconds: 5 } }\n"
       "parameters: { key: \"sluice.latency_target_us\" value: { string_value: \"5000\" } }",
       "cannot be combined with priority_levels or timeout_action: DELAY"},
      {"dynamic_batching { max_queue_delay_microseconds: 100000000 }", "at most 60000000"},
      {"dynamic_batching { }\nparameters: { key: \"sluice.max_shape_groups\" value: { "
       "string_value: \"0\" } }",
       "sluice.max_shape_groups must be an integer in [1, 4096]"},
      {"dynamic_batching { }\nparameters: { key: \"sluice.pad_batch_to_preferred\" value: { "
       "string_value: \"yes\" } }",
       "must be \"true\" or \"false\""},
      {"parameters: { key: \"INTRA_OP_THREAD_COUNT\" value: { string_value: \"many\" } }",
       "INTRA_OP_THREAD_COUNT must be an integer"},
  };
  for (const Case& c : cases) {
    auto spec = Build(base + c.extra);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.extra;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message)) << c.extra;
  }
}

TEST(VersionPolicyTest, LatestAllSpecific) {
  inference::ModelVersionPolicy policy;
  EXPECT_THAT(SelectVersions(policy, {3, 1, 2}), ElementsAre(3));
  policy.mutable_latest()->set_num_versions(2);
  EXPECT_THAT(SelectVersions(policy, {3, 1, 2}), ElementsAre(2, 3));
  policy.mutable_latest()->set_num_versions(10);
  EXPECT_THAT(SelectVersions(policy, {3, 1, 2}), ElementsAre(1, 2, 3));
  policy.mutable_all();
  EXPECT_THAT(SelectVersions(policy, {2, 1}), ElementsAre(1, 2));
  policy.mutable_specific()->add_versions(1);
  policy.mutable_specific()->add_versions(5);
  EXPECT_THAT(SelectVersions(policy, {1, 2, 3}), ElementsAre(1));
}

}  // namespace
}  // namespace sluice
