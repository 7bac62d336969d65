// A fake libnvidia-ml.so.1 for the metrics tests: the NVML entry points Sluice calls, answering
// fixed values for FAKE_NVML_GPUS GPUs (default 2). GPU i reports utilisation 37 + 10 i percent,
// 3 + i GiB used of 80 GiB, 123.456 + i W of a 700 W limit, 55 + i degrees and 1000 + i J used.
// Loaded through SLUICE_NVML_LIBRARY_FOR_TESTS; never shipped.
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

}  // namespace

extern "C" {

struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};

int nvmlInit_v2() {
  initialised = true;
  return kSuccess;
}
int nvmlShutdown() {
  initialised = false;
  return kSuccess;
}
const char* nvmlErrorString(int result) { return result == kSuccess ? "Success" : "Fake NVML error"; }
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
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  std::snprintf(uuid, length, "GPU-fa4e0000-0000-4000-8000-00000000000%u", IndexOf(device));
  return kSuccess;
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  std::snprintf(name, length, "Fake GPU %u", IndexOf(device));
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(void* device, NvmlUtilization* utilization) {
  utilization->gpu = 37 + 10 * IndexOf(device);
  utilization->memory = 12;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(void* device, NvmlMemory* memory) {
  memory->total = 80ull << 30;
  memory->used = (3ull + IndexOf(device)) << 30;
  memory->free = memory->total - memory->used;
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  *milliwatts = 123456 + 1000 * IndexOf(device);
  return kSuccess;
}
int nvmlDeviceGetPowerManagementLimit(void*, unsigned int* milliwatts) {
  *milliwatts = 700000;
  return kSuccess;
}
int nvmlDeviceGetTemperature(void* device, int, unsigned int* celsius) {
  *celsius = 55 + IndexOf(device);
  return kSuccess;
}
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* millijoules) {
  *millijoules = 1000000ull + 1000ull * IndexOf(device);
  return kSuccess;
}

}  // extern "C"
