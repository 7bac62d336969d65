// The NVML poller (server/metrics/gpu_telemetry.h) against fake libnvidia-ml builds: the GPU
// series it publishes, values a GPU or library cannot give, CUDA's numbering, and no NVML at all.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/metrics/gpu_telemetry.h"
#include "tests/unit/metrics_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// Sets an environment variable for its scope: the fake NVML reads its switches at every call.
// Change them only while no GpuTelemetry thread is running (getenv and setenv race).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { Set(value); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void Set(const char* value) { setenv(name_, value, 1); }

 private:
  const char* name_;
};

std::string FakeUuid(int index) {
  return "GPU-fa4e0000-0000-4000-8000-00000000000" + std::to_string(index);
}
// Triton's labels, and ours, of fake GPU `nvml_index` exported as `gpu`.
std::string NvLabels(int nvml_index) { return R"({gpu_uuid=")" + FakeUuid(nvml_index) + R"("})"; }
std::string OurLabels(int gpu, int nvml_index) {
  return R"({gpu=")" + std::to_string(gpu) + R"(",gpu_uuid=")" + FakeUuid(nvml_index) +
         R"(",name="Fake GPU )" + std::to_string(nvml_index) + R"("})";
}

constexpr double kGiB = 1 << 30;

TEST_F(MetricsTest, FakeNvmlFeedsTheGpuSeriesAndGoneGpusDisappear) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_THAT((*nvml)->missing(), ::testing::IsEmpty());
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[1].uuid, "GPU-fa4e0000-0000-4000-8000-000000000001");
  EXPECT_DOUBLE_EQ((*samples)[1].utilization.value_or(-1), 0.47);
  EXPECT_DOUBLE_EQ((*samples)[0].power_watts.value_or(-1), 123.456);
  metrics_.SetGpus(*samples);
  std::string text = Exposition(*registry_);
  const std::string gpu0 = NvLabels(0);
  const std::string gpu1 = NvLabels(1);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_total_bytes" + gpu0), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + gpu1), 4.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_usage" + gpu0), 123.456);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + gpu0), 700);
  EXPECT_DOUBLE_EQ(
      Value(
          text,
          R"(sluice_gpu_temperature_celsius{gpu="1",gpu_uuid="GPU-fa4e0000-0000-4000-8000-000000000001",name="Fake GPU 1"})"),
      56);

  // Energy is a counter from the first reading on (the fake's reading does not change).
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu0), 0);
  // The poller samples on its own; a GPU that goes away loses its series.
  gpus.Set("1");
  {
    GpuTelemetry::Options options;
    options.interval = 100ms;
    GpuTelemetry telemetry(*std::move(nvml), &metrics_, options);
    EXPECT_EQ(telemetry.gpus(), 1);
    text = Exposition(*registry_);
  }  // the poller thread is gone before the environment changes again
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + gpu0), 0.37);
  EXPECT_EQ(Value(text, "nv_gpu_utilization" + gpu1), -1);
  EXPECT_EQ(Value(text, "nv_energy_consumption" + gpu1), -1);
}

TEST_F(MetricsTest, UnsupportedUtilizationDropsOnlyItsSeriesUntilSupportedAgain) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  ScopedEnv errors("FAKE_NVML_ERRORS", "");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto publish = [&] {
    auto samples = (*nvml)->Sample();
    ASSERT_TRUE(samples.ok()) << samples.status();
    ASSERT_EQ(samples->size(), 2u);
    metrics_.SetGpus(*samples);
  };
  publish();
  std::string text = Exposition(*registry_);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);

  // GPU 1 answers NOT_SUPPORTED (as a MIG-enabled GPU does): its utilisation goes, not to 0.
  errors.Set("utilization@1=3");
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_FALSE((*samples)[1].utilization.has_value());
  EXPECT_TRUE((*samples)[1].memory_used_bytes.has_value());
  publish();
  text = Exposition(*registry_);
  EXPECT_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), -1);
  EXPECT_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), -1);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(0)), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(0, 0)), 0.37);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_usage" + NvLabels(1)), 124.456);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + NvLabels(1)), 4 * kGiB);
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(1, 1)), 56);

  errors.Set("");
  publish();
  text = Exposition(*registry_);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);
}

TEST_F(MetricsTest, AFailedQueryLeavesItsSeriesOutAndAGpuWithoutUuidIsLeftOut) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "3");
  // 15: GPU_IS_LOST; 999: a code this Sluice does not know.
  ScopedEnv errors("FAKE_NVML_ERRORS", "power=15,temperature@1=999,energy=3,uuid@2=15");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);  // GPU 2 has no UUID to label it with
  metrics_.SetGpus(*samples);
  const std::string text = Exposition(*registry_);
  EXPECT_THAT(text, Not(HasSubstr("nv_gpu_power_usage{")));
  EXPECT_THAT(text, Not(HasSubstr("sluice_gpu_power_watts{")));
  EXPECT_THAT(text, Not(HasSubstr("nv_energy_consumption{")));
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(2))));
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(1, 1)), -1);
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(0, 0)), 55);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + NvLabels(1)), 700);
}

TEST_F(MetricsTest, MemoryComesFromTheV2QueryAndFallsBackToV1) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "1");
  ScopedEnv errors("FAKE_NVML_ERRORS", "");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto used = [&]() -> double {
    auto samples = (*nvml)->Sample();
    if (!samples.ok() || samples->size() != 1) return -2;
    EXPECT_EQ((*samples)[0].memory_total_bytes.has_value(),
              (*samples)[0].memory_used_bytes.has_value());
    return (*samples)[0].memory_used_bytes.value_or(-1);
  };
  // v2 (the fake checks the struct's version field) leaves the driver's 512 MiB out; v1 counts it.
  EXPECT_EQ(used(), 3 * kGiB);
  errors.Set("memory_v2=3");  // NOT_SUPPORTED
  EXPECT_EQ(used(), 3.5 * kGiB);
  errors.Set("memory_v2=13");  // FUNCTION_NOT_FOUND
  EXPECT_EQ(used(), 3.5 * kGiB);
  errors.Set("memory_v2=15");  // GPU_IS_LOST: no fallback, no value
  EXPECT_EQ(used(), -1);
  errors.Set("memory_v2=3,memory=3");
  EXPECT_EQ(used(), -1);
}

TEST_F(MetricsTest, ALibraryLackingOptionalEntryPointsStillLoadsAndARequiredOneIsNamed) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "2");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML_PARTIAL);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_THAT((*nvml)->missing(),
              ::testing::ElementsAre("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetPowerUsage"));
  auto samples = (*nvml)->Sample();
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_FALSE((*samples)[0].power_watts.has_value());
  EXPECT_EQ((*samples)[0].memory_used_bytes.value_or(-1), 3.5 * kGiB);  // v1
  metrics_.SetGpus(*samples);
  const std::string text = Exposition(*registry_);
  EXPECT_THAT(text, Not(HasSubstr("nv_gpu_power_usage{")));
  EXPECT_THAT(text, Not(HasSubstr("sluice_gpu_power_watts{")));
  EXPECT_DOUBLE_EQ(Value(text, "sluice_gpu_utilization_ratio" + OurLabels(1, 1)), 0.47);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_power_limit" + NvLabels(0)), 700);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_memory_used_bytes" + NvLabels(0)), 3.5 * kGiB);

  auto no_uuid = Nvml::Load(SLUICE_FAKE_NVML_NO_UUID);
  EXPECT_EQ(no_uuid.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(no_uuid.status().message(), HasSubstr("lacks nvmlDeviceGetUUID"));
}

TEST(InCudaOrderTest, CudaUuidsReorderFilterAndRenumberTheGpus) {
  std::vector<GpuSample> samples(3);
  for (int i = 0; i < 3; ++i) {
    samples[i].index = i;
    samples[i].uuid = FakeUuid(i);
  }
  auto uuids_and_indexes = [](const std::vector<GpuSample>& gpus) {
    std::vector<std::pair<std::string, int>> out;
    for (const GpuSample& gpu : gpus) out.emplace_back(gpu.uuid, gpu.index);
    return out;
  };
  using Pairs = std::vector<std::pair<std::string, int>>;
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {})),
            (Pairs{{FakeUuid(0), 0}, {FakeUuid(1), 1}, {FakeUuid(2), 2}}));
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {FakeUuid(1)})), (Pairs{{FakeUuid(1), 0}}));
  EXPECT_EQ(uuids_and_indexes(InCudaOrder(samples, {FakeUuid(2), FakeUuid(0)})),
            (Pairs{{FakeUuid(2), 0}, {FakeUuid(0), 1}}));
  // A MIG instance matches no whole GPU: skipped, and the next device keeps its own ordinal.
  EXPECT_EQ(uuids_and_indexes(
                InCudaOrder(samples, {"MIG-0a1b2c3d-0000-4000-8000-000000000000", FakeUuid(0)})),
            (Pairs{{FakeUuid(0), 1}}));
}

TEST_F(MetricsTest, TelemetryExportsOnlyCudaVisibleGpusUnderCudaOrdinals) {
  ScopedEnv gpus("FAKE_NVML_GPUS", "3");
  auto nvml = Nvml::Load(SLUICE_FAKE_NVML);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  GpuTelemetry::Options options;
  options.interval = 1h;
  options.cuda_uuids = {FakeUuid(1)};  // CUDA_VISIBLE_DEVICES=1: NVML's GPU 1 is cuda:0
  std::string text;
  {
    GpuTelemetry telemetry(*std::move(nvml), &metrics_, options);
    EXPECT_EQ(telemetry.gpus(), 1);
    text = Exposition(*registry_);
  }
  EXPECT_EQ(Value(text, "sluice_gpu_temperature_celsius" + OurLabels(0, 1)), 56);
  EXPECT_DOUBLE_EQ(Value(text, "nv_gpu_utilization" + NvLabels(1)), 0.47);
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(0))));
  EXPECT_THAT(text, Not(HasSubstr(FakeUuid(2))));
  EXPECT_THAT(text, Not(HasSubstr(R"(gpu="1")")));
}

TEST_F(MetricsTest, NoNvmlMeansNoGpuSeriesAndAReason) {
  auto nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("cannot load /nonexistent/libnvidia-ml.so.1"));
  EXPECT_THAT(Exposition(*registry_), Not(HasSubstr("nv_gpu_utilization{")));
}

}  // namespace
}  // namespace sluice
