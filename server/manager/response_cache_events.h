// What the response cache reports about itself: its figures and the observer interface the
// metrics implement (server/metrics), apart from the cache, so that an observer includes only
// this.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice {

// What the cache holds and has done, for metrics and tests.
struct ResponseCacheStats {
  size_t byte_limit = 0;
  size_t bytes = 0;        // mapped segments: never above byte_limit
  size_t entry_bytes = 0;  // what the live entries take of them (keys, outputs, headers)
  size_t entries = 0;
  uint64_t insertions = 0;
  uint64_t evictions = 0;  // entries dropped to make room (not those dropped with their version)
  uint64_t too_large = 0;  // answers not kept because one alone would exceed the whole bound
};

// Told about every change of the cache's contents, under the cache's lock: keep it cheap.
class ResponseCacheObserver {
 public:
  virtual ~ResponseCacheObserver() = default;
  virtual void OnResponseCacheChanged(const ResponseCacheStats& stats) = 0;
};

}  // namespace sluice
