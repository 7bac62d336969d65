// server/os/process_memory.h: resident memory grows with memory touched, the peak keeps the most,
// and a reset peak starts again from what is resident now.
#include "server/os/process_memory.h"

#include <sys/mman.h>

#include <cstring>

#include <gtest/gtest.h>

namespace sluice {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(ProcessMemoryTest, TouchedMemoryRaisesCurrentAndPeakAndAResetPeakFollowsCurrent) {
  const MemoryReading before = ReadProcessMemory();
  ASSERT_GT(before.current, 0u) << "/proc/self/status unreadable";
  EXPECT_GE(before.peak, before.current);

  // mmap rather than new: the pages go back to the kernel at munmap, not to an allocator's cache.
  constexpr size_t kBytes = 64 * kMiB;
  void* block = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(block, MAP_FAILED);
  std::memset(block, 1, kBytes);
  const MemoryReading touched = ReadProcessMemory();
  EXPECT_GE(touched.current, before.current + 60 * kMiB);
  EXPECT_GE(touched.peak, touched.current);
  munmap(block, kBytes);

  const MemoryReading released = ReadProcessMemory();
  EXPECT_LE(released.current + 60 * kMiB, touched.current);
  // The peak remembers (within the kernel's per-thread counting slack).
  EXPECT_GE(released.peak + 4 * kMiB, touched.current);
  if (!ResetProcessPeak()) GTEST_SKIP() << "the kernel refused clear_refs";
  const MemoryReading reset = ReadProcessMemory();
  EXPECT_LT(reset.peak + 32 * kMiB, touched.current);
  EXPECT_GE(reset.peak, reset.current);
}

}  // namespace
}  // namespace sluice
