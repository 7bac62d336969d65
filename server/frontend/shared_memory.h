// System (POSIX) shared memory regions, as Triton's clients register them: a client creates an
// object with shm_open, registers (name, key, offset, byte size), and then names the region, an
// offset and a byte size in a request's input and output parameters instead of sending tensor
// bytes. Inputs are read where they lie (the request views the mapping); outputs are written
// straight into the region by the backend (the sink hands out the mapped memory). No protobuf and
// no JSON here: the gRPC and HTTP front ends both map their messages onto this, so the control
// calls, the parameters and the errors are the same over both.
//
// The client owns the object and may shrink it (ftruncate) while it is registered; an access past
// the new end would fault (SIGBUS) and end the process. Every region is a GuardedMapping
// (shm_fault_guard.h): such a fault poisons the region instead (zero pages in place of the
// object's), a poisoned region is dropped from the registry when next looked up, and a request
// that used one while in flight is answered INVALID_ARGUMENT instead of its result
// (SharedMemoryRefs::CheckIntact, called by the inference path before the answer). Which objects
// clients may register at all is the operator's choice (SharedMemoryManager::Options, from
// --client-shm-keys).
//
// Errors use Triton's wording where Triton's clients and scripts see it (Sluice's explanation
// follows in brackets):
//
//   case                                 code              message
//   register or unregister, shm off      UNIMPLEMENTED     Client shared memory is disabled. Start
//   the server
//                                                          with '--allow-client-shm=true' to
//                                                          enable.
//   register a name in use               ALREADY_EXISTS    shared memory region 'r' already in
//   manager (..) register: a key that is not one      INVALID_ARGUMENT  shared memory key '..' is
//   not a POSIX shared memory
//     POSIX name (CheckSharedMemoryKey)                    name: (..)
//   register: a key outside the          PERMISSION_DENIED shared memory key '/k' is not allowed:
//   (the prefixes,
//     operator's prefixes                                  or the flag to set)
//   register: object cannot be opened    INVALID_ARGUMENT  Unable to open shared memory region:
//   'key' (..) register: every guard slot in use    RESOURCE_EXHAUSTED  region 'r' (key '/k'): 4096
//   shared memory regions
//     (GuardedMapping::kMaxGuardedMappings)                are mapped already, ..; unregister
//     regions no longer
//                                                          in use
//   register: range past the object      INVALID_ARGUMENT  failed to register shared memory region
//   'r': invalid
//                                                          args (..)
//   status of an unknown name            NOT_FOUND         Unable to find system shared memory
//   region: 'r' CUDA status of any name              NOT_FOUND         Unable to find cuda shared
//   memory region: 'r' CUDA register (no CUDA shm here)     INVALID_ARGUMENT  failed to register
//   CUDA shared memory region: 'r',
//                                                          GPUs not supported (..)
//   a request names an unknown region    NOT_FOUND         Unable to find shared memory region: 'r'
//   (input 'x') a request's slice past the region    INVALID_ARGUMENT  Invalid offset + byte size
//   for shared memory
//                                                          region: 'r' (..)
//   a request names a region whose       INVALID_ARGUMENT  shared memory region 'r' was truncated
//   while
//     object shrank (a fault poisoned it)                  registered (..); the region is dropped
//   a region a request used shrank       INVALID_ARGUMENT  shared memory region 'r' was truncated
//   while the
//     while the request was in flight                      request used it (..), instead of the
//     result
//   a request names a region, shm off    FAILED_PRECONDITION  input 'x' names shared memory region
//   'r', but
//                                                          Client shared memory is disabled. ...
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

#include "server/core/infer_request.h"
#include "server/core/mutex.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"
#include "server/frontend/request_parameters.h"
#include "server/frontend/shm_fault_guard.h"

namespace sluice {

// One registered region, mapped read-write and guarded (shm_fault_guard.h). The mapping lives as
// long as the last reference: unregistering drops the registry's, and requests that use the
// region hold theirs until they are answered, so an unregister while in use succeeds and the
// unmap waits for them.
class SharedMemoryRegion {
 public:
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }        // of the region within the object
  uint64_t byte_size() const { return byte_size_; }  // of the region
  // `byte_size` bytes at `offset` within the region: INVALID_ARGUMENT, naming `what` and the
  // region, when they do not lie inside it (overflow-safe).
  StatusOr<char*> Slice(const std::string& what, uint64_t offset, uint64_t byte_size) const;
  // Whether the client shrank the object and an access past its new end poisoned the mapping:
  // what was read from or written to the region since is garbage. Once true, stays true.
  bool truncated() const { return mapping_.poisoned(); }

 private:
  friend class SharedMemoryManager;
  SharedMemoryRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
                     GuardedMapping mapping, char* data)
      : name_(std::move(name)),
        key_(std::move(key)),
        offset_(offset),
        byte_size_(byte_size),
        mapping_(std::move(mapping)),
        data_(data) {}

  const std::string name_;
  const std::string key_;
  const uint64_t offset_;
  const uint64_t byte_size_;
  const GuardedMapping mapping_;  // from the page that holds the region's first byte
  char* const data_;              // the region's first byte (inside the mapping)
};

struct SharedMemoryStatusEntry {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// Client shared memory follows Triton 26.05 and later: off unless the operator starts the server
// with --allow-client-shm=true (a client that truncates a registered object can fault the
// server). Off, every register and unregister call, system and CUDA, answers this (UNIMPLEMENTED,
// Triton's sentence); status calls still answer, with nothing registered.
Status ClientSharedMemoryDisabledError();

// A tensor's shared memory reference, read from its parameters (shared_memory_region,
// shared_memory_byte_size, shared_memory_offset) by either codec; nullopt when it names no region.
// INVALID_ARGUMENT for a byte size or offset without a region, a region that is not a name, a
// region without a byte size, or values that are not non-negative integers. `what`: "input 'x'"
// or "output 'y'".
struct SharedMemoryReference {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};
StatusOr<std::optional<SharedMemoryReference>> ReadSharedMemoryReference(ParameterFinder find,
                                                                         const std::string& what);

// The keys Sluice accepts: one POSIX shared memory name, portably spelled: '/' then 1 to 255
// characters, none of them '/' or NUL, and not "/." or "/..". INVALID_ARGUMENT otherwise, the key
// shown escaped. Triton hands the key to shm_open as it comes, so a key with a NUL byte is cut
// there (another object is opened than the one status reports), and glibc also takes "name"
// without the slash; Triton refuses only keys starting with its Python backend's reserved prefix
// (triton_python_backend_shm_region_), which Sluice has no use for.
Status CheckSharedMemoryKey(const std::string& key);

// --client-shm-keys: comma-separated key prefixes, each '/' then characters other than '/' and
// ',' (the start of a key), or '*' (every key). INVALID_ARGUMENT naming the entry that is neither
// (an empty entry, or an empty list, included).
StatusOr<std::vector<std::string>> ParseClientShmKeyPrefixes(const std::string& text);

// The registry. Thread-safe.
class SharedMemoryManager {
 public:
  struct Options {
    // The keys clients may register: those starting with one of these ("*": every key). Empty:
    // none, every registration is PERMISSION_DENIED naming --client-shm-keys.
    std::vector<std::string> key_prefixes;
  };

  SharedMemoryManager() : SharedMemoryManager(Options()) {}
  explicit SharedMemoryManager(Options options) : options_(std::move(options)) {}

  // Maps `byte_size` bytes at `offset` of the POSIX shared memory object `key` under `name`.
  // ALREADY_EXISTS for a name in use; INVALID_ARGUMENT for an empty name or key, a key
  // CheckSharedMemoryKey refuses, a zero size, an object that cannot be opened, or a range past
  // the object's real size (fstat; overflow-safe); PERMISSION_DENIED for a key outside the
  // options' prefixes; RESOURCE_EXHAUSTED when the process guards
  // GuardedMapping::kMaxGuardedMappings regions already; each in the table's words. An object
  // that shrinks between fstat and mmap is caught as any later shrink is (the guard).
  Status Register(const std::string& name, const std::string& key, uint64_t offset,
                  uint64_t byte_size) ABSL_LOCKS_EXCLUDED(mutex_);
  // Forgets `name` (every region when empty). A name that is not registered is not an error
  // (Triton's behaviour). Requests in flight keep their regions mapped until they are answered.
  void Unregister(const std::string& name) ABSL_LOCKS_EXCLUDED(mutex_);
  // `name`'s entry, or every region's when empty; NOT_FOUND for an unknown name. Truncated
  // regions are dropped first (as by Find), and not listed.
  StatusOr<std::vector<SharedMemoryStatusEntry>> Regions(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mutex_);
  // The region `name`; NOT_FOUND ("Unable to find shared memory region: 'name'", Triton's words
  // when a request names it). A region found truncated is dropped from the registry (logged:
  // event=shm_truncated) and answered INVALID_ARGUMENT ("... was truncated while registered").
  StatusOr<std::shared_ptr<const SharedMemoryRegion>> Find(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mutex_);
  // Drops `name` from the registry when the region registered under it is truncated (logged).
  void DropIfTruncated(const std::string& name) const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  // Takes `name`'s region out of `regions_` when it is truncated (then returns it, to be logged
  // outside the lock), else null.
  std::shared_ptr<const SharedMemoryRegion> TakeIfTruncated(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  Status CheckKeyAllowed(const std::string& key) const;

  const Options options_;
  mutable Mutex mutex_;
  // mutable: lookups (const for the requests that use the registry) drop truncated regions.
  mutable std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> regions_
      ABSL_GUARDED_BY(mutex_);
};

// The control calls as both front ends answer them (Triton's behaviour), the front end having
// checked its restrictions first. `registry` null: client shared memory is off (register and
// unregister answer ClientSharedMemoryDisabledError, status lists nothing). This server has no
// CUDA shared memory: with the registry on, CUDA status lists nothing, unregistering one or all
// succeeds and a registration is refused.
StatusOr<std::vector<SharedMemoryStatusEntry>> SystemSharedMemoryStatus(
    const SharedMemoryManager* registry, const std::string& name);
Status RegisterSystemSharedMemory(SharedMemoryManager* registry, const std::string& name,
                                  const std::string& key, uint64_t offset, uint64_t byte_size);
Status UnregisterSystemSharedMemory(SharedMemoryManager* registry, const std::string& name);
Status CudaSharedMemoryStatus(const std::string& name);  // OK (none), or NOT_FOUND for a name
Status RegisterCudaSharedMemory(const SharedMemoryManager* registry, const std::string& name);
Status UnregisterCudaSharedMemory(const SharedMemoryManager* registry);

class SharedMemorySink;

// One request's references to regions: resolves (region, offset, byte size) to memory and keeps
// each region it resolved mapped until this object is destroyed (the transport destroys it after
// the request's answer). Thread-compatible (one request).
class SharedMemoryRefs {
 public:
  // `manager` null: client shared memory is off (--allow-client-shm false); every reference fails.
  explicit SharedMemoryRefs(const SharedMemoryManager* manager) : manager_(manager) {}
  StatusOr<char*> Resolve(const std::string& what, const std::string& region, uint64_t offset,
                          uint64_t byte_size);
  // Points input `view` (name and dtype set) at `reference`'s slice. BYTES inputs are copied into
  // `request`'s owned buffers: they are checked (framing, count, UTF-8) and later split again by
  // their length prefixes, and a client rewriting its region in between could move row
  // boundaries into another request's strings in the same batch; a private copy makes the check
  // hold.
  Status ResolveInput(const SharedMemoryReference& reference, TensorView* view,
                      InferRequest* request);
  // Sends output `name` to `reference`'s slice through `sink` (SharedMemorySink::Add).
  Status ResolveOutput(const std::string& name, const SharedMemoryReference& reference,
                       SharedMemorySink* sink);
  // Whether any input or output was resolved into a region (InferRequest::shared_memory).
  bool used() const { return !held_.empty(); }
  // OK unless a region this request resolved was truncated by then (its reads and writes went to
  // zero pages, so its result is garbage): INVALID_ARGUMENT naming the region, which is dropped
  // from the registry. The inference path calls it before answering (InferenceCall).
  Status CheckIntact() const;

 private:
  const SharedMemoryManager* const manager_;
  std::vector<std::shared_ptr<const SharedMemoryRegion>> held_;
};

// An output sink that writes the outputs named in `targets` into their shared memory slices and
// hands every other output to `fallback`. A shared-memory output still gets its description from
// the fallback (name, datatype, shape: `describe` adds it) but no bytes; INVALID_ARGUMENT when the
// output is larger than its slice.
class SharedMemorySink final : public OutputSink {
 public:
  struct Slice {
    char* data = nullptr;
    uint64_t byte_size = 0;
  };
  using Describe = std::function<void(const OutputDescription&)>;
  SharedMemorySink(OutputSink* fallback, Describe describe)
      : fallback_(fallback), describe_(std::move(describe)) {}
  void Add(const std::string& output, Slice slice) { targets_[output] = slice; }
  bool empty() const { return targets_.empty(); }
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::shared_ptr<AnswerConnection> Connection() override { return fallback_->Connection(); }

 private:
  OutputSink* const fallback_;
  const Describe describe_;
  std::map<std::string, Slice> targets_;
};

}  // namespace sluice
