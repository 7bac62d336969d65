// config.pbtxt -> inference::ModelConfig (Triton's whole schema) -> ModelSpec (what Sluice serves).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model_config.pb.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// Parses protobuf text format. INVALID_ARGUMENT names `source` and the line/column of the error.
StatusOr<inference::ModelConfig> ParseModelConfigText(const std::string& text,
                                                      const std::string& source);

// Parses protobuf's JSON form of ModelConfig (a load request's "config" override; numbers may be
// quoted, as Triton's clients send them). INVALID_ARGUMENT says what is wrong.
StatusOr<inference::ModelConfig> ParseModelConfigJson(const std::string& json);

// Validates a parsed config for the model directory `model_name` and converts it. Fills the
// config's defaults in place (name, platform, instance groups, version policy), so that the
// ModelConfig RPC reports what Sluice actually uses. Features Sluice does not support are rejected
// by field name with INVALID_ARGUMENT (ensemble_scheduling, sequence_batching's oldest strategy and
// implicit state, ...).
StatusOr<ModelSpec> BuildModelSpec(const std::string& model_name, inference::ModelConfig* config);

// Which of `available` version numbers the policy loads, ascending. Default policy: latest 1.
std::vector<int64_t> SelectVersions(const inference::ModelVersionPolicy& policy,
                                    std::vector<int64_t> available);

}  // namespace sluice
