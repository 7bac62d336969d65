// Memory mapped from a shared memory object that another process owns, guarded against that
// process shrinking the object. A client can ftruncate an object after the server mapped it; the
// kernel then answers any access to the pages past the new end with SIGBUS, which ends the
// process. Guarded, such a fault instead poisons the mapping: a process-wide SIGBUS handler finds
// the faulting address among the guarded mappings, replaces that whole mapping in place with
// private zero pages (mmap MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS), marks it poisoned and
// returns, so the faulting read or write runs again, on harmless memory. What was read from or
// written to a poisoned mapping is garbage: its user checks poisoned() before trusting it.
//
// The handler is installed once, by the first Map. A SIGBUS outside the guarded mappings (or sent
// by kill) goes to the handler that was installed before (its sa_sigaction or sa_handler), or,
// when that was the default action or SIG_IGN, ends the process as it would have ended without
// this guard. A SIGBUS handler installed later by someone else replaces this one.
//
// The handler reads a fixed table of kMaxGuardedMappings slots without locks (a sequence counter
// per slot; atomics that are always lock-free) and makes one system call (mmap); it takes no
// lock and allocates nothing. Mapping and unmapping take a mutex among themselves only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "server/core/status.h"

namespace sluice {

// One mapping, read-write and shared, guarded from Map until destruction. Move-only.
// Thread-safe: poisoned() may be read from any thread while others read or write the memory.
class GuardedMapping {
 public:
  // How many mappings the process guards at once (every registry together): 4096, a bound on
  // the handler's scan (128 KiB of slots, scanned only on a fault) and far above what clients
  // register in practice (a region or two per tensor).
  static constexpr size_t kMaxGuardedMappings = 4096;

  // Maps `size` bytes (> 0) of `fd` from `offset` (a multiple of the page size) and guards them.
  // RESOURCE_EXHAUSTED when kMaxGuardedMappings mappings are guarded already; INVALID_ARGUMENT
  // with mmap's reason when the mapping fails; INTERNAL when the handler cannot be installed.
  // The object may be shorter than the range, or shrink at any time: its pages past the end
  // poison the mapping when touched.
  static StatusOr<GuardedMapping> Map(int fd, off_t offset, size_t size);

  GuardedMapping(GuardedMapping&& other) noexcept;
  GuardedMapping& operator=(GuardedMapping&& other) noexcept;
  GuardedMapping(const GuardedMapping&) = delete;
  GuardedMapping& operator=(const GuardedMapping&) = delete;
  // Stops guarding, then unmaps (a fault on the range after this is no longer this guard's).
  ~GuardedMapping();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether an access faulted and the mapping now holds zero pages instead of the object's.
  // Once true, stays true.
  bool poisoned() const;

 private:
  GuardedMapping(int slot, char* data, size_t size) : slot_(slot), data_(data), size_(size) {}
  void Reset();

  int slot_ = -1;  // in the table; -1: moved from
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace sluice
