#include "server/frontend/restricted_protocols.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sluice {
namespace {

constexpr ProtocolGroup kAllGroups[] = {
    ProtocolGroup::kHealth,          ProtocolGroup::kMetadata,
    ProtocolGroup::kInference,       ProtocolGroup::kModelConfig,
    ProtocolGroup::kModelRepository, ProtocolGroup::kStatistics,
    ProtocolGroup::kSharedMemory,    ProtocolGroup::kTrace};

// Characters gRPC allows in a metadata key (and no "-bin" suffix: binary headers are not text).
bool ValidHeaderKey(const std::string& key) {
  if (key.empty() || key.rfind("grpc-", 0) == 0 || key[0] == ':') return false;
  if (key.size() >= 4 && key.compare(key.size() - 4, 4, "-bin") == 0) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

}  // namespace

const char* ProtocolGroupName(ProtocolGroup group) {
  switch (group) {
    case ProtocolGroup::kHealth:
      return "health";
    case ProtocolGroup::kMetadata:
      return "metadata";
    case ProtocolGroup::kInference:
      return "inference";
    case ProtocolGroup::kModelConfig:
      return "model-config";
    case ProtocolGroup::kModelRepository:
      return "model-repository";
    case ProtocolGroup::kStatistics:
      return "statistics";
    case ProtocolGroup::kSharedMemory:
      return "shared-memory";
    case ProtocolGroup::kTrace:
      return "trace";
  }
  return "unknown";
}

StatusOr<ProtocolRestriction> ParseProtocolRestriction(const std::string& text) {
  const std::string usage = absl::StrCat(
      " (--grpc-restricted-protocol takes <group>[,<group>...]:<header>=<value>, groups: health, "
      "metadata, inference, model-config, model-repository, statistics, shared-memory, trace); got "
      "'",
      text, "'");
  const size_t colon = text.find(':');
  const size_t equals = text.find('=', colon == std::string::npos ? 0 : colon);
  if (colon == std::string::npos || equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("missing ':' or '='", usage));
  }
  ProtocolRestriction restriction;
  for (absl::string_view name : absl::StrSplit(text.substr(0, colon), ',')) {
    name = absl::StripAsciiWhitespace(name);
    auto group = std::find_if(std::begin(kAllGroups), std::end(kAllGroups),
                              [&](ProtocolGroup g) { return name == ProtocolGroupName(g); });
    if (group == std::end(kAllGroups)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown protocol group '", name, "'", usage));
    }
    restriction.groups.push_back(*group);
  }
  restriction.key =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(colon + 1, equals - colon - 1)));
  restriction.value = text.substr(equals + 1);
  if (!ValidHeaderKey(restriction.key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", restriction.key, "' is not a header gRPC carries as text", usage));
  }
  if (restriction.value.empty())
    return absl::InvalidArgumentError(absl::StrCat("empty header value", usage));
  return restriction;
}

Status CheckRestrictionsDistinct(const std::vector<ProtocolRestriction>& restrictions,
                                 const std::string& flag) {
  std::vector<ProtocolGroup> seen;
  for (const ProtocolRestriction& restriction : restrictions) {
    for (ProtocolGroup group : restriction.groups) {
      if (std::find(seen.begin(), seen.end(), group) != seen.end()) {
        return absl::InvalidArgumentError(absl::StrCat("protocol group '", ProtocolGroupName(group),
                                                       "' is restricted twice (", flag, ")"));
      }
      seen.push_back(group);
    }
  }
  return absl::OkStatus();
}

Status CheckProtocolAccess(
    const std::vector<ProtocolRestriction>& restrictions, ProtocolGroup group,
    absl::FunctionRef<std::vector<absl::string_view>(const std::string& key)> values) {
  for (const ProtocolRestriction& restriction : restrictions) {
    if (std::find(restriction.groups.begin(), restriction.groups.end(), group) ==
        restriction.groups.end()) {
      continue;
    }
    const std::vector<absl::string_view> sent = values(restriction.key);
    if (sent.empty()) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the '", ProtocolGroupName(group),
          "' protocol is restricted on this server: send the header '", restriction.key, "'"));
    }
    for (absl::string_view value : sent) {
      if (value == restriction.value) return absl::OkStatus();
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "the '", ProtocolGroupName(group), "' protocol is restricted on this server and header '",
        restriction.key, "' does not have the expected value"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
