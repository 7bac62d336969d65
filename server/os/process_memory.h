// The process's resident memory, as Linux counts it: what a CPU model's load is measured by.
#pragma once

#include <cstdint>

namespace sluice {

// Bytes resident now (VmRSS) and the most resident since start or the last ResetPeak (VmHWM).
// Both 0 when /proc/self/status cannot be read.
struct MemoryReading {
  uint64_t current = 0;
  uint64_t peak = 0;
};
MemoryReading ReadProcessMemory();

// Starts a new peak at the current resident size (writes 5 to /proc/self/clear_refs). False when
// the kernel refused (then the peak is since start, and a measurement over-counts, never under).
bool ResetProcessPeak();

}  // namespace sluice
