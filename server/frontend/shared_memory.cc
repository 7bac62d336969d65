#include "server/frontend/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/logging.h"

namespace sluice {
namespace {

std::string StatusNotFoundMessage(const std::string& name) {
  return absl::StrCat("Unable to find system shared memory region: '", name, "'");
}

Status AlreadyRegisteredError(const std::string& name) {
  return absl::AlreadyExistsError(
      absl::StrCat("shared memory region '", name, "' already in manager (unregister it first)"));
}

}  // namespace

SharedMemoryRegion::~SharedMemoryRegion() { munmap(mapping_, mapping_size_); }

StatusOr<char*> SharedMemoryRegion::Slice(const std::string& what, uint64_t offset, uint64_t byte_size) const {
  if (offset > byte_size_ || byte_size > byte_size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("Invalid offset + byte size for shared memory region: '", name_,
                                                   "' (", what, ": ", byte_size, " bytes at offset ", offset,
                                                   " do not fit its ", byte_size_, " bytes)"));
  }
  return data_ + offset;
}

Status SharedMemoryManager::Register(const std::string& name, const std::string& key, uint64_t offset,
                                     uint64_t byte_size) {
  if (name.empty()) {
    return absl::InvalidArgumentError("'region name' is necessary to register system shared memory region");
  }
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("region '", name, "' has no key"));
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat("region '", name, "' has byte_size 0"));
  {
    MutexLock lock(&mutex_);
    if (regions_.count(name) > 0) return AlreadyRegisteredError(name);
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Unable to open shared memory region: '", key, "' (region '",
                                                   name, "': ", std::strerror(errno), ")"));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("region '", name, "': cannot stat '", key, "': ",
                                                   std::strerror(error)));
  }
  const uint64_t object_size = static_cast<uint64_t>(info.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("failed to register shared memory region '", name,
                                                   "': invalid args (", byte_size, " bytes at offset ", offset,
                                                   " run past the end of shared memory object '", key, "', ",
                                                   object_size, " bytes)"));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t mapping_size = static_cast<size_t>(byte_size + (offset - aligned));
  void* mapping = mmap(nullptr, mapping_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(aligned));
  const int error = errno;
  close(fd);  // the mapping keeps the object
  if (mapping == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat("region '", name, "': cannot map '", key, "': ",
                                                   std::strerror(error)));
  }
  std::shared_ptr<const SharedMemoryRegion> region(new SharedMemoryRegion(
      name, key, offset, byte_size, mapping, mapping_size, static_cast<char*>(mapping) + (offset - aligned)));
  {
    MutexLock lock(&mutex_);
    if (!regions_.emplace(name, region).second) return AlreadyRegisteredError(name);  // by another call meanwhile
  }
  spdlog::info("event=shm_registered region={} key={} offset={} bytes={}", name, key, offset, byte_size);
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

StatusOr<std::vector<SharedMemoryStatusEntry>> SharedMemoryManager::Regions(const std::string& name) const {
  std::vector<SharedMemoryStatusEntry> entries;
  MutexLock lock(&mutex_);
  for (const auto& [region_name, region] : regions_) {
    if (!name.empty() && region_name != name) continue;
    entries.push_back({region->name(), region->key(), region->offset(), region->byte_size()});
  }
  if (!name.empty() && entries.empty()) return absl::NotFoundError(StatusNotFoundMessage(name));
  return entries;
}

StatusOr<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryManager::Find(const std::string& name) const {
  MutexLock lock(&mutex_);
  auto it = regions_.find(name);
  if (it == regions_.end()) return absl::NotFoundError(absl::StrCat("Unable to find shared memory region: '", name, "'"));
  return it->second;
}

Status ClientSharedMemoryDisabledError() {
  return absl::UnimplementedError(
      "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.");
}

StatusOr<std::optional<SharedMemoryReference>> ReadSharedMemoryReference(ParameterFinder find,
                                                                         const std::string& what) {
  const std::optional<ParameterValue> region = find("shared_memory_region");
  const std::optional<ParameterValue> byte_size = find("shared_memory_byte_size");
  const std::optional<ParameterValue> offset = find("shared_memory_offset");
  if (!region) {
    if (byte_size || offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has shared_memory_byte_size or shared_memory_offset but no shared_memory_region"));
    }
    return std::nullopt;
  }
  if (region->kind != ParameterValue::Kind::kString || region->text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shared_memory_region must be a region name"));
  }
  SharedMemoryReference reference;
  reference.region = std::string(region->text);
  if (!byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, " names shared memory region '", reference.region,
                                                   "' without shared_memory_byte_size"));
  }
  auto integer = [&](const ParameterValue& value, const char* key) -> StatusOr<uint64_t> {
    if (value.kind == ParameterValue::Kind::kUint64) return value.uint64;
    if (value.kind == ParameterValue::Kind::kInt64 && value.int64 >= 0) return static_cast<uint64_t>(value.int64);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, " must be a non-negative integer"));
  };
  SLUICE_ASSIGN_OR_RETURN(reference.byte_size, integer(*byte_size, "shared_memory_byte_size"));
  if (offset) {
    SLUICE_ASSIGN_OR_RETURN(reference.offset, integer(*offset, "shared_memory_offset"));
  }
  return reference;
}

StatusOr<std::vector<SharedMemoryStatusEntry>> SystemSharedMemoryStatus(const SharedMemoryManager* registry,
                                                                        const std::string& name) {
  if (registry != nullptr) return registry->Regions(name);
  if (!name.empty()) return absl::NotFoundError(StatusNotFoundMessage(name));
  return std::vector<SharedMemoryStatusEntry>{};
}

Status RegisterSystemSharedMemory(SharedMemoryManager* registry, const std::string& name, const std::string& key,
                                  uint64_t offset, uint64_t byte_size) {
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
  return absl::NotFoundError(absl::StrCat("Unable to find cuda shared memory region: '", name, "'"));
}

Status RegisterCudaSharedMemory(const SharedMemoryManager* registry, const std::string& name) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  return absl::InvalidArgumentError(absl::StrCat(
      "failed to register CUDA shared memory region: '", name,
      "', GPUs not supported (this server has no CUDA shared memory; use system shared memory or send the tensors "
      "in the request)"));
}

Status UnregisterCudaSharedMemory(const SharedMemoryManager* registry) {
  if (registry == nullptr) return ClientSharedMemoryDisabledError();
  return absl::OkStatus();  // nothing is registered: unregistering one or all succeeds
}

StatusOr<char*> SharedMemoryRefs::Resolve(const std::string& what, const std::string& region, uint64_t offset,
                                         uint64_t byte_size) {
  if (manager_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " names shared memory region '", region, "', but ",
                     ClientSharedMemoryDisabledError().message()));
  }
  StatusOr<std::shared_ptr<const SharedMemoryRegion>> found = manager_->Find(region);
  if (!found.ok()) return Status(found.status().code(), absl::StrCat(found.status().message(), " (", what, ")"));
  SLUICE_ASSIGN_OR_RETURN(char* data, (*found)->Slice(what, offset, byte_size));
  held_.push_back(*std::move(found));
  return data;
}

Status SharedMemoryRefs::ResolveInput(const SharedMemoryReference& reference, TensorView* view,
                                      InferRequest* request) {
  SLUICE_ASSIGN_OR_RETURN(char* data, Resolve(absl::StrCat("input '", view->name, "'"), reference.region,
                                              reference.offset, reference.byte_size));
  view->data = data;
  view->byte_size = static_cast<size_t>(reference.byte_size);
  if (view->dtype == DataType::kBytes) {
    auto copy = std::make_unique<std::string>(data, view->byte_size);
    view->data = copy->data();
    request->owned_buffers.push_back(std::move(copy));
  }
  return absl::OkStatus();
}

Status SharedMemoryRefs::ResolveOutput(const std::string& name, const SharedMemoryReference& reference,
                                       SharedMemorySink* sink) {
  SLUICE_ASSIGN_OR_RETURN(char* data, Resolve(absl::StrCat("output '", name, "'"), reference.region,
                                              reference.offset, reference.byte_size));
  sink->Add(name, {data, reference.byte_size});
  return absl::OkStatus();
}

StatusOr<char*> SharedMemorySink::Allocate(const OutputDescription& output) {
  auto it = targets_.find(output.name);
  if (it == targets_.end()) return fallback_->Allocate(output);
  if (output.byte_size > it->second.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("output '", output.name, "' has ", output.byte_size,
                                                   " bytes, more than its shared memory slice holds (",
                                                   it->second.byte_size, " bytes)"));
  }
  describe_(output);
  return it->second.data;
}

}  // namespace sluice
