#include "server/metrics/gpu_telemetry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/logging.h"
#include "server/os/threads.h"

namespace sluice {
namespace {

// NVML's C API, declared from its documentation (nvml.h is not needed to build).
using NvmlReturn = int;  // nvmlReturn_t
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotSupported = 3;
constexpr NvmlReturn kNvmlFunctionNotFound = 13;
constexpr NvmlReturn kNvmlArgumentVersionMismatch = 25;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of the sample period memory was read or written
};
struct NvmlMemory {                      // nvmlMemory_t
  unsigned long long total, free, used;  // bytes; used counts the driver-reserved memory
};
struct NvmlMemoryV2 {                              // nvmlMemory_v2_t
  unsigned int version;                            // kNvmlMemoryV2Version
  unsigned long long total, reserved, free, used;  // bytes; reserved: set aside by the driver
};
static_assert(sizeof(NvmlMemoryV2) == 40,
              "nvmlMemory_v2_t: an unsigned int padded to 8, then 4 x 8 bytes");
// NVML_STRUCT_VERSION(Memory, 2): the struct's size, and the version in the top byte.
constexpr unsigned int kNvmlMemoryV2Version =
    static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2u << 24);
constexpr int kNvmlTemperatureGpu = 0;
constexpr unsigned int kNvmlStringLength = 96;

}  // namespace

struct Nvml::Api {
  // Required.
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*device_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned int);
  // Optional: null when the library lacks them.
  NvmlReturn (*name)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*memory_v2)(NvmlDevice, NvmlMemoryV2*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*power)(NvmlDevice, unsigned int*);        // milliwatts
  NvmlReturn (*power_limit)(NvmlDevice, unsigned int*);  // milliwatts
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*);
  NvmlReturn (*energy)(NvmlDevice, unsigned long long*);  // millijoules
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
  std::vector<std::string> required_missing;
  std::vector<std::string> optional_missing;
  auto resolve = [&](auto& function, const char* symbol, bool required) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, symbol));
    if (function == nullptr) (required ? required_missing : optional_missing).push_back(symbol);
  };
  resolve(api->init, "nvmlInit_v2", true);
  resolve(api->shutdown, "nvmlShutdown", true);
  resolve(api->error_string, "nvmlErrorString", true);
  resolve(api->device_count, "nvmlDeviceGetCount_v2", true);
  resolve(api->device_by_index, "nvmlDeviceGetHandleByIndex_v2", true);
  resolve(api->uuid, "nvmlDeviceGetUUID", true);
  resolve(api->name, "nvmlDeviceGetName", false);
  resolve(api->utilization, "nvmlDeviceGetUtilizationRates", false);
  resolve(api->memory_v2, "nvmlDeviceGetMemoryInfo_v2", false);
  resolve(api->memory, "nvmlDeviceGetMemoryInfo", false);
  resolve(api->power, "nvmlDeviceGetPowerUsage", false);
  resolve(api->power_limit, "nvmlDeviceGetPowerManagementLimit", false);
  resolve(api->temperature, "nvmlDeviceGetTemperature", false);
  resolve(api->energy, "nvmlDeviceGetTotalEnergyConsumption", false);
  if (!required_missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(
        absl::StrCat(library, " lacks ", absl::StrJoin(required_missing, ", ")));
  }
  if (NvmlReturn result = api->init(); result != kNvmlSuccess) {
    const std::string why = api->error_string(result);
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("nvmlInit failed: ", why));
  }
  if (!optional_missing.empty()) {
    const char* memory_query =
        api->memory_v2 != nullptr ? "v2" : (api->memory != nullptr ? "v1" : "none");
    spdlog::info(
        "event=gpu_telemetry_partial missing={} memory_query={} action=\"the GPU series that need "
        "a missing "
        "entry point are not exported\"",
        absl::StrJoin(optional_missing, ","), memory_query);
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api), std::move(optional_missing)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api, std::vector<std::string> missing)
    : handle_(handle), api_(std::move(api)), missing_(std::move(missing)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

StatusOr<std::vector<GpuSample>> Nvml::Sample() {
  unsigned int count = 0;
  if (NvmlReturn result = api_->device_count(&count); result != kNvmlSuccess) {
    return absl::UnavailableError(
        absl::StrCat("nvmlDeviceGetCount failed: ", api_->error_string(result)));
  }
  std::vector<GpuSample> samples;
  for (unsigned int i = 0; i < count; ++i) {
    NvmlDevice device = nullptr;
    if (api_->device_by_index(i, &device) != kNvmlSuccess) continue;
    GpuSample sample;
    sample.index = static_cast<int>(i);
    char text[kNvmlStringLength] = {};
    if (api_->uuid(device, text, kNvmlStringLength) != kNvmlSuccess) continue;
    sample.uuid = text;
    if (api_->name != nullptr && api_->name(device, text, kNvmlStringLength) == kNvmlSuccess)
      sample.name = text;
    // Any answer but success (NOT_SUPPORTED above all: a MIG-enabled GPU has no utilisation)
    // leaves the value empty, so that its series is absent rather than a plausible 0.
    if (NvmlUtilization utilization{};
        api_->utilization != nullptr && api_->utilization(device, &utilization) == kNvmlSuccess) {
      sample.utilization = utilization.gpu / 100.0;
    }
    NvmlReturn memory_v2_result = kNvmlFunctionNotFound;
    if (NvmlMemoryV2 memory{}; api_->memory_v2 != nullptr) {
      memory.version = kNvmlMemoryV2Version;
      memory_v2_result = api_->memory_v2(device, &memory);
      if (memory_v2_result == kNvmlSuccess) {
        sample.memory_used_bytes = static_cast<double>(memory.used);
        sample.memory_total_bytes = static_cast<double>(memory.total);
      }
    }
    // v1 only where this driver has no v2 answer at all; a GPU that fails v2 otherwise fails v1
    // too.
    const bool try_v1 = memory_v2_result == kNvmlFunctionNotFound ||
                        memory_v2_result == kNvmlNotSupported ||
                        memory_v2_result == kNvmlArgumentVersionMismatch;
    if (NvmlMemory memory{};
        try_v1 && api_->memory != nullptr && api_->memory(device, &memory) == kNvmlSuccess) {
      sample.memory_used_bytes = static_cast<double>(memory.used);
      sample.memory_total_bytes = static_cast<double>(memory.total);
    }
    if (unsigned int milliwatts = 0;
        api_->power != nullptr && api_->power(device, &milliwatts) == kNvmlSuccess) {
      sample.power_watts = milliwatts / 1000.0;
    }
    if (unsigned int milliwatts = 0;
        api_->power_limit != nullptr && api_->power_limit(device, &milliwatts) == kNvmlSuccess) {
      sample.power_limit_watts = milliwatts / 1000.0;
    }
    if (unsigned int celsius = 0;
        api_->temperature != nullptr &&
        api_->temperature(device, kNvmlTemperatureGpu, &celsius) == kNvmlSuccess) {
      sample.temperature_celsius = celsius;
    }
    if (unsigned long long millijoules = 0;
        api_->energy != nullptr && api_->energy(device, &millijoules) == kNvmlSuccess) {
      sample.energy_joules = static_cast<double>(millijoules) / 1000.0;
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<GpuSample> InCudaOrder(std::vector<GpuSample> samples,
                                   const std::vector<std::string>& cuda_uuids) {
  if (cuda_uuids.empty()) return samples;
  std::vector<GpuSample> ordered;
  for (size_t ordinal = 0; ordinal < cuda_uuids.size(); ++ordinal) {
    auto it = std::find_if(samples.begin(), samples.end(), [&](const GpuSample& sample) {
      return sample.uuid == cuda_uuids[ordinal];
    });
    if (it == samples.end()) continue;
    GpuSample sample = std::move(*it);
    samples.erase(it);
    sample.index = static_cast<int>(ordinal);
    ordered.push_back(std::move(sample));
  }
  return ordered;
}

GpuTelemetry::GpuTelemetry(std::unique_ptr<Nvml> nvml, ServerMetrics* metrics, Options options)
    : nvml_(std::move(nvml)), metrics_(metrics), options_(std::move(options)) {
  // The first sample is taken before the constructor returns, so the series exist from the start.
  if (StatusOr<std::vector<GpuSample>> samples = nvml_->Sample(); samples.ok())
    Publish(*std::move(samples));
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

void GpuTelemetry::Publish(std::vector<GpuSample> samples) {
  for (size_t ordinal = 0; ordinal < options_.cuda_uuids.size(); ++ordinal) {
    const std::string& uuid = options_.cuda_uuids[ordinal];
    const bool matched = std::any_of(samples.begin(), samples.end(),
                                     [&](const GpuSample& sample) { return sample.uuid == uuid; });
    if (matched || !reported_unmatched_.insert(uuid).second) continue;
    spdlog::warn(
        "event=gpu_telemetry_unmatched cuda_device={} uuid={} reason=\"no GPU that NVML lists has "
        "this "
        "UUID; MIG instances are not matched\" action=\"no GPU series for cuda:{}\"",
        ordinal, uuid, ordinal);
  }
  std::vector<GpuSample> exported = InCudaOrder(std::move(samples), options_.cuda_uuids);
  gpus_ = static_cast<int>(exported.size());
  metrics_->SetGpus(exported);
}

void GpuTelemetry::Loop() {
  NameThisThread("sluice-nvml");
  MutexLock lock(&mutex_);
  bool failing = false;
  for (;;) {
    // Sleeps for the interval, or until the destructor sets stopping_ (other wake-ups are
    // spurious).
    const auto deadline = std::chrono::steady_clock::now() + options_.interval;
    while (!stopping_ && wake_.WaitUntil(&mutex_, deadline)) {
    }
    if (stopping_) return;
    lock.Unlock();
    StatusOr<std::vector<GpuSample>> samples = nvml_->Sample();
    if (samples.ok()) {
      if (failing) spdlog::info("event=gpu_telemetry_recovered gpus={}", samples->size());
      failing = false;
      Publish(*std::move(samples));
    } else if (!failing) {
      // No stale values: the GPU series go until NVML answers again. One line per outage.
      failing = true;
      spdlog::warn(
          "event=gpu_telemetry_failed reason=\"{}\" action=\"GPU series removed until NVML "
          "answers\"",
          samples.status().message());
      gpus_ = 0;
      metrics_->SetGpus({});
    }
    lock.Lock();
  }
}

}  // namespace sluice
