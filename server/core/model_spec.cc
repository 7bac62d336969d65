#include "server/core/model_spec.h"

#include "absl/strings/str_cat.h"

namespace sluice {

const char* CudnnBenchmarkModeName(CudnnBenchmarkMode mode) {
  switch (mode) {
    case CudnnBenchmarkMode::kAuto: return "auto";
    case CudnnBenchmarkMode::kOn: return "on";
    case CudnnBenchmarkMode::kOff: return "off";
  }
  return "auto";
}

StatusOr<CudnnBenchmarkMode> ParseCudnnBenchmarkMode(std::string_view text) {
  for (CudnnBenchmarkMode mode : {CudnnBenchmarkMode::kAuto, CudnnBenchmarkMode::kOn, CudnnBenchmarkMode::kOff}) {
    if (text == CudnnBenchmarkModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("must be \"auto\", \"on\" or \"off\", found '", std::string(text), "'"));
}

}  // namespace sluice
