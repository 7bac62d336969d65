#include "server/os/process_memory.h"

#include <fstream>
#include <string>

namespace sluice {

MemoryReading ReadProcessMemory() {
  MemoryReading reading;
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    uint64_t kib = 0;
    if (key == "VmRSS:" && status >> kib) reading.current = kib * 1024;
    if (key == "VmHWM:" && status >> kib) reading.peak = kib * 1024;
    status.ignore(1 << 12, '\n');
  }
  if (reading.peak < reading.current) reading.peak = reading.current;
  return reading;
}

bool ResetProcessPeak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace sluice
