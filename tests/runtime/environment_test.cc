// The environment report's judgement, on made-up environments (the real one has no GPU here).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/runtime/environment.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

RuntimeInfo HealthyGpuHost() {
  RuntimeInfo info;
  info.torch_version = "2.11.0";
  info.cuda_built = true;
  info.cuda_build_version = "13.0";
  info.cuda_runtime_version = "13.0";
  info.driver_found = true;
  info.driver_cuda_version = "13.0";
  info.driver_version = "580.65.06";
  info.cuda_usable = true;
  info.cuda_device_count = 1;
  info.gpus.push_back({0, "NVIDIA H200", 9, 0, uint64_t{141} << 30,
                       "GPU-01234567-89ab-cdef-0123-456789abcdef", ""});
  info.cudnn_version = "9.19.0";
  info.cudnn_loaded_version = "9.19.0";
  info.cudnn_allow_tf32 = true;
  info.intra_op_threads = 16;
  info.inter_op_threads = 16;
  return info;
}

TEST(EnvironmentTest, HealthyHostHasNoProblems) {
  const RuntimeInfo info = HealthyGpuHost();
  EXPECT_THAT(EnvironmentProblems(info, true), IsEmpty());
  const std::string report = FormatEnvironment(info, "auto", DevicePolicy::kAuto);
  EXPECT_THAT(report, HasSubstr("libtorch: 2.11.0\n"));
  EXPECT_THAT(report, HasSubstr("cuda_built_with: 13.0\n"));
  EXPECT_THAT(report, HasSubstr("nvidia_driver: 580.65.06, supports CUDA 13.0\n"));
  EXPECT_THAT(report, HasSubstr("cudnn_loaded: 9.19.0\n"));
  EXPECT_THAT(report,
              HasSubstr("gpu 0: NVIDIA H200, compute capability 9.0, 144384 MiB, GPU-01234567"));
  EXPECT_THAT(report, HasSubstr("cudnn_benchmark: auto"));
  EXPECT_THAT(report, HasSubstr("result: 1 GPU(s) usable"));
  EXPECT_THAT(report, ::testing::Not(HasSubstr("problem:")));
}

TEST(EnvironmentTest, DriverTooOldForTheCudaLibTorchWasBuiltFor) {
  RuntimeInfo info = HealthyGpuHost();
  info.driver_cuda_version = "12.4";
  info.driver_version = "550.54.15";
  info.cuda_usable = false;
  info.problem = "CUDA driver version is insufficient for CUDA runtime version";
  info.gpus.clear();
  const std::vector<std::string> problems = EnvironmentProblems(info, false);
  ASSERT_FALSE(problems.empty());
  EXPECT_THAT(problems[0],
              AllOf(HasSubstr("driver 550.54.15 supports CUDA up to 12.4"),
                    HasSubstr("built for CUDA 13.0"), HasSubstr("upgrade the driver")));
  EXPECT_THAT(FormatEnvironment(info, "auto", DevicePolicy::kAuto),
              HasSubstr("result: no usable GPU; every model runs on the CPU"));
  EXPECT_THAT(FormatEnvironment(HealthyGpuHost(), "auto", DevicePolicy::kCpu),
              HasSubstr("result: --device cpu: every model runs on the CPU"));
  // More lines (the operator libraries) go after the problems, before the result.
  const std::string with_more =
      FormatEnvironment(info, "auto", DevicePolicy::kAuto, "operator libraries: none\n");
  EXPECT_THAT(with_more, HasSubstr("\noperator libraries: none\nresult: no usable GPU"));
  EXPECT_LT(with_more.rfind("problem: "), with_more.find("operator libraries: none"));
}

TEST(EnvironmentTest, OlderMinorDriverIsANoteAboutCompatibility) {
  RuntimeInfo info = HealthyGpuHost();
  info.cuda_build_version = "13.1";
  EXPECT_THAT(EnvironmentProblems(info, false),
              ElementsAre(HasSubstr("minor-version compatibility")));
}

TEST(EnvironmentTest, NoDriverNoLibTorchCudaNoGpuVisible) {
  RuntimeInfo info;
  info.cuda_built = true;
  info.cuda_build_version = "13.0";
  info.cudnn_version = info.cudnn_loaded_version = "9.19.0";
  EXPECT_THAT(EnvironmentProblems(info, false), ElementsAre(HasSubstr("No NVIDIA driver")));
  EXPECT_THAT(
      EnvironmentProblems(info, true),
      ElementsAre(HasSubstr("No NVIDIA driver"), HasSubstr("--device cuda asks for a GPU")));

  info.driver_found = true;
  info.driver_cuda_version = "13.0";
  EXPECT_THAT(EnvironmentProblems(info, false), ElementsAre(HasSubstr("no CUDA GPU is visible")));

  RuntimeInfo cpu_only;
  EXPECT_THAT(EnvironmentProblems(cpu_only, false), ElementsAre(HasSubstr("no CUDA support")));
}

TEST(EnvironmentTest, CudnnProblems) {
  RuntimeInfo info = HealthyGpuHost();
  info.cudnn_loaded_version = "";
  EXPECT_THAT(EnvironmentProblems(info, false), ElementsAre(HasSubstr("cuDNN cannot be loaded")));
  info.cudnn_loaded_version = "8.9.7";
  EXPECT_THAT(EnvironmentProblems(info, false),
              ElementsAre(HasSubstr("built with cuDNN 9.19.0 but cuDNN 8.9.7 is loaded")));
  info.cudnn_loaded_version = "9.19.0";
  info.cudnn_enabled = false;
  EXPECT_THAT(EnvironmentProblems(info, false), ElementsAre(HasSubstr("cuDNN is disabled")));
}

TEST(EnvironmentTest, GpuWhoseComputeCapabilityIsNotCovered) {
  RuntimeInfo info = HealthyGpuHost();
  info.gpus[0].major = 12;
  info.gpus[0].problem = "this LibTorch build has no kernels for compute capability 12.0";
  EXPECT_THAT(EnvironmentProblems(info, false),
              ElementsAre(AllOf(HasSubstr("GPU 0 (NVIDIA H200, compute capability 12.0)"),
                                HasSubstr("no kernels"))));
}

TEST(EnvironmentTest, DriverVersionFromBothKernelModuleSpellings) {
  EXPECT_EQ(
      DriverVersionFromProc("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 "
                            "06:54:38 UTC 2025"),
      "580.65.06");
  // The open kernel module's line, as an H200 machine wrote it on 2026-12-04 (the report said
  // "driver for" before this was parsed by shape rather than position).
  EXPECT_EQ(
      DriverVersionFromProc("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
                            "Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Nov 20 2025"),
      "580.159.04");
  EXPECT_EQ(DriverVersionFromProc(
                "NVRM version: NVIDIA UNIX aarch64 Kernel Module  570.86.15  Thu Jan 30"),
            "570.86.15");
  EXPECT_EQ(DriverVersionFromProc(""), "");
  EXPECT_EQ(DriverVersionFromProc("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64"), "");
  EXPECT_EQ(DriverVersionFromProc("something else 580.65.06"), "");
}

TEST(EnvironmentTest, VersionFromInt) {
  EXPECT_EQ(VersionFromInt(13000, 1000, 0), "13.0");
  EXPECT_EQ(VersionFromInt(12040, 1000, 0), "12.4");
  EXPECT_EQ(VersionFromInt(91900, 10000, 100), "9.19.0");
  EXPECT_EQ(VersionFromInt(0, 1000, 0), "");
  EXPECT_EQ(CudnnVersionFromInt(91900), "9.19.0");
  EXPECT_EQ(CudnnVersionFromInt(8907), "8.9.7");
}

}  // namespace
}  // namespace sluice
