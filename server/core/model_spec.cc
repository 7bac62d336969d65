#include "server/core/model_spec.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice {

const char* CudnnBenchmarkModeName(CudnnBenchmarkMode mode) {
  switch (mode) {
    case CudnnBenchmarkMode::kAuto:
      return "auto";
    case CudnnBenchmarkMode::kOn:
      return "on";
    case CudnnBenchmarkMode::kOff:
      return "off";
  }
  return "auto";
}

const char* SequenceControlKindName(SequenceControlKind kind) {
  switch (kind) {
    case SequenceControlKind::kStart:
      return "CONTROL_SEQUENCE_START";
    case SequenceControlKind::kEnd:
      return "CONTROL_SEQUENCE_END";
    case SequenceControlKind::kReady:
      return "CONTROL_SEQUENCE_READY";
    case SequenceControlKind::kCorrId:
      return "CONTROL_SEQUENCE_CORRID";
  }
  return "CONTROL_SEQUENCE_START";
}

StatusOr<CudnnBenchmarkMode> ParseCudnnBenchmarkMode(std::string_view text) {
  for (CudnnBenchmarkMode mode :
       {CudnnBenchmarkMode::kAuto, CudnnBenchmarkMode::kOn, CudnnBenchmarkMode::kOff}) {
    if (text == CudnnBenchmarkModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be \"auto\", \"on\" or \"off\", found '", std::string(text), "'"));
}

std::optional<int> IndexSuffix(const std::string& name) {
  const size_t pos = name.rfind("__");
  int index = 0;
  if (pos == std::string::npos || !absl::SimpleAtoi(name.substr(pos + 2), &index) || index < 0) {
    return std::nullopt;
  }
  return index;
}

std::optional<std::vector<int>> PositionsBySuffix(const std::vector<TensorSpec>& tensors,
                                                  size_t count) {
  std::vector<int> positions;
  std::vector<bool> taken(count, false);
  for (const TensorSpec& tensor : tensors) {
    std::optional<int> index = IndexSuffix(tensor.name);
    if (!index || static_cast<size_t>(*index) >= count || taken[*index]) return std::nullopt;
    taken[*index] = true;
    positions.push_back(*index);
  }
  return positions;
}

size_t DeclaredIndex(const std::vector<TensorSpec>& tensors, const std::string& name) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return 0;
}

}  // namespace sluice
