// The response cache (Triton's `response_cache { enable: true }` with `--cache-config
// local,size=BYTES`): answers of earlier requests, kept so that an identical request is answered
// without running the model. One cache serves every model of the server, within one byte bound.
//
// What makes two requests identical (ResponseCache::MakeKey): the same model version (its
// namespace, see OpenNamespace), the same inputs (name, datatype, shape and bytes; the order the
// request lists them in does not matter) and the same requested outputs, in the same order. The
// request parameters Sluice acts on do not change an answer (a queue timeout, sequence
// parameters, which only stateful models read, and those are refused a cache at load). Codec
// options (HTTP's binary_data, shared memory) change how an answer is written, not what it is:
// the cache keeps bytes and writes them through the request's own OutputSink.
//
// A 64-bit hash finds an entry, and a hit is confirmed on the whole key, which the entry keeps:
// two requests whose keys collide in the hash (by chance, or crafted) never share an answer.
//
// Memory: entries (key, outputs, a header) live in segments the cache maps itself (mmap), never
// in malloc's heap. Kept in the heap, long-lived entries between LibTorch's large transient
// buffers pinned the holes those leave: a 64 MiB cache grew the server by 640 MiB. The bound
// counts mapped segments, so the memory the cache holds is its size at most (plus a hash index
// of 16 bytes or so per entry). A new segment is made room for by the oldest ones (the oldest
// that nobody reads is reused in place); an entry of them that answered a hit since it was written
// gets a second chance (it moves to the new segment while there is room), a CLOCK-like
// approximation of least recently used. Hits must not outlive the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "server/core/infer_request.h"
#include "server/core/mutex.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"
#include "server/manager/response_cache_events.h"
#include "server/core/tensor.h"

namespace sluice {

// One output of an answer, as written to the request that missed (views of its sink's memory).
struct OutputView {
  absl::string_view name;
  DataType dtype = DataType::kFp32;
  absl::Span<const int64_t> shape;
  absl::string_view bytes;
};

// Copies `outputs` into `sink`, one Allocate and one copy each, in order; the sink's refusal (a
// shared-memory slice too small) is returned as it is.
Status WriteOutputs(absl::Span<const OutputView> outputs, OutputSink* sink);

// Stands between a request that missed and its own sink: forwards every Allocate and notes where
// each output went, so that once the request has answered OK its outputs can be copied into the
// cache. Thread-compatible, like every sink.
class RecordingSink final : public OutputSink {
 public:
  explicit RecordingSink(OutputSink* inner) : inner_(inner) {}
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::shared_ptr<AnswerConnection> Connection() override { return inner_->Connection(); }
  // The outputs written, viewing the inner sink's memory: valid only after the request answered
  // OK and before its completion returns (while that memory is still the sink's).
  std::vector<OutputView> Outputs() const;

 private:
  struct Written {
    std::string name;
    DataType dtype;
    Shape shape;
    const char* data;
    size_t byte_size;
  };
  OutputSink* const inner_;
  std::vector<Written> written_;
};

// Thread-safe.
class ResponseCache {
 public:
  // A request's identity, built once per request (one copy of its input bytes).
  struct Key {
    uint64_t space = 0;  // the model version's namespace (also the first bytes of `bytes`)
    uint64_t hash = 0;
    std::string bytes;
    // Where each input's bytes start in `bytes` (in the request's order), aligned for any element
    // type: a request that runs for its key's waiters (SingleFlight) reads its inputs there.
    std::vector<size_t> input_offsets;
  };
  using Hasher = uint64_t (*)(absl::string_view bytes);

  struct Segment;
  struct Entry;
  // An answer found: readable until the Hit is destroyed, even if it is evicted meanwhile.
  class Hit {
   public:
    Hit() = default;
    Hit(Hit&& other) noexcept;
    Hit& operator=(Hit&& other) noexcept;
    Hit(const Hit&) = delete;
    Hit& operator=(const Hit&) = delete;
    ~Hit();
    explicit operator bool() const { return entry_ != nullptr; }
    // Writes every output into `sink` (one Allocate and one copy each, in the order they were
    // cached). A sink's refusal (a shared-memory slice too small) is returned as it is.
    Status WriteTo(OutputSink* sink) const;

   private:
    friend class ResponseCache;
    Hit(ResponseCache* cache, const Entry* entry) : cache_(cache), entry_(entry) {}
    ResponseCache* cache_ = nullptr;
    const Entry* entry_ = nullptr;
  };

  // `byte_limit`: the bound on the segments together. `hasher` null: absl's (seeded per
  // process); tests pass one that collides. `observer` may be null, else outlives the cache.
  explicit ResponseCache(size_t byte_limit, Hasher hasher = nullptr,
                         ResponseCacheObserver* observer = nullptr);
  ~ResponseCache();
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  // A fresh namespace for one loaded model version: keys made in it never match another's, so a
  // version loaded again (same number, new files) starts empty.
  uint64_t OpenNamespace() ABSL_LOCKS_EXCLUDED(mutex_);
  // Drops the namespace's entries (a segment left without live entries is unmapped); answers
  // inserted into it afterwards are not kept.
  void CloseNamespace(uint64_t space) ABSL_LOCKS_EXCLUDED(mutex_);

  // The key of `request` in `space`. `request` must have been validated (its inputs' bytes match
  // their shapes). `every_output`: the model's outputs in config order; a request that names
  // exactly these, in this order, asks for what one that names none gets: the same key.
  Key MakeKey(uint64_t space, const InferRequest& request,
              const std::vector<std::string>& every_output = {}) const;

  // The answer cached for `key`, or an empty Hit.
  Hit Find(const Key& key) ABSL_LOCKS_EXCLUDED(mutex_);
  // Keeps `outputs` (copied) as the answer for `key`, evicting the oldest segments as needed.
  // Not kept (false) when the entry alone would exceed the bound, its namespace is closed, or an
  // answer for the same key is already there (two identical requests that both missed).
  bool Insert(const Key& key, absl::Span<const OutputView> outputs) ABSL_LOCKS_EXCLUDED(mutex_);

  ResponseCacheStats Stats() const ABSL_LOCKS_EXCLUDED(mutex_);
  size_t byte_limit() const { return byte_limit_; }
  size_t segment_bytes() const {
    return segment_bytes_;
  }  // the usual segment (bigger entries get their own)

 private:
  // Calls `each` with every live entry of `segment`, in the order they were written.
  template <typename Each>
  void ForEachLiveLocked(Segment* segment, Each each) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  size_t SegmentSizeFor(size_t size) const;
  Entry* FindLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Room for an entry of `size` bytes in the newest segment, mapping a segment (and evicting the
  // oldest ones for it) when needed; null when the bound cannot make room.
  char* ReserveLocked(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops `segment`'s entries (those used since written move to `into` while it has room; `into`
  // may be null) and retires it.
  void EvictLocked(Segment* segment, Segment* into) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // In place: entries used since written move to the front (a second chance), the rest go.
  void CompactLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DropAllLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void UnlinkLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void LinkLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Unmaps `segment` once nothing reads it (else its last reader does).
  void RetireLocked(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ReleaseReader(const Entry* entry) ABSL_LOCKS_EXCLUDED(mutex_);
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const size_t byte_limit_;
  const size_t segment_bytes_;
  const Hasher hasher_;
  ResponseCacheObserver* const observer_;
  mutable Mutex mutex_;
  std::deque<Segment*> segments_ ABSL_GUARDED_BY(mutex_);  // oldest first; the newest takes writes
  absl::flat_hash_map<uint64_t, Entry*> index_ ABSL_GUARDED_BY(mutex_);  // hash -> first of a chain
  std::unordered_set<uint64_t> open_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_space_ ABSL_GUARDED_BY(mutex_) = 1;
  ResponseCacheStats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace sluice
