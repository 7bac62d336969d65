#include "server/core/device.h"

#include "absl/strings/str_cat.h"

namespace sluice {

StatusOr<DevicePolicy> ParseDevicePolicy(const std::string& text) {
  if (text == "auto") return DevicePolicy::kAuto;
  if (text == "cpu") return DevicePolicy::kCpu;
  if (text == "cuda") return DevicePolicy::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be auto, cpu or cuda, not '", text, "'"));
}

StatusOr<DeviceDecision> DecideDevice(DevicePolicy policy, InstanceKind kind, bool cuda_usable) {
  if (policy == DevicePolicy::kCuda && !cuda_usable) {
    return absl::FailedPreconditionError(
        "--device cuda was given but no CUDA GPU is usable (check the driver with nvidia-smi, "
        "and that the container was started with --gpus all); use --device auto to fall back "
        "to the CPU");
  }
  DeviceDecision decision;
  if (policy == DevicePolicy::kCpu || kind == InstanceKind::kCpu) return decision;
  decision.use_cuda = cuda_usable;
  decision.fell_back_to_cpu = !cuda_usable && kind == InstanceKind::kGpu;
  return decision;
}

}  // namespace sluice
