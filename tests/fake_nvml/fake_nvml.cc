// A fake libnvidia-ml.so.1 for the metrics tests: the NVML entry points Sluice calls, answering
// fixed values for FAKE_NVML_GPUS GPUs (default 2). GPU i reports utilisation 37 + 10 i percent,
// 3 + i GiB used of 80 GiB (the v2 memory query; the v1 query counts the 512 MiB the driver
// reserves as used too, as NVML's does), 123.456 + i W of a 700 W limit, 55 + i degrees and
// 1000 + i J used. Its UUID ends in i: GPU-fa4e0000-0000-4000-8000-00000000000i.
//
// FAKE_NVML_ERRORS makes queries fail: a comma-separated list of `query=code` (every GPU) or
// `query@i=code` (GPU i), where query is one of name, uuid, utilization, memory_v2, memory, power,
// power_limit, temperature, energy and code is the nvmlReturn_t to answer (3: NOT_SUPPORTED,
// 13: FUNCTION_NOT_FOUND). Read at every call, so a test can change it between samples.
//
// Built three times (tests/CMakeLists.txt): as is; with FAKE_NVML_WITHOUT_OPTIONAL, lacking
// nvmlDeviceGetPowerUsage and nvmlDeviceGetMemoryInfo_v2 (an older or partial driver); and with
// FAKE_NVML_WITHOUT_UUID, lacking nvmlDeviceGetUUID, which Sluice requires.
// Loaded through SLUICE_NVML_LIBRARY_FOR_TESTS or by path; never shipped.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct FakeDevice {
  unsigned int index;
};
FakeDevice devices[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
bool initialised = false;

unsigned int Count() {
  const char* count = std::getenv("FAKE_NVML_GPUS");
  const int value = count != nullptr ? std::atoi(count) : 2;
  return value < 0 ? 0u : (value > 8 ? 8u : static_cast<unsigned int>(value));
}

unsigned int IndexOf(void* device) { return static_cast<FakeDevice*>(device)->index; }

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kArgumentVersionMismatch = 25;

// What FAKE_NVML_ERRORS says `query` answers on `device`: an NVML error code, or kSuccess.
int ErrorFor(const char* query, void* device) {
  const char* errors = std::getenv("FAKE_NVML_ERRORS");
  if (errors == nullptr) return kSuccess;
  const std::string all = errors;
  const std::string on_every = std::string(query) + "=";
  const std::string on_this = std::string(query) + "@" + std::to_string(IndexOf(device)) + "=";
  for (size_t begin = 0; begin <= all.size();) {
    size_t end = all.find(',', begin);
    if (end == std::string::npos) end = all.size();
    const std::string entry = all.substr(begin, end - begin);
    for (const std::string& prefix : {on_every, on_this}) {
      if (entry.compare(0, prefix.size(), prefix) == 0)
        return std::atoi(entry.c_str() + prefix.size());
    }
    begin = end + 1;
  }
  return kSuccess;
}

constexpr unsigned long long kGiB = 1ull << 30;
constexpr unsigned long long kReserved = 512ull << 20;

}  // namespace

extern "C" {

struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlMemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};

int nvmlInit_v2() {
  initialised = true;
  return kSuccess;
}
int nvmlShutdown() {
  initialised = false;
  return kSuccess;
}
const char* nvmlErrorString(int result) {
  return result == kSuccess ? "Success" : "Fake NVML error";
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialised) return kUninitialized;
  *count = Count();
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= Count()) return kInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}
#ifndef FAKE_NVML_WITHOUT_UUID
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  if (int error = ErrorFor("uuid", device); error != kSuccess) return error;
  std::snprintf(uuid, length, "GPU-fa4e0000-0000-4000-8000-00000000000%u", IndexOf(device));
  return kSuccess;
}
#endif
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  if (int error = ErrorFor("name", device); error != kSuccess) return error;
  std::snprintf(name, length, "Fake GPU %u", IndexOf(device));
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(void* device, NvmlUtilization* utilization) {
  if (int error = ErrorFor("utilization", device); error != kSuccess) return error;
  utilization->gpu = 37 + 10 * IndexOf(device);
  utilization->memory = 12;
  return kSuccess;
}
#ifndef FAKE_NVML_WITHOUT_OPTIONAL
int nvmlDeviceGetMemoryInfo_v2(void* device, NvmlMemoryV2* memory) {
  if (int error = ErrorFor("memory_v2", device); error != kSuccess) return error;
  // NVML_STRUCT_VERSION(Memory, 2), as nvml.h defines it.
  if (memory->version != (static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2u << 24))) {
    return kArgumentVersionMismatch;
  }
  memory->total = 80 * kGiB;
  memory->reserved = kReserved;
  memory->used = (3ull + IndexOf(device)) * kGiB;
  memory->free = memory->total - memory->reserved - memory->used;
  return kSuccess;
}
#endif
int nvmlDeviceGetMemoryInfo(void* device, NvmlMemory* memory) {
  if (int error = ErrorFor("memory", device); error != kSuccess) return error;
  memory->total = 80 * kGiB;
  memory->used = (3ull + IndexOf(device)) * kGiB + kReserved;
  memory->free = memory->total - memory->used;
  return kSuccess;
}
#ifndef FAKE_NVML_WITHOUT_OPTIONAL
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  if (int error = ErrorFor("power", device); error != kSuccess) return error;
  *milliwatts = 123456 + 1000 * IndexOf(device);
  return kSuccess;
}
#endif
int nvmlDeviceGetPowerManagementLimit(void* device, unsigned int* milliwatts) {
  if (int error = ErrorFor("power_limit", device); error != kSuccess) return error;
  *milliwatts = 700000;
  return kSuccess;
}
int nvmlDeviceGetTemperature(void* device, int, unsigned int* celsius) {
  if (int error = ErrorFor("temperature", device); error != kSuccess) return error;
  *celsius = 55 + IndexOf(device);
  return kSuccess;
}
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* millijoules) {
  if (int error = ErrorFor("energy", device); error != kSuccess) return error;
  *millijoules = 1000000ull + 1000ull * IndexOf(device);
  return kSuccess;
}

}  // extern "C"
