#include "server/frontend/model_queries.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/core/data_type.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

Status CheckRepositoryName(const std::string& repository_name) {
  if (repository_name.empty()) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("unknown repository '", QuoteClientText(repository_name),
                   "'; Sluice serves one repository (leave repository_name empty)"));
}

// Why the ensemble `spec` cannot run now: its first step whose model serves no version the step
// names. Empty when each one does, and for a model that is not an ensemble. (An ensemble is ready
// while every model its steps run is, as Triton's is.)
std::string UnservedStep(const ModelManager& manager, const ModelSpec& spec) {
  for (size_t i = 0; i < spec.ensemble.steps.size(); ++i) {
    const EnsembleStepSpec& step = spec.ensemble.steps[i];
    StatusOr<InFlightModel> found = manager.Find(step.model, step.VersionText());
    if (!found.ok()) {
      return absl::StrCat("step ", i + 1, " (model '", step.model,
                          "') cannot be served: ", found.status().message());
    }
  }
  return {};
}

}  // namespace

void AnswerServerMetadata(const std::string& version, bool system_shared_memory, bool trace,
                          inference::ServerMetadataResponse* response) {
  response->set_name("sluice");
  response->set_version(version);
  // Only what Sluice really implements.
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  response->add_extensions("model_repository");
  response->add_extensions("model_repository(unload_dependents)");
  response->add_extensions("binary_tensor_data");
  if (system_shared_memory) response->add_extensions("system_shared_memory");
  if (trace) response->add_extensions("trace");
}

StatusOr<bool> AnswerModelReady(const ModelManager& manager, const std::string& name,
                                const std::string& version) {
  SLUICE_RETURN_IF_ERROR(manager.FindModel(name).status());
  StatusOr<InFlightModel> found = manager.Find(name, version);
  return found.ok() && UnservedStep(manager, (*found)->spec()).empty();
}

StatusOr<TraceSettingsMap> AnswerTraceSettings(const ModelManager& manager, Tracer* tracer,
                                               const std::string& model,
                                               const TraceSettingsMap* update) {
  if (tracer == nullptr) return absl::UnavailableError("tracing is not set up in this server");
  if (!model.empty()) SLUICE_RETURN_IF_ERROR(manager.FindModel(model).status());
  if (update == nullptr) return tracer->Get(model);
  return tracer->Update(model, *update);
}

Status AnswerModelMetadata(const ModelManager& manager, const std::string& name,
                           const std::string& version, inference::ModelMetadataResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(InFlightModel model, manager.Find(name, version));
  FillModelMetadata(model->spec(), manager.ReadyVersions(name), response);
  return absl::OkStatus();
}

Status AnswerModelConfig(const ModelManager& manager, const std::string& name,
                         const std::string& version, inference::ModelConfigResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(InFlightModel model, manager.Find(name, version));
  const std::shared_ptr<const inference::ModelConfig>& config = model->model().config;
  if (config == nullptr) {
    return absl::InternalError(
        absl::StrCat("model '", name, "' was loaded without its config.pbtxt"));
  }
  *response->mutable_config() = *config;
  AddBatchSizeChoice(model->batch_sizes(), response->mutable_config());
  return absl::OkStatus();
}

Status AnswerRepositoryIndex(const ModelManager& manager, const std::string& repository_name,
                             bool ready_only, inference::RepositoryIndexResponse* response) {
  SLUICE_RETURN_IF_ERROR(CheckRepositoryName(repository_name));
  for (ModelIndexEntry& entry : manager.Index()) {
    if (entry.state == ModelState::kReady) {
      // A ready ensemble with a step whose model does not serve is not ready (as the model-ready
      // call says): listed UNAVAILABLE, with the step as the reason.
      StatusOr<std::shared_ptr<const RepositoryModel>> found = manager.FindModel(entry.name);
      if (found.ok() && (*found)->spec.is_ensemble()) {
        StatusOr<InFlightModel> serving = manager.Find(entry.name, entry.version);
        std::string why = serving.ok() ? UnservedStep(manager, (*serving)->spec()) : "";
        if (!why.empty()) {
          entry.state = ModelState::kUnavailable;
          entry.reason = std::move(why);
        }
      }
    }
    if (ready_only && entry.state != ModelState::kReady) continue;
    auto* model = response->add_models();
    model->set_name(entry.name);
    model->set_version(entry.version);
    model->set_state(std::string(ModelStateName(entry.state)));
    model->set_reason(entry.reason);
    uint64_t memory = 0;
    for (const auto& [device, bytes] : entry.memory) memory += bytes;
    if (memory > 0) model->mutable_sluice_memory()->set_bytes(memory);
  }
  return absl::OkStatus();
}

Status AnswerModelStatistics(const ModelManager& manager, const std::string& name,
                             const std::string& version,
                             inference::ModelStatisticsResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<VersionStatistics> statistics,
                          manager.Statistics(name, version));
  for (const VersionStatistics& each : statistics) {
    inference::ModelStatistics* stats = response->add_model_stats();
    FillModelStatistics(each.name, each.version, each.stats, stats);
    // Triton's memory_usage: the memory the version took at load, per device.
    for (const auto& [device, bytes] : each.memory) {
      inference::MemoryUsage* usage = stats->add_memory_usage();
      const bool gpu = device.rfind("cuda:", 0) == 0;
      usage->set_type(gpu ? "GPU" : "CPU");
      usage->set_id(gpu ? std::stoll(device.substr(5)) : 0);
      usage->set_byte_size(bytes);
    }
  }
  return absl::OkStatus();
}

namespace {

// A "file:" load parameter's path: relative to the model directory, each component a plain name
// (not empty, ".", ".." or longer than NAME_MAX), so that a file lands inside the load's own
// directory and nowhere else.
Status CheckLoadFilePath(const std::string& key, const std::string& path) {
  auto refuse = [&key](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid file parameter '", QuoteClientText(key), "': ", why));
  };
  constexpr size_t kNameMax = 255;
  constexpr size_t kPathMax = 4095;
  if (path.empty()) return refuse("no path after 'file:'");
  if (path.size() > kPathMax)
    return refuse(absl::StrCat("the path is longer than ", kPathMax, " bytes"));
  if (path.front() == '/') return refuse("the path must be relative to the model directory");
  if (path.find('\0') != std::string::npos) return refuse("the path holds a NUL byte");
  if (path == "config.pbtxt") return refuse("the 'config' parameter is the model's configuration");
  for (absl::string_view component : absl::StrSplit(path, '/')) {
    if (component.empty() || component == "." || component == "..") {
      return refuse(
          "each path component must be a file or directory name (no '', '.' or '..'): the file "
          "must "
          "stay within the model directory");
    }
    if (component.size() > kNameMax) {
      return refuse(absl::StrCat("a path component is longer than ", kNameMax, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<ControlRequest> CheckModelControl(
    const ModelControl* control, const std::string& transport, const std::string& repository_name,
    const std::string& model_name, const std::vector<ControlParameter>& parameters, bool unload) {
  // Load and unload work only in explicit mode (see ModelControlMode).
  const ModelControlMode mode = control != nullptr ? control->mode() : ModelControlMode::kNone;
  if (mode != ModelControlMode::kExplicit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "models cannot be loaded or unloaded over ", transport, " with --model-control-mode ",
        ModelControlModeName(mode), "; start the server with --model-control-mode explicit"));
  }
  SLUICE_RETURN_IF_ERROR(CheckRepositoryName(repository_name));
  auto kind_name = [](ControlParameter::Kind kind) {
    switch (kind) {
      case ControlParameter::Kind::kBool:
        return "bool";
      case ControlParameter::Kind::kInt64:
        return "int64";
      case ControlParameter::Kind::kString:
        return "string";
      case ControlParameter::Kind::kBytes:
        return "bytes";
    }
    return "unknown";
  };
  ControlRequest request;
  ModelOverride& override = request.override;
  uint64_t file_bytes = 0;
  for (const ControlParameter& parameter : parameters) {
    if (unload) {
      if (parameter.key == "unload_dependents") {
        if (parameter.kind != ControlParameter::Kind::kBool) {
          return absl::InvalidArgumentError(
              "Unload parameter 'unload_dependents' must have bool type for its value");
        }
        request.unload_dependents = parameter.value == "true";
        continue;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", QuoteClientText(parameter.key),
                       "' is not supported by unload (only unload_dependents)"));
    }
    if (parameter.key == "config") {
      if (parameter.kind != ControlParameter::Kind::kString) {
        return absl::InvalidArgumentError(
            "Config parameter 'config' must have string type for its value");
      }
      override.config_json = parameter.value;
    } else if (absl::StartsWith(parameter.key, "file:")) {
      if (!control->accepts_load_files()) {
        return absl::InvalidArgumentError(
            absl::StrCat("load parameter '", QuoteClientText(parameter.key),
                         "': model files sent with a load are not accepted by this server (they "
                         "are code it would run; the "
                         "operator allows them with --allow-load-files=true); put them in the "
                         "model repository"));
      }
      if (parameter.kind != ControlParameter::Kind::kBytes) {
        return absl::InvalidArgumentError(absl::StrCat("File parameter '",
                                                       QuoteClientText(parameter.key),
                                                       "' must have bytes type for its value"));
      }
      const std::string path = parameter.key.substr(5);
      SLUICE_RETURN_IF_ERROR(CheckLoadFilePath(parameter.key, path));
      file_bytes += parameter.value.size();
      override.files[path] = parameter.value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("Unrecognized load parameter '", QuoteClientText(parameter.key),
                       "' with type '", kind_name(parameter.kind), "'"));
    }
  }
  if (!override.files.empty()) {
    if (!override.config_json) {
      return absl::InvalidArgumentError(
          "Load parameter 'config' must be specified for model file override");
    }
    if (file_bytes > control->max_load_file_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model files sent with this load have ", file_bytes,
          " bytes, more than --load-files-max-bytes ", control->max_load_file_bytes()));
    }
  }
  if (model_name.empty()) return absl::InvalidArgumentError("model_name is empty");
  return request;
}

void AddBatchSizeChoice(const BatchSizeChoice& choice, inference::ModelConfig* config) {
  if (!choice.measured) return;
  auto& parameters = *config->mutable_parameters();
  parameters[kAutoBatchSizesChosenKey].set_string_value(choice.SizesText());
  parameters[kAutoBatchSizesRatesKey].set_string_value(choice.RatesText());
}

void FillModelMetadata(const ModelSpec& spec, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* proto) {
  proto->set_name(spec.name);
  proto->set_platform(spec.platform);
  for (int64_t version : versions) proto->add_versions(std::to_string(version));
  auto add = [&](const TensorSpec& tensor, auto* list) {
    auto* meta = list->Add();
    meta->set_name(tensor.name);
    meta->set_datatype(std::string(DataTypeName(tensor.dtype)));
    for (int64_t dim : spec.FullShape(tensor)) meta->add_shape(dim);
  };
  for (const TensorSpec& input : spec.inputs) {
    if (!input.filled_by_server) add(input, proto->mutable_inputs());  // clients do not send it
  }
  for (const TensorSpec& output : spec.outputs) {
    if (!output.state_only) add(output, proto->mutable_outputs());  // the server keeps it
  }
}

void FillModelStatistics(const std::string& name, int64_t version, const ModelStatsSnapshot& stats,
                         inference::ModelStatistics* proto) {
  auto fill = [](const DurationStat& from, inference::StatisticDuration* to) {
    to->set_count(from.count);
    to->set_ns(from.ns);
  };
  proto->set_name(name);
  proto->set_version(std::to_string(version));
  proto->set_last_inference(stats.last_inference_ms);
  proto->set_inference_count(stats.inference_count);
  proto->set_execution_count(stats.execution_count);
  auto* inference = proto->mutable_inference_stats();
  fill(stats.success, inference->mutable_success());
  fill(stats.fail, inference->mutable_fail());
  fill(stats.queue, inference->mutable_queue());
  fill(stats.compute_input, inference->mutable_compute_input());
  fill(stats.compute_infer, inference->mutable_compute_infer());
  fill(stats.compute_output, inference->mutable_compute_output());
  fill(stats.cache_hit, inference->mutable_cache_hit());
  fill(stats.cache_miss, inference->mutable_cache_miss());
  for (const auto& [size, batch] : stats.batches) {
    auto* out = proto->add_batch_stats();
    out->set_batch_size(size);
    fill(batch.compute_input, out->mutable_compute_input());
    fill(batch.compute_infer, out->mutable_compute_infer());
    fill(batch.compute_output, out->mutable_compute_output());
  }
  if (stats.latency_target > Duration::zero()) {
    auto* target = proto->mutable_sluice_latency_target();
    target->set_target_us(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(stats.latency_target).count()));
    target->set_refused_for_target(stats.refused_for_target);
    target->set_refused_for_deadline(stats.refused_for_deadline);
    target->set_plan_share(stats.plan_share);
    target->set_answered(stats.answers.answered);
    target->set_answered_late(stats.answers.late);
    for (const BatchCostModel::Entry& entry : stats.batch_costs) {
      auto* cost = target->add_batch_costs();
      cost->set_shape_group(entry.group);
      cost->set_batch_size(static_cast<uint64_t>(entry.rows));
      cost->set_instance(static_cast<uint32_t>(entry.instance));
      cost->set_ns(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(entry.cost).count()));
      cost->set_observations(entry.observations);
    }
  }
}

}  // namespace sluice
