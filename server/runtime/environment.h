// What this process runs on (LibTorch, CUDA, driver, cuDNN, GPUs, threads), and what is wrong with
// it, in words an operator can act on. ProbeRuntime asks LibTorch, the CUDA runtime and the driver
// and fills RuntimeInfo; the judgement and the formatting work on RuntimeInfo alone, so that they
// can be tested with made-up environments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/device.h"

namespace sluice {

struct GpuInfo {
  int index = 0;
  std::string name;          // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  uint64_t memory_bytes = 0;
  std::string uuid;     // "GPU-8c6f...", as nvidia-smi prints it
  std::string problem;  // non-empty: this GPU cannot run LibTorch's kernels, and why
};

struct RuntimeInfo {
  std::string torch_version;         // "2.11.0"
  bool cuda_built = false;           // LibTorch was loaded with its CUDA library
  std::string cuda_build_version;    // the CUDA LibTorch was compiled with, "13.0"
  std::string cuda_runtime_version;  // the libcudart in use, "13.0"
  bool driver_found = false;         // libcuda.so.1 (the NVIDIA driver's user-space library) loads
  std::string driver_cuda_version;   // the newest CUDA the driver supports, "13.0"
  std::string driver_version;        // "580.65.06" (from /proc/driver/nvidia/version), may be empty
  bool cuda_usable = false;          // a driver, a GPU, and a CUDA build of LibTorch
  int cuda_device_count = 0;
  std::vector<GpuInfo> gpus;
  std::string cudnn_version;         // the cuDNN LibTorch was compiled with, "9.19.0"
  std::string cudnn_loaded_version;  // the cuDNN library loaded at run time
  bool cudnn_enabled = true;         // LibTorch's cuDNN switches (process-wide)
  bool cudnn_benchmark = false;
  bool cudnn_deterministic = false;
  bool cudnn_allow_tf32 = false;
  int intra_op_threads = 0;  // LibTorch's defaults for this process
  int inter_op_threads = 0;
  std::string problem;  // why CUDA is not usable; empty when it is
};

// What this process runs on. With `touch_gpus`, runs a tiny kernel and a tiny convolution on
// every GPU to find the ones this LibTorch build cannot run on (each keeps a CUDA context, some
// hundred MiB, for the life of the process); GPUs with a problem do not count as usable.
RuntimeInfo ProbeRuntime(bool touch_gpus = true);

// A LibTorch message cut to 1 KiB (enough to act on, not a C++ backtrace), for statuses and logs.
std::string TruncateTorchMessage(std::string message);

// "13.0" from 13000 (CUDA) or "9.19.0" from 91900 (cuDNN, with minor_divisor 100); empty for <= 0.
std::string VersionFromInt(long version, int major_divisor, int minor_divisor);
// cuDNN's own encoding: 9.x and later major*10000 + minor*100 + patch, 8.x and earlier
// major*1000 + minor*100 + patch (8907 is 8.9.7).
std::string CudnnVersionFromInt(long version);

// The driver's version ("580.159.04") from the first line of /proc/driver/nvidia/version: the
// first token after "Kernel Module" made of digits and dots. Both spellings the driver writes:
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." (proprietary) and
// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." (open).
// Empty when the line holds none.
std::string DriverVersionFromProc(const std::string& line);

// Things that are wrong or surprising, one sentence each, with what to do. `gpu_required`: the
// server was started with --device cuda.
std::vector<std::string> EnvironmentProblems(const RuntimeInfo& info, bool gpu_required);

// The report `sluice-server --print-env` prints: one "name: value" line per fact, then the
// problems, then `more` (whole lines: the operator libraries and their problems), then one line
// that says where models will run under `policy` (--device). `benchmark_mode` is
// --cudnn-benchmark.
std::string FormatEnvironment(const RuntimeInfo& info, const std::string& benchmark_mode,
                              DevicePolicy policy, const std::string& more = "");

}  // namespace sluice
