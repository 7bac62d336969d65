#include "server/repository/model_config_parser.h"

#include "server/repository/model_parameters.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

class FirstErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty())
      error_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

StatusOr<DataType> ConvertDataType(inference::DataType type, const std::string& where) {
  switch (type) {
    case inference::TYPE_BOOL:
      return DataType::kBool;
    case inference::TYPE_UINT8:
      return DataType::kUint8;
    case inference::TYPE_INT8:
      return DataType::kInt8;
    case inference::TYPE_INT16:
      return DataType::kInt16;
    case inference::TYPE_INT32:
      return DataType::kInt32;
    case inference::TYPE_INT64:
      return DataType::kInt64;
    case inference::TYPE_FP16:
      return DataType::kFp16;
    case inference::TYPE_BF16:
      return DataType::kBf16;
    case inference::TYPE_FP32:
      return DataType::kFp32;
    case inference::TYPE_FP64:
      return DataType::kFp64;
    case inference::TYPE_STRING:
      return DataType::kBytes;
    case inference::TYPE_INVALID:
      return absl::InvalidArgumentError(absl::StrCat(where, ": data_type is missing"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_type ", inference::DataType_Name(type),
          " is not supported (Sluice serves BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, "
          "FP32, FP64, STRING)"));
  }
}

Status CheckDims(const google::protobuf::RepeatedField<int64_t>& dims, const std::string& where) {
  for (int64_t dim : dims) {
    if (dim != -1 && dim < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dims must be positive or -1 (any size), found ", dim));
    }
  }
  return absl::OkStatus();
}

// A tensor's `reshape` (every type but TYPE_STRING): the shape the model takes or makes instead of
// `dims` (Triton's ModelTensorReshape). Each -1 of the reshape takes the size at the matching -1
// of dims, in order, so both have as many -1s and the same element count otherwise. The reshape
// when it differs from dims, nullopt when it does not.
StatusOr<std::optional<Shape>> ConvertReshape(const google::protobuf::RepeatedField<int64_t>& dims,
                                              const inference::ModelTensorReshape& reshape,
                                              const std::string& where) {
  const Shape from(dims.begin(), dims.end());
  const Shape to(reshape.shape().begin(), reshape.shape().end());
  for (int64_t dim : to) {
    if (dim != -1 && dim < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": reshape dims must be positive or -1 (any size), found ", dim));
    }
  }
  auto variable = [](const Shape& shape) { return std::count(shape.begin(), shape.end(), -1); };
  auto fixed_count = [](const Shape& shape) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim == -1 ? 1 : dim;
    return count;
  };
  if (variable(from) != variable(to) || fixed_count(from) != fixed_count(to)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": reshape ", ShapeToString(to), " does not hold what dims ", ShapeToString(from),
        " hold: both need the same element count and as many -1s (each -1 of the reshape takes "
        "the size of the matching -1 of dims, in order)"));
  }
  if (from == to) return std::optional<Shape>();
  return std::optional<Shape>(to);
}

// A string tensor reaches a TorchScript model as one flat List[str] (every element of every
// request of the batch, in order), as in Triton's PyTorch backend. So at most one dimension
// besides the batch, and a `reshape` (which Triton's string models use to drop a [1]) changes
// nothing the model sees: it is accepted for strings when it keeps the element count.
Status CheckStringShape(const google::protobuf::RepeatedField<int64_t>& dims, bool has_reshape,
                        const inference::ModelTensorReshape& reshape, const std::string& where) {
  if (dims.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": a TYPE_STRING tensor is a flat List[str] for the model; declare at most one dimension "
        "(besides the batch), found dims ",
        ShapeToString(Shape(dims.begin(), dims.end()))));
  }
  if (!has_reshape) return absl::OkStatus();
  const Shape to(reshape.shape().begin(), reshape.shape().end());
  const bool fixed = std::none_of(dims.begin(), dims.end(), [](int64_t d) { return d == -1; }) &&
                     std::none_of(to.begin(), to.end(), [](int64_t d) { return d == -1; });
  int64_t from_count = 1, to_count = 1;
  for (int64_t d : dims) from_count *= d;
  for (int64_t d : to) to_count *= d;
  if (to.size() > 1 || (fixed && from_count != to_count)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": reshape ", ShapeToString(to),
                     " must keep the element count of dims and have at most one "
                     "dimension"));
  }
  return absl::OkStatus();
}

StatusOr<TensorSpec> ConvertInput(const inference::ModelInput& input) {
  const std::string where = absl::StrCat("input '", input.name(), "'");
  if (input.name().empty()) return absl::InvalidArgumentError("an input has no name");
  if (input.is_shape_tensor()) {
    return absl::InvalidArgumentError(where + ": 'is_shape_tensor' is not supported");
  }
  if (input.allow_ragged_batch()) {
    return absl::InvalidArgumentError(where + ": 'allow_ragged_batch' is not supported");
  }
  if (input.optional()) return absl::InvalidArgumentError(where + ": 'optional' is not supported");
  if (input.is_non_linear_format_io()) {
    return absl::InvalidArgumentError(where + ": 'is_non_linear_format_io' is not supported");
  }
  TensorSpec spec;
  spec.name = input.name();
  SLUICE_ASSIGN_OR_RETURN(spec.dtype, ConvertDataType(input.data_type(), where));
  SLUICE_RETURN_IF_ERROR(CheckDims(input.dims(), where));
  if (spec.dtype == DataType::kBytes) {
    SLUICE_RETURN_IF_ERROR(
        CheckStringShape(input.dims(), input.has_reshape(), input.reshape(), where));
  }
  spec.dims.assign(input.dims().begin(), input.dims().end());
  if (input.has_reshape() && spec.dtype != DataType::kBytes) {
    SLUICE_ASSIGN_OR_RETURN(spec.reshape, ConvertReshape(input.dims(), input.reshape(), where));
  }
  return spec;
}

StatusOr<TensorSpec> ConvertOutput(const inference::ModelOutput& output) {
  const std::string where = absl::StrCat("output '", output.name(), "'");
  if (output.name().empty()) return absl::InvalidArgumentError("an output has no name");
  if (output.is_shape_tensor()) {
    return absl::InvalidArgumentError(where + ": 'is_shape_tensor' is not supported");
  }
  if (!output.label_filename().empty()) {
    // Read from the model's directory and shown to clients through their classes: never a path
    // that leaves it.
    const std::string& file = output.label_filename();
    const std::vector<absl::string_view> parts = absl::StrSplit(file, '/');
    if (file.front() == '/' || std::any_of(parts.begin(), parts.end(),
                                           [](absl::string_view part) { return part == ".."; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": label_filename '", file,
          "' must name a file inside the model's directory (a relative path without '..')"));
    }
  }
  if (output.is_non_linear_format_io()) {
    return absl::InvalidArgumentError(where + ": 'is_non_linear_format_io' is not supported");
  }
  TensorSpec spec;
  spec.name = output.name();
  SLUICE_ASSIGN_OR_RETURN(spec.dtype, ConvertDataType(output.data_type(), where));
  SLUICE_RETURN_IF_ERROR(CheckDims(output.dims(), where));
  if (spec.dtype == DataType::kBytes) {
    SLUICE_RETURN_IF_ERROR(
        CheckStringShape(output.dims(), output.has_reshape(), output.reshape(), where));
  }
  spec.dims.assign(output.dims().begin(), output.dims().end());
  if (output.has_reshape() && spec.dtype != DataType::kBytes) {
    SLUICE_ASSIGN_OR_RETURN(spec.reshape, ConvertReshape(output.dims(), output.reshape(), where));
  }
  spec.label_filename = output.label_filename();
  return spec;
}

// Top-level features outside what Sluice serves: each is rejected by its field name.
Status RejectUnsupported(const inference::ModelConfig& config) {
  std::vector<std::string> fields;
  if (config.batch_input_size() > 0) fields.push_back("batch_input");
  if (config.batch_output_size() > 0) fields.push_back("batch_output");
  if (config.has_model_operations()) fields.push_back("model_operations");
  if (config.model_transaction_policy().decoupled())
    fields.push_back("model_transaction_policy.decoupled");
  if (config.has_model_repository_agents()) fields.push_back("model_repository_agents");
  if (config.cc_model_filenames_size() > 0) fields.push_back("cc_model_filenames");
  if (config.optimization().has_execution_accelerators()) {
    fields.push_back("optimization.execution_accelerators");
  }
  if (config.has_model_metrics()) fields.push_back("model_metrics");
  if (fields.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported configuration field", fields.size() > 1 ? "s" : "", ": ",
                   absl::StrJoin(fields, ", "),
                   " (Sluice serves TorchScript models, .pt2 packages and ensembles; remove ",
                   fields.size() > 1 ? "these fields" : "this field", ")"));
}

Status ConvertInstanceGroups(inference::ModelConfig* config, ModelSpec* spec) {
  if (config->instance_group_size() == 0) {
    // Triton's default: one instance of KIND_AUTO (the GPU when usable).
    config->add_instance_group()->set_count(1);
  }
  for (inference::ModelInstanceGroup& group : *config->mutable_instance_group()) {
    const std::string where = absl::StrCat("instance_group '", group.name(), "'");
    InstanceGroupSpec out;
    switch (group.kind()) {
      case inference::ModelInstanceGroup::KIND_AUTO:
        out.kind = InstanceKind::kAuto;
        break;
      case inference::ModelInstanceGroup::KIND_GPU:
        out.kind = InstanceKind::kGpu;
        break;
      case inference::ModelInstanceGroup::KIND_CPU:
        out.kind = InstanceKind::kCpu;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": kind ", inference::ModelInstanceGroup::Kind_Name(group.kind()),
                         " is not supported (use KIND_GPU, KIND_CPU or KIND_AUTO)"));
    }
    if (group.count() == 0) group.set_count(1);
    if (group.count() < 0 || group.count() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": count must be between 1 and 64, found ", group.count()));
    }
    if (group.secondary_devices_size() > 0 || group.has_rate_limiter() || group.passive() ||
        group.profile_size() > 0 || !group.host_policy().empty()) {
      return absl::InvalidArgumentError(
          where +
          ": secondary_devices, rate_limiter, passive, profile and host_policy are not "
          "supported");
    }
    for (int gpu : group.gpus()) {
      if (gpu < 0)
        return absl::InvalidArgumentError(absl::StrCat(where, ": negative GPU id ", gpu));
    }
    out.count = group.count();
    out.gpus.assign(group.gpus().begin(), group.gpus().end());
    spec->instance_groups.push_back(std::move(out));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> IntParameter(const std::map<std::string, std::string>& parameters,
                               const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  auto it = parameters.find(key);
  if (it == parameters.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", key, " must be an integer in [",
                                                   min, ", ", max, "], found '", it->second, "'"));
  }
  return value;
}

QueuePolicySpec ConvertQueuePolicy(const inference::ModelQueuePolicy& policy) {
  QueuePolicySpec out;
  out.max_queue_size = policy.max_queue_size();
  out.default_timeout_us = static_cast<int64_t>(
      std::min<uint64_t>(policy.default_timeout_microseconds(), uint64_t{1} << 40));
  out.allow_timeout_override = policy.allow_timeout_override();
  out.delay = policy.timeout_action() == inference::ModelQueuePolicy::DELAY;
  return out;
}

Status ConvertDynamicBatching(const inference::ModelConfig& config, ModelSpec* spec) {
  if (!config.has_dynamic_batching()) return absl::OkStatus();
  const inference::ModelDynamicBatching& batching = config.dynamic_batching();
  if (spec->max_batch_size == 0) {
    return absl::InvalidArgumentError("dynamic_batching needs max_batch_size > 0");
  }
  DynamicBatchingSpec& out = spec->dynamic_batching;
  out.enabled = true;
  for (int size : batching.preferred_batch_size()) {
    if (size < 1 || size > spec->max_batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("preferred_batch_size ", size,
                       " is outside [1, max_batch_size=", spec->max_batch_size, "]"));
    }
    out.preferred_batch_sizes.push_back(size);
  }
  std::sort(out.preferred_batch_sizes.begin(), out.preferred_batch_sizes.end());
  out.preferred_batch_sizes.erase(
      std::unique(out.preferred_batch_sizes.begin(), out.preferred_batch_sizes.end()),
      out.preferred_batch_sizes.end());
  constexpr int64_t kMaxDelayUs = 60'000'000;
  if (batching.max_queue_delay_microseconds() > static_cast<uint64_t>(kMaxDelayUs)) {
    return absl::InvalidArgumentError(
        "max_queue_delay_microseconds must be at most 60000000 (60 s)");
  }
  out.max_queue_delay_us = static_cast<int64_t>(batching.max_queue_delay_microseconds());
  out.default_policy = ConvertQueuePolicy(batching.default_queue_policy());
  if (batching.priority_levels() > static_cast<uint64_t>(kMaxPriorityLevels)) {
    return absl::InvalidArgumentError(absl::StrCat("priority_levels must be at most ",
                                                   kMaxPriorityLevels, ", found ",
                                                   batching.priority_levels()));
  }
  out.priority_levels = static_cast<int>(batching.priority_levels());
  if (out.priority_levels > 0) {
    if (batching.default_priority_level() < 1 ||
        batching.default_priority_level() > static_cast<uint64_t>(out.priority_levels)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "default_priority_level must be in [1, priority_levels=", out.priority_levels,
          "], found ", batching.default_priority_level(), " (level 1 is the highest priority)"));
    }
    out.default_priority_level = static_cast<int>(batching.default_priority_level());
    out.level_policies.assign(static_cast<size_t>(out.priority_levels), out.default_policy);
  }
  // Without levels, default_priority_level and priority_queue_policy mean nothing: ignored, as
  // Triton ignores them.
  for (const auto& [level, policy] : batching.priority_queue_policy()) {
    if (out.priority_levels == 0) break;
    if (level < 1 || level > static_cast<uint64_t>(out.priority_levels)) {
      return absl::InvalidArgumentError(
          absl::StrCat("priority_queue_policy names level ", level,
                       ", outside [1, priority_levels=", out.priority_levels, "]"));
    }
    out.level_policies[level - 1] = ConvertQueuePolicy(policy);
  }
  out.preserve_ordering = batching.preserve_ordering();
  SLUICE_ASSIGN_OR_RETURN(out.pad_to_preferred,
                          ReadBool(spec->parameters, "sluice.pad_batch_to_preferred"));
  if (spec->parameters.count("sluice.stage_ahead") > 0) {
    SLUICE_ASSIGN_OR_RETURN(const bool stage_ahead,
                            ReadBool(spec->parameters, "sluice.stage_ahead"));
    out.stage_ahead = stage_ahead;
  }
  SLUICE_ASSIGN_OR_RETURN(const int64_t groups,
                          ReadInt(spec->parameters, "sluice.max_shape_groups"));
  out.max_shape_groups = static_cast<int>(groups);
  SLUICE_ASSIGN_OR_RETURN(out.auto_batch_sizes,
                          ReadBool(spec->parameters, "sluice.auto_batch_sizes"));
  return absl::OkStatus();
}

// START/END/READY: the values for off and on, from exactly one of the three *_false_true lists.
Status ConvertControlValues(const inference::ModelSequenceBatching::Control& control,
                            const std::string& where, SequenceControlSpec* out) {
  const int lists = (control.int32_false_true_size() > 0) + (control.fp32_false_true_size() > 0) +
                    (control.bool_false_true_size() > 0);
  if (lists != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": give exactly one of int32_false_true, fp32_false_true or bool_false_true "
                     "(two values: off, on)"));
  }
  if (control.data_type() != inference::TYPE_INVALID) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_type is for CONTROL_SEQUENCE_CORRID only"));
  }
  // The list given (int32, fp32 or bool values) and the type it makes the input.
  auto take = [&](DataType dtype, const auto& values) -> Status {
    if (values.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": the *_false_true list needs exactly two values "
                       "(off, on), found ",
                       values.size()));
    }
    out->dtype = dtype;
    out->false_value = static_cast<double>(values.Get(0));
    out->true_value = static_cast<double>(values.Get(1));
    return absl::OkStatus();
  };
  if (control.int32_false_true_size() > 0)
    return take(DataType::kInt32, control.int32_false_true());
  if (control.fp32_false_true_size() > 0) return take(DataType::kFp32, control.fp32_false_true());
  return take(DataType::kBool, control.bool_false_true());
}

// platform "ensemble": its steps, and what the configuration alone can tell about them. What
// needs the steps' models (their tensors, datatypes and shapes) is checked when the ensemble loads.
// response_cache is the ensemble's own (its answers are cached whole); what batches, warms up or
// runs belongs to the step models.
Status ConvertEnsemble(const inference::ModelConfig& config, ModelSpec* spec) {
  const std::string where = absl::StrCat("ensemble '", spec->name, "'");
  std::vector<std::string> refused;
  if (config.has_dynamic_batching()) refused.push_back("dynamic_batching");
  if (config.has_sequence_batching()) refused.push_back("sequence_batching");
  if (config.model_warmup_size() > 0) refused.push_back("model_warmup");
  if (config.optimization().cuda().graphs()) refused.push_back("optimization.cuda.graphs");
  if (!refused.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", absl::StrJoin(refused, ", "),
        " cannot be set on an ensemble (each step is batched, warmed up and run by its own model; "
        "set them there)"));
  }
  const inference::ModelEnsembling& scheduling = config.ensemble_scheduling();
  if (scheduling.step_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has no step in ensemble_scheduling"));
  }
  // Who writes each ensemble tensor: -1 for the ensemble's inputs (the request), else a step.
  std::map<std::string, int> writer;
  for (const TensorSpec& input : spec->inputs) writer[input.name] = -1;
  auto describe = [&](int step) {
    return step < 0 ? std::string("the ensemble's inputs")
                    : absl::StrCat("step ", step + 1, " (model '",
                                   scheduling.step(step).model_name(), "')");
  };
  EnsembleSpec& out = spec->ensemble;
  out.max_inflight_requests = scheduling.max_inflight_requests();
  for (int i = 0; i < scheduling.step_size(); ++i) {
    const inference::ModelEnsembling::Step& step = scheduling.step(i);
    if (step.model_name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": step ", i + 1, " has no model_name"));
    }
    if (step.model_name() == spec->name) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": step ", i + 1, " names the ensemble itself"));
    }
    if (step.input_map_size() == 0 || step.output_map_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", describe(i),
                       " needs an input_map and an output_map (which of its model's "
                       "tensors read and write which ensemble tensors)"));
    }
    if (step.model_version() < -1 || step.model_version() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", describe(i),
                                                     " has model_version ", step.model_version(),
                                                     "; give a version (1, 2, ...) or -1 for the "
                                                     "newest ready one"));
    }
    EnsembleStepSpec parsed;
    parsed.model = step.model_name();
    parsed.version = step.model_version();
    // The maps are protobuf maps: sorted here so that the order (and so every message) is stable.
    std::map<std::string, std::string> inputs(step.input_map().begin(), step.input_map().end());
    std::map<std::string, std::string> outputs(step.output_map().begin(), step.output_map().end());
    parsed.inputs.assign(inputs.begin(), inputs.end());
    parsed.outputs.assign(outputs.begin(), outputs.end());
    for (const auto& [model_output, tensor] : parsed.outputs) {
      auto [it, fresh] = writer.emplace(tensor, i);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ensemble tensor '", tensor, "' is written by ", describe(it->second),
            " and by ", describe(i), "; each ensemble tensor has one writer"));
      }
    }
    out.steps.push_back(std::move(parsed));
  }
  // Every tensor a step reads is written; the steps run in an order where each reads only what
  // was written before it (Kahn's order over the steps): else they form a cycle.
  std::vector<int> waiting_on(out.steps.size(), 0);
  std::vector<std::vector<int>> readers(out.steps.size());
  for (size_t i = 0; i < out.steps.size(); ++i) {
    std::set<int> producers;
    for (const auto& [model_input, tensor] : out.steps[i].inputs) {
      auto it = writer.find(tensor);
      if (it == writer.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", describe(static_cast<int>(i)), " reads '", tensor, "' (for its input '",
            model_input, "'), which is neither an ensemble input nor written by any step"));
      }
      if (it->second >= 0) producers.insert(it->second);
    }
    waiting_on[i] = static_cast<int>(producers.size());
    for (int producer : producers)
      readers[static_cast<size_t>(producer)].push_back(static_cast<int>(i));
  }
  std::vector<int> ready;
  for (size_t i = 0; i < out.steps.size(); ++i) {
    if (waiting_on[i] == 0) ready.push_back(static_cast<int>(i));
  }
  size_t ordered = 0;
  while (!ready.empty()) {
    const int step = ready.back();
    ready.pop_back();
    ++ordered;
    for (int reader : readers[static_cast<size_t>(step)]) {
      if (--waiting_on[static_cast<size_t>(reader)] == 0) ready.push_back(reader);
    }
  }
  if (ordered != out.steps.size()) {
    std::vector<std::string> cycle;
    for (size_t i = 0; i < out.steps.size(); ++i) {
      if (waiting_on[i] > 0) cycle.push_back(describe(static_cast<int>(i)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": its steps form a cycle (each waits for another's output): ",
                     absl::StrJoin(cycle, ", ")));
  }
  for (const TensorSpec& output : spec->outputs) {
    auto it = writer.find(output.name);
    if (it == writer.end() || it->second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": its output '", output.name, "' is not written by any step"));
    }
  }
  return absl::OkStatus();
}

// sequence_batching's oldest strategy.
Status ConvertOldestStrategy(const inference::ModelSequenceBatching::StrategyOldest& oldest,
                             const ModelSpec& spec, SequenceBatchingSpec* out) {
  if (oldest.max_candidate_sequences() < 1 || oldest.max_candidate_sequences() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence_batching oldest.max_candidate_sequences must be in [1, 4096] (the sequences an "
        "instance keeps at once, each in one slot), found ",
        oldest.max_candidate_sequences()));
  }
  if (oldest.max_queue_delay_microseconds() > 60'000'000) {
    return absl::InvalidArgumentError(
        "oldest.max_queue_delay_microseconds must be at most 60000000 (60 s)");
  }
  const int most = std::max(1, spec.max_batch_size);
  for (int size : oldest.preferred_batch_size()) {
    if (size < 1 || size > most) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence_batching oldest.preferred_batch_size ", size, " must be in [1, ",
                       most, "] (max_batch_size", spec.batches() ? "" : " 0: one row", ")"));
    }
  }
  out->strategy = SequenceStrategy::kOldest;
  out->max_candidate_sequences = oldest.max_candidate_sequences();
  out->max_queue_delay_us = static_cast<int64_t>(oldest.max_queue_delay_microseconds());
  out->preferred_batch_sizes.assign(oldest.preferred_batch_size().begin(),
                                    oldest.preferred_batch_size().end());
  std::sort(out->preferred_batch_sizes.begin(), out->preferred_batch_sizes.end());
  return absl::OkStatus();
}

// sequence_batching's implicit state: each state's input joins spec->inputs (filled by the server
// from the state it keeps), its output joins spec->outputs unless the config lists it already
// (then clients may ask for it too). A TorchScript model binds outputs by index, so its states
// and outputs follow Triton's `<name>__<index>` rule, in Triton's words.
Status ConvertSequenceStates(const inference::ModelSequenceBatching& batching, ModelSpec* spec) {
  SequenceBatchingSpec& out = spec->sequence_batching;
  if (batching.state_size() == 0) return absl::OkStatus();
  const bool by_index = spec->format == ModelFormat::kTorchScript;
  auto naming = [&](const std::string& what, const std::string& name) -> Status {
    if (!by_index || IndexSuffix(name)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", spec->name, "' is using sequence batching with state but ", what, " '", name,
        "' does not follow the <name>__<index> naming convention (a TorchScript model's "
        "outputs bind by index: name them OUTPUT__0, OUTPUT__1, ... in the order forward() "
        "returns them, and each state after the argument or value it is)"));
  };
  for (const TensorSpec& output : spec->outputs)
    SLUICE_RETURN_IF_ERROR(naming("output", output.name));
  std::set<std::string> inputs, outputs;
  for (const TensorSpec& input : spec->inputs) inputs.insert(input.name);
  for (const inference::ModelSequenceBatching::State& state : batching.state()) {
    const std::string where = absl::StrCat("sequence_batching state '", state.input_name(), "'");
    if (state.input_name().empty() || state.output_name().empty()) {
      return absl::InvalidArgumentError(
          "a sequence_batching state needs input_name and output_name");
    }
    SLUICE_RETURN_IF_ERROR(naming("state", state.input_name()));
    SLUICE_RETURN_IF_ERROR(naming("state", state.output_name()));
    if (!inputs.insert(state.input_name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": input_name is already an input of the model (the server fills a state's "
                       "input; clients do not send it)"));
    }
    if (!outputs.insert(state.output_name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": output_name '", state.output_name(), "' is another state's"));
    }
    SequenceStateSpec parsed;
    parsed.input = state.input_name();
    parsed.output = state.output_name();
    SLUICE_ASSIGN_OR_RETURN(parsed.dtype, ConvertDataType(state.data_type(), where));
    if (parsed.dtype == DataType::kBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": a state is a tensor the server keeps on the device; TYPE_STRING "
                       "has none (use a numeric type)"));
    }
    if (state.dims_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": dims are missing"));
    }
    for (int64_t dim : state.dims()) {
      if (dim < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": dims must be positive, found ", dim,
            " (a state of variable size, use_growable_memory, is not supported: the server keeps "
            "each state in a fixed row per sequence slot)"));
      }
    }
    parsed.dims.assign(state.dims().begin(), state.dims().end());
    if (state.initial_state_size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": give at most one initial_state, found ", state.initial_state_size()));
    }
    if (state.initial_state_size() == 1) {
      const inference::ModelSequenceBatching::InitialState& initial = state.initial_state(0);
      const std::string at = absl::StrCat(where, " initial_state '", initial.name(), "'");
      SLUICE_ASSIGN_OR_RETURN(const DataType type, ConvertDataType(initial.data_type(), at));
      const Shape dims(initial.dims().begin(), initial.dims().end());
      if (type != parsed.dtype || dims != parsed.dims) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": its data_type and dims (", DataTypeName(type), " [",
                         absl::StrJoin(dims, ","), "]) must be the state's (",
                         DataTypeName(parsed.dtype), " [", absl::StrJoin(parsed.dims, ","), "])"));
      }
      if (initial.state_data_case() ==
          inference::ModelSequenceBatching::InitialState::STATE_DATA_NOT_SET) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": give zero_data: true or data_file"));
      }
      if (initial.has_data_file()) {
        const std::string& file = initial.data_file();
        bool climbs = file.empty() || file.front() == '/';
        for (absl::string_view part : absl::StrSplit(file, '/')) climbs = climbs || part == "..";
        if (climbs) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ": data_file '", QuoteClientText(file),
                           "' must name a file inside the model's initial_state/ directory"));
        }
        parsed.initial_file = file;
      }
    }
    TensorSpec input;
    input.name = parsed.input;
    input.dtype = parsed.dtype;
    input.dims = parsed.dims;
    input.filled_by_server = true;
    input.sequence_state = true;
    input.filled_with = "the sequence batcher (the sequence's implicit state)";
    spec->inputs.push_back(std::move(input));
    TensorSpec* listed = FindTensor(spec->outputs, parsed.output);
    if (listed != nullptr) {
      if (listed->dtype != parsed.dtype || listed->dims != parsed.dims || listed->reshape) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": output '", parsed.output, "' is listed in `output` as ",
            DataTypeName(listed->dtype), " [", absl::StrJoin(listed->dims, ","),
            "]; a state output listed there must have the state's data_type and dims (",
            DataTypeName(parsed.dtype), " [", absl::StrJoin(parsed.dims, ","), "]), no reshape"));
      }
    } else {
      TensorSpec output;
      output.name = parsed.output;
      output.dtype = parsed.dtype;
      output.dims = parsed.dims;
      output.state_only = true;
      spec->outputs.push_back(std::move(output));
    }
    out.states.push_back(std::move(parsed));
  }
  return absl::OkStatus();
}

// Triton's sequence_batching block. Control inputs join spec->inputs as inputs the server fills
// (dims [1], after the declared ones), then each state's input (ConvertSequenceStates).
Status ConvertSequenceBatching(const inference::ModelConfig& config, ModelSpec* spec) {
  if (!config.has_sequence_batching()) return absl::OkStatus();
  const inference::ModelSequenceBatching& batching = config.sequence_batching();
  if (batching.iterative_sequence()) {
    return absl::InvalidArgumentError(
        "sequence_batching 'iterative_sequence' is not supported (it needs decoupled models, which "
        "Sluice does not "
        "serve)");
  }
  if (spec->padding.enabled()) {
    return absl::InvalidArgumentError(
        "sluice.buckets (padding buckets) cannot be combined with sequence_batching: a slot's rows "
        "must keep "
        "the shapes the client sent");
  }
  SequenceBatchingSpec& out = spec->sequence_batching;
  out.enabled = true;
  constexpr uint64_t kMaxIdleUs = uint64_t{24} * 3600 * 1000000;
  if (batching.max_sequence_idle_microseconds() > kMaxIdleUs) {
    return absl::InvalidArgumentError(
        "max_sequence_idle_microseconds must be at most 86400000000 (one day)");
  }
  if (batching.max_sequence_idle_microseconds() > 0) {
    out.max_sequence_idle_us = static_cast<int64_t>(batching.max_sequence_idle_microseconds());
  }
  if (batching.has_oldest()) {
    SLUICE_RETURN_IF_ERROR(ConvertOldestStrategy(batching.oldest(), *spec, &out));
  } else {
    const inference::ModelSequenceBatching::StrategyDirect& direct = batching.direct();
    if (direct.max_queue_delay_microseconds() > 60'000'000) {
      return absl::InvalidArgumentError(
          "direct.max_queue_delay_microseconds must be at most 60000000 (60 s)");
    }
    out.max_queue_delay_us = static_cast<int64_t>(direct.max_queue_delay_microseconds());
    if (!(direct.minimum_slot_utilization() >= 0 && direct.minimum_slot_utilization() <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("direct.minimum_slot_utilization must be in [0, 1], found ",
                       direct.minimum_slot_utilization()));
    }
    out.minimum_slot_utilization = direct.minimum_slot_utilization();
  }

  std::set<std::string> names;
  for (const TensorSpec& input : spec->inputs) names.insert(input.name);
  bool kinds[4] = {false, false, false, false};
  for (const inference::ModelSequenceBatching::ControlInput& input : batching.control_input()) {
    const std::string where = absl::StrCat("sequence_batching control_input '", input.name(), "'");
    if (input.name().empty())
      return absl::InvalidArgumentError("a sequence_batching control_input needs a name");
    if (!names.insert(input.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is already an input of the model"));
    }
    if (input.control_size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give exactly one control, found ", input.control_size()));
    }
    const inference::ModelSequenceBatching::Control& control = input.control(0);
    SequenceControlSpec parsed;
    parsed.input = input.name();
    switch (control.kind()) {
      case inference::ModelSequenceBatching::Control::CONTROL_SEQUENCE_START:
        parsed.kind = SequenceControlKind::kStart;
        break;
      case inference::ModelSequenceBatching::Control::CONTROL_SEQUENCE_END:
        parsed.kind = SequenceControlKind::kEnd;
        break;
      case inference::ModelSequenceBatching::Control::CONTROL_SEQUENCE_READY:
        parsed.kind = SequenceControlKind::kReady;
        break;
      case inference::ModelSequenceBatching::Control::CONTROL_SEQUENCE_CORRID:
        parsed.kind = SequenceControlKind::kCorrId;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown control kind ", control.kind()));
    }
    bool& seen = kinds[static_cast<int>(parsed.kind)];
    if (seen) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", SequenceControlKindName(parsed.kind), " is given by two control inputs"));
    }
    seen = true;
    if (parsed.kind == SequenceControlKind::kCorrId) {
      if (control.int32_false_true_size() + control.fp32_false_true_size() +
              control.bool_false_true_size() >
          0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": CONTROL_SEQUENCE_CORRID takes a data_type, not *_false_true values"));
      }
      switch (control.data_type()) {
        case inference::TYPE_INT64:
          parsed.dtype = DataType::kInt64;
          break;
        case inference::TYPE_INT32:
          parsed.dtype = DataType::kInt32;
          break;
        case inference::TYPE_STRING:
          parsed.dtype = DataType::kBytes;
          break;
        case inference::TYPE_UINT64:
        case inference::TYPE_UINT32:
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": CONTROL_SEQUENCE_CORRID data_type ",
                           inference::DataType_Name(control.data_type()),
                           " has no LibTorch tensor type; use TYPE_INT64 (ids up to 2^63-1), "
                           "TYPE_INT32 or TYPE_STRING"));
        default:
          return absl::InvalidArgumentError(absl::StrCat(
              where,
              ": CONTROL_SEQUENCE_CORRID data_type must be TYPE_INT64, TYPE_INT32 or TYPE_STRING"));
      }
      if (parsed.dtype == DataType::kBytes && spec->format == ModelFormat::kAotInductor) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         ": a TYPE_STRING correlation id cannot reach an AOTInductor package (it "
                         "takes tensors only); use "
                         "an integer type"));
      }
      out.correlation_id_type = parsed.dtype;
    } else {
      SLUICE_RETURN_IF_ERROR(ConvertControlValues(control, where, &parsed));
    }
    TensorSpec tensor;
    tensor.name = parsed.input;
    tensor.dtype = parsed.dtype;
    tensor.dims = {1};
    tensor.filled_by_server = true;
    tensor.filled_with =
        absl::StrCat("the sequence batcher (", SequenceControlKindName(parsed.kind), ")");
    spec->inputs.push_back(std::move(tensor));
    out.controls.push_back(std::move(parsed));
  }
  return ConvertSequenceStates(batching, spec);
}

// sluice.operator_libraries ("ops/libfoo.so, libbar.so") and Triton's MODEL_INIT_LIBRARY (one
// path). Where they resolve is the runtime's business (server/runtime/operator_libraries.h);
// here a path is refused when it is empty or climbs out with "..".
Status ConvertOperatorLibraries(ModelSpec* spec) {
  auto check = [](const std::string& key, absl::string_view path) -> Status {
    if (path.empty())
      return absl::InvalidArgumentError(absl::StrCat("parameter ", key, " names an empty path"));
    for (absl::string_view part : absl::StrSplit(path, '/')) {
      if (part == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", key, ": '", QuoteClientText(path),
                         "' climbs out with '..'; name a path inside the model's "
                         "directory or an --operator-library-dir"));
      }
    }
    return absl::OkStatus();
  };
  if (const std::string* value = ReadText(spec->parameters, "sluice.operator_libraries")) {
    for (absl::string_view item : absl::StrSplit(*value, ',')) {
      item = absl::StripAsciiWhitespace(item);
      SLUICE_RETURN_IF_ERROR(check("sluice.operator_libraries", item));
      spec->operator_libraries.emplace_back(item);
    }
  }
  if (auto it = spec->parameters.find("MODEL_INIT_LIBRARY"); it != spec->parameters.end()) {
    const absl::string_view path = absl::StripAsciiWhitespace(it->second);
    SLUICE_RETURN_IF_ERROR(check(it->first, path));
    spec->init_library = std::string(path);
  }
  return absl::OkStatus();
}

// Whether `value` converts to `type` without overflow or a fraction lost (floats take any finite
// value; NaN and infinities only floats).
bool Representable(DataType type, double value) {
  auto integral_in = [&](double low, double high) {
    return std::isfinite(value) && value == std::trunc(value) && value >= low && value <= high;
  };
  switch (type) {
    case DataType::kBool:
      return value == 0 || value == 1;
    case DataType::kUint8:
      return integral_in(0, 255);
    case DataType::kInt8:
      return integral_in(-128, 127);
    case DataType::kInt16:
      return integral_in(-32768, 32767);
    case DataType::kInt32:
      return integral_in(-2147483648.0, 2147483647.0);
    case DataType::kInt64:
      return integral_in(-9223372036854775808.0, 9223372036854774784.0);
    case DataType::kFp16:
      return !std::isfinite(value) || std::fabs(value) <= 65504;
    case DataType::kBf16:
    case DataType::kFp32:
      return !std::isfinite(value) || std::fabs(value) <= 3.4028234663852886e38;
    case DataType::kFp64:
      return true;
    case DataType::kBytes:
      return false;  // strings are not padded (refused in ConvertPadding)
  }
  return false;
}

// sluice.buckets "seq=16,32,64; h=224,448", sluice.bucket_dims "tokens:0=seq, logits:0=seq",
// sluice.pad_value, sluice.lengths_input.
Status ConvertPadding(ModelSpec* spec) {
  const auto& parameters = spec->parameters;
  const std::string* buckets = ReadText(parameters, "sluice.buckets");
  const std::string* dims = ReadText(parameters, "sluice.bucket_dims");
  const std::string* pad_value = ReadText(parameters, "sluice.pad_value");
  const std::string* lengths_input = ReadText(parameters, "sluice.lengths_input");
  const bool has_buckets = buckets != nullptr;
  const bool has_dims = dims != nullptr;
  if (!has_buckets && !has_dims) {
    for (const char* key : {"sluice.pad_value", "sluice.lengths_input"}) {
      if (ReadText(parameters, key) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", key, " needs sluice.buckets"));
      }
    }
    return absl::OkStatus();
  }
  if (!has_buckets || !has_dims) {
    return absl::InvalidArgumentError(
        "padding needs both sluice.buckets (axis=sizes) and sluice.bucket_dims (tensor:dim=axis)");
  }
  PaddingSpec& padding = spec->padding;
  for (absl::string_view item : absl::StrSplit(*buckets, ';', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits('=', 1));
    BucketAxis axis;
    axis.name = std::string(absl::StripAsciiWhitespace(parts[0]));
    if (parts.size() != 2 || axis.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sluice.buckets: '", item, "' is not axis=size,size,... (e.g. \"seq=16,32,64\")"));
    }
    for (absl::string_view size_text : absl::StrSplit(parts[1], ',', absl::SkipWhitespace())) {
      int64_t size = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(size_text), &size) || size < 1) {
        return absl::InvalidArgumentError(absl::StrCat("sluice.buckets: axis '", axis.name, "': '",
                                                       size_text, "' is not a positive size"));
      }
      axis.sizes.push_back(size);
    }
    if (axis.sizes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sluice.buckets: axis '", axis.name, "' has no sizes"));
    }
    std::sort(axis.sizes.begin(), axis.sizes.end());
    axis.sizes.erase(std::unique(axis.sizes.begin(), axis.sizes.end()), axis.sizes.end());
    for (const BucketAxis& other : padding.axes) {
      if (other.name == axis.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("sluice.buckets: axis '", axis.name, "' is given twice"));
      }
    }
    padding.axes.push_back(std::move(axis));
  }
  if (padding.axes.empty()) return absl::InvalidArgumentError("sluice.buckets declares no axis");
  std::vector<bool> axis_has_input(padding.axes.size(), false);
  for (absl::string_view item : absl::StrSplit(*dims, ',', absl::SkipWhitespace())) {
    const std::string where =
        absl::StrCat("sluice.bucket_dims: '", absl::StripAsciiWhitespace(item), "'");
    std::vector<absl::string_view> sides = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const size_t colon = sides[0].rfind(':');
    int dim = 0;
    if (sides.size() != 2 || colon == absl::string_view::npos ||
        !absl::SimpleAtoi(sides[0].substr(colon + 1), &dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not tensor:dim=axis (e.g. \"tokens:0=seq\")"));
    }
    BucketDim bucketed;
    bucketed.tensor = std::string(absl::StripAsciiWhitespace(sides[0].substr(0, colon)));
    bucketed.dim = dim;
    const std::string axis_name(absl::StripAsciiWhitespace(sides[1]));
    auto axis = std::find_if(padding.axes.begin(), padding.axes.end(),
                             [&](const BucketAxis& a) { return a.name == axis_name; });
    if (axis == padding.axes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no axis '", axis_name, "' in sluice.buckets"));
    }
    bucketed.axis = static_cast<int>(axis - padding.axes.begin());
    TensorSpec* tensor = FindTensor(spec->inputs, bucketed.tensor);
    bucketed.is_input = tensor != nullptr;
    if (tensor == nullptr) tensor = FindTensor(spec->outputs, bucketed.tensor);
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no input or output '", bucketed.tensor, "'"));
    }
    if (tensor->dtype == DataType::kBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", bucketed.tensor,
                       "' is TYPE_STRING; padding buckets pad fixed-size elements with "
                       "sluice.pad_value, and a List[str] has no such element (send the strings "
                       "unpadded, or pad token ids)"));
    }
    if (dim < 0 || static_cast<size_t>(dim) >= tensor->dims.size() || tensor->dims[dim] != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dimension ", dim, " of '", bucketed.tensor,
                       "' must exist and be -1 in its dims ", ShapeToString(tensor->dims),
                       " (dimensions count from 0, the batch dimension not counted)"));
    }
    for (const BucketDim& other : padding.dims) {
      if (other.tensor == bucketed.tensor && other.dim == bucketed.dim) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": this dimension is given twice"));
      }
    }
    if (bucketed.is_input) axis_has_input[bucketed.axis] = true;
    padding.dims.push_back(std::move(bucketed));
  }
  for (size_t axis = 0; axis < padding.axes.size(); ++axis) {
    if (!axis_has_input[axis]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sluice.bucket_dims: no input dimension follows axis '", padding.axes[axis].name, "'"));
    }
  }
  if (pad_value != nullptr) {
    if (!absl::SimpleAtod(*pad_value, &padding.pad_value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sluice.pad_value must be a number, found '", *pad_value, "'"));
    }
    for (const BucketDim& bucketed : padding.dims) {
      const TensorSpec* input =
          bucketed.is_input ? FindTensor(spec->inputs, bucketed.tensor) : nullptr;
      if (input != nullptr && !Representable(input->dtype, padding.pad_value)) {
        return absl::InvalidArgumentError(absl::StrCat("sluice.pad_value ", *pad_value,
                                                       " cannot be stored in input '", input->name,
                                                       "' of type ", DataTypeName(input->dtype)));
      }
    }
  }
  if (lengths_input != nullptr) {
    TensorSpec* lengths = FindTensor(spec->inputs, *lengths_input);
    const Shape expected = {static_cast<int64_t>(padding.axes.size())};
    if (lengths == nullptr ||
        (lengths->dtype != DataType::kInt32 && lengths->dtype != DataType::kInt64) ||
        lengths->dims != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sluice.lengths_input must name an input of TYPE_INT32 or TYPE_INT64 with dims ",
          ShapeToString(expected), " (one length per axis of sluice.buckets); found '",
          *lengths_input, "'"));
    }
    for (const BucketDim& bucketed : padding.dims) {
      if (bucketed.tensor == lengths->name) {
        return absl::InvalidArgumentError("sluice.lengths_input cannot itself be padded");
      }
    }
    lengths->filled_by_server = true;
    lengths->filled_with = "the true lengths of padded inputs (sluice.lengths_input)";
    padding.lengths_input = lengths->name;
  }
  return absl::OkStatus();
}

Status ConvertWarmup(const inference::ModelConfig& config, ModelSpec* spec) {
  // Shape warm-up feeds zeros, which any tensor model takes; for strings that is empty strings,
  // which a model that parses its strings (int(s), a vocabulary lookup) may refuse, failing the
  // load of a model that would serve real requests. So a model with a string input warms its
  // shapes only when its config asks (sluice.warmup: "true"); model_warmup samples still run.
  const bool takes_strings =
      std::any_of(spec->inputs.begin(), spec->inputs.end(), [](const TensorSpec& input) {
        return input.dtype == DataType::kBytes && !input.filled_by_server;
      });
  SLUICE_ASSIGN_OR_RETURN(spec->warmup,
                          ReadBool(spec->parameters, "sluice.warmup", !takes_strings));
  SLUICE_ASSIGN_OR_RETURN(const int64_t runs, ReadInt(spec->parameters, "sluice.warmup_runs"));
  spec->warmup_runs = static_cast<int>(runs);
  if (const std::string* value = ReadText(spec->parameters, "sluice.cudnn_benchmark")) {
    StatusOr<CudnnBenchmarkMode> mode = ParseCudnnBenchmarkMode(*value);
    if (!mode.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter sluice.cudnn_benchmark ", mode.status().message()));
    }
    if (*mode != CudnnBenchmarkMode::kAuto) spec->cudnn_benchmark_override = *mode;
  }
  if (const std::string* value = ReadText(spec->parameters, "sluice.cuda_wait")) {
    if (*value != "spin" && *value != "blocking") {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter sluice.cuda_wait is \"", *value,
                       "\": use \"spin\" (the default) or \"blocking\""));
    }
    spec->cuda_blocking_wait = *value == "blocking";
  }
  for (const inference::ModelWarmup& warmup : config.model_warmup()) {
    WarmupSampleSpec sample;
    sample.name =
        warmup.name().empty() ? absl::StrCat("#", spec->warmup_samples.size()) : warmup.name();
    const std::string where = absl::StrCat("model_warmup '", sample.name, "'");
    if (spec->batches()) {
      if (warmup.batch_size() < 1 ||
          warmup.batch_size() > static_cast<uint32_t>(spec->max_batch_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": batch_size must be in [1, max_batch_size=", spec->max_batch_size,
                         "], found ", warmup.batch_size()));
      }
    } else if (warmup.batch_size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(where,
                                                     ": batch_size must be 0 or 1 for a model "
                                                     "without max_batch_size"));
    }
    sample.batch_size = std::max<int>(1, static_cast<int>(warmup.batch_size()));
    if (warmup.count() > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": count must be at most 1000"));
    }
    sample.count = std::max<int>(1, static_cast<int>(warmup.count()));
    std::map<std::string, inference::ModelWarmup::Input> inputs(warmup.inputs().begin(),
                                                                warmup.inputs().end());
    for (const auto& [name, input] : inputs) {
      WarmupInputSpec out;
      out.name = name;
      SLUICE_ASSIGN_OR_RETURN(
          out.dtype,
          ConvertDataType(input.data_type(), absl::StrCat(where, " input '", name, "'")));
      for (int64_t dim : input.dims()) {
        if (dim < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, " input '", name, "': dims must be concrete, found ", dim));
        }
        out.dims.push_back(dim);
      }
      switch (input.input_data_type_case()) {
        case inference::ModelWarmup::Input::kRandomData:
          out.source = WarmupInputSpec::Source::kRandom;
          break;
        case inference::ModelWarmup::Input::kInputDataFile:
          out.source = WarmupInputSpec::Source::kFile;
          out.file = input.input_data_file();
          if (out.file.empty() || out.file.find('/') != std::string::npos || out.file == "..") {
            return absl::InvalidArgumentError(absl::StrCat(
                where, " input '", name,
                "': input_data_file must be a plain file name in the model's warmup/ folder"));
          }
          break;
        default:
          out.source = WarmupInputSpec::Source::kZero;
          break;
      }
      sample.inputs.push_back(std::move(out));
    }
    spec->warmup_samples.push_back(std::move(sample));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<inference::ModelConfig> ParseModelConfigText(const std::string& text,
                                                      const std::string& source) {
  inference::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a valid model config: ", errors.error()));
  }
  return config;
}

StatusOr<ModelSpec> BuildModelSpec(const std::string& model_name, inference::ModelConfig* config) {
  if (config->name().empty()) config->set_name(model_name);
  if (config->name() != model_name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config name '", config->name(), "' differs from its directory name '", model_name, "'"));
  }
  const bool aoti = config->platform() == kTorchAotiPlatform;
  const bool ensemble = config->platform() == kEnsemblePlatform;
  const bool torch_platform =
      config->platform().empty() || config->platform() == "pytorch_libtorch" || aoti;
  const bool torch_backend = config->backend().empty() || config->backend() == "pytorch";
  if (!(torch_platform || ensemble) || !torch_backend || (ensemble && !config->backend().empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "platform '", config->platform(), "' / backend '", config->backend(),
        "' is not supported: Sluice serves TorchScript models (platform: \"pytorch_libtorch\" "
        "or backend: \"pytorch\"), AOTInductor packages (platform: \"torch_aoti\") and "
        "ensembles of them (platform: \"ensemble\", no backend)"));
  }
  if (ensemble != config->has_ensemble_scheduling()) {
    return absl::InvalidArgumentError(
        ensemble ? "platform \"ensemble\" needs an ensemble_scheduling block with its steps"
                 : "ensemble_scheduling belongs to a model with platform: \"ensemble\"");
  }
  if (config->platform().empty()) config->set_platform("pytorch_libtorch");
  if (config->backend().empty() && !ensemble) config->set_backend("pytorch");
  SLUICE_RETURN_IF_ERROR(RejectUnsupported(*config));

  ModelSpec spec;
  spec.name = config->name();
  spec.platform = config->platform();
  spec.format = aoti ? ModelFormat::kAotInductor : ModelFormat::kTorchScript;
  if (config->max_batch_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_size must be >= 0, found ", config->max_batch_size()));
  }
  spec.max_batch_size = config->max_batch_size();
  if (config->input_size() == 0 || config->output_size() == 0) {
    return absl::InvalidArgumentError(
        "a PyTorch model needs its inputs and outputs declared in config.pbtxt (input [...] "
        "and output [...])");
  }
  std::set<std::string> names;
  for (const inference::ModelInput& input : config->input()) {
    SLUICE_ASSIGN_OR_RETURN(TensorSpec tensor, ConvertInput(input));
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", tensor.name, "' is declared twice"));
    }
    spec.inputs.push_back(std::move(tensor));
  }
  names.clear();
  for (const inference::ModelOutput& output : config->output()) {
    SLUICE_ASSIGN_OR_RETURN(TensorSpec tensor, ConvertOutput(output));
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", tensor.name, "' is declared twice"));
    }
    spec.outputs.push_back(std::move(tensor));
  }
  if (aoti) {
    for (const auto* tensors : {&spec.inputs, &spec.outputs}) {
      for (const TensorSpec& tensor : *tensors) {
        if (tensor.dtype != DataType::kBytes) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "'", tensor.name,
            "' is TYPE_STRING, but an AOTInductor package (platform \"torch_aoti\") takes and "
            "returns tensors only; serve string models as TorchScript (List[str])"));
      }
    }
  }
  SLUICE_RETURN_IF_ERROR(ConvertInstanceGroups(config, &spec));
  if (config->default_model_filename().empty())
    config->set_default_model_filename(aoti ? "model.pt2" : "model.pt");
  spec.model_filename = config->default_model_filename();
  if (spec.model_filename.find('/') != std::string::npos || spec.model_filename == "..") {
    return absl::InvalidArgumentError("default_model_filename must be a plain file name");
  }
  for (const auto& [key, value] : config->parameters()) spec.parameters[key] = value.string_value();
  SLUICE_RETURN_IF_ERROR(CheckModelParameterNames(spec.parameters));
  SLUICE_RETURN_IF_ERROR(ConvertDynamicBatching(*config, &spec));
  // The byte cap holds for every scheduler (dynamic, sequence, and none: see Admission).
  SLUICE_ASSIGN_OR_RETURN(const int64_t queued_bytes,
                          ReadInt(spec.parameters, "sluice.max_queued_bytes"));
  spec.dynamic_batching.max_queued_bytes = static_cast<size_t>(queued_bytes);
  SLUICE_ASSIGN_OR_RETURN(spec.pinned, ReadBool(spec.parameters, "sluice.pinned"));
  SLUICE_RETURN_IF_ERROR(ConvertOperatorLibraries(&spec));
  spec.cuda_graphs = config->optimization().cuda().graphs();
  SLUICE_ASSIGN_OR_RETURN(const int64_t graphs_max,
                          ReadInt(spec.parameters, "sluice.cuda_graphs_max"));
  spec.cuda_graphs_max = static_cast<int>(graphs_max);
  SLUICE_ASSIGN_OR_RETURN(spec.dynamic_batching.run_on_receiving_thread,
                          ReadBool(spec.parameters, "sluice.run_on_receiving_thread"));
  SLUICE_ASSIGN_OR_RETURN(spec.dynamic_batching.run_on_receiving_thread_max_us,
                          ReadInt(spec.parameters, "sluice.run_on_receiving_thread_max_us"));
  SLUICE_ASSIGN_OR_RETURN(spec.dynamic_batching.latency_target_us,
                          ReadInt(spec.parameters, "sluice.latency_target_us"));
  if (spec.dynamic_batching.latency_target_us > 0 && config->has_sequence_batching()) {
    return absl::InvalidArgumentError(
        "sluice.latency_target_us cannot be combined with sequence_batching: a stateful model's "
        "requests must run "
        "in their sequence's order and slot, so the batcher cannot size batches or refuse requests "
        "for a target; "
        "remove the parameter");
  }
  const DynamicBatchingSpec& batching = spec.dynamic_batching;
  if (batching.latency_target_us > 0 && (batching.priority_levels > 0 || batching.AnyDelay())) {
    return absl::InvalidArgumentError(
        "sluice.latency_target_us cannot be combined with priority_levels or timeout_action: DELAY "
        "yet: the "
        "batcher plans each batch for its oldest request, and priorities put other requests first; "
        "remove one");
  }
  spec.response_cache = config->response_cache().enable();
  if (spec.response_cache && config->has_sequence_batching()) {
    return absl::InvalidArgumentError(
        "response_cache cannot be enabled with sequence_batching: a stateful model's answer "
        "depends on the "
        "requests of its sequence before it, so a cached answer would be wrong; remove "
        "response_cache");
  }
  SLUICE_RETURN_IF_ERROR(ConvertPadding(&spec));
  SLUICE_RETURN_IF_ERROR(ConvertSequenceBatching(*config, &spec));
  if (ensemble) SLUICE_RETURN_IF_ERROR(ConvertEnsemble(*config, &spec));
  SLUICE_RETURN_IF_ERROR(ConvertWarmup(*config, &spec));
  SLUICE_ASSIGN_OR_RETURN(const int64_t threads,
                          IntParameter(spec.parameters, "INTRA_OP_THREAD_COUNT", 0, 0, 1024));
  spec.intra_op_threads = static_cast<int>(threads);
  if (config->version_policy().policy_choice_case() ==
      inference::ModelVersionPolicy::POLICY_CHOICE_NOT_SET) {
    config->mutable_version_policy()->mutable_latest()->set_num_versions(1);
  }
  return spec;
}

std::vector<int64_t> SelectVersions(const inference::ModelVersionPolicy& policy,
                                    std::vector<int64_t> available) {
  std::sort(available.begin(), available.end());
  switch (policy.policy_choice_case()) {
    case inference::ModelVersionPolicy::kAll:
      return available;
    case inference::ModelVersionPolicy::kSpecific: {
      std::vector<int64_t> chosen;
      for (int64_t version : available) {
        const auto& wanted = policy.specific().versions();
        if (std::find(wanted.begin(), wanted.end(), version) != wanted.end())
          chosen.push_back(version);
      }
      return chosen;
    }
    case inference::ModelVersionPolicy::kLatest:
    case inference::ModelVersionPolicy::POLICY_CHOICE_NOT_SET: {
      const size_t keep =
          policy.has_latest() ? std::max<uint32_t>(1, policy.latest().num_versions()) : 1;
      if (available.size() > keep) available.erase(available.begin(), available.end() - keep);
      return available;
    }
  }
  return available;
}

StatusOr<inference::ModelConfig> ParseModelConfigJson(const std::string& json) {
  inference::ModelConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt field is an error, not a silent default
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &config, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid config override: ", std::string(parsed.message())));
  }
  return config;
}

}  // namespace sluice
