// The answers both front ends give to the non-inference calls, as KServe v2 messages: the gRPC
// service sends them as they are, the HTTP service prints them as JSON (json_protocol.h). One
// place decides what each call answers, so that the two protocols cannot drift apart.
#pragma once

#include <string>
#include <vector>

#include "grpc_service.pb.h"
#include "server/batching/batch_sizes.h"
#include "server/batching/model_stats.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"
#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "server/tracing/tracer.h"

namespace sluice {

// ServerMetadata: name "sluice", `version`, and the extensions Sluice really implements.
// `system_shared_memory`: the front end serves Triton's system shared memory extension; `trace`:
// its trace settings extension (a tracer is set up).
void AnswerServerMetadata(const std::string& version, bool system_shared_memory, bool trace,
                          inference::ServerMetadataResponse* response);

// ModelReady: NOT_FOUND for a model the repository lacks; else whether `version` (empty: the
// newest) is ready; an ensemble's, only while every model its steps run serves.
StatusOr<bool> AnswerModelReady(const ModelManager& manager, const std::string& name,
                                const std::string& version);

// ModelMetadata and ModelConfig of a ready version (NOT_FOUND / UNAVAILABLE as ModelManager::Find).
Status AnswerModelMetadata(const ModelManager& manager, const std::string& name,
                           const std::string& version, inference::ModelMetadataResponse* response);
Status AnswerModelConfig(const ModelManager& manager, const std::string& name,
                         const std::string& version, inference::ModelConfigResponse* response);

// RepositoryIndex: every model version the server knows (only the ready ones when `ready_only`);
// an ensemble with a step whose model does not serve is UNAVAILABLE, that step the reason.
// NOT_FOUND for a repository name other than "" (Sluice serves one repository).
Status AnswerRepositoryIndex(const ModelManager& manager, const std::string& repository_name,
                             bool ready_only, inference::RepositoryIndexResponse* response);

// ModelStatistics of one model (`name` empty: every model) and version (empty: every version).
Status AnswerModelStatistics(const ModelManager& manager, const std::string& name,
                             const std::string& version,
                             inference::ModelStatisticsResponse* response);

// TraceSetting: the trace settings of the server (`model` empty) or of a model the repository
// knows (NOT_FOUND otherwise), after `update` when it is not null (Tracer::Update: all or
// nothing, INVALID_ARGUMENT naming what is wrong). `tracer` null: UNAVAILABLE.
StatusOr<TraceSettingsMap> AnswerTraceSettings(const ModelManager& manager, Tracer* tracer,
                                               const std::string& model,
                                               const TraceSettingsMap* update);
// One load or unload parameter as a front end decoded it: a gRPC ModelRepositoryParameter, or a
// member of the HTTP body's "parameters" (a "file:" member's base64 already decoded to kBytes).
struct ControlParameter {
  enum class Kind { kBool, kInt64, kString, kBytes };
  std::string key;
  Kind kind = Kind::kString;
  std::string value;  // kString and kBytes
};

// The checks a repository load or unload request passes before it is queued: explicit model
// control (`control` null counts as none), the one repository, a model name, and the parameters,
// with Triton's rules. Load takes "config" (a string: ModelConfig JSON) and, when the control
// accepts load files, "file:<path>" entries (bytes; they require "config"; each path relative,
// every component a plain name of at most 255 bytes, all of them within the per-load byte cap),
// returned as the override; "file:" entries are refused otherwise, and anything else is
// INVALID_ARGUMENT ("Unrecognized load parameter"). Unload takes unload_dependents (a bool: also
// unload the step models of an ensemble that nothing else runs, ModelControl::UnloadModel).
// `transport` ("gRPC", "HTTP") goes into the message.
struct ControlRequest {
  ModelOverride override;          // a load's
  bool unload_dependents = false;  // an unload's
};
StatusOr<ControlRequest> CheckModelControl(
    const ModelControl* control, const std::string& transport, const std::string& repository_name,
    const std::string& model_name, const std::vector<ControlParameter>& parameters, bool unload);

// ModelMetadata for a model spec and its ready versions (shapes carry a leading -1 when the
// model batches).
void FillModelMetadata(const ModelSpec& spec, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* proto);

// Adds the batch sizes warm-up chose to a ModelConfig answer's parameters
// (kAutoBatchSizesChosenKey, kAutoBatchSizesRatesKey); nothing when they were not measured.
void AddBatchSizeChoice(const BatchSizeChoice& choice, inference::ModelConfig* config);

// One ModelStatistics entry with Triton's meaning (durations in nanoseconds).
void FillModelStatistics(const std::string& name, int64_t version, const ModelStatsSnapshot& stats,
                         inference::ModelStatistics* proto);

}  // namespace sluice
