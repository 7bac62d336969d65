#include "server/api/model_queries.h"

#include "absl/strings/str_cat.h"
#include "server/api/protocol.h"

namespace sluice {
namespace {

Status CheckRepositoryName(const std::string& repository_name) {
  if (repository_name.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("unknown repository '", repository_name,
                                          "'; Sluice serves one repository (leave repository_name empty)"));
}

}  // namespace

void AnswerServerMetadata(const std::string& version, bool system_shared_memory,
                          inference::ServerMetadataResponse* response) {
  response->set_name("sluice");
  response->set_version(version);
  // Only what Sluice really implements.
  response->add_extensions("model_configuration");
  response->add_extensions("statistics");
  response->add_extensions("model_repository");
  response->add_extensions("binary_tensor_data");
  if (system_shared_memory) response->add_extensions("system_shared_memory");
}

StatusOr<bool> AnswerModelReady(const ModelManager& manager, const std::string& name, const std::string& version) {
  SLUICE_RETURN_IF_ERROR(manager.FindModel(name).status());
  return manager.Find(name, version).ok();
}

Status AnswerModelMetadata(const ModelManager& manager, const std::string& name, const std::string& version,
                           inference::ModelMetadataResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(InFlightModel model, manager.Find(name, version));
  FillModelMetadata(model->spec(), manager.ReadyVersions(name), response);
  return absl::OkStatus();
}

Status AnswerModelConfig(const ModelManager& manager, const std::string& name, const std::string& version,
                         inference::ModelConfigResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(InFlightModel model, manager.Find(name, version));
  const std::shared_ptr<const inference::ModelConfig>& config = model->model().config;
  if (config == nullptr) {
    return absl::InternalError(absl::StrCat("model '", name, "' was loaded without its config.pbtxt"));
  }
  *response->mutable_config() = *config;
  AddBatchSizeChoice(model->batch_sizes(), response->mutable_config());
  return absl::OkStatus();
}

Status AnswerRepositoryIndex(const ModelManager& manager, const std::string& repository_name, bool ready_only,
                             inference::RepositoryIndexResponse* response) {
  SLUICE_RETURN_IF_ERROR(CheckRepositoryName(repository_name));
  for (const ModelIndexEntry& entry : manager.Index()) {
    if (ready_only && entry.state != ModelState::kReady) continue;
    auto* model = response->add_models();
    model->set_name(entry.name);
    model->set_version(entry.version);
    model->set_state(std::string(ModelStateName(entry.state)));
    model->set_reason(entry.reason);
  }
  return absl::OkStatus();
}

Status AnswerModelStatistics(const ModelManager& manager, const std::string& name, const std::string& version,
                             inference::ModelStatisticsResponse* response) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<VersionStatistics> statistics, manager.Statistics(name, version));
  for (const VersionStatistics& each : statistics) {
    FillModelStatistics(each.name, each.version, each.stats, response->add_model_stats());
  }
  return absl::OkStatus();
}

Status CheckModelControl(const ModelControl* control, const std::string& transport, const std::string& repository_name,
                         const std::string& model_name, const std::vector<std::string>& parameter_keys, bool unload) {
  // Load and unload work only in explicit mode (see ModelControlMode).
  const ModelControlMode mode = control != nullptr ? control->mode() : ModelControlMode::kNone;
  if (mode != ModelControlMode::kExplicit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "models cannot be loaded or unloaded over ", transport, " with --model-control-mode ",
        ModelControlModeName(mode), "; start the server with --model-control-mode explicit"));
  }
  SLUICE_RETURN_IF_ERROR(CheckRepositoryName(repository_name));
  for (const std::string& key : parameter_keys) {
    // Unload's unload_dependents concerns ensembles, which Sluice does not have: nothing depends
    // on a model, so either value means the same.
    if (unload && key == "unload_dependents") continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", key,
        "' is not supported: Sluice loads models only as the repository has them (edit config.pbtxt "
        "and the version directories, then load)"));
  }
  if (model_name.empty()) return absl::InvalidArgumentError("model_name is empty");
  return absl::OkStatus();
}

}  // namespace sluice
