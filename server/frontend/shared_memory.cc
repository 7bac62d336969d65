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

std::string NotFoundMessage(const std::string& name) {
  return absl::StrCat("Unable to find system shared memory region: '", name, "'");
}

}  // namespace

SharedMemoryRegion::~SharedMemoryRegion() { munmap(mapping_, mapping_size_); }

StatusOr<char*> SharedMemoryRegion::Slice(const std::string& what, uint64_t offset, uint64_t byte_size) const {
  if (offset > byte_size_ || byte_size > byte_size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", byte_size, " bytes at offset ", offset,
                                                   " do not fit system shared memory region '", name_, "' (",
                                                   byte_size_, " bytes)"));
  }
  return data_ + offset;
}

Status SharedMemoryManager::Register(const std::string& name, const std::string& key, uint64_t offset,
                                     uint64_t byte_size) {
  if (name.empty()) return absl::InvalidArgumentError("a shared memory region needs a name");
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("region '", name, "' has no key"));
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat("region '", name, "' has byte_size 0"));
  {
    MutexLock lock(&mutex_);
    if (regions_.count(name) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("shared memory region '", name, "' is already registered; unregister it first"));
    }
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("region '", name, "': cannot open shared memory object '", key,
                                                   "': ", std::strerror(errno)));
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
    return absl::InvalidArgumentError(absl::StrCat("region '", name, "': ", byte_size, " bytes at offset ", offset,
                                                   " run past the end of shared memory object '", key, "' (",
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
    if (!regions_.emplace(name, region).second) {  // registered meanwhile by another call
      return absl::AlreadyExistsError(
          absl::StrCat("shared memory region '", name, "' is already registered; unregister it first"));
    }
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
  if (!name.empty() && entries.empty()) return absl::NotFoundError(NotFoundMessage(name));
  return entries;
}

StatusOr<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryManager::Find(const std::string& name) const {
  MutexLock lock(&mutex_);
  auto it = regions_.find(name);
  if (it == regions_.end()) return absl::NotFoundError(NotFoundMessage(name));
  return it->second;
}

Status ClientSharedMemoryDisabledError() {
  return absl::UnimplementedError(
      "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.");
}

StatusOr<char*> SharedMemoryRefs::Resolve(const std::string& what, const std::string& region, uint64_t offset,
                                         uint64_t byte_size) {
  if (manager_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " names shared memory region '", region, "', but ",
                     ClientSharedMemoryDisabledError().message()));
  }
  StatusOr<std::shared_ptr<const SharedMemoryRegion>> found = manager_->Find(region);
  if (!found.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", found.status().message()));
  SLUICE_ASSIGN_OR_RETURN(char* data, (*found)->Slice(what, offset, byte_size));
  held_.push_back(*std::move(found));
  return data;
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
