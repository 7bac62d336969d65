// Guarded APIs (Triton's --grpc-restricted-protocol and --http-restricted-api): calls of a
// restricted protocol group must carry a header with the expected value, so that a client allowed
// to infer cannot, say, read the model configurations or statistics. grpc.health.v1 is never
// restricted (orchestrator probes).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

#include "server/core/status.h"

namespace sluice {

// Triton's protocol groups, as far as Sluice serves them.
enum class ProtocolGroup {
  kHealth,           // ServerLive, ServerReady, ModelReady
  kMetadata,         // ServerMetadata, ModelMetadata
  kInference,        // ModelInfer, ModelStreamInfer
  kModelConfig,      // ModelConfig
  kModelRepository,  // RepositoryIndex (and model load/unload)
  kStatistics,       // ModelStatistics
  kSharedMemory,     // SystemSharedMemory{Register,Status,Unregister} (and the CUDA ones)
  kTrace,            // TraceSetting (and HTTP's /v2/[models/{m}/]trace/setting)
};
const char* ProtocolGroupName(ProtocolGroup group);  // "health", "model-config", ...

struct ProtocolRestriction {
  std::vector<ProtocolGroup> groups;
  std::string key;  // header name, lower case (gRPC metadata keys are)
  std::string value;
};

// Parses one --grpc-restricted-protocol value: "<group>[,<group>...]:<header>=<value>", e.g.
// "model-repository,model-config,statistics:admin-key=s3cret". INVALID_ARGUMENT saying what is
// wrong (unknown group, missing header or value, a header gRPC would not carry).
StatusOr<ProtocolRestriction> ParseProtocolRestriction(const std::string& text);

// Checks that no group is restricted twice by the values of `flag`.
Status CheckRestrictionsDistinct(const std::vector<ProtocolRestriction>& restrictions,
                                 const std::string& flag = "--grpc-restricted-protocol");

// OK when `group` is unrestricted or the call carries the header with the value; UNAUTHENTICATED
// when the header is missing, PERMISSION_DENIED when its value is wrong. `values(key)` is what the
// call sent for header `key` (lower case: gRPC metadata keys are; the HTTP front end looks
// headers up case-insensitively).
Status CheckProtocolAccess(
    const std::vector<ProtocolRestriction>& restrictions, ProtocolGroup group,
    absl::FunctionRef<std::vector<absl::string_view>(const std::string& key)> values);

}  // namespace sluice
