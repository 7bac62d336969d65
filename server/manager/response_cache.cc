#include "server/manager/response_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/hash/hash.h"

namespace sluice {

// An entry's header, at the start of its bytes in a segment; the key's bytes follow it, then the
// outputs, each as [name size][name][dtype][rank][dims][byte size][bytes] (sizes as uint64_t).
struct ResponseCache::Entry {
  Entry* next = nullptr;  // the next entry whose key has the same hash
  Segment* segment = nullptr;
  uint64_t hash = 0;
  uint64_t space = 0;
  uint64_t key_size = 0;
  uint64_t size = 0;  // header, key and outputs, rounded up to 8: the stride to the next entry
  uint64_t outputs = 0;
  bool live = false;     // in the index (false: written but never linked, evicted, dropped)
  bool visited = false;  // a hit since it was written: a second chance at eviction

  const char* key() const { return reinterpret_cast<const char*>(this + 1); }
  const char* outputs_begin() const { return key() + key_size; }
};

struct ResponseCache::Segment {
  char* base = nullptr;
  size_t size = 0;
  size_t used = 0;
  size_t live = 0;       // live entries in it
  int readers = 0;       // Hits and insertions copying into it, outside the lock
  bool retired = false;  // out of segments_: unmapped when the last reader leaves
};

namespace {

uint64_t DefaultHash(absl::string_view bytes) { return absl::Hash<absl::string_view>{}(bytes); }

template <typename T>
void AppendPod(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Length-prefixed, so that no two different requests serialize to the same bytes.
void AppendText(std::string* out, absl::string_view text) {
  AppendPod<uint64_t>(out, text.size());
  out->append(text.data(), text.size());
}

size_t RoundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

// Where an input's bytes start in a key, relative to the key's first byte (std::string's buffer
// is at least this aligned): enough for any tensor element type.
constexpr size_t kInputAlignment = alignof(std::max_align_t);

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The usual segment: a sixteenth of the cache (evicting one drops that much at once), within
// [one page, 4 MiB]; 0 when the cache is smaller than a page (it holds nothing).
size_t SegmentBytes(size_t limit) {
  const size_t page = PageSize();
  if (limit < page) return 0;
  return std::clamp(limit / 16 / page * page, page, size_t{4} << 20);
}

size_t OutputsSize(absl::Span<const OutputView> outputs) {
  size_t size = 0;
  for (const OutputView& output : outputs) {
    size += 4 * sizeof(uint64_t) + output.name.size() + output.shape.size() * sizeof(int64_t) +
            output.bytes.size();
  }
  return size;
}

char* Put(char* at, const void* data, size_t size) {
  if (size > 0) std::memcpy(at, data, size);
  return at + size;
}
char* PutU64(char* at, uint64_t value) { return Put(at, &value, sizeof(value)); }
const char* GetU64(const char* at, uint64_t* value) {
  std::memcpy(value, at, sizeof(*value));
  return at + sizeof(*value);
}

// Calls `each` with every output stored from `at` (the entry's outputs_begin).
template <typename Each>
Status ForEachOutput(const char* at, uint64_t count, Each each) {
  std::vector<int64_t> dims;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t name_size = 0, dtype = 0, rank = 0, byte_size = 0;
    at = GetU64(at, &name_size);
    const absl::string_view name(at, name_size);
    at += name_size;
    at = GetU64(at, &dtype);
    at = GetU64(at, &rank);
    dims.resize(rank);
    if (rank > 0) std::memcpy(dims.data(), at, rank * sizeof(int64_t));
    at += rank * sizeof(int64_t);
    at = GetU64(at, &byte_size);
    SLUICE_RETURN_IF_ERROR(each(
        OutputView{name, static_cast<DataType>(dtype), dims, absl::string_view(at, byte_size)}));
    at += byte_size;
  }
  return absl::OkStatus();
}

}  // namespace

// `each` may unlink its entry, or move it to an offset at or before its own: the walk has read
// the stride first.
template <typename Each>
void ResponseCache::ForEachLiveLocked(Segment* segment, Each each) {
  for (size_t offset = 0; offset < segment->used;) {
    auto* entry = reinterpret_cast<Entry*>(segment->base + offset);
    offset += entry->size;
    if (entry->live) each(entry);
  }
}

// A segment that holds an entry of `size` bytes: the usual one, or one of its own, page-rounded.
size_t ResponseCache::SegmentSizeFor(size_t size) const {
  return std::max(segment_bytes_, RoundUp(size, PageSize()));
}

StatusOr<char*> RecordingSink::Allocate(const OutputDescription& output) {
  SLUICE_ASSIGN_OR_RETURN(char* memory, inner_->Allocate(output));
  written_.push_back({output.name, output.dtype, output.shape, memory, output.byte_size});
  return memory;
}

std::vector<OutputView> RecordingSink::Outputs() const {
  std::vector<OutputView> outputs;
  outputs.reserve(written_.size());
  for (const Written& written : written_) {
    outputs.push_back({written.name, written.dtype, written.shape,
                       absl::string_view(written.data, written.byte_size)});
  }
  return outputs;
}

ResponseCache::Hit::Hit(Hit&& other) noexcept : cache_(other.cache_), entry_(other.entry_) {
  other.entry_ = nullptr;
}

ResponseCache::Hit& ResponseCache::Hit::operator=(Hit&& other) noexcept {
  if (this != &other) {
    if (entry_ != nullptr) cache_->ReleaseReader(entry_);
    cache_ = other.cache_;
    entry_ = other.entry_;
    other.entry_ = nullptr;
  }
  return *this;
}

ResponseCache::Hit::~Hit() {
  if (entry_ != nullptr) cache_->ReleaseReader(entry_);
}

namespace {

// Copies `output` into `sink`; `name` and `shape` are scratch space the description refers to.
Status WriteOutput(const OutputView& output, OutputSink* sink, std::string* name, Shape* shape) {
  name->assign(output.name.data(), output.name.size());
  shape->assign(output.shape.begin(), output.shape.end());
  SLUICE_ASSIGN_OR_RETURN(char* memory, sink->Allocate({*name, output.dtype, *shape,
                                                        output.bytes.size(), MemoryType::kCpu}));
  if (!output.bytes.empty()) std::memcpy(memory, output.bytes.data(), output.bytes.size());
  return absl::OkStatus();
}

}  // namespace

Status WriteOutputs(absl::Span<const OutputView> outputs, OutputSink* sink) {
  std::string name;
  Shape shape;
  for (const OutputView& output : outputs)
    SLUICE_RETURN_IF_ERROR(WriteOutput(output, sink, &name, &shape));
  return absl::OkStatus();
}

Status ResponseCache::Hit::WriteTo(OutputSink* sink) const {
  std::string name;
  Shape shape;
  return ForEachOutput(entry_->outputs_begin(), entry_->outputs, [&](const OutputView& output) {
    return WriteOutput(output, sink, &name, &shape);
  });
}

ResponseCache::ResponseCache(size_t byte_limit, Hasher hasher, ResponseCacheObserver* observer)
    : byte_limit_(byte_limit),
      segment_bytes_(SegmentBytes(byte_limit)),
      hasher_(hasher != nullptr ? hasher : &DefaultHash),
      observer_(observer) {
  MutexLock lock(&mutex_);
  stats_.byte_limit = byte_limit;
  NotifyLocked();
}

ResponseCache::~ResponseCache() {
  MutexLock lock(&mutex_);
  for (Segment* segment : segments_) {
    munmap(segment->base, segment->size);
    delete segment;
  }
  segments_.clear();
}

uint64_t ResponseCache::OpenNamespace() {
  MutexLock lock(&mutex_);
  const uint64_t space = next_space_++;
  open_.insert(space);
  return space;
}

void ResponseCache::CloseNamespace(uint64_t space) {
  MutexLock lock(&mutex_);
  if (open_.erase(space) == 0) return;
  std::vector<Segment*> emptied;
  for (Segment* segment : segments_) {
    ForEachLiveLocked(segment, [&](Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      if (entry->space == space) UnlinkLocked(entry);
    });
    // Unmapped now unless something reads it or an insertion is still writing into it.
    if (segment->live == 0 && segment->readers == 0) emptied.push_back(segment);
  }
  for (Segment* segment : emptied) RetireLocked(segment);
  NotifyLocked();
}

ResponseCache::Key ResponseCache::MakeKey(uint64_t space, const InferRequest& request,
                                          const std::vector<std::string>& every_output) const {
  const std::vector<std::string> none;
  const std::vector<std::string>& requested =
      request.requested_outputs == every_output ? none : request.requested_outputs;
  std::vector<const TensorView*> inputs;
  inputs.reserve(request.inputs.size());
  size_t size = 3 * sizeof(uint64_t);
  for (const TensorView& input : request.inputs) {
    inputs.push_back(&input);
    size += 4 * sizeof(uint64_t) + input.name.size() + input.shape.size() * sizeof(int64_t) +
            input.byte_size + kInputAlignment;
  }
  for (const std::string& output : requested) size += sizeof(uint64_t) + output.size();
  // Input names are distinct (validation): sorted by name, the order a client lists them in does
  // not matter.
  std::sort(inputs.begin(), inputs.end(),
            [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  Key key;
  key.space = space;
  key.bytes.reserve(size);
  key.input_offsets.resize(request.inputs.size());
  AppendPod<uint64_t>(&key.bytes, space);
  AppendPod<uint64_t>(&key.bytes, inputs.size());
  for (const TensorView* input : inputs) {
    AppendText(&key.bytes, input->name);
    AppendPod<uint64_t>(&key.bytes, static_cast<uint64_t>(input->dtype));
    AppendPod<uint64_t>(&key.bytes, input->shape.size());
    for (int64_t dim : input->shape) AppendPod<int64_t>(&key.bytes, dim);
    AppendPod<uint64_t>(&key.bytes, input->byte_size);
    // Zeros up to an aligned offset: where they go follows from what came before (all of it in
    // the key), so they tell no two keys apart, and the bytes can be a tensor's
    // (Key::input_offsets).
    key.bytes.resize(RoundUp(key.bytes.size(), kInputAlignment), '\0');
    key.input_offsets[static_cast<size_t>(input - request.inputs.data())] = key.bytes.size();
    key.bytes.append(input->data, input->byte_size);
  }
  AppendPod<uint64_t>(&key.bytes, requested.size());
  for (const std::string& output : requested) AppendText(&key.bytes, output);
  key.hash = hasher_(key.bytes);
  return key;
}

ResponseCache::Entry* ResponseCache::FindLocked(const Key& key) {
  auto found = index_.find(key.hash);
  if (found == index_.end()) return nullptr;
  for (Entry* entry = found->second; entry != nullptr; entry = entry->next) {
    // A hash collision is not this request's answer: the whole key decides.
    if (entry->key_size == key.bytes.size() &&
        std::memcmp(entry->key(), key.bytes.data(), key.bytes.size()) == 0) {
      return entry;
    }
  }
  return nullptr;
}

ResponseCache::Hit ResponseCache::Find(const Key& key) {
  MutexLock lock(&mutex_);
  Entry* entry = FindLocked(key);
  if (entry == nullptr) return Hit();
  entry->visited = true;
  ++entry->segment->readers;
  return Hit(this, entry);
}

bool ResponseCache::Insert(const Key& key, absl::Span<const OutputView> outputs) {
  const size_t size =
      RoundUp(sizeof(Entry) + key.bytes.size() + OutputsSize(outputs), alignof(Entry));
  Entry* entry = nullptr;
  {
    MutexLock lock(&mutex_);
    if (segment_bytes_ == 0 || SegmentSizeFor(size) > byte_limit_) {
      ++stats_.too_large;
      NotifyLocked();
      return false;
    }
    if (open_.count(key.space) == 0 || FindLocked(key) != nullptr) return false;
    char* memory = ReserveLocked(size);
    if (memory == nullptr) {
      NotifyLocked();
      return false;
    }
    entry = new (memory) Entry();
    entry->segment = segments_.back();
    entry->hash = key.hash;
    entry->space = key.space;
    entry->key_size = key.bytes.size();
    entry->size = size;
    entry->outputs = outputs.size();
    ++entry->segment->readers;  // its bytes are copied outside the lock
  }
  char* at = Put(const_cast<char*>(entry->key()), key.bytes.data(), key.bytes.size());
  for (const OutputView& output : outputs) {
    at = PutU64(at, output.name.size());
    at = Put(at, output.name.data(), output.name.size());
    at = PutU64(at, static_cast<uint64_t>(output.dtype));
    at = PutU64(at, output.shape.size());
    at = Put(at, output.shape.data(), output.shape.size() * sizeof(int64_t));
    at = PutU64(at, output.bytes.size());
    at = Put(at, output.bytes.data(), output.bytes.size());
  }
  MutexLock lock(&mutex_);
  Segment* segment = entry->segment;
  --segment->readers;
  if (segment->retired) {  // evicted while it was being written
    if (segment->readers == 0) RetireLocked(segment);
    NotifyLocked();
    return false;
  }
  // Its namespace closed meanwhile, or an identical request's answer got in first: the bytes
  // written stay unused until the segment goes.
  if (open_.count(key.space) == 0 || FindLocked(key) != nullptr) {
    NotifyLocked();
    return false;
  }
  LinkLocked(entry);
  ++stats_.insertions;
  NotifyLocked();
  return true;
}

char* ResponseCache::ReserveLocked(size_t size) {
  if (!segments_.empty()) {
    Segment* newest = segments_.back();
    if (newest->size - newest->used >= size) {
      char* memory = newest->base + newest->used;
      newest->used += size;
      return memory;
    }
  }
  // A new segment, for which the oldest make room. A segment someone still reads stays mapped
  // (and counted) until they are done, so it frees nothing now.
  const size_t mapped = SegmentSizeFor(size);
  // How many of the oldest segments must go; none when even all of them would not make room
  // (segments still being read free nothing until their readers are done).
  size_t count = 0;
  for (size_t freed = 0; stats_.bytes - freed + mapped > byte_limit_; ++count) {
    if (count == segments_.size()) return nullptr;
    if (segments_[count]->readers == 0) freed += segments_[count]->size;
  }
  std::vector<Segment*> evicted(segments_.begin(),
                                segments_.begin() + static_cast<std::ptrdiff_t>(count));
  segments_.erase(segments_.begin(), segments_.begin() + static_cast<std::ptrdiff_t>(count));
  // The oldest segment nobody reads, when it has the size wanted, is used again in place (its
  // pages are resident: no mapping, no page faults, no unmapping in the steady state).
  Segment* segment = nullptr;
  for (Segment*& old : evicted) {
    if (old->readers == 0 && old->size == mapped) {
      segment = old;
      old = nullptr;
      break;
    }
  }
  if (segment != nullptr) {
    CompactLocked(segment);
    if (segment->size - segment->used < size) {  // second chances filled it: they go too
      DropAllLocked(segment);
    }
  } else {
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      for (Segment* old : evicted) EvictLocked(old, nullptr);
      NotifyLocked();
      return nullptr;
    }
    segment = new Segment();
    segment->base = static_cast<char*>(base);
    segment->size = mapped;
    stats_.bytes += mapped;
  }
  char* memory = segment->base + segment->used;
  segment->used += size;
  for (Segment* old : evicted) {
    if (old != nullptr) EvictLocked(old, segment);
  }
  segments_.push_back(segment);
  return memory;
}

void ResponseCache::CompactLocked(Segment* segment) {
  size_t kept = 0;
  ForEachLiveLocked(segment, [&](Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    UnlinkLocked(entry);
    if (!entry->visited) {
      ++stats_.evictions;
      return;
    }
    // A second chance for an answer used since it was written: it moves to the segment's front.
    const size_t size = entry->size;
    auto* moved = reinterpret_cast<Entry*>(segment->base + kept);
    if (moved != entry) std::memmove(static_cast<void*>(moved), entry, size);
    moved->visited = false;
    LinkLocked(moved);
    kept += size;
  });
  segment->used = kept;
}

void ResponseCache::DropAllLocked(Segment* segment) {
  ForEachLiveLocked(segment, [&](Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    UnlinkLocked(entry);
    ++stats_.evictions;
  });
  segment->used = 0;
}

void ResponseCache::EvictLocked(Segment* segment, Segment* into) {
  ForEachLiveLocked(segment, [&](Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    UnlinkLocked(entry);
    // A second chance for an answer used since it was written, where the new segment has room.
    if (entry->visited && into != nullptr && into->size - into->used >= entry->size) {
      auto* moved = reinterpret_cast<Entry*>(into->base + into->used);
      std::memcpy(static_cast<void*>(moved), entry, entry->size);
      into->used += entry->size;
      moved->segment = into;
      moved->visited = false;
      LinkLocked(moved);
      return;
    }
    ++stats_.evictions;
  });
  RetireLocked(segment);
}

void ResponseCache::LinkLocked(Entry* entry) {
  auto [slot, inserted] = index_.try_emplace(entry->hash, entry);
  entry->next = inserted ? nullptr : slot->second;
  slot->second = entry;
  entry->live = true;
  ++entry->segment->live;
  ++stats_.entries;
  stats_.entry_bytes += entry->size;
}

void ResponseCache::UnlinkLocked(Entry* entry) {
  auto slot = index_.find(entry->hash);
  if (slot != index_.end()) {
    Entry** link = &slot->second;
    while (*link != nullptr && *link != entry) link = &(*link)->next;
    if (*link == entry) *link = entry->next;
    if (slot->second == nullptr) index_.erase(slot);
  }
  entry->next = nullptr;
  entry->live = false;
  --entry->segment->live;
  --stats_.entries;
  stats_.entry_bytes -= entry->size;
}

void ResponseCache::RetireLocked(Segment* segment) {
  if (!segment->retired) {
    segment->retired = true;
    auto it = std::find(segments_.begin(), segments_.end(), segment);
    if (it != segments_.end()) segments_.erase(it);
  }
  if (segment->readers > 0) return;  // its last reader unmaps it
  munmap(segment->base, segment->size);
  stats_.bytes -= segment->size;
  delete segment;
}

void ResponseCache::ReleaseReader(const Entry* entry) {
  MutexLock lock(&mutex_);
  Segment* segment = entry->segment;
  if (--segment->readers == 0 && segment->retired) {
    RetireLocked(segment);
    NotifyLocked();
  }
}

void ResponseCache::NotifyLocked() {
  if (observer_ != nullptr) observer_->OnResponseCacheChanged(stats_);
}

ResponseCacheStats ResponseCache::Stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

}  // namespace sluice
