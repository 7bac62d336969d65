#include "server/runtime/environment.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace sluice {
namespace {

int Major(const std::string& version) {
  int major = 0;
  const std::vector<std::string> parts = absl::StrSplit(version, '.');
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &major)) return 0;
  return major;
}

int Minor(const std::string& version) {
  int minor = 0;
  const std::vector<std::string> parts = absl::StrSplit(version, '.');
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &minor)) return 0;
  return minor;
}

const char* YesNo(bool value) { return value ? "yes" : "no"; }

constexpr size_t kMaxTorchMessage = 1024;

}  // namespace

std::string TruncateTorchMessage(std::string message) {
  if (message.size() > kMaxTorchMessage) {
    message.resize(kMaxTorchMessage);
    message += " ...(truncated)";
  }
  return message;
}

RuntimeInfo ProbeRuntime(bool touch_gpus) {
  RuntimeInfo info;
  info.torch_version = TORCH_VERSION;
  at::Context& context = at::globalContext();
  info.cudnn_enabled = context.userEnabledCuDNN();
  info.cudnn_benchmark = context.benchmarkCuDNN();
  info.cudnn_deterministic = context.deterministicCuDNN();
  info.cudnn_allow_tf32 = context.allowTF32CuDNN();
  info.intra_op_threads = at::get_num_threads();
  info.inter_op_threads = at::get_num_interop_threads();
  const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
  try {
    info.cuda_built = hooks.hasCUDA() || torch::cuda::is_available() || hooks.versionCUDART() > 0;
  } catch (const std::exception&) {
    info.cuda_built = false;
  }
  if (!info.cuda_built) {
    info.problem = "LibTorch was loaded without its CUDA library (libtorch_cuda.so)";
    return info;
  }
  try {
    info.cuda_build_version = VersionFromInt(hooks.versionCUDART(), 1000, 0);
  } catch (const std::exception&) {
  }
  // The runtime and driver versions come from the libraries actually loaded: libcudart is already
  // in the process (libtorch_cuda needs it); libcuda.so.1 is the driver's and may be absent.
  using VersionFn = int (*)(int*);
  if (auto runtime_version =
          reinterpret_cast<VersionFn>(dlsym(RTLD_DEFAULT, "cudaRuntimeGetVersion"))) {
    int version = 0;
    if (runtime_version(&version) == 0)
      info.cuda_runtime_version = VersionFromInt(version, 1000, 0);
  }
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    info.driver_found = true;
    if (auto driver_version = reinterpret_cast<VersionFn>(dlsym(driver, "cuDriverGetVersion"))) {
      int version = 0;
      if (driver_version(&version) == 0)
        info.driver_cuda_version = VersionFromInt(version, 1000, 0);
    }
    dlclose(driver);
  }
  if (std::ifstream proc("/proc/driver/nvidia/version"); proc) {
    std::string line;
    std::getline(proc, line);
    info.driver_version = DriverVersionFromProc(line);
  }
  try {
    if (hooks.hasCuDNN()) info.cudnn_version = CudnnVersionFromInt(hooks.versionCuDNN());
    info.cudnn_loaded_version = CudnnVersionFromInt(hooks.versionRuntimeCuDNN());
  } catch (const std::exception&) {
  }
  try {
    info.cuda_device_count = static_cast<int>(torch::cuda::device_count());
    info.cuda_usable = torch::cuda::is_available() && info.cuda_device_count > 0;
  } catch (const std::exception& e) {
    info.problem = TruncateTorchMessage(e.what());
  }
  if (!info.cuda_usable && info.problem.empty()) {
    info.problem =
        "no CUDA GPU is visible to this process (no NVIDIA driver, no device, or the container "
        "was started without --gpus all)";
  }
  for (int index = 0; info.cuda_usable && index < info.cuda_device_count; ++index) {
    GpuInfo gpu;
    gpu.index = index;
    try {
      const cudaDeviceProp* properties =
          at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
      gpu.name = properties->name;
      gpu.major = properties->major;
      gpu.minor = properties->minor;
      gpu.memory_bytes = properties->totalGlobalMem;
      const auto* uuid = reinterpret_cast<const unsigned char*>(properties->uuid.bytes);
      gpu.uuid = "GPU-";
      for (int i = 0; i < 16; ++i) {
        absl::StrAppend(&gpu.uuid, absl::Hex(uuid[i], absl::kZeroPad2));
        if (i == 3 || i == 5 || i == 7 || i == 9) gpu.uuid += "-";
      }
      // A kernel and a cuDNN convolution: "no kernel image is available" means this LibTorch
      // build does not cover the GPU's compute capability; a cuDNN failure names its library.
      if (!touch_gpus) {
        info.gpus.push_back(std::move(gpu));
        continue;
      }
      const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
      at::Tensor probe = torch::ones({1, 1, 4, 4}, torch::TensorOptions().device(device));
      (void)torch::conv2d(probe.add(1), torch::ones({1, 1, 3, 3}, probe.options()))
          .sum()
          .item<float>();
    } catch (const std::exception& e) {
      const std::string message = e.what();
      gpu.problem =
          message.find("no kernel image") != std::string::npos
              ? absl::StrCat("this LibTorch build has no kernels for compute capability ",
                             gpu.major, ".", gpu.minor, "; install a torch build that covers it")
              : TruncateTorchMessage(message.substr(0, message.find('\n')));
    }
    info.gpus.push_back(std::move(gpu));
  }
  if (info.cuda_usable && std::all_of(info.gpus.begin(), info.gpus.end(),
                                      [](const GpuInfo& gpu) { return !gpu.problem.empty(); })) {
    info.cuda_usable = false;
    info.problem = "no GPU can run this LibTorch build's kernels (see the problems above)";
  }
  return info;
}

std::string VersionFromInt(long version, int major_divisor, int minor_divisor) {
  if (version <= 0) return "";
  if (minor_divisor == 0)
    return absl::StrCat(version / major_divisor, ".", (version % major_divisor) / 10);
  return absl::StrCat(version / major_divisor, ".", (version % major_divisor) / minor_divisor, ".",
                      version % minor_divisor);
}

std::string DriverVersionFromProc(const std::string& line) {
  const size_t module = line.find("Kernel Module");
  if (module == std::string::npos) return "";
  for (absl::string_view token :
       absl::StrSplit(absl::string_view(line).substr(module + std::strlen("Kernel Module")), ' ',
                      absl::SkipEmpty())) {
    const bool version = token.find('.') != absl::string_view::npos &&
                         std::all_of(token.begin(), token.end(),
                                     [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
    if (version) return std::string(token);
  }
  return "";
}

std::string CudnnVersionFromInt(long version) {
  return version < 10000 ? VersionFromInt(version, 1000, 100) : VersionFromInt(version, 10000, 100);
}

std::vector<std::string> EnvironmentProblems(const RuntimeInfo& info, bool gpu_required) {
  std::vector<std::string> problems;
  if (!info.cuda_built) {
    problems.push_back(
        "LibTorch has no CUDA support in this process (libtorch_cuda.so is missing or this is a "
        "CPU-only torch build): install the CUDA build of torch to serve on a GPU.");
  } else if (!info.driver_found) {
    problems.push_back(
        "No NVIDIA driver: libcuda.so.1 cannot be loaded. On a GPU host install the NVIDIA driver; "
        "in a container start it with --gpus all (the NVIDIA Container Toolkit mounts the "
        "driver).");
  } else {
    const std::string& built = info.cuda_build_version;
    const std::string& driver = info.driver_cuda_version;
    if (!built.empty() && !driver.empty()) {
      if (Major(driver) < Major(built)) {
        problems.push_back(
            absl::StrCat("The NVIDIA driver",
                         info.driver_version.empty() ? "" : absl::StrCat(" ", info.driver_version),
                         " supports CUDA up to ", driver, ", but LibTorch was built for CUDA ",
                         built, ": upgrade the driver to one that supports CUDA ", built,
                         ", or install a torch build for CUDA ", Major(driver), ".x."));
      } else if (Major(driver) == Major(built) && Minor(driver) < Minor(built)) {
        problems.push_back(absl::StrCat(
            "The NVIDIA driver supports CUDA ", driver, ", older than the CUDA ", built,
            " LibTorch was built for: this runs through CUDA minor-version compatibility, but "
            "kernels that need a newer driver (PTX JIT) fail; upgrading the driver is safer."));
      }
    }
    if (info.cuda_device_count == 0) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      problems.push_back(
          absl::StrCat("The driver is installed but no CUDA GPU is visible",
                       visible ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=\"", visible, "\")") : "",
                       ": check nvidia-smi, and start containers with --gpus all.",
                       info.problem.empty() ? "" : absl::StrCat(" CUDA says: ", info.problem)));
    } else if (!info.cuda_usable && !info.problem.empty()) {
      problems.push_back(absl::StrCat("CUDA is not usable: ", info.problem));
    }
  }
  if (info.cuda_built) {
    if (info.cudnn_version.empty()) {
      problems.push_back(
          "This LibTorch was built without cuDNN: convolutions on the GPU run without "
          "it, much slower.");
    } else if (info.cudnn_loaded_version.empty()) {
      problems.push_back(absl::StrCat(
          "cuDNN cannot be loaded (LibTorch was built with cuDNN ", info.cudnn_version,
          "): convolutions on the GPU fail or run without it. Install cuDNN ",
          Major(info.cudnn_version),
          " (the nvidia-cudnn-cu* wheel torch depends on) and check LD_LIBRARY_PATH."));
    } else if (Major(info.cudnn_loaded_version) != Major(info.cudnn_version)) {
      problems.push_back(
          absl::StrCat("LibTorch was built with cuDNN ", info.cudnn_version, " but cuDNN ",
                       info.cudnn_loaded_version,
                       " is loaded: another copy is found first (LD_LIBRARY_PATH?); load cuDNN ",
                       Major(info.cudnn_version), "."));
    }
    if (!info.cudnn_enabled)
      problems.push_back("cuDNN is disabled in LibTorch: convolutions run without it.");
  }
  for (const GpuInfo& gpu : info.gpus) {
    if (!gpu.problem.empty()) {
      problems.push_back(absl::StrCat("GPU ", gpu.index, " (", gpu.name, ", compute capability ",
                                      gpu.major, ".", gpu.minor, "): ", gpu.problem));
    }
  }
  if (gpu_required && !info.cuda_usable) {
    problems.push_back(
        "--device cuda asks for a GPU but CUDA is not usable: the server will not start.");
  }
  return problems;
}

std::string FormatEnvironment(const RuntimeInfo& info, const std::string& benchmark_mode,
                              DevicePolicy policy, const std::string& more) {
  const bool gpu_required = policy == DevicePolicy::kCuda;
  auto or_none = [](const std::string& value, const char* none) {
    return value.empty() ? std::string(none) : value;
  };
  std::string out;
  auto line = [&](const char* name, const std::string& value) {
    absl::StrAppend(&out, name, ": ", value, "\n");
  };
  line("libtorch", info.torch_version);
  line("cuda_built_with",
       info.cuda_built ? or_none(info.cuda_build_version, "unknown") : "none (CPU-only LibTorch)");
  line("cuda_runtime", or_none(info.cuda_runtime_version, "none"));
  line("nvidia_driver",
       !info.driver_found ? "none (libcuda.so.1 not loadable)"
                          : absl::StrCat(or_none(info.driver_version, "found"), ", supports CUDA ",
                                         or_none(info.driver_cuda_version, "?")));
  line("cudnn_compiled", or_none(info.cudnn_version, "none"));
  line("cudnn_loaded", or_none(info.cudnn_loaded_version, "none"));
  if (info.gpus.empty()) {
    line("gpus", "none");
  } else {
    for (const GpuInfo& gpu : info.gpus) {
      absl::StrAppend(&out, "gpu ", gpu.index, ": ", gpu.name, ", compute capability ", gpu.major,
                      ".", gpu.minor, ", ", gpu.memory_bytes >> 20, " MiB",
                      gpu.uuid.empty() ? "" : absl::StrCat(", ", gpu.uuid), "\n");
    }
  }
  line("cudnn_enabled", YesNo(info.cudnn_enabled));
  line("cudnn_benchmark",
       absl::StrCat(benchmark_mode, " (global flag ", info.cudnn_benchmark ? "on" : "off",
                    "; auto: per model with a fixed shape set, timed on a GPU and kept where "
                    "5 % faster)"));
  line("cudnn_deterministic", YesNo(info.cudnn_deterministic));
  line("allow_tf32", YesNo(info.cudnn_allow_tf32));
  line("intra_op_threads", absl::StrCat(info.intra_op_threads));
  line("inter_op_threads", absl::StrCat(info.inter_op_threads));
  const std::vector<std::string> problems = EnvironmentProblems(info, gpu_required);
  for (const std::string& problem : problems) absl::StrAppend(&out, "problem: ", problem, "\n");
  out += more;
  if (policy == DevicePolicy::kCpu) {
    line("result", "--device cpu: every model runs on the CPU");
  } else if (info.cuda_usable) {
    int usable = 0;
    for (const GpuInfo& gpu : info.gpus) usable += gpu.problem.empty() ? 1 : 0;
    line("result",
         absl::StrCat(usable, " GPU(s) usable; KIND_GPU and KIND_AUTO models run on the GPU"));
  } else {
    line("result", "no usable GPU; every model runs on the CPU");
  }
  return out;
}

}  // namespace sluice
