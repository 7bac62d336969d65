#include "server/repository/model_config_parser.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace sluice {
namespace {

class FirstErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

StatusOr<DataType> ConvertDataType(inference::DataType type, const std::string& where) {
  switch (type) {
    case inference::TYPE_BOOL: return DataType::kBool;
    case inference::TYPE_UINT8: return DataType::kUint8;
    case inference::TYPE_INT8: return DataType::kInt8;
    case inference::TYPE_INT16: return DataType::kInt16;
    case inference::TYPE_INT32: return DataType::kInt32;
    case inference::TYPE_INT64: return DataType::kInt64;
    case inference::TYPE_FP16: return DataType::kFp16;
    case inference::TYPE_BF16: return DataType::kBf16;
    case inference::TYPE_FP32: return DataType::kFp32;
    case inference::TYPE_FP64: return DataType::kFp64;
    case inference::TYPE_INVALID:
      return absl::InvalidArgumentError(absl::StrCat(where, ": data_type is missing"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_type ", inference::DataType_Name(type),
          " is not supported (Sluice serves BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, "
          "FP32, FP64)"));
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

StatusOr<TensorSpec> ConvertInput(const inference::ModelInput& input) {
  const std::string where = absl::StrCat("input '", input.name(), "'");
  if (input.name().empty()) return absl::InvalidArgumentError("an input has no name");
  if (input.has_reshape()) return absl::InvalidArgumentError(where + ": 'reshape' is not supported");
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
  spec.dims.assign(input.dims().begin(), input.dims().end());
  return spec;
}

StatusOr<TensorSpec> ConvertOutput(const inference::ModelOutput& output) {
  const std::string where = absl::StrCat("output '", output.name(), "'");
  if (output.name().empty()) return absl::InvalidArgumentError("an output has no name");
  if (output.has_reshape()) return absl::InvalidArgumentError(where + ": 'reshape' is not supported");
  if (output.is_shape_tensor()) {
    return absl::InvalidArgumentError(where + ": 'is_shape_tensor' is not supported");
  }
  if (!output.label_filename().empty()) {
    return absl::InvalidArgumentError(where + ": 'label_filename' (classification) is not supported");
  }
  if (output.is_non_linear_format_io()) {
    return absl::InvalidArgumentError(where + ": 'is_non_linear_format_io' is not supported");
  }
  TensorSpec spec;
  spec.name = output.name();
  SLUICE_ASSIGN_OR_RETURN(spec.dtype, ConvertDataType(output.data_type(), where));
  SLUICE_RETURN_IF_ERROR(CheckDims(output.dims(), where));
  spec.dims.assign(output.dims().begin(), output.dims().end());
  return spec;
}

// Top-level features outside what Sluice serves: each is rejected by its field name.
Status RejectUnsupported(const inference::ModelConfig& config) {
  std::vector<std::string> fields;
  if (config.has_sequence_batching()) fields.push_back("sequence_batching");
  if (config.has_ensemble_scheduling()) fields.push_back("ensemble_scheduling");
  if (config.batch_input_size() > 0) fields.push_back("batch_input");
  if (config.batch_output_size() > 0) fields.push_back("batch_output");
  if (config.model_warmup_size() > 0) fields.push_back("model_warmup");
  if (config.has_model_operations()) fields.push_back("model_operations");
  if (config.model_transaction_policy().decoupled()) fields.push_back("model_transaction_policy.decoupled");
  if (config.has_model_repository_agents()) fields.push_back("model_repository_agents");
  if (config.response_cache().enable()) fields.push_back("response_cache");
  if (config.cc_model_filenames_size() > 0) fields.push_back("cc_model_filenames");
  if (config.optimization().cuda().graphs()) fields.push_back("optimization.cuda.graphs");
  if (config.optimization().has_execution_accelerators()) {
    fields.push_back("optimization.execution_accelerators");
  }
  if (config.has_model_metrics()) fields.push_back("model_metrics");
  if (fields.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported configuration field", fields.size() > 1 ? "s" : "", ": ",
      absl::StrJoin(fields, ", "), " (Sluice serves single TorchScript models; remove ",
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
      case inference::ModelInstanceGroup::KIND_AUTO: out.kind = InstanceKind::kAuto; break;
      case inference::ModelInstanceGroup::KIND_GPU: out.kind = InstanceKind::kGpu; break;
      case inference::ModelInstanceGroup::KIND_CPU: out.kind = InstanceKind::kCpu; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": kind ", inference::ModelInstanceGroup::Kind_Name(group.kind()),
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
          where + ": secondary_devices, rate_limiter, passive, profile and host_policy are not "
                  "supported");
    }
    for (int gpu : group.gpus()) {
      if (gpu < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative GPU id ", gpu));
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

StatusOr<bool> BoolParameter(const std::map<std::string, std::string>& parameters,
                             const std::string& key) {
  auto it = parameters.find(key);
  if (it == parameters.end()) return false;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("parameter ", key, " must be \"true\" or \"false\", found '", it->second, "'"));
}

Status ConvertDynamicBatching(const inference::ModelConfig& config, ModelSpec* spec) {
  if (!config.has_dynamic_batching()) return absl::OkStatus();
  const inference::ModelDynamicBatching& batching = config.dynamic_batching();
  if (spec->max_batch_size == 0) {
    return absl::InvalidArgumentError("dynamic_batching needs max_batch_size > 0");
  }
  std::vector<std::string> unsupported;
  if (batching.priority_levels() > 0) unsupported.push_back("priority_levels");
  if (batching.priority_queue_policy_size() > 0) unsupported.push_back("priority_queue_policy");
  if (batching.preserve_ordering()) unsupported.push_back("preserve_ordering");
  if (batching.default_queue_policy().timeout_action() == inference::ModelQueuePolicy::DELAY) {
    unsupported.push_back("default_queue_policy.timeout_action: DELAY");
  }
  if (!unsupported.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dynamic_batching field",
                                                   unsupported.size() > 1 ? "s" : "", ": ",
                                                   absl::StrJoin(unsupported, ", ")));
  }
  DynamicBatchingSpec& out = spec->dynamic_batching;
  out.enabled = true;
  for (int size : batching.preferred_batch_size()) {
    if (size < 1 || size > spec->max_batch_size) {
      return absl::InvalidArgumentError(absl::StrCat("preferred_batch_size ", size,
                                                     " is outside [1, max_batch_size=",
                                                     spec->max_batch_size, "]"));
    }
    out.preferred_batch_sizes.push_back(size);
  }
  std::sort(out.preferred_batch_sizes.begin(), out.preferred_batch_sizes.end());
  out.preferred_batch_sizes.erase(
      std::unique(out.preferred_batch_sizes.begin(), out.preferred_batch_sizes.end()),
      out.preferred_batch_sizes.end());
  constexpr int64_t kMaxDelayUs = 60'000'000;
  if (batching.max_queue_delay_microseconds() > static_cast<uint64_t>(kMaxDelayUs)) {
    return absl::InvalidArgumentError("max_queue_delay_microseconds must be at most 60000000 (60 s)");
  }
  out.max_queue_delay_us = static_cast<int64_t>(batching.max_queue_delay_microseconds());
  const inference::ModelQueuePolicy& policy = batching.default_queue_policy();
  out.max_queue_size = policy.max_queue_size();
  out.default_timeout_us = static_cast<int64_t>(
      std::min<uint64_t>(policy.default_timeout_microseconds(), uint64_t{1} << 40));
  out.allow_timeout_override = policy.allow_timeout_override();
  SLUICE_ASSIGN_OR_RETURN(out.pad_to_preferred,
                          BoolParameter(spec->parameters, "sluice.pad_batch_to_preferred"));
  SLUICE_ASSIGN_OR_RETURN(const int64_t groups,
                          IntParameter(spec->parameters, "sluice.max_shape_groups", 16, 1, 4096));
  out.max_shape_groups = static_cast<int>(groups);
  SLUICE_ASSIGN_OR_RETURN(const int64_t bytes,
                          IntParameter(spec->parameters, "sluice.max_queued_bytes", 256 << 20, 1,
                                       int64_t{1} << 40));
  out.max_queued_bytes = static_cast<size_t>(bytes);
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
    return absl::InvalidArgumentError(absl::StrCat("config name '", config->name(),
                                                   "' differs from its directory name '",
                                                   model_name, "'"));
  }
  const bool torch_platform = config->platform().empty() || config->platform() == "pytorch_libtorch";
  const bool torch_backend = config->backend().empty() || config->backend() == "pytorch";
  if (!torch_platform || !torch_backend) {
    return absl::InvalidArgumentError(absl::StrCat(
        "platform '", config->platform(), "' / backend '", config->backend(),
        "' is not supported: Sluice serves TorchScript models (platform: \"pytorch_libtorch\" "
        "or backend: \"pytorch\")"));
  }
  if (config->platform().empty()) config->set_platform("pytorch_libtorch");
  if (config->backend().empty()) config->set_backend("pytorch");
  SLUICE_RETURN_IF_ERROR(RejectUnsupported(*config));

  ModelSpec spec;
  spec.name = config->name();
  spec.platform = config->platform();
  if (config->max_batch_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_size must be >= 0, found ", config->max_batch_size()));
  }
  spec.max_batch_size = config->max_batch_size();
  if (config->input_size() == 0 || config->output_size() == 0) {
    return absl::InvalidArgumentError(
        "a TorchScript model needs its inputs and outputs declared in config.pbtxt (input [...] "
        "and output [...])");
  }
  std::set<std::string> names;
  for (const inference::ModelInput& input : config->input()) {
    SLUICE_ASSIGN_OR_RETURN(TensorSpec tensor, ConvertInput(input));
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("input '", tensor.name, "' is declared twice"));
    }
    spec.inputs.push_back(std::move(tensor));
  }
  names.clear();
  for (const inference::ModelOutput& output : config->output()) {
    SLUICE_ASSIGN_OR_RETURN(TensorSpec tensor, ConvertOutput(output));
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("output '", tensor.name, "' is declared twice"));
    }
    spec.outputs.push_back(std::move(tensor));
  }
  SLUICE_RETURN_IF_ERROR(ConvertInstanceGroups(config, &spec));
  if (config->default_model_filename().empty()) config->set_default_model_filename("model.pt");
  spec.model_filename = config->default_model_filename();
  if (spec.model_filename.find('/') != std::string::npos || spec.model_filename == "..") {
    return absl::InvalidArgumentError("default_model_filename must be a plain file name");
  }
  for (const auto& [key, value] : config->parameters()) spec.parameters[key] = value.string_value();
  SLUICE_RETURN_IF_ERROR(ConvertDynamicBatching(*config, &spec));
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
        if (std::find(wanted.begin(), wanted.end(), version) != wanted.end()) chosen.push_back(version);
      }
      return chosen;
    }
    case inference::ModelVersionPolicy::kLatest:
    case inference::ModelVersionPolicy::POLICY_CHOICE_NOT_SET: {
      const size_t keep = policy.has_latest() ? std::max<uint32_t>(1, policy.latest().num_versions()) : 1;
      if (available.size() > keep) available.erase(available.begin(), available.end() - keep);
      return available;
    }
  }
  return available;
}

}  // namespace sluice
