// How a failed forward pass is answered, decided from evidence gathered after it rather than from
// the exception's text alone. Neither LibTorch nor CUDA headers: CUDA error codes are plain ints
// (cudaError_t values; the driver API's CUresult uses the same numbers for every code below), so
// the decision is unit-tested without a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "server/core/status.h"

namespace sluice {

enum class ForwardFailureKind {
  kOutOfMemory,  // RESOURCE_EXHAUSTED: the instance serves on
  kStickyCuda,   // INTERNAL marked fatal: the CUDA context is unusable, the process must restart
  kOther,        // INTERNAL: this request failed, nothing else did
};

// What the runtime knows about a failed forward pass.
struct ForwardFailure {
  // The exception's text (without a backtrace).
  std::string message;
  // The exception was a c10::OutOfMemoryError (its type rarely survives: the TorchScript
  // interpreter rethrows as std::runtime_error and AOTInductor's runner rewraps every error).
  bool out_of_memory_type = false;
  // GPU instances: the code the instance's stream (or, when that is clean, the thread's last
  // error) returned when queried after the failure; nullopt on the CPU. A sticky error is
  // returned by every later call, so this sees it whatever the exception said.
  std::optional<int> cuda_error;
  // GPU instances: the caching allocator's out-of-memory counter for the device advanced during
  // the forward pass. The allocator clears the CUDA error before it throws, so no code is left
  // to query; the counter is what survives any rewrapping of the message.
  bool allocator_out_of_memory = false;
};

// A sticky error: every later CUDA call in the process fails with it (illegal address, device-side
// assert, launch failure, uncorrectable ECC, ...).
bool IsStickyCudaError(int code);
// "cudaErrorIllegalAddress" for 700; "cudaError 12345" for a code it does not know.
std::string CudaErrorName(int code);

// The decision. A sticky code wins over everything (an allocation can fail because the context
// is already broken); then out of memory (counter, type, or an allocator's message: the CPU
// allocator's failures carry no type); with no code (CPU instances), the message's known sticky
// forms still count as sticky.
ForwardFailureKind ClassifyForwardFailure(const ForwardFailure& failure);

// The status for `failure`: `what` leads the message, then the (truncated) torch message, and for
// a sticky error the CUDA error's name when the message does not already say it.
// kOutOfMemory -> RESOURCE_EXHAUSTED; kStickyCuda -> INTERNAL marked fatal (MarkFatal);
// kOther -> INTERNAL.
Status ForwardFailureStatus(const std::string& what, const ForwardFailure& failure);

}  // namespace sluice
