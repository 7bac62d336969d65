// GPU telemetry from NVML, loaded at run time with dlopen("libnvidia-ml.so.1"): no link-time
// dependency, so the same binary runs on machines without a driver (no GPU series, one log line).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
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
  // UNAVAILABLE, saying why, when it cannot be loaded or initialised.
  static StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library);
  ~Nvml();

  // One sample of every GPU NVML sees.
  StatusOr<std::vector<GpuSample>> Sample();

  struct Api;  // the NVML entry points, resolved with dlsym

 private:
  Nvml(void* handle, std::unique_ptr<Api> api);
  void* handle_;
  std::unique_ptr<Api> api_;
};

// The library Sluice loads: libnvidia-ml.so.1, or SLUICE_NVML_LIBRARY_FOR_TESTS when set (the
// tests point it at a fake NVML; operators have no reason to set it).
std::string NvmlLibraryPath();

// Samples every GPU every `interval` on its own thread and publishes into `metrics`.
class GpuTelemetry {
 public:
  GpuTelemetry(std::unique_ptr<Nvml> nvml, ServerMetrics* metrics, std::chrono::milliseconds interval);
  ~GpuTelemetry() ABSL_LOCKS_EXCLUDED(mutex_);  // stops the thread

  int gpus() const { return gpus_.load(); }  // GPUs in the last sample

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mutex_);

  std::unique_ptr<Nvml> nvml_;
  ServerMetrics* const metrics_;
  const std::chrono::milliseconds interval_;
  std::atomic<int> gpus_{0};
  Mutex mutex_;
  CondVar wake_;  // stopping_ set
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace sluice
