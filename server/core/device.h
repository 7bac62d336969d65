// Where model instances run, decided once at load time from the --device flag, the instance
// group's kind and whether CUDA is usable on this machine.
#pragma once

#include <string>
#include <string_view>

#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// --device: auto (GPU where asked and usable, else CPU with a warning), cpu (always), cuda (a GPU
// is required: start-up fails without one).
enum class DevicePolicy { kAuto, kCpu, kCuda };

StatusOr<DevicePolicy> ParseDevicePolicy(const std::string& text);

struct Device {
  bool cuda = false;
  int index = 0;  // GPU ordinal when cuda
  std::string ToString() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }
  bool operator==(const Device& other) const { return cuda == other.cuda && index == other.index; }
};

struct DeviceDecision {
  bool use_cuda = false;
  bool fell_back_to_cpu = false;  // auto policy, GPU asked for, none usable: warn the operator
};

// The device rule:
//   cpu  -> every instance on the CPU.
//   auto -> KIND_GPU and KIND_AUTO instances on the GPU when CUDA is usable, else on the CPU
//           (fell_back_to_cpu for KIND_GPU); KIND_CPU on the CPU.
//   cuda -> FAILED_PRECONDITION when no GPU is usable; otherwise as auto.
StatusOr<DeviceDecision> DecideDevice(DevicePolicy policy, InstanceKind kind, bool cuda_usable);

}  // namespace sluice
