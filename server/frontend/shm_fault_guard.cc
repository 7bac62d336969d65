#include "server/frontend/shm_fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "server/core/mutex.h"

namespace sluice {
namespace {

// One guarded mapping as the handler sees it. The fields change only while `sequence` is odd
// (a sequence lock): the handler skips a slot whose sequence is odd or changed while it read the
// range. A slot being written is never the one of a mapping in use: a mapping is published before
// anyone can touch it and unpublished only by its owner's destructor.
struct Slot {
  std::atomic<uint64_t> sequence{0};
  std::atomic<uintptr_t> start{0};  // [start, end), whole pages; empty when free
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> poisoned{false};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uintptr_t>::is_always_lock_free &&
                  std::atomic<bool>::is_always_lock_free,
              "the SIGBUS handler reads these: they must not take a lock");

std::array<Slot, GuardedMapping::kMaxGuardedMappings> g_slots;

// Claiming and freeing slots, and writing them: Map and ~GuardedMapping, never the handler.
Mutex g_writers;
std::array<bool, GuardedMapping::kMaxGuardedMappings> g_claimed ABSL_GUARDED_BY(g_writers) = {};

// The SIGBUS disposition before ours; written once, before ours is installed.
struct sigaction g_previous;
std::once_flag g_install_once;
int g_install_error = 0;  // errno of a failed sigaction; written under g_install_once

void Write(Slot& slot, uintptr_t start, uintptr_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_writers) {
  const uint64_t sequence = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.start.store(start, std::memory_order_relaxed);
  slot.end.store(end, std::memory_order_relaxed);
  slot.poisoned.store(false, std::memory_order_relaxed);
  slot.sequence.store(sequence + 2, std::memory_order_release);
}

// Hands the signal on to the disposition installed before ours.
void Chain(int signal, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(signal, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(signal);
    return;
  }
  // The default action (SIG_IGN does not hold for a fault): a fault's access runs again on return
  // and ends the process; a SIGBUS sent by kill is raised again, delivered once this returns.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGBUS, &default_action, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

void OnSigbus(int signal, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // si_code > 0: the kernel's, for an access at si_addr (not kill or sigqueue).
  if (info != nullptr && info->si_code > 0) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Slot& slot : g_slots) {
      const uint64_t before = slot.sequence.load(std::memory_order_acquire);
      if ((before & 1) != 0) continue;
      const uintptr_t start = slot.start.load(std::memory_order_relaxed);
      const uintptr_t end = slot.end.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.sequence.load(std::memory_order_relaxed) != before) continue;
      if (address < start || address >= end) continue;
      void* zeros = mmap(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (zeros == MAP_FAILED) break;  // no memory for the zero pages: as without the guard
      slot.poisoned.store(true, std::memory_order_release);
      errno = saved_errno;
      return;  // the access runs again, on the zero pages
    }
  }
  errno = saved_errno;
  Chain(signal, info, context);
}

void InstallHandler() {
  // The previous disposition is read first, so that a SIGBUS arriving as ours goes in finds it.
  if (sigaction(SIGBUS, nullptr, &g_previous) != 0) {
    g_install_error = errno;
    return;
  }
  struct sigaction ours {};
  ours.sa_sigaction = OnSigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  if (sigaction(SIGBUS, &ours, nullptr) != 0) g_install_error = errno;
}

uintptr_t PageSize() { return static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

StatusOr<GuardedMapping> GuardedMapping::Map(int fd, off_t offset, size_t size) {
  std::call_once(g_install_once, InstallHandler);
  if (g_install_error != 0) {
    return absl::InternalError(
        absl::StrCat("cannot install the SIGBUS handler that guards shared memory: ",
                     std::strerror(g_install_error)));
  }
  int slot = -1;
  {
    MutexLock lock(&g_writers);
    for (size_t i = 0; i < g_claimed.size(); ++i) {
      if (!g_claimed[i]) {
        g_claimed[i] = true;
        slot = static_cast<int>(i);
        break;
      }
    }
  }
  if (slot < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kMaxGuardedMappings,
                     " shared memory regions are mapped already, the most this "
                     "server holds at once"));
  }
  void* mapping = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
  const int error = errno;
  MutexLock lock(&g_writers);
  if (mapping == MAP_FAILED) {
    g_claimed[static_cast<size_t>(slot)] = false;
    return absl::InvalidArgumentError(absl::StrCat("cannot map it: ", std::strerror(error)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t page = PageSize();
  Write(g_slots[static_cast<size_t>(slot)], start, start + (size + page - 1) / page * page);
  return GuardedMapping(slot, static_cast<char*>(mapping), size);
}

GuardedMapping::GuardedMapping(GuardedMapping&& other) noexcept
    : slot_(other.slot_), data_(other.data_), size_(other.size_) {
  other.slot_ = -1;
  other.data_ = nullptr;
  other.size_ = 0;
}

GuardedMapping& GuardedMapping::operator=(GuardedMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    slot_ = other.slot_;
    data_ = other.data_;
    size_ = other.size_;
    other.slot_ = -1;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

GuardedMapping::~GuardedMapping() { Reset(); }

void GuardedMapping::Reset() {
  if (slot_ < 0) return;
  MutexLock lock(&g_writers);
  // Unpublished before the unmap: once the range is free, another mapping may take its addresses,
  // and a fault there is not ours to hide.
  Write(g_slots[static_cast<size_t>(slot_)], 0, 0);
  munmap(data_, size_);
  g_claimed[static_cast<size_t>(slot_)] = false;
  slot_ = -1;
  data_ = nullptr;
  size_ = 0;
}

bool GuardedMapping::poisoned() const {
  return slot_ >= 0 && g_slots[static_cast<size_t>(slot_)].poisoned.load(std::memory_order_acquire);
}

}  // namespace sluice
