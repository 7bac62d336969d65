#include <pthread.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <sched.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"

#include "server/core/bytes_tensor.h"
#include "server/os/cpu_budget.h"
#include "server/core/data_type.h"
#include "server/core/device.h"
#include "server/core/output_sink.h"
#include "server/os/pem.h"
#include "server/core/tensor.h"
#include "server/os/threads.h"
#include "server/core/validation.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(DataTypeTest, NamesRoundTripAndSizes) {
  for (DataType type : kAllDataTypes) {
    ASSERT_EQ(ParseDataTypeName(DataTypeName(type)), type);
  }
  EXPECT_EQ(ElementSize(DataType::kBool), 1u);
  EXPECT_EQ(ElementSize(DataType::kBf16), 2u);
  EXPECT_EQ(ElementSize(DataType::kFp32), 4u);
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
  EXPECT_EQ(ParseDataTypeName("BYTES"), DataType::kBytes);
  EXPECT_EQ(ElementSize(DataType::kBytes), 0u);  // no fixed size
  EXPECT_FALSE(HasFixedSize(DataType::kBytes));
  EXPECT_FALSE(ParseDataTypeName("fp32").has_value());
  EXPECT_FALSE(ParseDataTypeName("UINT16").has_value());
}

std::string Serialize(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& element : elements) AppendBytesElement(element, &out);
  return out;
}

TEST(BytesTensorTest, SerializedFormIsLengthThenBytes) {
  const std::string data = Serialize({"ab", "", "\xc3\xa9"});
  EXPECT_EQ(data, std::string("\x02\0\0\0ab\0\0\0\0\x02\0\0\0\xc3\xa9", 16));
  EXPECT_TRUE(CheckBytesTensor("x", data, 3, true).ok());
  EXPECT_THAT(SplitBytesTensor(data), ::testing::ElementsAre("ab", "", "\xc3\xa9"));
  EXPECT_EQ(EmptyBytesElements(2), std::string(8, '\0'));
  EXPECT_TRUE(CheckBytesTensor("x", "", 0, true).ok());
  // Rows of two elements each: where each row starts.
  const std::string rows = Serialize({"a", "bb", "", "cccc", "d", ""});
  EXPECT_THAT(BytesRowOffsets(rows, 3, 2), ::testing::ElementsAre(0u, 11u, 23u, rows.size()));
}

TEST(BytesTensorTest, EveryMalformedBufferIsRefusedWithItsReason) {
  const std::string two = Serialize({"ab", "cd"});
  struct Case {
    std::string data;
    int64_t elements;
    std::string message;
  };
  const std::vector<Case> cases = {
      {two, 3, "x has 2 BYTES elements but its shape needs 3"},
      {two, 1, "x has 6 bytes after its 1 BYTES element"},
      {two.substr(0, 11), 2, "BYTES element 1 has length 2, but only 1 bytes are left"},
      {two + std::string("\x01\0", 2), 3, "BYTES element 2 has a truncated length (2 of 4 bytes)"},
      {std::string("\xff\xff\xff\xff", 4), 1, "has length 4294967295, but only 0 bytes are left"},
      {Serialize({"ok", "\xc3"}), 2, "BYTES element 1 is not valid UTF-8 (at its byte 0)"},
      {"", 5, "x has 0 BYTES elements but its shape needs 5"},
      // A hostile element count costs nothing: the data runs out first.
      {two, std::numeric_limits<int64_t>::max(), "x has 2 BYTES elements but its shape needs"},
  };
  for (const Case& c : cases) {
    const Status status = CheckBytesTensor("x", c.data, c.elements, /*require_utf8=*/true);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(CheckBytesTensor("x", Serialize({"\xc3"}), 1, /*require_utf8=*/false).ok());
}

TEST(BytesTensorTest, Utf8IsStrict) {
  for (const char* valid : {"", "plain", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                            "\xf4\x8f\xbf\xbf", "\xef\xbf\xbd", "\x7f"}) {
    EXPECT_TRUE(IsValidUtf8(valid)) << valid;
  }
  struct Bad {
    std::string text;
    size_t offset;
  };
  for (const Bad& bad : std::vector<Bad>{{"a\x80", 1},             // continuation byte alone
                                         {"\xc0\xaf", 0},          // overlong '/'
                                         {"\xc1\xbf", 0},          // overlong
                                         {"\xe0\x80\xaf", 0},      // overlong 3-byte
                                         {"\xed\xa0\x80", 0},      // UTF-16 surrogate
                                         {"\xf0\x80\x80\xaf", 0},  // overlong 4-byte
                                         {"\xf4\x90\x80\x80", 0},  // past U+10FFFF
                                         {"\xf5\x80\x80\x80", 0},  // no such lead byte
                                         {"ab\xe4\xb8", 2},        // truncated at the end
                                         {"\xe4\x41\x41", 0}}) {   // a continuation missing
    size_t offset = 99;
    EXPECT_FALSE(IsValidUtf8(bad.text, &offset)) << absl::CHexEscape(bad.text);
    EXPECT_EQ(offset, bad.offset) << absl::CHexEscape(bad.text);
  }
}

TEST(TensorTest, ElementCountRejectsNegativeAndOverflow) {
  EXPECT_EQ(*ElementCount({2, 3, 4}), 24);
  EXPECT_EQ(*ElementCount({}), 1);
  EXPECT_EQ(*ElementCount({5, 0}), 0);
  EXPECT_THAT(ElementCount({2, -1}).status().message(), HasSubstr("negative"));
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THAT(ElementCount({big, 3}).status().message(), HasSubstr("too many elements"));
  EXPECT_EQ(ShapeToString({1, 2, 3}), "[1,2,3]");
}

TEST(PemTest, ReadsPemAndNamesTheFlagOnErrors) {
  const auto directory = std::filesystem::temp_directory_path() / "sluice_pem_test";
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "good.pem")
      << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  std::ofstream(directory / "bad.pem") << "not a certificate";
  auto good = ReadPemFile((directory / "good.pem").string(), "--grpc-server-cert");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(*good, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(
      ReadPemFile((directory / "bad.pem").string(), "--grpc-server-cert").status().message(),
      ::testing::HasSubstr("--grpc-server-cert: " + (directory / "bad.pem").string() +
                           " is not a PEM file"));
  EXPECT_THAT(ReadPemFile((directory / "none.pem").string(), "--grpc-root-cert").status().message(),
              ::testing::HasSubstr("--grpc-root-cert: cannot read"));
  EXPECT_THAT(ReadPemFile("", "--grpc-server-key").status().message(),
              ::testing::HasSubstr("--grpc-server-key is required"));
  std::filesystem::remove_all(directory);
}

TEST(CpuBudgetTest, QuotaFilesParse) {
  EXPECT_EQ(ParseCpuMax("max 100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCpuMax("150000 100000\n"), 1.5);
  EXPECT_EQ(ParseCpuMax("garbage"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCfsQuota("200000\n", "100000\n"), 2.0);
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), std::nullopt);
}

TEST(CpuBudgetTest, TheSmallestLimitWinsAndAQuotaRoundsUp) {
  CpuBudget budget = DecideCpuBudget(16, 16, std::nullopt);
  EXPECT_EQ(budget.cpus, 16);
  EXPECT_EQ(budget.limit, "cores");
  budget = DecideCpuBudget(16, 2, std::nullopt);  // taskset -c 0,1
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_EQ(budget.limit, "affinity");
  budget = DecideCpuBudget(16, 16, 1.5);  // docker --cpus 1.5
  EXPECT_EQ(budget.cpus, 2);
  EXPECT_EQ(budget.limit, "cgroup quota");
  EXPECT_EQ(budget.detail, "16 cores, affinity 16, cgroup quota 1.5");
  EXPECT_EQ(DecideCpuBudget(4, 4, 0.2).cpus, 1);
  EXPECT_EQ(DecideCpuBudget(0, 0, std::nullopt).cpus, 1);
}

TEST(CpuListTest, TasksetsFormParsesSortedAndOnceEach) {
  EXPECT_EQ(ParseCpuList("0").value_or(std::vector<int>{}), (std::vector<int>{0}));
  EXPECT_EQ(ParseCpuList("8, 0-3,2").value_or(std::vector<int>{}),
            (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(ParseCpuList("5-5").value_or(std::vector<int>{}), (std::vector<int>{5}));
  for (const char* bad : {"", "a", "-1", "3-1", "1-", "0,,1", "1024", "1-2-3"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseCpuList("3-1").status().message()), HasSubstr("runs backwards"));
  EXPECT_THAT(std::string(ParseCpuList("0-5000").status().message()), HasSubstr("over 1023"));
}

TEST(CpuListTest, TheModelsTakeTheirCpusAndTheFrontEndsTheRest) {
  auto split = SplitCpus({0, 2}, {0, 1, 2, 3});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->model, (std::vector<int>{0, 2}));
  EXPECT_EQ(split->front_ends, (std::vector<int>{1, 3}));
  // Every CPU for the models leaves the front ends nothing; a CPU the process may not use is no
  // CPU at all.
  EXPECT_THAT(std::string(SplitCpus({0, 1}, {0, 1}).status().message()),
              HasSubstr("leave at least one"));
  EXPECT_THAT(std::string(SplitCpus({1, 7}, {0, 1, 2}).status().message()),
              HasSubstr("CPU(s) 7 are not among the CPUs this process may use (0,1,2)"));
  EXPECT_FALSE(SplitCpus({}, {0, 1}).ok());
}

TEST(CpuListTest, FirstAndLastCountFromTheEndsOfTheCpusAllowed) {
  absl::StatusOr<CpuChoice> last = ParseCpuChoice("last:2");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->list.empty());
  EXPECT_FALSE(last->empty());
  // A container's CPUs need not start at 0 nor be contiguous.
  EXPECT_EQ(ChooseCpus(*last, {4, 5, 9, 12}).value_or(std::vector<int>{}),
            (std::vector<int>{9, 12}));
  absl::StatusOr<CpuChoice> first = ParseCpuChoice(" first:1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ChooseCpus(*first, {4, 5, 9, 12}).value_or(std::vector<int>{}), (std::vector<int>{4}));
  // A list is passed on as it is; SplitCpus judges it against the mask.
  absl::StatusOr<CpuChoice> list = ParseCpuChoice("3,1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(ChooseCpus(*list, {0, 1}).value_or(std::vector<int>{}), (std::vector<int>{1, 3}));
  // As many as the process may use leaves the front ends nothing.
  EXPECT_THAT(
      std::string(ChooseCpus(*last, {7, 8}).status().message()),
      HasSubstr(
          "last:2 would give the models every CPU this process may use (7,8): leave at least one"));
  for (const char* bad : {"last:", "last:0", "first:-1", "last:2x", "first:99999", "middle:1",
                          "last:1,2", "LAST:2", "last :2"}) {
    EXPECT_FALSE(ParseCpuChoice(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseCpuChoice("first:99999").status().message()),
              HasSubstr("from 1 to 1024"));
  EXPECT_THAT(std::string(ParseCpuChoice("LAST:2").status().message()),
              HasSubstr("is none of a CPU list (0-3,8), first:N or last:N"));
  // absl's number parsing: spaces around N and a plus sign are accepted.
  EXPECT_EQ(ParseCpuChoice("last: 3 ").value_or(CpuChoice{}).last, 3);
  EXPECT_EQ(ParseCpuChoice("first:+2").value_or(CpuChoice{}).first, 2);
  EXPECT_TRUE(CpuChoice{}.empty());
}

TEST(CpuListTest, ASharedPoolUnderAQuotaIsNamed) {
  // A pod without dedicated CPUs: the node's 64 CPUs in its mask, a quota of 8.
  const std::string warning = SharedCpusWarning(DecideCpuBudget(64, 64, 8.0), 64);
  EXPECT_THAT(warning, HasSubstr("may run on 64 CPUs but its cgroup quota lets it use 8 ("));
  EXPECT_THAT(warning, HasSubstr("shared pool"));
  // Dedicated CPUs (the mask is the quota), no quota, or a mask narrower than the quota: nothing.
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 8, 8.0), 8), "");
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 64, std::nullopt), 64), "");
  EXPECT_EQ(SharedCpusWarning(DecideCpuBudget(64, 4, 8.0), 4), "");
}

// A fake /sys/fs/cgroup and /proc/self/cgroup under a temporary directory.
class CpuBudgetFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        std::filesystem::temp_directory_path() / ("sluice_cgroup_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    std::filesystem::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  std::filesystem::path root_;
};

TEST_F(CpuBudgetFilesTest, CgroupV2QuotaOnTheProcessOrAnAncestor) {
  Write("proc_cgroup", "0::/kubepods/pod1/container\n");
  Write("sys/kubepods/cpu.max", "max 100000\n");
  Write("sys/kubepods/pod1/cpu.max", "100000 100000\n");  // the pod's limit: 1 CPU
  Write("sys/kubepods/pod1/container/cpu.max", "max 100000\n");
  CpuBudget budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_EQ(budget.cpus, 1);
  EXPECT_EQ(budget.limit, "cgroup quota");
  EXPECT_THAT(budget.detail, ::testing::HasSubstr("kubepods/pod1"));
  // No limit anywhere: the cores (or the affinity mask).
  Write("sys/kubepods/pod1/cpu.max", "max 100000\n");
  budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_NE(budget.limit, "cgroup quota");
}

TEST_F(CpuBudgetFilesTest, CgroupV1CfsQuota) {
  Write("proc_cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  CpuBudget budget = DetectCpuBudget((root_ / "proc_cgroup").string(), (root_ / "sys").string());
  EXPECT_EQ(budget.cpus, 1);
  EXPECT_EQ(budget.limit, "cgroup quota");
  // Missing files: no quota, no error.
  budget = DetectCpuBudget((root_ / "absent").string(), (root_ / "absent_sys").string());
  EXPECT_NE(budget.limit, "cgroup quota");
}

TEST(ThreadNameTest, LinuxKeepsFifteenCharacters) {
  std::thread named([] {
    NameThisThread("sluice-a-very-long-name");
    char name[32] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    EXPECT_STREQ(name, "sluice-a-very-l");
    NameThisThread("short");
    pthread_getname_np(pthread_self(), name, sizeof(name));
    EXPECT_STREQ(name, "short");
  });
  named.join();
}

// Runs in its own thread so that the test process's policy is left alone.
TEST(ThreadPolicyTest, BatchIsInheritedAndModelWorkTurnsItBack) {
  std::thread front([] {
    ASSERT_EQ(sched_getscheduler(0), SCHED_OTHER);
    // Before the front ends chose SCHED_BATCH a batcher stays as it is (--model-threads-first
    // false). The choice is the process's for good: a repetition in one process skips this.
    if (!FrontEndsRunAsBatch()) {
      int batcher_before = -1;
      std::thread([&] {
        RunThisThreadAsFrontEnd();
        batcher_before = sched_getscheduler(0);
      }).join();
      EXPECT_EQ(batcher_before, SCHED_OTHER);
    }
    ASSERT_TRUE(RunThreadsFromHereAsBatch());
    EXPECT_TRUE(FrontEndsRunAsBatch());
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
    int started_as = -1, model_work_as = -1;
    std::thread child([&] {  // as gRPC's and the front ends' threads: started after main's call
      started_as = sched_getscheduler(0);
      RunThisThreadAsModelWork();  // as a worker does first
      model_work_as = sched_getscheduler(0);
    });
    child.join();
    EXPECT_EQ(started_as, SCHED_BATCH);
    EXPECT_EQ(model_work_as, SCHED_OTHER);
    // A batcher started by a worker (SCHED_OTHER) runs as the front ends do.
    int batcher_as = -1;
    std::thread worker([&] {
      RunThisThreadAsModelWork();
      std::thread([&] {
        RunThisThreadAsFrontEnd();
        batcher_as = sched_getscheduler(0);
      }).join();
    });
    worker.join();
    EXPECT_EQ(batcher_as, SCHED_BATCH);
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);  // the child's change is its own
  });
  front.join();
  RunThisThreadAsModelWork();  // on a SCHED_OTHER thread: nothing to do
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
}

// Counts holds and releases; refuses to hold when told (a connection that closed meanwhile).
class CountingConnection final : public AnswerConnection {
 public:
  explicit CountingConnection(bool holdable = true) : holdable_(holdable) {}
  bool Hold() override {
    ++holds;
    return holdable_;
  }
  void Release() override { ++releases; }
  int holds = 0, releases = 0;

 private:
  const bool holdable_;
};

class SinkOn final : public OutputSink {
 public:
  explicit SinkOn(std::shared_ptr<AnswerConnection> connection)
      : connection_(std::move(connection)) {}
  StatusOr<char*> Allocate(const OutputDescription&) override {
    return absl::InternalError("not written");
  }
  std::shared_ptr<AnswerConnection> Connection() override { return connection_; }

 private:
  const std::shared_ptr<AnswerConnection> connection_;
};

TEST(AnswerConnectionsTest, HoldsOnlyConnectionsTwoAnswersShareAndReleasesWhatItHeld) {
  auto shared = std::make_shared<CountingConnection>();
  auto single = std::make_shared<CountingConnection>();
  auto closed = std::make_shared<CountingConnection>(/*holdable=*/false);
  SinkOn a(shared), b(shared), c(single), d(closed), e(closed), none(nullptr);
  TensorSink plain;  // a sink with no connection at all (the default)
  EXPECT_EQ(plain.Connection(), nullptr);
  {
    AnswerConnections connections;
    for (OutputSink* sink : std::initializer_list<OutputSink*>{&a, &c, &none, &d, &b, &e, &plain})
      connections.Add(sink);
    EXPECT_EQ(connections.Hold(), 1u);  // `closed` was asked but could not be held
    EXPECT_EQ(shared->holds, 1);
    EXPECT_EQ(single->holds, 0);
    EXPECT_EQ(closed->holds, 1);
    EXPECT_EQ(connections.Hold(), 1u);  // what is held is not held twice
    EXPECT_EQ(shared->holds, 1);
    connections.Release();
    EXPECT_EQ(shared->releases, 1);
    connections.Release();  // released once only
    EXPECT_EQ(shared->releases, 1);
    EXPECT_EQ(connections.Hold(), 1u);
  }  // destruction releases what is still held
  EXPECT_EQ(shared->releases, 2);
  EXPECT_EQ(single->releases, 0);
  EXPECT_EQ(closed->releases, 0);
}

TEST(DeviceTest, Rule) {
  // cpu: always the CPU.
  EXPECT_FALSE(DecideDevice(DevicePolicy::kCpu, InstanceKind::kGpu, true)->use_cuda);
  // auto: the GPU for KIND_GPU/KIND_AUTO when usable.
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, true)->use_cuda);
  EXPECT_TRUE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, true)->use_cuda);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kCpu, true)->use_cuda);
  // auto without a GPU: the CPU, with a warning for KIND_GPU only.
  auto fallback = DecideDevice(DevicePolicy::kAuto, InstanceKind::kGpu, false);
  EXPECT_FALSE(fallback->use_cuda);
  EXPECT_TRUE(fallback->fell_back_to_cpu);
  EXPECT_FALSE(DecideDevice(DevicePolicy::kAuto, InstanceKind::kAuto, false)->fell_back_to_cpu);
  // cuda: an error without a GPU.
  auto required = DecideDevice(DevicePolicy::kCuda, InstanceKind::kCpu, false);
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(required.status().message(), HasSubstr("--gpus all"));
  EXPECT_TRUE(DecideDevice(DevicePolicy::kCuda, InstanceKind::kGpu, true)->use_cuda);
}

TEST(DeviceTest, ParsePolicy) {
  EXPECT_EQ(*ParseDevicePolicy("auto"), DevicePolicy::kAuto);
  EXPECT_EQ(*ParseDevicePolicy("cpu"), DevicePolicy::kCpu);
  EXPECT_EQ(*ParseDevicePolicy("cuda"), DevicePolicy::kCuda);
  EXPECT_EQ(ParseDevicePolicy("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

class ValidationTest : public ::testing::Test {
 protected:
  ValidationTest() {
    spec_.name = "m";
    spec_.max_batch_size = 4;
    spec_.inputs = {{"a", DataType::kFp32, {3}}, {"b", DataType::kInt64, {-1, 2}}};
    spec_.outputs = {{"y", DataType::kFp32, {3}}};
  }

  // A valid request with batch `batch`; byte sizes match shapes (data itself is not read).
  InferRequest Request(int64_t batch = 2) {
    InferRequest request;
    request.inputs.push_back(
        {"a", DataType::kFp32, {batch, 3}, buffer_, static_cast<size_t>(batch * 3 * 4)});
    request.inputs.push_back(
        {"b", DataType::kInt64, {batch, 5, 2}, buffer_, static_cast<size_t>(batch * 10 * 8)});
    return request;
  }

  Status Validate(InferRequest request) { return ValidateRequest(spec_, &request); }

  ModelSpec spec_;
  char buffer_[1024] = {};
};

TEST_F(ValidationTest, AcceptsValidRequestAndSetsBatchSize) {
  InferRequest request = Request(3);
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 3);
}

TEST_F(ValidationTest, EachErrorNamesTheTensor) {
  struct Case {
    std::string what;
    std::function<void(InferRequest&)> mutate;
    std::string message;
  };
  std::vector<Case> cases = {
      {"missing", [](InferRequest& r) { r.inputs.pop_back(); }, "missing input 'b'"},
      {"extra",
       [](InferRequest& r) {
         r.inputs.push_back(r.inputs[0]);
         r.inputs.back().name = "c";
       },
       "unexpected input 'c' for model 'm'; it takes: a, b"},
      {"duplicate", [](InferRequest& r) { r.inputs.push_back(r.inputs[0]); },
       "input 'a' is given more than once"},
      {"dtype", [](InferRequest& r) { r.inputs[0].dtype = DataType::kFp64; },
       "input 'a' has datatype FP64, model 'm' expects FP32"},
      {"rank", [](InferRequest& r) { r.inputs[0].shape = {2}; },
       "rank 1 where the model takes rank 2"},
      {"dims",
       [](InferRequest& r) {
         r.inputs[0].shape = {2, 4};
       },
       "dimension 1 is 4"},
      {"bytes", [](InferRequest& r) { r.inputs[0].byte_size -= 1; },
       "has 23 bytes of data, but shape [2,3] of FP32 needs 24"},
      {"batch mismatch",
       [](InferRequest& r) {
         r.inputs[1].shape[0] = 1;
         r.inputs[1].byte_size = 80;
       },
       "inputs disagree on the batch dimension"},
      {"batch too big", [this](InferRequest& r) { r = Request(5); },
       "batch size 5 is outside [1, 4]"},
      {"zero batch", [this](InferRequest& r) { r = Request(0); }, "batch size 0 is outside [1, 4]"},
      {"unknown output", [](InferRequest& r) { r.requested_outputs = {"z"}; },
       "unknown requested output 'z'"},
      {"output twice",
       [](InferRequest& r) {
         r.requested_outputs = {"y", "y"};
       },
       "output 'y' is requested more than once"},
  };
  for (const Case& c : cases) {
    InferRequest request = Request();
    c.mutate(request);
    Status status = Validate(std::move(request));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
}

TEST_F(ValidationTest, StringInputsAreCheckedElementByElement) {
  spec_.inputs = {{"s", DataType::kBytes, {1}}};
  const std::string good = Serialize({"one", "two"});
  InferRequest request;
  request.inputs.push_back({"s", DataType::kBytes, {2, 1}, good.data(), good.size()});
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 2);
  EXPECT_EQ(request.InputBytes(), good.size());  // what the queued-bytes budget counts
  request.inputs[0].shape = {3, 1};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("input 's' has 2 BYTES elements but its shape needs 3"));
  const std::string bad = Serialize({"one", "\xff"});
  request.inputs[0] = {"s", DataType::kBytes, {2, 1}, bad.data(), bad.size()};
  const Status status = ValidateRequest(spec_, &request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("input 's': BYTES element 1 is not valid UTF-8"));
  request.inputs[0] = {"s", DataType::kFp32, {2, 1}, buffer_, 8};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("has datatype FP32, model 'm' expects BYTES"));
}

TEST_F(ValidationTest, ModelWithoutBatchingTakesExactShape) {
  spec_.max_batch_size = 0;
  spec_.inputs = {{"a", DataType::kFp32, {2, 3}}};
  InferRequest request;
  request.inputs.push_back({"a", DataType::kFp32, {2, 3}, buffer_, 24});
  ASSERT_TRUE(ValidateRequest(spec_, &request).ok());
  EXPECT_EQ(request.batch_size, 1);
  request.inputs[0].shape = {1, 2, 3};
  EXPECT_THAT(ValidateRequest(spec_, &request).message(),
              HasSubstr("rank 3 where the model takes rank 2"));
}

}  // namespace
}  // namespace sluice
