#include "server/metrics/gpu_telemetry.h"

#include <dlfcn.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "server/core/logging.h"
#include "server/core/thread_name.h"

namespace sluice {
namespace {

// NVML's C API, declared from its documentation (nvml.h is not needed to build).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of the sample period memory was read or written
};
struct NvmlMemory {
  unsigned long long total, free, used;  // bytes
};
constexpr int kNvmlTemperatureGpu = 0;
constexpr unsigned int kNvmlStringLength = 96;

}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*device_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*name)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*power)(NvmlDevice, unsigned int*);        // milliwatts
  NvmlReturn (*power_limit)(NvmlDevice, unsigned int*);  // milliwatts
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*);
  NvmlReturn (*energy)(NvmlDevice, unsigned long long*);  // millijoules; optional
};

std::string NvmlLibraryPath() {
  const char* override_path = std::getenv("SLUICE_NVML_LIBRARY_FOR_TESTS");
  return override_path != nullptr && *override_path != '\0' ? override_path : "libnvidia-ml.so.1";
}

StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::UnavailableError(absl::StrCat("cannot load ", library, " (no NVIDIA driver?): ",
                                               error != nullptr ? error : "unknown error"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto resolve = [&](auto& function, const char* symbol, bool required = true) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, symbol));
    if (function == nullptr && required) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  resolve(api->init, "nvmlInit_v2");
  resolve(api->shutdown, "nvmlShutdown");
  resolve(api->error_string, "nvmlErrorString");
  resolve(api->device_count, "nvmlDeviceGetCount_v2");
  resolve(api->device_by_index, "nvmlDeviceGetHandleByIndex_v2");
  resolve(api->uuid, "nvmlDeviceGetUUID");
  resolve(api->name, "nvmlDeviceGetName");
  resolve(api->utilization, "nvmlDeviceGetUtilizationRates");
  resolve(api->memory, "nvmlDeviceGetMemoryInfo");
  resolve(api->power, "nvmlDeviceGetPowerUsage");
  resolve(api->power_limit, "nvmlDeviceGetPowerManagementLimit");
  resolve(api->temperature, "nvmlDeviceGetTemperature");
  resolve(api->energy, "nvmlDeviceGetTotalEnergyConsumption", /*required=*/false);
  if (!missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat(library, " lacks ", missing));
  }
  if (NvmlReturn result = api->init(); result != 0) {
    const std::string why = api->error_string(result);
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("nvmlInit failed: ", why));
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

StatusOr<std::vector<GpuSample>> Nvml::Sample() {
  unsigned int count = 0;
  if (NvmlReturn result = api_->device_count(&count); result != 0) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount failed: ", api_->error_string(result)));
  }
  std::vector<GpuSample> samples;
  for (unsigned int i = 0; i < count; ++i) {
    NvmlDevice device = nullptr;
    if (api_->device_by_index(i, &device) != 0) continue;
    GpuSample sample;
    sample.index = static_cast<int>(i);
    char text[kNvmlStringLength] = {};
    if (api_->uuid(device, text, kNvmlStringLength) == 0) sample.uuid = text;
    if (api_->name(device, text, kNvmlStringLength) == 0) sample.name = text;
    // A query a GPU does not support leaves its value at 0 rather than dropping the GPU.
    if (NvmlUtilization utilization{}; api_->utilization(device, &utilization) == 0) {
      sample.utilization = utilization.gpu / 100.0;
    }
    if (NvmlMemory memory{}; api_->memory(device, &memory) == 0) {
      sample.memory_used_bytes = static_cast<double>(memory.used);
      sample.memory_total_bytes = static_cast<double>(memory.total);
    }
    if (unsigned int milliwatts = 0; api_->power(device, &milliwatts) == 0) sample.power_watts = milliwatts / 1000.0;
    if (unsigned int milliwatts = 0; api_->power_limit(device, &milliwatts) == 0) {
      sample.power_limit_watts = milliwatts / 1000.0;
    }
    if (unsigned int celsius = 0; api_->temperature(device, kNvmlTemperatureGpu, &celsius) == 0) {
      sample.temperature_celsius = celsius;
    }
    if (unsigned long long millijoules = 0; api_->energy != nullptr && api_->energy(device, &millijoules) == 0) {
      sample.energy_joules = static_cast<double>(millijoules) / 1000.0;
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

GpuTelemetry::GpuTelemetry(std::unique_ptr<Nvml> nvml, ServerMetrics* metrics,
                           std::chrono::milliseconds interval)
    : nvml_(std::move(nvml)), metrics_(metrics), interval_(interval) {
  // The first sample is taken before the constructor returns, so the series exist from the start.
  if (StatusOr<std::vector<GpuSample>> samples = nvml_->Sample(); samples.ok()) {
    gpus_ = static_cast<int>(samples->size());
    metrics_->SetGpus(*samples);
  }
  thread_ = std::thread([this] { Loop(); });
}

GpuTelemetry::~GpuTelemetry() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
  }
  wake_.SignalAll();
  thread_.join();
}

void GpuTelemetry::Loop() {
  NameThisThread("sluice-nvml");
  MutexLock lock(&mutex_);
  bool failing = false;
  for (;;) {
    // Sleeps for interval_, or until the destructor sets stopping_ (other wake-ups are spurious).
    const auto deadline = std::chrono::steady_clock::now() + interval_;
    while (!stopping_ && wake_.WaitUntil(&mutex_, deadline)) {
    }
    if (stopping_) return;
    lock.Unlock();
    StatusOr<std::vector<GpuSample>> samples = nvml_->Sample();
    if (samples.ok()) {
      if (failing) spdlog::info("event=gpu_telemetry_recovered gpus={}", samples->size());
      failing = false;
      gpus_ = static_cast<int>(samples->size());
      metrics_->SetGpus(*samples);
    } else if (!failing) {
      // No stale values: the GPU series go until NVML answers again. One line per outage.
      failing = true;
      spdlog::warn("event=gpu_telemetry_failed reason=\"{}\" action=\"GPU series removed until NVML answers\"",
                   samples.status().message());
      gpus_ = 0;
      metrics_->SetGpus({});
    }
    lock.Lock();
  }
}

}  // namespace sluice
