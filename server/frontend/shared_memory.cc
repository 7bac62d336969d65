#include "server/frontend/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/message_text.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/logging.h"

namespace sluice {
namespace {

std::string StatusNotFoundMessage(const std::string& name) {
  return absl::StrCat("Unable to find system shared memory region: '", QuoteClientText(name), "'");
}

Status AlreadyRegisteredError(const std::string& name) {
  return absl::AlreadyExistsError(absl::StrCat("shared memory region '", QuoteClientText(name),
                                               "' already in manager (unregister it first)"));
}

constexpr char kTruncatedAdvice[] =
    "its object shrank below the registered range (ftruncate) and the server's access past the end "
    "was "
    "caught; the region is unregistered: recreate the object at its full size and register it "
    "again";

void LogTruncated(const SharedMemoryRegion& region) {
  spdlog::warn("event=shm_truncated region={} key={} offset={} bytes={} action=unregistered",
               region.name(), region.key(), region.offset(), region.byte_size());
}

}  // namespace

Status CheckSharedMemoryKey(const std::string& key) {
  const char* problem = nullptr;
  if (key.find('\0') != std::string::npos) {
    problem = "it holds a NUL byte";
  } else if (key.size() < 2 || key[0] != '/') {
    problem = "it must be '/' followed by a name";
  } else if (key.find('/', 1) != std::string::npos) {
    problem = "only its first character may be '/'";
  } else if (key == "/." || key == "/..") {
    problem = "'.' and '..' name no object";
  } else if (key.size() > 256) {
    problem = "the name after '/' is longer than 255 characters";
  }
  if (problem == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("shared memory key '", QuoteClientText(key),
                                                 "' is not a POSIX shared memory name: ", problem,
                                                 " (as /my_tensor_0)"));
}

StatusOr<std::vector<std::string>> ParseClientShmKeyPrefixes(const std::string& text) {
  std::vector<std::string> prefixes;
  for (absl::string_view each : absl::StrSplit(text, ',')) {
    const bool valid = each == "*" || (!each.empty() && each[0] == '/' &&
                                       each.find('/', 1) == absl::string_view::npos);
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("--client-shm-keys: '", absl::CHexEscape(each),
                       "' is no key prefix; give comma-separated prefixes of shared memory keys, "
                       "each '/' then the start of "
                       "a name without '/' (as /myapp_), or '*' for every key"));
    }
    prefixes.emplace_back(each);
  }
  return prefixes;
}

Status SharedMemoryManager::CheckKeyAllowed(const std::string& key) const {
  for (const std::string& prefix : options_.key_prefixes) {
    if (prefix == "*" || absl::StartsWith(key, prefix)) return absl::OkStatus();
  }
  if (options_.key_prefixes.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared memory key '", QuoteClientText(key),
        "' is not allowed: this server accepts no key until its operator names them: start it with "
        "--client-shm-keys=<prefix>[,<prefix>...] (the keys' common start, as /myapp_), or '*' for "
        "every key"));
  }
  std::vector<std::string> quoted;
  for (const std::string& prefix : options_.key_prefixes)
    quoted.push_back(absl::StrCat("'", prefix, "'"));
  return absl::PermissionDeniedError(
      absl::StrCat("shared memory key '", QuoteClientText(key),
                   "' is not allowed: this server accepts keys starting with ",
                   absl::StrJoin(quoted, ", "), " (--client-shm-keys)"));
}

StatusOr<char*> SharedMemoryRegion::Slice(const std::string& what, uint64_t offset,
                                          uint64_t byte_size) const {
  if (offset > byte_size_ || byte_size > byte_size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid offset + byte size for shared memory region: '",
                     QuoteClientText(name_), "' (", what, ": ", byte_size, " bytes at offset ",
                     offset, " do not fit its ", byte_size_, " bytes)"));
  }
  return data_ + offset;
}

Status SharedMemoryManager::Register(const std::string& name, const std::string& key,
                                     uint64_t offset, uint64_t byte_size) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "'region name' is necessary to register system shared memory region");
  }
  if (key.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("region '", QuoteClientText(name), "' has no key"));
  SLUICE_RETURN_IF_ERROR(CheckSharedMemoryKey(key));
  if (byte_size == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("region '", QuoteClientText(name), "' has byte_size 0"));
  SLUICE_RETURN_IF_ERROR(CheckKeyAllowed(key));
  std::shared_ptr<const SharedMemoryRegion> truncated;
  {
    MutexLock lock(&mutex_);
    truncated = TakeIfTruncated(name);  // a truncated region's name is free again
    if (regions_.count(name) > 0) return AlreadyRegisteredError(name);
  }
  if (truncated) LogTruncated(*truncated);
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Unable to open shared memory region: '",
                                                   QuoteClientText(key), "' (region '", name,
                                                   "': ", std::strerror(errno), ")"));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("region '", QuoteClientText(name),
                                                   "': cannot stat '", QuoteClientText(key),
                                                   "': ", std::strerror(error)));
  }
  const uint64_t object_size = static_cast<uint64_t>(info.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "failed to register shared memory region '", QuoteClientText(name), "': invalid args (",
        byte_size, " bytes at offset ", offset, " run past the end of shared memory object '",
        QuoteClientText(key), "', ", object_size, " bytes)"));
  }
  // The object may shrink from here on (even before the mmap): the guard catches the access.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t mapping_size = static_cast<size_t>(byte_size + (offset - aligned));
  StatusOr<GuardedMapping> mapping =
      GuardedMapping::Map(fd, static_cast<off_t>(aligned), mapping_size);
  close(fd);  // the mapping keeps the object
  if (!mapping.ok()) {
    const Status& status = mapping.status();
    return Status(status.code(), absl::StrCat("region '", QuoteClientText(name), "' (key '",
                                              QuoteClientText(key), "'): ", status.message(),
                                              status.code() == absl::StatusCode::kResourceExhausted
                                                  ? "; unregister regions no longer in use"
                                                  : ""));
  }
  char* data = mapping->data() + (offset - aligned);
  std::shared_ptr<const SharedMemoryRegion> region(
      new SharedMemoryRegion(name, key, offset, byte_size, *std::move(mapping), data));
  {
    MutexLock lock(&mutex_);
    if (!regions_.emplace(name, region).second)
      return AlreadyRegisteredError(name);  // by another call meanwhile
  }
  spdlog::info("event=shm_registered region=\"{}\" key=\"{}\" offset={} bytes={}",
               QuoteClientText(name), QuoteClientText(key), offset, byte_size);
  return absl::OkStatus();
}

void SharedMemoryManager::Unregister(const std::string& name) {
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> dropped;
  {
    MutexLock lock(&mutex_);
    if (name.empty()) {
      dropped.swap(regions_);
    } else if (auto it = regions_.find(name); it != regions_.end()) {
      dropped.insert(regions_.extract(it));
    }
  }
  for (const auto& [region, mapping] : dropped) {
    spdlog::info("event=shm_unregistered region={} in_use={}", region, mapping.use_count() > 1);
  }
  // Unmapped here, or by the last request that still uses it.
}

StatusOr<std::vector<SharedMemoryStatusEntry>> SharedMemoryManager::Regions(
    const std::string& name) const {
  std::vector<SharedMemoryStatusEntry> entries;
  std::vector<std::shared_ptr<const SharedMemoryRegion>> truncated;
  {
    MutexLock lock(&mutex_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      const auto& region = it->second;
      if (region->truncated()) {
        truncated.push_back(region);
        it = regions_.erase(it);
        continue;
      }
      if (name.empty() || it->first == name) {
        entries.push_back({region->name(), region->key(), region->offset(), region->byte_size()});
      }
      ++it;
    }
  }
  for (const auto& region : truncated) LogTruncated(*region);
  if (!name.empty() && entries.empty()) return absl::NotFoundError(StatusNotFoundMessage(name));
  return entries;
}

std::shared_ptr<const SharedMemoryRegion> SharedMemoryManager::TakeIfTruncated(
    const std::string& name) const {
  auto it = regions_.find(name);
  if (it == regions_.end() || !it->second->truncated()) return nullptr;
  std::shared_ptr<const SharedMemoryRegion> region = std::move(it->second);
  regions_.erase(it);
  return region;
}

StatusOr<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryManager::Find(
    const std::string& name) const {
  std::shared_ptr<const SharedMemoryRegion> truncated;
  {
    MutexLock lock(&mutex_);
    truncated = TakeIfTruncated(name);
    if (!truncated) {
      auto it = regions_.find(name);
      if (it == regions_.end()) {
        return absl::NotFoundError(
            absl::StrCat("Unable to find shared memory region: '", QuoteClientText(name), "'"));
      }
      return it->second;
    }
  }
  LogTruncated(*truncated);
  return absl::InvalidArgumentError(absl::StrCat("shared memory region '", QuoteClientText(name),
                                                 "' was truncated while registered (key '",
                                                 truncated->key(), "': ", kTruncatedAdvice, ")"));
}

void SharedMemoryManager::DropIfTruncated(const std::string& name) const {
  std::shared_ptr<const SharedMemoryRegion> truncated;
  {
    MutexLock lock(&mutex_);
    truncated = TakeIfTruncated(name);
  }
  if (truncated) LogTruncated(*truncated);
}

Status ClientSharedMemoryDisabledError() {
  return absl::UnimplementedError(
      "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "
      "enable.");
}

StatusOr<std::optional<SharedMemoryReference>> ReadSharedMemoryReference(ParameterFinder find,
                                                                         const std::string& what) {
  const std::optional<ParameterValue> region = find("shared_memory_region");
  const std::optional<ParameterValue> byte_size = find("shared_memory_byte_size");
  const std::optional<ParameterValue> offset = find("shared_memory_offset");
  if (!region) {
    if (byte_size || offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          " has shared_memory_byte_size or shared_memory_offset but no shared_memory_region"));
    }
    return std::nullopt;
  }
  if (region->kind != ParameterValue::Kind::kString || region->text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shared_memory_region must be a region name"));
  }
  SharedMemoryReference reference;
  reference.region = std::string(region->text);
  if (!byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, " names shared memory region '",
                                                   QuoteClientText(reference.region),
                                                   "' without shared_memory_byte_size"));
  }
  auto integer = [&](const ParameterValue& value, const char* key) -> StatusOr<uint64_t> {
    if (value.kind == ParameterValue::Kind::kUint64) return value.uint64;
    if (value.kind == ParameterValue::Kind::kInt64 && value.int64 >= 0)
      return static_cast<uint64_t>(value.int64);
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", key, " must be a non-negative integer"));
  };
  SLUICE_ASSIGN_OR_RETURN(reference.byte_size, integer(*byte_size, "shared_memory_byte_size"));
  if (offset) {
    SLUICE_ASSIGN_OR_RETURN(reference.offset, integer(*offset, "shared_memory_offset"));
  }
  return reference;
}

StatusOr<std::vector<SharedMemoryStatusEntry>> SystemSharedMemoryStatus(
    const SharedMemoryManager* registry, const std::string& name) {
  if (registry != nullptr) return registry->Regions(name);
  if (!name.empty()) return absl::NotFoundError(StatusNotFoundMessage(name));
  return std::vector<SharedMemoryStatusEntry>{};
}

Status RegisterSystemSharedMemory(SharedMemoryManager* registry, const std::string& name,
                                  const std::string& key, uint64_t offset, uint64_t byte_size) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  return registry->Register(name, key, offset, byte_size);
}

Status UnregisterSystemSharedMemory(SharedMemoryManager* registry, const std::string& name) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  registry->Unregister(name);
  return absl::OkStatus();
}

Status CudaSharedMemoryStatus(const std::string& name) {
  if (name.empty()) return absl::OkStatus();  // nothing registered
  return absl::NotFoundError(
      absl::StrCat("Unable to find cuda shared memory region: '", QuoteClientText(name), "'"));
}

Status RegisterCudaSharedMemory(const SharedMemoryManager* registry, const std::string& name) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  return absl::InvalidArgumentError(
      absl::StrCat("failed to register CUDA shared memory region: '", QuoteClientText(name),
                   "', GPUs not supported (this server has no CUDA shared memory; use system "
                   "shared memory or send the tensors "
                   "in the request)"));
}

Status UnregisterCudaSharedMemory(const SharedMemoryManager* registry) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  return absl::OkStatus();  // nothing is registered: unregistering one or all succeeds
}

StatusOr<char*> SharedMemoryRefs::Resolve(const std::string& what, const std::string& region,
                                          uint64_t offset, uint64_t byte_size) {
  if (manager_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, " names shared memory region '",
                                                      QuoteClientText(region), "', but ",
                                                      ClientSharedMemoryDisabledError().message()));
  }
  StatusOr<std::shared_ptr<const SharedMemoryRegion>> found = manager_->Find(region);
  if (!found.ok())
    return Status(found.status().code(), absl::StrCat(found.status().message(), " (", what, ")"));
  SLUICE_ASSIGN_OR_RETURN(char* data, (*found)->Slice(what, offset, byte_size));
  held_.push_back(*std::move(found));
  return data;
}

Status SharedMemoryRefs::CheckIntact() const {
  for (const auto& region : held_) {
    if (!region->truncated()) continue;
    if (manager_ != nullptr) manager_->DropIfTruncated(region->name());
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory region '", region->name(),
        "' was truncated while the request used it (key '", region->key(), "': ", kTruncatedAdvice,
        "); the request's inputs or outputs there are lost, so it has no result"));
  }
  return absl::OkStatus();
}

Status SharedMemoryRefs::ResolveInput(const SharedMemoryReference& reference, TensorView* view,
                                      InferRequest* request) {
  SLUICE_ASSIGN_OR_RETURN(char* data,
                          Resolve(absl::StrCat("input '", QuoteClientText(view->name), "'"),
                                  reference.region, reference.offset, reference.byte_size));
  view->data = data;
  view->byte_size = static_cast<size_t>(reference.byte_size);
  if (view->dtype == DataType::kBytes) {
    auto copy = std::make_unique<std::string>(data, view->byte_size);
    view->data = copy->data();
    request->owned_buffers.push_back(std::move(copy));
  }
  return absl::OkStatus();
}

Status SharedMemoryRefs::ResolveOutput(const std::string& name,
                                       const SharedMemoryReference& reference,
                                       SharedMemorySink* sink) {
  SLUICE_ASSIGN_OR_RETURN(
      char* data, Resolve(absl::StrCat("output '", QuoteClientText(name), "'"), reference.region,
                          reference.offset, reference.byte_size));
  sink->Add(name, {data, reference.byte_size});
  return absl::OkStatus();
}

StatusOr<char*> SharedMemorySink::Allocate(const OutputDescription& output) {
  auto it = targets_.find(output.name);
  if (it == targets_.end()) return fallback_->Allocate(output);
  if (output.byte_size > it->second.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output '", QuoteClientText(output.name), "' has ", output.byte_size,
        " bytes, more than its shared memory slice holds (", it->second.byte_size, " bytes)"));
  }
  describe_(output);
  return it->second.data;
}

}  // namespace sluice
