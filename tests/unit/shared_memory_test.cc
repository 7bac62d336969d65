// System shared memory regions over real POSIX shared memory objects: registration and its
// errors, status, unregister while a request still holds the region, slices checked against the
// region (overflow-safe), requests whose inputs view a region and whose outputs are written into
// one; keys (one POSIX name, within the operator's prefixes); a client that shrinks its object
// while it is registered (the fault guard, shm_fault_guard.h) and the guard's bound.
#include "server/frontend/shared_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grpc_service.pb.h"
#include "server/core/logging.h"
#include "server/grpc/grpc_codec.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A POSIX shared memory object of `size` bytes, unlinked at the end of the test.
class ShmObject {
 public:
  explicit ShmObject(size_t size)
      : key_("/sluice_test_" + std::to_string(getpid()) + "_" + std::to_string(next_++)) {
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    data_ = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    size_ = size;
    close(fd);
  }
  ~ShmObject() {
    munmap(data_, size_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  char* data() { return data_; }
  // What a hostile client does: shrinks the object while the server has it mapped. The test's
  // own mapping past the new end must not be touched after this (it is not guarded).
  void Truncate(off_t size) {
    const int fd = shm_open(key_.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, size), 0);
    close(fd);
  }

 private:
  static inline int next_ = 0;
  std::string key_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

// The keys ShmObject makes, as an operator would allow them (--client-shm-keys=/sluice_test_).
SharedMemoryManager::Options TestKeys() {
  SharedMemoryManager::Options options;
  options.key_prefixes = {"/sluice_test_"};
  return options;
}

TEST(SharedMemoryTest, RegisterStatusUnregister) {
  ShmObject object(8192);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("a", object.key(), 0, 4096).ok());
  ASSERT_TRUE(
      manager.Register("b", object.key(), 5000, 100).ok());  // an offset that is not page-aligned
  Status again = manager.Register("a", object.key(), 0, 16);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("shared memory region 'a' already in manager"));

  auto all = manager.Regions("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].name, "b");
  EXPECT_EQ((*all)[1].key, object.key());
  EXPECT_EQ((*all)[1].offset, 5000u);
  EXPECT_EQ((*all)[1].byte_size, 100u);
  auto unknown = manager.Regions("nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("Unable to find system shared memory region: 'nope'"));

  // The region "b" is the object's bytes 5000..5099.
  std::memcpy(object.data() + 5000, "hello", 5);
  auto b = manager.Find("b");
  ASSERT_TRUE(b.ok());
  auto slice = (*b)->Slice("input 'x'", 0, 5);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(std::string(*slice, 5), "hello");

  manager.Unregister("a");
  manager.Unregister("a");  // not registered any more: not an error
  EXPECT_EQ(manager.Regions("").value().size(), 1u);
  manager.Unregister("");  // all
  EXPECT_TRUE(manager.Regions("").value().empty());
}

TEST(SharedMemoryTest, RegistrationErrorsSayWhatIsWrong) {
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  struct Case {
    std::string name, key;
    uint64_t offset, byte_size;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"", object.key(), 0, 16,
            "'region name' is necessary to register system shared memory region"},
           {"r", "", 0, 16, "has no key"},
           {"r", object.key(), 0, 0, "byte_size 0"},
           {"r", "/sluice_test_missing_object", 0, 16,
            "Unable to open shared memory region: '/sluice_test_missing_object'"},
           {"r", object.key(), 0, 4097,
            "failed to register shared memory region 'r': invalid args (4097 bytes at offset 0 "
            "run past the end of shared memory object"},
           {"r", object.key(), 4000, 97, "run past the end"},
           {"r", object.key(), huge, 2, "run past the end"},  // offset + size wraps
           {"r", object.key(), 16, huge, "run past the end"},
       }) {
    const Status status = manager.Register(c.name, c.key, c.offset, c.byte_size);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  ASSERT_TRUE(manager.Register("r", object.key(), 0, 64).ok());
  auto region = manager.Find("r").value();
  EXPECT_TRUE(region->Slice("x", 0, 64).ok());
  EXPECT_TRUE(region->Slice("x", 64, 0).ok());
  EXPECT_THAT(region->Slice("input 'x'", 60, 8).status().message(),
              HasSubstr("Invalid offset + byte size for shared memory region: 'r' (input 'x': 8 "
                        "bytes at offset 60 do "
                        "not fit its 64 bytes)"));
  EXPECT_FALSE(region->Slice("x", huge, 2).ok());
  EXPECT_FALSE(region->Slice("x", 1, huge).ok());
}

TEST(SharedMemoryTest, AnUnregisteredRegionStaysMappedWhileARequestHoldsIt) {
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("r", object.key(), 0, 4096).ok());
  auto refs = std::make_unique<SharedMemoryRefs>(&manager);
  auto data = refs->Resolve("input 'x'", "r", 128, 4);
  ASSERT_TRUE(data.ok());
  manager.Unregister("r");
  EXPECT_EQ(manager.Find("r").status().code(),
            absl::StatusCode::kNotFound);  // new requests cannot use it
  std::memcpy(*data, "late", 4);  // the request's view is still mapped (ASan would catch otherwise)
  EXPECT_EQ(std::string(object.data() + 128, 4), "late");
  refs.reset();  // the request is answered: now unmapped
  SharedMemoryRefs off(nullptr);
  EXPECT_EQ(off.Resolve("input 'x'", "r", 0, 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  SharedMemoryRefs fresh(&manager);
  EXPECT_THAT(fresh.Resolve("input 'x'", "r", 0, 4).status().message(),
              HasSubstr("Unable to find shared memory region: 'r' (input 'x')"));
}

TEST(SharedMemoryTest, RequestsReadInputsFromAndWriteOutputsToRegions) {
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("in", object.key(), 0, 1024).ok());
  ASSERT_TRUE(manager.Register("out", object.key(), 1024, 64).ok());
  const float values[3] = {1, 2, 3};
  std::memcpy(object.data() + 16, values, sizeof(values));

  inference::ModelInferRequest proto;
  proto.set_model_name("m");
  auto* shm_input = proto.add_inputs();
  shm_input->set_name("a");
  shm_input->set_datatype("FP32");
  shm_input->add_shape(1);
  shm_input->add_shape(3);
  (*shm_input->mutable_parameters())["shared_memory_region"].set_string_param("in");
  (*shm_input->mutable_parameters())["shared_memory_byte_size"].set_int64_param(12);
  (*shm_input->mutable_parameters())["shared_memory_offset"].set_int64_param(16);
  auto* raw_input =
      proto.add_inputs();  // the one raw entry belongs to the input not in shared memory
  raw_input->set_name("b");
  raw_input->set_datatype("INT64");
  raw_input->add_shape(1);
  const int64_t seven = 7;
  proto.add_raw_input_contents(std::string(reinterpret_cast<const char*>(&seven), 8));

  SharedMemoryRefs refs(&manager);
  auto request = InferRequestFromProto(proto, &refs);
  ASSERT_TRUE(request.ok()) << request.status();
  const TensorView& a = (*request)->inputs[0];
  EXPECT_EQ(a.byte_size, 12u);
  EXPECT_EQ(std::memcmp(a.data, values, 12), 0);
  object.data()[16] = 'Z';  // viewed where it lies (the server's own mapping of it), not copied
  EXPECT_EQ(a.data[0], 'Z');
  EXPECT_EQ((*request)->inputs[1].data, proto.raw_input_contents(0).data());

  // Strings in a region are copied once: they are checked, then split again by their length
  // prefixes, and the client must not be able to change them in between.
  inference::ModelInferRequest strings;
  strings.set_model_name("m");
  auto* text = strings.add_inputs();
  text->set_name("s");
  text->set_datatype("BYTES");
  text->add_shape(1);
  (*text->mutable_parameters())["shared_memory_region"].set_string_param("in");
  (*text->mutable_parameters())["shared_memory_byte_size"].set_int64_param(6);
  (*text->mutable_parameters())["shared_memory_offset"].set_int64_param(512);
  std::memcpy(object.data() + 512, "\x02\0\0\0ok", 6);
  auto string_request = InferRequestFromProto(strings, &refs);
  ASSERT_TRUE(string_request.ok()) << string_request.status();
  const TensorView& s_view = (*string_request)->inputs[0];
  object.data()[516] = 'X';  // the client rewrites its region after the request was read
  EXPECT_EQ(std::string(s_view.data, s_view.byte_size), std::string("\x02\0\0\0ok", 6));

  // Errors: a slice past the region, an unknown region, a byte size without a region, shared
  // memory off, and raw entries counted against every input.
  auto with = [&](const char* key, auto set) {
    inference::ModelInferRequest changed = proto;
    set((*changed.mutable_inputs(0)->mutable_parameters())[key]);
    SharedMemoryRefs scoped(&manager);
    return InferRequestFromProto(changed, &scoped).status();
  };
  EXPECT_THAT(with("shared_memory_byte_size", [](auto& p) { p.set_int64_param(2000); }).message(),
              HasSubstr("Invalid offset + byte size for shared memory region: 'in' (input 'a': "
                        "2000 bytes at offset 16"));
  EXPECT_THAT(with("shared_memory_region", [](auto& p) { p.set_string_param("nope"); }).message(),
              HasSubstr("Unable to find shared memory region: 'nope'"));
  EXPECT_THAT(with("shared_memory_offset", [](auto& p) { p.set_int64_param(-1); }).message(),
              HasSubstr("shared_memory_offset must be a non-negative integer"));
  inference::ModelInferRequest no_region = proto;
  no_region.mutable_inputs(0)->mutable_parameters()->erase("shared_memory_region");
  EXPECT_THAT(
      InferRequestFromProto(no_region, &refs).status().message(),
      HasSubstr("has shared_memory_byte_size or shared_memory_offset but no shared_memory_region"));
  EXPECT_EQ(InferRequestFromProto(proto, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  inference::ModelInferRequest extra_raw = proto;
  extra_raw.add_raw_input_contents("x");
  EXPECT_THAT(InferRequestFromProto(extra_raw, &refs).status().message(),
              HasSubstr("raw_input_contents has 2 entries for 1 inputs not in shared memory"));

  // An output into "out": described in the response with an empty raw entry, bytes in the region.
  inference::ModelInferResponse response;
  ResponseSink response_sink(&response);
  SharedMemorySink sink(&response_sink,
                        [&](const OutputDescription& output) { response_sink.Describe(output); });
  auto out = refs.Resolve("output 'y'", "out", 8, 16);
  ASSERT_TRUE(out.ok());
  sink.Add("y", {*out, 16});
  const std::string y = "y", z = "z";
  const Shape shape = {1, 3};
  auto y_memory = sink.Allocate({y, DataType::kFp32, shape, 12, MemoryType::kCpu});
  ASSERT_TRUE(y_memory.ok());
  std::memcpy(*y_memory, "written!", 8);
  EXPECT_EQ(std::string(object.data() + 1024 + 8, 8), "written!");
  auto z_memory =
      sink.Allocate({z, DataType::kFp32, shape, 12, MemoryType::kCpu});  // not in shared memory
  ASSERT_TRUE(z_memory.ok());
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(0).name(), "y");
  EXPECT_THAT(response.outputs(0).shape(), ::testing::ElementsAre(1, 3));
  ASSERT_EQ(response.raw_output_contents_size(), 2);
  EXPECT_TRUE(response.raw_output_contents(0).empty());
  EXPECT_EQ(response.raw_output_contents(1).size(), 12u);
  auto too_big = sink.Allocate({y, DataType::kFp32, shape, 17, MemoryType::kCpu});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("output 'y' has 17 bytes, more than its shared memory slice"));
}

TEST(SharedMemoryTest, ControlCallsAnswerAsTriton) {
  const std::string disabled =
      "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "
      "enable.";
  // Off (no registry): register and unregister, system and CUDA, refused; status answers, empty.
  for (const Status& status :
       {RegisterSystemSharedMemory(nullptr, "r", "/k", 0, 8),
        UnregisterSystemSharedMemory(nullptr, ""), UnregisterSystemSharedMemory(nullptr, "r"),
        RegisterCudaSharedMemory(nullptr, "c"), UnregisterCudaSharedMemory(nullptr)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(status.message(), disabled);
  }
  EXPECT_TRUE(SystemSharedMemoryStatus(nullptr, "").value().empty());
  EXPECT_EQ(SystemSharedMemoryStatus(nullptr, "r").status().message(),
            "Unable to find system shared memory region: 'r'");

  // On: the registry answers; CUDA lists nothing, unregisters fine, refuses a registration.
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(RegisterSystemSharedMemory(&manager, "r", object.key(), 0, 64).ok());
  EXPECT_EQ(SystemSharedMemoryStatus(&manager, "r").value().size(), 1u);
  EXPECT_TRUE(UnregisterSystemSharedMemory(&manager, "r").ok());
  EXPECT_TRUE(SystemSharedMemoryStatus(&manager, "").value().empty());
  EXPECT_TRUE(CudaSharedMemoryStatus("").ok());
  const Status cuda_status = CudaSharedMemoryStatus("c");
  EXPECT_EQ(cuda_status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cuda_status.message(), "Unable to find cuda shared memory region: 'c'");
  EXPECT_TRUE(UnregisterCudaSharedMemory(&manager).ok());
  const Status cuda_register = RegisterCudaSharedMemory(&manager, "c");
  EXPECT_EQ(cuda_register.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cuda_register.message(),
              HasSubstr("failed to register CUDA shared memory region: 'c', GPUs not supported"));
}

// A client shrinks its object to nothing while it is registered and a request reads and writes
// the region: without the guard the first access ends the process with SIGBUS. With it the
// accesses land on zero pages, the region is marked truncated, the request's references say so,
// and the registry drops the region when it is next looked up.
TEST(SharedMemoryTest, ATruncatedObjectPoisonsItsRegionInsteadOfEndingTheProcess) {
  ShmObject object(8192);
  std::memset(object.data(), 7, 8192);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("r", object.key(), 0, 8192).ok());
  SharedMemoryRefs refs(&manager);
  auto input = refs.Resolve("input 'x'", "r", 0, 8192);
  ASSERT_TRUE(input.ok());
  EXPECT_EQ((*input)[4100], 7);
  EXPECT_TRUE(refs.CheckIntact().ok());

  object.Truncate(0);
  const volatile char* read = *input;
  EXPECT_EQ(read[4100], 0);  // faults, then reads a zero page
  volatile char* written = *input;
  written[6000] = 'w';  // writes to the zero pages, harmlessly
  EXPECT_EQ(read[6000], 'w');
  EXPECT_EQ(manager.Find("r").status().code(), absl::StatusCode::kInvalidArgument);

  const Status intact = refs.CheckIntact();
  EXPECT_EQ(intact.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(intact.message(),
              HasSubstr("shared memory region 'r' was truncated while the request used it (key '" +
                        object.key() + "'"));
  EXPECT_THAT(intact.message(),
              HasSubstr("recreate the object at its full size and register it again"));
  // Dropped from the registry (by the lookup above): status lists nothing, the name is free again.
  EXPECT_EQ(manager.Find("r").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager.Regions("").value().empty());
}

TEST(SharedMemoryTest, FindRefusesARegionFoundTruncatedAndDropsIt) {
  ShmObject object(8192);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("head", object.key(), 0, 4096).ok());
  ASSERT_TRUE(manager.Register("tail", object.key(), 4096, 4096).ok());
  SharedMemoryRefs refs(&manager);
  auto head = refs.Resolve("input 'a'", "head", 0, 4096);
  auto tail = refs.Resolve("output 'b'", "tail", 0, 4096);
  ASSERT_TRUE(head.ok() && tail.ok());

  object.Truncate(4096);  // the tail's page is gone, the head's is not
  std::memset(*tail, 1,
              4096);  // an output written into the region: faults, then lands on zero pages
  (*head)[0] = 'h';   // still the object's page
  EXPECT_EQ(object.data()[0], 'h');

  const auto found = manager.Find("tail");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(found.status().message(),
              HasSubstr("shared memory region 'tail' was truncated while registered (key '" +
                        object.key() + "'"));
  EXPECT_EQ(manager.Find("tail").status().code(), absl::StatusCode::kNotFound);  // dropped
  EXPECT_TRUE(manager.Find("head").ok());
  auto listed = manager.Regions("");
  ASSERT_EQ(listed.value().size(), 1u);
  EXPECT_EQ(listed.value()[0].name, "head");
  EXPECT_EQ(refs.CheckIntact().code(),
            absl::StatusCode::kInvalidArgument);  // this request used the tail

  // The name is free again: the client recreates its object and registers it anew.
  object.Truncate(8192);
  ASSERT_TRUE(manager.Register("tail", object.key(), 4096, 4096).ok());
  SharedMemoryRefs again(&manager);
  ASSERT_TRUE(again.Resolve("output 'b'", "tail", 0, 4).ok());
  EXPECT_TRUE(again.CheckIntact().ok());
}

// A SIGBUS that is no registered region's still ends the process, as without the guard.
TEST(SharedMemoryDeathTest, AFaultOutsideTheRegionsStillEndsTheProcess) {
  ShmObject registered(4096);
  SharedMemoryManager manager(TestKeys());
  ASSERT_TRUE(manager.Register("r", registered.key(), 0, 4096).ok());  // the guard is installed
  ShmObject other(8192);
  other.Truncate(0);
  EXPECT_EXIT(
      {
        volatile char* unguarded = other.data();
        unguarded[100] = 1;
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(SharedMemoryTest, KeysMustBeOnePosixName) {
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  // An embedded NUL: shm_open would see only the part before it (this object) while status would
  // report the whole key.
  const std::string with_nul = object.key() + std::string("\0/../other", 10);
  Status status = manager.Register("r", with_nul, 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("is not a POSIX shared memory name: it holds a NUL byte"));
  EXPECT_THAT(status.message(), HasSubstr("\\x00/../other"));  // shown escaped
  for (const auto& [key, problem] : std::vector<std::pair<std::string, std::string>>{
           {object.key().substr(1), "it must be '/' followed by a name"},
           {"/", "it must be '/' followed by a name"},
           {"/sluice_test_a/b", "only its first character may be '/'"},
           {"//sluice_test_a", "only its first character may be '/'"},
           {"/.", "'.' and '..' name no object"},
           {"/..", "'.' and '..' name no object"},
           {"/" + std::string(256, 'k'), "longer than 255 characters"}}) {
    status = manager.Register("r", key, 0, 64);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(status.message(), HasSubstr(problem)) << key;
  }
  EXPECT_TRUE(CheckSharedMemoryKey("/" + std::string(255, 'k')).ok());
  EXPECT_TRUE(manager.Regions("").value().empty());
  EXPECT_TRUE(manager.Register("r", object.key(), 0, 64).ok());
}

TEST(SharedMemoryTest, OnlyKeysTheOperatorAllowsAreRegistered) {
  ShmObject object(4096);  // /sluice_test_<pid>_<n>
  // No prefixes (--allow-client-shm=true without --client-shm-keys): nothing, and the message says
  // which flag to set.
  SharedMemoryManager closed;
  Status status = closed.Register("r", object.key(), 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(),
              HasSubstr("shared memory key '" + object.key() + "' is not allowed"));
  EXPECT_THAT(status.message(), HasSubstr("--client-shm-keys=<prefix>"));
  EXPECT_EQ(RegisterSystemSharedMemory(&closed, "r", object.key(), 0, 64).code(),
            absl::StatusCode::kPermissionDenied);

  SharedMemoryManager::Options options;
  options.key_prefixes = {"/client_", "/sluice_other_"};
  SharedMemoryManager elsewhere(options);
  status = elsewhere.Register("r", object.key(), 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      status.message(),
      HasSubstr("accepts keys starting with '/client_', '/sluice_other_' (--client-shm-keys)"));
  options.key_prefixes.push_back("/sluice_test_");
  SharedMemoryManager allowed(options);
  EXPECT_TRUE(allowed.Register("r", object.key(), 0, 64).ok());
  options.key_prefixes = {"*"};
  SharedMemoryManager every(options);
  EXPECT_TRUE(every.Register("r", object.key(), 0, 64).ok());

  EXPECT_EQ(ParseClientShmKeyPrefixes("/sluice_,/client_").value(),
            (std::vector<std::string>{"/sluice_", "/client_"}));
  EXPECT_EQ(ParseClientShmKeyPrefixes("*").value(), (std::vector<std::string>{"*"}));
  EXPECT_EQ(ParseClientShmKeyPrefixes("/").value(), (std::vector<std::string>{"/"}));
  for (const char* bad : {"", "sluice_", "/a,", ",/a", "/a/b", "**", "/a,*x"}) {
    const auto parsed = ParseClientShmKeyPrefixes(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("is no key prefix")) << bad;
  }
}

TEST(SharedMemoryTest, TheProcessGuardsABoundedNumberOfRegions) {
  ShmObject object(4096);
  SharedMemoryManager manager(TestKeys());
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);  // a line per registration otherwise
  size_t registered = 0;
  Status refused;
  while (registered <= GuardedMapping::kMaxGuardedMappings) {
    refused = manager.Register("r" + std::to_string(registered), object.key(), 0, 64);
    if (!refused.ok()) break;
    ++registered;
  }
  EXPECT_EQ(registered,
            GuardedMapping::kMaxGuardedMappings);  // nothing else in this process holds one
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("4096 shared memory regions are mapped already"));
  EXPECT_THAT(refused.message(), HasSubstr("unregister regions no longer in use"));
  manager.Unregister("r7");
  EXPECT_TRUE(manager.Register("again", object.key(), 0, 64).ok());
  manager.Unregister("");
  spdlog::set_level(level);
  EXPECT_TRUE(manager.Register("after", object.key(), 0, 64).ok());
}

}  // namespace
}  // namespace sluice
