// GPU telemetry from NVML, loaded at run time with dlopen("libnvidia-ml.so.1"): no link-time
// dependency, so the same binary runs on machines without a driver (no GPU series, one log line).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/core/mutex.h"
#include "server/core/status.h"
#include "server/metrics/server_metrics.h"

namespace sluice {

// The NVML library, initialised. Thread-compatible (one poller uses it).
class Nvml {
 public:
  // `library`: what dlopen is given ("libnvidia-ml.so.1"; tests give a fake's path).
  // UNAVAILABLE, saying why, when it cannot be loaded or initialised, or lacks one of the entry
  // points every sample needs (init, shutdown, error string, device count, handle by index, UUID).
  // Every other entry point is optional: one the library lacks drops only the values it reads,
  // and Load logs the missing ones once (event=gpu_telemetry_partial).
  static StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library);
  ~Nvml();

  // One sample of every GPU NVML sees, `index` being NVML's index. A value whose query the
  // library lacks, the GPU does not support (a MIG-enabled GPU has no utilisation) or that
  // fails is left empty, never 0. Memory comes from the v2 query (nvmlDeviceGetMemoryInfo_v2),
  // or from the v1 query where the driver lacks or does not support v2. A GPU whose UUID cannot be
  // read is left out (it could not be labelled).
  StatusOr<std::vector<GpuSample>> Sample();

  // The optional entry points the library lacks, in the order Load looked for them.
  const std::vector<std::string>& missing() const { return missing_; }

  struct Api;  // the NVML entry points, resolved with dlsym

 private:
  Nvml(void* handle, std::unique_ptr<Api> api, std::vector<std::string> missing);
  void* handle_;
  std::unique_ptr<Api> api_;
  const std::vector<std::string> missing_;
};

// The library Sluice loads: libnvidia-ml.so.1, or SLUICE_NVML_LIBRARY_FOR_TESTS when set (the
// tests point it at a fake NVML; operators have no reason to set it).
std::string NvmlLibraryPath();

// The samples of the GPUs listed in `cuda_uuids` (CUDA's devices in CUDA's order, which under
// CUDA_VISIBLE_DEVICES is the listed order renumbered from 0), each with `index` set to its
// position in the list (the N of cuda:N), in that order. Samples whose UUID is not listed are
// dropped; a listed UUID that no sample has is skipped. An empty `cuda_uuids` returns `samples`
// unchanged (NVML's numbering).
std::vector<GpuSample> InCudaOrder(std::vector<GpuSample> samples,
                                   const std::vector<std::string>& cuda_uuids);

// Samples every GPU every `interval` on its own thread and publishes into `metrics`.
//
// GPU labels follow CUDA's view when `cuda_uuids` is given: only the GPUs this process's CUDA
// runtime sees are exported, each labelled with its CUDA ordinal (the N of the cuda:N its model
// instances run on), matched to NVML's GPUs by UUID. With an empty list (no CUDA runtime, e.g. a
// CPU-only host with NVML present) every GPU NVML sees is exported under NVML's index, which
// follows PCI order and need not match CUDA's.
//
// MIG: a MIG instance (CUDA_VISIBLE_DEVICES=MIG-...) has a UUID of its own that matches none of
// the whole GPUs NVML lists, and its parent GPU's utilisation, power and memory are not the
// instance's; so MIG instances are not matched: neither the instance nor its parent is exported,
// and one line per unmatched UUID says so (event=gpu_telemetry_unmatched).
class GpuTelemetry {
 public:
  struct Options {
    // How often NVML is sampled.
    std::chrono::milliseconds interval{2000};
    // "GPU-..." UUIDs of the GPUs CUDA shows this process, in CUDA's order; empty: NVML's view.
    std::vector<std::string> cuda_uuids;
  };

  GpuTelemetry(std::unique_ptr<Nvml> nvml, ServerMetrics* metrics, Options options);
  ~GpuTelemetry() ABSL_LOCKS_EXCLUDED(mutex_);  // stops the thread

  int gpus() const { return gpus_.load(); }  // GPUs exported from the last sample

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mutex_);
  // Maps `samples` to CUDA's view and exports them.
  void Publish(std::vector<GpuSample> samples);

  std::unique_ptr<Nvml> nvml_;
  ServerMetrics* const metrics_;
  const Options options_;
  std::atomic<int> gpus_{0};
  // CUDA UUIDs already reported as unmatched. Used by the constructor, then by the poller thread
  // alone (the thread starts after the constructor's use).
  std::set<std::string> reported_unmatched_;
  Mutex mutex_;
  CondVar wake_;  // stopping_ set
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace sluice
