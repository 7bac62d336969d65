#include "server/runtime/torch_backend.h"

#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/script.h>

#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/bytes_tensor.h"
#include "server/core/mutex.h"
#include "server/runtime/aoti_backend.h"
#include "server/runtime/aoti_package.h"
#include "server/runtime/convolution_rewrite.h"
#include "server/runtime/torch_common.h"

namespace sluice {
namespace {

class TorchScriptBackend final : public TorchInstance {
 public:
  TorchScriptBackend(ModelSpec spec, torch::jit::Module module, torch::Device device,
                     std::vector<int> input_positions, ConvolutionTuning tuning,
                     std::shared_ptr<StreamRecycler> streams)
      : TorchInstance(std::move(spec), device, std::move(streams)),
        module_(std::move(module)),
        input_positions_(std::move(input_positions)),
        tuning_(std::move(tuning)) {}

  ConvolutionTuning Tuning() const override { return tuning_; }

 private:
  StatusOr<std::vector<c10::IValue>> Forward(std::vector<c10::IValue> inputs,
                                             const InferRequest&) override {
    std::vector<c10::IValue> arguments(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      arguments[input_positions_[i]] = std::move(inputs[i]);
    return BindOutputs(module_.forward(std::move(arguments)));
  }

  // The returned values, one per declared output, in config order: tensors, or List[str] for
  // TYPE_STRING outputs (OutputDelivery checks which is which).
  StatusOr<std::vector<c10::IValue>> BindOutputs(const c10::IValue& result) {
    const size_t declared = spec().outputs.size();
    std::vector<c10::IValue> bound(declared);
    // A List[str] returned alone is the value of a single TYPE_STRING output, not a list of
    // outputs.
    const bool single_string_output = declared == 1 && spec().outputs[0].dtype == DataType::kBytes;
    if (result.isTensor() || (single_string_output && result.isList())) {
      if (declared != 1) {
        return absl::InternalError(absl::StrCat("model '", spec().name,
                                                "' returned one tensor but its config declares ",
                                                declared, " outputs"));
      }
      bound[0] = result;
      return bound;
    }
    if (result.isGenericDict()) {
      const c10::Dict<c10::IValue, c10::IValue> dict = result.toGenericDict();
      for (size_t i = 0; i < declared; ++i) {
        const std::string& name = spec().outputs[i].name;
        auto it = dict.find(c10::IValue(name));
        if (it == dict.end()) {
          return absl::InternalError(
              absl::StrCat("model '", spec().name, "' returned a dict without key '", name, "'"));
        }
        bound[i] = it->value();
      }
      return bound;
    }
    std::vector<c10::IValue> elements;
    if (result.isTuple()) {
      elements = result.toTupleRef().elements().vec();
    } else if (result.isList()) {
      elements = result.toList().vec();
    } else {
      return absl::InternalError(
          absl::StrCat("model '", spec().name, "' returned a ", result.tagKind(),
                       "; expected a tensor, a tuple/list or a dict of tensors"));
    }
    std::vector<int> positions;
    if (auto by_suffix = PositionsBySuffix(spec().outputs, elements.size())) {
      positions = *by_suffix;
    } else if (elements.size() >= declared) {
      for (size_t i = 0; i < declared; ++i) positions.push_back(static_cast<int>(i));
    } else {
      return absl::InternalError(absl::StrCat("model '", spec().name, "' returned ",
                                              elements.size(), " values but its config declares ",
                                              declared, " outputs"));
    }
    for (size_t i = 0; i < declared; ++i) {
      bound[i] = elements[positions[i]];
    }
    return bound;
  }

  torch::jit::Module module_;
  const std::vector<int> input_positions_;  // forward argument index of each declared input
  const ConvolutionTuning tuning_;
};

StatusOr<std::vector<int>> BindInputs(const ModelSpec& spec, const torch::jit::Module& module) {
  const c10::FunctionSchema& schema = module.get_method("forward").function().getSchema();
  std::vector<std::string> arguments;
  std::vector<std::string> types;
  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.name() == "self") continue;
    arguments.push_back(argument.name());
    types.push_back(argument.type()->annotation_str());
  }
  if (arguments.size() != spec.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward() takes ", arguments.size(), " input(s) (", absl::StrJoin(arguments, ", "),
        ") but config.pbtxt declares ", spec.inputs.size()));
  }
  std::vector<int> positions;
  for (const TensorSpec& input : spec.inputs) {
    auto it = std::find(arguments.begin(), arguments.end(), input.name);
    if (it == arguments.end()) break;
    positions.push_back(static_cast<int>(it - arguments.begin()));
  }
  if (positions.size() != spec.inputs.size()) {
    std::optional<std::vector<int>> by_suffix = PositionsBySuffix(spec.inputs, arguments.size());
    if (!by_suffix) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot bind config inputs to forward(", absl::StrJoin(arguments, ", "),
                       "): name inputs after the forward arguments or INPUT__0, INPUT__1, ..."));
    }
    positions = *std::move(by_suffix);
  }
  // Strings and tensors cannot stand in for each other: say so at load, not on the first request.
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const std::string& type = types[static_cast<size_t>(positions[i])];
    const bool strings = spec.inputs[i].dtype == DataType::kBytes;
    if (strings != (type == "List[str]")) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", spec.inputs[i].name, "' is ",
                       strings ? "TYPE_STRING" : DataTypeName(spec.inputs[i].dtype),
                       " in config.pbtxt, but forward() takes '",
                       arguments[static_cast<size_t>(positions[i])], "' as ", type,
                       strings ? " (a TYPE_STRING input is passed as List[str])"
                               : " (only TYPE_STRING inputs are passed as List[str])"));
    }
  }
  return positions;
}

std::map<int, std::string> ComputeCapabilities(const RuntimeInfo& info) {
  std::map<int, std::string> capabilities;
  for (const GpuInfo& gpu : info.gpus) capabilities[gpu.index] = absl::StrCat(gpu.major, gpu.minor);
  return capabilities;
}

class TorchBackendFactory final : public BackendFactory {
 public:
  TorchBackendFactory(RuntimeInfo info, OperatorLibraries* libraries)
      : info_(std::move(info)),
        aoti_host_(ProbeAotiHost(info_.torch_version, ComputeCapabilities(info_))),
        libraries_(libraries) {
    EnableAotiInputChecks();
  }

  StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadInstances(
      const ModelSpec& spec, const std::filesystem::path& model_file, const Device& device,
      int count) override {
    SLUICE_ASSIGN_OR_RETURN(std::optional<OperatorLibrary> init_library,
                            LoadModelLibraries(spec, model_file));
    // Triton's order: each instance's init hook runs before that instance loads.
    std::vector<std::unique_ptr<ModelInitState>> init_states(count);
    auto init = [&](int i) {
      if (init_library) {
        init_states[i] = libraries_->CallInitHook(*init_library, model_file.parent_path(),
                                                  device.cuda ? device.index : -1);
      }
    };
    // With --model-digests the file loads from a checked copy (the one a .pt2 package of this
    // device kind would load), removed once the instances have read it.
    const ModelPinning* pinning = libraries_ != nullptr ? libraries_->pinning() : nullptr;
    const std::filesystem::path chosen =
        spec.format == ModelFormat::kAotInductor
            ? std::filesystem::path(PackageFileFor(model_file.string(), device))
            : model_file;
    std::filesystem::path load_from = chosen;
    if (pinning != nullptr) {
      SLUICE_ASSIGN_OR_RETURN(load_from, pinning->Pin(chosen, "model file"));
    }
    struct RemoveCopy {
      std::filesystem::path path;
      ~RemoveCopy() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove(path, ec);
      }
    } copy{load_from != chosen ? load_from : std::filesystem::path()};
    std::vector<std::unique_ptr<ModelBackend>> instances;
    if (spec.format == ModelFormat::kAotInductor) {
      for (int i = 0; i < count; ++i) init(i);
      SLUICE_ASSIGN_OR_RETURN(
          instances, LoadAotiInstances(spec, load_from, device, count, aoti_host_, streams_));
    } else {
      for (int i = 0; i < count; ++i) {
        init(i);
        SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ModelBackend> instance,
                                LoadTorchScript(spec, load_from, device));
        instances.push_back(std::move(instance));
      }
    }
    for (size_t i = 0; i < instances.size(); ++i) {
      if (init_states[i])
        static_cast<TorchInstance&>(*instances[i]).HoldInitState(std::move(init_states[i]));
    }
    return instances;
  }

  // The model's operator libraries, loaded (once per process) before its file; the init library
  // (MODEL_INIT_LIBRARY), if any, for its hook.
  StatusOr<std::optional<OperatorLibrary>> LoadModelLibraries(
      const ModelSpec& spec, const std::filesystem::path& model_file) {
    if (spec.operator_libraries.empty() && spec.init_library.empty()) return std::nullopt;
    if (libraries_ == nullptr) {
      return absl::FailedPreconditionError(
          "the model names operator libraries, and this runtime loads none");
    }
    // <model>/<version>/<file>
    const std::filesystem::path model_dir = model_file.parent_path().parent_path();
    for (const std::string& library : spec.operator_libraries) {
      SLUICE_RETURN_IF_ERROR(libraries_->LoadForModel(library, model_dir, spec.name).status());
    }
    if (spec.init_library.empty()) return std::nullopt;
    SLUICE_ASSIGN_OR_RETURN(OperatorLibrary init,
                            libraries_->LoadForModel(spec.init_library, model_dir, spec.name));
    return init;
  }

  StatusOr<std::unique_ptr<ModelBackend>> LoadTorchScript(const ModelSpec& spec,
                                                          const std::filesystem::path& model_file,
                                                          const Device& device) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_file, ec)) {
      return absl::NotFoundError(
          absl::StrCat("model file ", model_file.string(), " does not exist"));
    }
    const torch::Device torch_device = ToTorchDevice(device);
    return CatchTorch(
        absl::StrCat("cannot load ", model_file.string()),
        [&]() -> StatusOr<std::unique_ptr<ModelBackend>> {
          torch::jit::Module module = torch::jit::load(model_file.string(), torch_device);
          module.eval();
          SLUICE_ASSIGN_OR_RETURN(std::vector<int> positions, BindInputs(spec, module));
          ConvolutionTuning tuning = TuneConvolutions(spec, module, torch_device);
          return std::unique_ptr<ModelBackend>(std::make_unique<TorchScriptBackend>(
              spec, std::move(module), torch_device, std::move(positions), std::move(tuning),
              streams_));
        });
  }

  bool CudaUsable() const override { return info_.cuda_usable; }
  int CudaDeviceCount() const override { return info_.cuda_device_count; }
  void ReleaseCachedMemory() override {
    if (!info_.cuda_usable) return;
    const auto no_capture = WaitForGraphCaptures();
    c10::cuda::CUDACachingAllocator::emptyCache();
    // Pinned host memory (staging and output buffers of GPU instances) is cached by its own
    // allocator; the blocks no living instance holds go back too, so RSS falls on unload.
    at::getHostAllocator(at::kCUDA)->empty_cache();
  }
  // A GPU's figures come from LibTorch's caching allocator; one it cannot give (not initialised
  // for that device) reads as zeros, which measures nothing rather than failing a load.
  MemoryReading ReadMemory(const Device& device) override {
    if (!device.cuda) return ReadProcessMemory();
    if (!info_.cuda_usable) return {};
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
          static_cast<c10::DeviceIndex>(device.index));
      const auto& allocated =
          stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      return MemoryReading{static_cast<uint64_t>(allocated.current),
                           static_cast<uint64_t>(allocated.peak)};
    } catch (const std::exception&) {
      return {};
    }
  }
  bool ResetPeakMemory(const Device& device) override {
    if (!device.cuda) return ResetProcessPeak();
    if (!info_.cuda_usable) return false;
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device.index));
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  uint64_t DeviceMemoryBytes(const Device& device) override {
    if (!device.cuda) return 0;
    for (const GpuInfo& gpu : info_.gpus) {
      if (gpu.index == device.index) return gpu.memory_bytes;
    }
    return 0;
  }

 private:
  const std::shared_ptr<StreamRecycler> streams_ = std::make_shared<StreamRecycler>();
  ConvolutionTuning TuneConvolutions(const ModelSpec& spec, const torch::jit::Module& module,
                                     const torch::Device& device)
      ABSL_LOCKS_EXCLUDED(global_flag_mutex_) {
    at::Context& context = at::globalContext();
    ConvolutionFlags flags;
    flags.benchmark = spec.cudnn_benchmark;
    flags.deterministic = context.deterministicCuDNN() || context.deterministicAlgorithms();
    flags.cudnn_enabled = context.userEnabledCuDNN();
    flags.allow_tf32 = context.allowTF32CuDNN();
    ConvolutionTuning tuning = RewriteConvolutions(module, flags);
    // cuDNN runs GPU convolutions only: a CPU instance never needs the global flag.
    if (tuning.fallback.empty() || !device.is_cuda()) return tuning;
    // What the graph cannot carry follows the process-wide flag: the first model that needs it
    // sets it; a later model that wants the opposite runs with the first one's choice.
    MutexLock lock(&global_flag_mutex_);
    if (global_flag_owner_.empty()) {
      global_flag_owner_ = spec.name;
      context.setBenchmarkCuDNN(spec.cudnn_benchmark);
      absl::StrAppend(&tuning.fallback, "; model '", spec.name, "' set the global flag ",
                      spec.cudnn_benchmark ? "on" : "off");
    } else if (context.benchmarkCuDNN() != spec.cudnn_benchmark) {
      absl::StrAppend(&tuning.fallback, "; the global flag is already ",
                      context.benchmarkCuDNN() ? "on" : "off", " for model '", global_flag_owner_,
                      "', so these run with it ", context.benchmarkCuDNN() ? "on" : "off");
    }
    return tuning;
  }

  const RuntimeInfo info_;
  const AotiHost aoti_host_;
  OperatorLibraries* const libraries_;  // may be null: models that name libraries are refused
  Mutex global_flag_mutex_;
  std::string global_flag_owner_ ABSL_GUARDED_BY(global_flag_mutex_);
};

}  // namespace

void ConfigureCudnn(const CudnnSettings& settings) {
  at::Context& context = at::globalContext();
  context.setBenchmarkCuDNN(settings.benchmark);
  context.setDeterministicCuDNN(settings.deterministic);
  context.setAllowTF32CuDNN(settings.allow_tf32);
  // The TorchScript executor settings warm-up relies on (see server/batching/warmup.h): the
  // profiling executor records one run per new input shape (num_profiled_runs = 1), then
  // specialises; sluice.warmup_runs (default 3) covers the profiled run, the optimising run and
  // one steady run per shape.
  torch::jit::getProfilingMode() = true;
  torch::jit::getExecutorMode() = true;
  torch::jit::getNumProfiledRuns() = 1;
}

std::unique_ptr<BackendFactory> MakeTorchBackendFactory(const RuntimeInfo& info,
                                                        OperatorLibraries* libraries) {
  return std::make_unique<TorchBackendFactory>(info, libraries);
}

std::unique_ptr<BackendFactory> MakeTorchBackendFactory() {
  return MakeTorchBackendFactory(ProbeRuntime());
}

}  // namespace sluice
