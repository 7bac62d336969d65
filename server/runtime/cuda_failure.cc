#include "server/runtime/cuda_failure.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/backend.h"
#include "server/runtime/environment.h"

namespace sluice {
namespace {

struct CudaErrorCode {
  int code;
  const char* name;
  bool sticky;
};

// cudaError_t values (driver_types.h). Sticky: the documentation says the context (or the
// process) is left unusable and must be recreated (relaunched); 999 (unknown) is counted as
// sticky because after it no further work can be trusted to run.
constexpr CudaErrorCode kCudaErrors[] = {
    {2, "cudaErrorMemoryAllocation", false},
    {214, "cudaErrorECCUncorrectable", true},
    {220, "cudaErrorNvlinkUncorrectable", true},
    {600, "cudaErrorNotReady", false},
    {700, "cudaErrorIllegalAddress", true},
    {701, "cudaErrorLaunchOutOfResources", false},
    {702, "cudaErrorLaunchTimeout", true},
    {709, "cudaErrorContextIsDestroyed", true},
    {710, "cudaErrorAssert", true},
    {714, "cudaErrorHardwareStackError", true},
    {715, "cudaErrorIllegalInstruction", true},
    {716, "cudaErrorMisalignedAddress", true},
    {717, "cudaErrorInvalidAddressSpace", true},
    {718, "cudaErrorInvalidPc", true},
    {719, "cudaErrorLaunchFailure", true},
    {721, "cudaErrorTensorMemoryLeak", true},
    {911, "cudaErrorExternalDevice", true},
    {999, "cudaErrorUnknown", true},
};

const CudaErrorCode* Find(int code) {
  for (const CudaErrorCode& entry : kCudaErrors) {
    if (entry.code == code) return &entry;
  }
  return nullptr;
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Messages of sticky errors, for when no code could be queried (a CPU instance whose model ran
// CUDA work anyway). LibTorch says "CUDA error: <cudaGetErrorString>" for runtime calls and
// "CUDA driver error: <cuGetErrorString>" for driver calls; cuBLAS and cuDNN report a kernel that
// died under them as EXECUTION_FAILED.
bool StickyMessage(std::string_view message) {
  const bool cuda = Contains(message, "CUDA error") || Contains(message, "CUDA driver error") ||
                    Contains(message, "CUBLAS_STATUS_EXECUTION_FAILED") ||
                    Contains(message, "CUDNN_STATUS_EXECUTION_FAILED");
  if (!cuda) return false;
  if (Contains(message, "EXECUTION_FAILED")) return true;
  for (std::string_view sticky :
       {"illegal memory access", "an illegal memory access", "unspecified launch failure",
        "device-side assert", "misaligned address", "illegal instruction", "uncorrectable ECC",
        "uncorrectable NVLink", "launch timed out", "hardware stack error",
        "invalid program counter", "operation not supported on global/shared address space",
        "context is destroyed", "unknown error"}) {
    if (Contains(message, sticky)) return true;
  }
  return false;
}

// Allocators' failures, recognised by their text: the CPU allocator throws a plain c10::Error.
bool OutOfMemoryMessage(std::string_view message) {
  // "CUDA error: out of memory": a raw cudaMalloc that failed (PYTORCH_NO_CUDA_MEMORY_CACHING=1,
  // or a library allocating around the caching allocator); the error is not sticky.
  for (std::string_view marker :
       {"CUDA out of memory", "CUDA error: out of memory", "OutOfMemoryError",
        "DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory"}) {
    if (Contains(message, marker)) return true;
  }
  return false;
}

}  // namespace

bool IsStickyCudaError(int code) {
  const CudaErrorCode* entry = Find(code);
  return entry != nullptr && entry->sticky;
}

std::string CudaErrorName(int code) {
  const CudaErrorCode* entry = Find(code);
  return entry != nullptr ? entry->name : absl::StrCat("cudaError ", code);
}

ForwardFailureKind ClassifyForwardFailure(const ForwardFailure& failure) {
  if (failure.cuda_error && IsStickyCudaError(*failure.cuda_error))
    return ForwardFailureKind::kStickyCuda;
  if (failure.allocator_out_of_memory || failure.out_of_memory_type ||
      OutOfMemoryMessage(failure.message)) {
    return ForwardFailureKind::kOutOfMemory;
  }
  // A queried code that is not sticky overrules the text: the context still works.
  if (!failure.cuda_error && StickyMessage(failure.message)) return ForwardFailureKind::kStickyCuda;
  return ForwardFailureKind::kOther;
}

Status ForwardFailureStatus(const std::string& what, const ForwardFailure& failure) {
  const std::string message = TruncateTorchMessage(failure.message);
  switch (ClassifyForwardFailure(failure)) {
    case ForwardFailureKind::kOutOfMemory:
      return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", message));
    case ForwardFailureKind::kStickyCuda: {
      std::string text = absl::StrCat(what, ": ", message);
      if (failure.cuda_error) {
        const std::string name = CudaErrorName(*failure.cuda_error);
        if (!Contains(message, name)) absl::StrAppend(&text, " (CUDA reports ", name, ")");
      }
      absl::StrAppend(&text, "; the GPU context is unusable and the server is no longer live");
      return MarkFatal(absl::InternalError(text));
    }
    case ForwardFailureKind::kOther:
      break;
  }
  return absl::InternalError(absl::StrCat(what, ": ", message));
}

}  // namespace sluice
