#include "server/runtime/torch_backend.h"

#include <ATen/Context.h>
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/mutex.h"
#include "server/runtime/convolution_rewrite.h"

namespace sluice {
namespace {

// CUDA errors after which the device context is unusable: every later call fails too, so the
// process must be restarted (see MarkFatal).
bool IsStickyCudaError(const std::string& message) {
  if (message.find("CUDA error") == std::string::npos) return false;
  for (const char* sticky : {"illegal memory access", "unspecified launch failure", "device-side assert",
                             "misaligned address", "illegal instruction", "uncorrectable ECC",
                             "launch timed out", "hardware stack error"}) {
    if (message.find(sticky) != std::string::npos) return true;
  }
  return false;
}

// An allocation failure, recognised by its message: the TorchScript interpreter rethrows every
// error inside a scripted model as std::runtime_error ("The following operation failed in the
// TorchScript interpreter ..."), so c10::OutOfMemoryError's type does not survive a forward pass,
// and the CPU allocator reports failure as a plain c10::Error.
bool IsOutOfMemory(const std::string& message) {
  for (const char* marker : {"CUDA out of memory", "OutOfMemoryError", "DefaultCPUAllocator: can't allocate memory",
                             "DefaultCPUAllocator: not enough memory"}) {
    if (message.find(marker) != std::string::npos) return true;
  }
  return false;
}

// The status for a LibTorch exception's message: out of memory is RESOURCE_EXHAUSTED (the
// instance serves on), a sticky CUDA error is INTERNAL marked fatal, anything else INTERNAL.
Status TorchFailure(const std::string& what, const std::string& message, bool out_of_memory) {
  if (out_of_memory || IsOutOfMemory(message)) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", TruncateTorchMessage(message)));
  }
  Status status = absl::InternalError(absl::StrCat(what, ": ", TruncateTorchMessage(message)));
  return IsStickyCudaError(message) ? MarkFatal(std::move(status)) : status;
}

// Runs `fn`, turning LibTorch exceptions into statuses (TorchFailure).
template <typename Fn>
auto CatchTorch(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    return TorchFailure(what, e.what_without_backtrace(), /*out_of_memory=*/true);
  } catch (const c10::Error& e) {
    return TorchFailure(what, e.what_without_backtrace(), /*out_of_memory=*/false);
  } catch (const std::exception& e) {
    return TorchFailure(what, e.what(), /*out_of_memory=*/false);
  }
}

at::ScalarType ToScalarType(DataType type) {
  switch (type) {
    case DataType::kBool: return at::kBool;
    case DataType::kUint8: return at::kByte;
    case DataType::kInt8: return at::kChar;
    case DataType::kInt16: return at::kShort;
    case DataType::kInt32: return at::kInt;
    case DataType::kInt64: return at::kLong;
    case DataType::kFp16: return at::kHalf;
    case DataType::kBf16: return at::kBFloat16;
    case DataType::kFp32: return at::kFloat;
    case DataType::kFp64: return at::kDouble;
  }
  return at::kFloat;
}

std::optional<DataType> FromScalarType(at::ScalarType type) {
  for (DataType candidate : kAllDataTypes) {
    if (ToScalarType(candidate) == type) return candidate;
  }
  return std::nullopt;
}

// "INPUT__3" -> 3; nullopt without a `__<non-negative integer>` suffix.
std::optional<int> IndexSuffix(const std::string& name) {
  const size_t pos = name.rfind("__");
  int index = 0;
  if (pos == std::string::npos || !absl::SimpleAtoi(name.substr(pos + 2), &index) || index < 0) {
    return std::nullopt;
  }
  return index;
}

// For each declared tensor, its position (a forward argument, or an element of the returned
// tuple): by `__<index>` suffix when every name has a distinct one below `count`, else nullopt.
std::optional<std::vector<int>> PositionsBySuffix(const std::vector<TensorSpec>& tensors, size_t count) {
  std::vector<int> positions;
  std::vector<bool> taken(count, false);
  for (const TensorSpec& tensor : tensors) {
    std::optional<int> index = IndexSuffix(tensor.name);
    if (!index || static_cast<size_t>(*index) >= count || taken[*index]) return std::nullopt;
    taken[*index] = true;
    positions.push_back(*index);
  }
  return positions;
}

class PinnedStagingBuffer final : public StagingBuffer {
 public:
  explicit PinnedStagingBuffer(size_t bytes)
      : tensor_(at::empty({static_cast<int64_t>(bytes)},
                          at::TensorOptions().dtype(at::kByte).pinned_memory(true))) {}
  char* data() override { return static_cast<char*>(tensor_.data_ptr()); }
  size_t size() const override { return tensor_.nbytes(); }

 private:
  at::Tensor tensor_;
};

// CUDA streams for GPU instances: an instance hands its stream back when it is destroyed, and
// the next instance on that device takes it again. LibTorch keeps a cuBLAS workspace (32 MiB on
// Hopper) per (cuBLAS handle, stream) pair for the life of the process; handles already return
// to LibTorch's pool when an instance's worker thread ends, so reusing streams too keeps the
// pairs, and their workspaces, bounded by the instances alive at once. A fresh pool stream per
// load would leave one more workspace behind on every reload that unloading never gives back.
// Thread-safe.
class StreamRecycler {
 public:
  c10::cuda::CUDAStream Take(c10::DeviceIndex device) ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    std::vector<c10::cuda::CUDAStream>& free = free_[device];
    if (free.empty()) return c10::cuda::getStreamFromPool(false, device);
    const c10::cuda::CUDAStream stream = free.back();
    free.pop_back();
    return stream;
  }
  // `stream` must have no work pending for its owner any more.
  void Give(c10::cuda::CUDAStream stream) ABSL_LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(&mutex_);
    free_[stream.device_index()].push_back(stream);
  }

 private:
  Mutex mutex_;
  std::unordered_map<c10::DeviceIndex, std::vector<c10::cuda::CUDAStream>> free_ ABSL_GUARDED_BY(mutex_);
};

class TorchScriptBackend final : public ModelBackend {
 public:
  TorchScriptBackend(ModelSpec spec, torch::jit::Module module, torch::Device device,
                     std::vector<int> input_positions, size_t forward_arity, ConvolutionTuning tuning,
                     std::shared_ptr<StreamRecycler> streams)
      : spec_(std::move(spec)),
        module_(std::move(module)),
        device_(device),
        input_positions_(std::move(input_positions)),
        forward_arity_(forward_arity),
        tuning_(std::move(tuning)),
        streams_(std::move(streams)) {
    if (device_.is_cuda()) {
      stream_ = streams_->Take(device_.index());
    } else {
      intra_op_threads_ = spec_.intra_op_threads;  // 0: LibTorch's own default
    }
  }

  ~TorchScriptBackend() override {
    if (!stream_) return;
    // Nothing of ours may still run on it when the next instance takes it.
    CatchTorch("stream synchronize", [&]() -> Status {
      stream_->synchronize();
      return absl::OkStatus();
    }).IgnoreError();
    streams_->Give(*stream_);
  }

  Status Execute(const InferRequest& batch, absl::Span<const OutputTarget> targets) override {
    return CatchTorch(absl::StrCat("model '", spec_.name, "' failed"), [&]() -> Status {
      if (!stream_) return Run(batch, targets);
      // Each instance runs on its own stream, so instances on one GPU overlap.
      c10::cuda::CUDAStreamGuard guard(*stream_);
      return Run(batch, targets);
    });
  }

  // Pinned host memory on a GPU instance, so the host-to-device copy can be asynchronous.
  std::unique_ptr<StagingBuffer> AllocateStaging(size_t bytes) override {
    if (!device_.is_cuda()) return ModelBackend::AllocateStaging(bytes);
    return std::make_unique<PinnedStagingBuffer>(bytes);
  }

  ConvolutionTuning Tuning() const override { return tuning_; }

 private:
  Status Run(const InferRequest& request, absl::Span<const OutputTarget> targets) {
    // LibTorch's CPU pool (OpenMP in the torch wheel) takes its thread count per calling thread,
    // and each instance has its own worker thread: set it once on that thread.
    thread_local int configured_threads = 0;
    if (intra_op_threads_ > 0 && configured_threads != intra_op_threads_) {
      at::set_num_threads(intra_op_threads_);
      configured_threads = intra_op_threads_;
    }
    c10::InferenceMode inference_mode;
    std::vector<c10::IValue> arguments(forward_arity_);
    for (const TensorView& input : request.inputs) {
      const size_t declared = DeclaredIndex(spec_.inputs, input.name);
      // The request's bytes stay alive and untouched until completion (InferRequest contract);
      // from_blob only wraps them, so the CPU path copies nothing.
      at::Tensor tensor = torch::from_blob(const_cast<char*>(input.data), input.shape,
                                           torch::TensorOptions().dtype(ToScalarType(input.dtype)));
      // From pinned staging memory this copy is asynchronous on the instance's stream; reading
      // the outputs back below synchronises before the staging buffer is reused.
      if (device_.is_cuda()) tensor = tensor.to(device_, /*non_blocking=*/true);
      arguments[input_positions_[declared]] = std::move(tensor);
    }
    c10::IValue result = module_.forward(std::move(arguments));
    SLUICE_ASSIGN_OR_RETURN(std::vector<at::Tensor> outputs, BindOutputs(result));

    // Only the outputs some target asked for are checked, brought to the host and delivered.
    std::vector<bool> wanted(spec_.outputs.size(), false);
    for (const OutputTarget& target : targets) {
      if (target.requested == nullptr || target.requested->empty()) {
        wanted.assign(wanted.size(), true);
        break;
      }
      for (const std::string& name : *target.requested) wanted[DeclaredIndex(spec_.outputs, name)] = true;
    }
    std::vector<at::Tensor> host(spec_.outputs.size());
    std::vector<HostOutput> delivered;
    for (size_t i = 0; i < spec_.outputs.size(); ++i) {
      if (!wanted[i]) continue;
      SLUICE_RETURN_IF_ERROR(CheckOutput(spec_.outputs[i], outputs[i], request));
      host[i] = ToHost(i, outputs[i]);
    }
    // The device-to-pinned copies were queued on the instance's stream; wait for all of them once.
    if (stream_) stream_->synchronize();
    for (size_t i = 0; i < spec_.outputs.size(); ++i) {
      if (!wanted[i]) continue;
      HostOutput output;
      output.name = &spec_.outputs[i].name;
      output.dtype = spec_.outputs[i].dtype;
      output.shape.assign(outputs[i].sizes().begin(), outputs[i].sizes().end());
      output.data = static_cast<const char*>(host[i].data_ptr());
      output.byte_size = host[i].nbytes();
      output.memory = device_.is_cuda() ? MemoryType::kCpuPinned : MemoryType::kCpu;
      delivered.push_back(std::move(output));
    }
    return DeliverOutputs(delivered, targets, spec_.batches());
  }

  // Output `index` in contiguous host memory. CPU: the tensor itself when it is contiguous (the
  // sink copy is then the only one). GPU: an asynchronous copy into this instance's pinned buffer
  // for that output (reused, grown when a larger batch needs it); the caller synchronises.
  at::Tensor ToHost(size_t index, const at::Tensor& value) {
    if (!device_.is_cuda()) return value.contiguous();
    if (pinned_outputs_.size() <= index) pinned_outputs_.resize(index + 1);
    at::Tensor& pinned = pinned_outputs_[index];
    const int64_t bytes = static_cast<int64_t>(value.nbytes());
    if (!pinned.defined() || pinned.numel() < bytes) {
      pinned = at::empty({std::max<int64_t>(bytes, 64)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    }
    at::Tensor view = pinned.narrow(0, 0, bytes).view(value.scalar_type()).view(value.sizes());
    view.copy_(value, /*non_blocking=*/true);
    return view;
  }

  static size_t DeclaredIndex(const std::vector<TensorSpec>& tensors, const std::string& name) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].name == name) return i;
    }
    return 0;  // unreachable for validated requests
  }

  // The returned value's tensors, one per declared output, in config order.
  StatusOr<std::vector<at::Tensor>> BindOutputs(const c10::IValue& result) {
    const size_t declared = spec_.outputs.size();
    std::vector<at::Tensor> bound(declared);
    auto expect_tensor = [&](const c10::IValue& value, const std::string& what) -> StatusOr<at::Tensor> {
      if (!value.isTensor()) {
        return absl::InternalError(absl::StrCat("model '", spec_.name, "' returned a ",
                                                value.tagKind(), " for ", what, ", not a tensor"));
      }
      return value.toTensor();
    };
    if (result.isTensor()) {
      if (declared != 1) {
        return absl::InternalError(absl::StrCat("model '", spec_.name,
                                                "' returned one tensor but its config declares ",
                                                declared, " outputs"));
      }
      bound[0] = result.toTensor();
      return bound;
    }
    if (result.isGenericDict()) {
      const c10::Dict<c10::IValue, c10::IValue> dict = result.toGenericDict();
      for (size_t i = 0; i < declared; ++i) {
        const std::string& name = spec_.outputs[i].name;
        auto it = dict.find(c10::IValue(name));
        if (it == dict.end()) {
          return absl::InternalError(absl::StrCat("model '", spec_.name,
                                                  "' returned a dict without key '", name, "'"));
        }
        SLUICE_ASSIGN_OR_RETURN(bound[i], expect_tensor(it->value(), absl::StrCat("key '", name, "'")));
      }
      return bound;
    }
    std::vector<c10::IValue> elements;
    if (result.isTuple()) {
      elements = result.toTupleRef().elements().vec();
    } else if (result.isList()) {
      elements = result.toList().vec();
    } else {
      return absl::InternalError(absl::StrCat("model '", spec_.name, "' returned a ",
                                              result.tagKind(),
                                              "; expected a tensor, a tuple/list or a dict of tensors"));
    }
    std::vector<int> positions;
    if (auto by_suffix = PositionsBySuffix(spec_.outputs, elements.size())) {
      positions = *by_suffix;
    } else if (elements.size() >= declared) {
      for (size_t i = 0; i < declared; ++i) positions.push_back(static_cast<int>(i));
    } else {
      return absl::InternalError(absl::StrCat("model '", spec_.name, "' returned ", elements.size(),
                                              " values but its config declares ", declared, " outputs"));
    }
    for (size_t i = 0; i < declared; ++i) {
      SLUICE_ASSIGN_OR_RETURN(bound[i], expect_tensor(elements[positions[i]],
                                                      absl::StrCat("output '", spec_.outputs[i].name, "'")));
    }
    return bound;
  }

  Status CheckOutput(const TensorSpec& declared, const at::Tensor& value, const InferRequest& request) {
    std::optional<DataType> dtype = FromScalarType(value.scalar_type());
    if (!dtype || *dtype != declared.dtype) {
      return absl::InternalError(absl::StrCat(
          "model '", spec_.name, "' produced ", c10::toString(value.scalar_type()), " for output '",
          declared.name, "', but config.pbtxt declares ", DataTypeName(declared.dtype)));
    }
    Shape shape(value.sizes().begin(), value.sizes().end());
    const Shape expected = spec_.FullShape(declared);
    bool matches = shape.size() == expected.size();
    for (size_t i = 0; matches && i < shape.size(); ++i) {
      matches = expected[i] == -1 || expected[i] == shape[i];
    }
    if (matches && spec_.batches()) matches = shape[0] == request.batch_size;
    if (!matches) {
      return absl::InternalError(absl::StrCat(
          "model '", spec_.name, "' produced shape ", ShapeToString(shape), " for output '",
          declared.name, "', but config.pbtxt declares ", ShapeToString(expected),
          spec_.batches() ? absl::StrCat(" with batch size ", request.batch_size) : ""));
    }
    return absl::OkStatus();
  }

  const ModelSpec spec_;
  torch::jit::Module module_;
  const torch::Device device_;
  const std::vector<int> input_positions_;  // forward argument index of each declared input
  const size_t forward_arity_;
  std::optional<c10::cuda::CUDAStream> stream_;  // GPU instances only
  std::vector<at::Tensor> pinned_outputs_;  // GPU instances: per declared output, bytes; worker thread only
  int intra_op_threads_ = 0;  // CPU instances only; the manager sets the default split
  const ConvolutionTuning tuning_;
  const std::shared_ptr<StreamRecycler> streams_;  // shared with the factory; outlives it if need be
};

StatusOr<std::vector<int>> BindInputs(const ModelSpec& spec, const torch::jit::Module& module) {
  const c10::FunctionSchema& schema = module.get_method("forward").function().getSchema();
  std::vector<std::string> arguments;
  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.name() != "self") arguments.push_back(argument.name());
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
  if (positions.size() == spec.inputs.size()) return positions;
  if (auto by_suffix = PositionsBySuffix(spec.inputs, arguments.size())) return *by_suffix;
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot bind config inputs to forward(", absl::StrJoin(arguments, ", "),
      "): name inputs after the forward arguments or INPUT__0, INPUT__1, ..."));
}

class TorchBackendFactory final : public BackendFactory {
 public:
  explicit TorchBackendFactory(RuntimeInfo info) : info_(std::move(info)) {}

  StatusOr<std::unique_ptr<ModelBackend>> Load(const ModelSpec& spec,
                                               const std::filesystem::path& model_file,
                                               const Device& device) override {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_file, ec)) {
      return absl::NotFoundError(absl::StrCat("model file ", model_file.string(), " does not exist"));
    }
    const torch::Device torch_device =
        device.cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                    : torch::Device(torch::kCPU);
    return CatchTorch(absl::StrCat("cannot load ", model_file.string()),
                      [&]() -> StatusOr<std::unique_ptr<ModelBackend>> {
                        torch::jit::Module module = torch::jit::load(model_file.string(), torch_device);
                        module.eval();
                        SLUICE_ASSIGN_OR_RETURN(std::vector<int> positions, BindInputs(spec, module));
                        ConvolutionTuning tuning = TuneConvolutions(spec, module, torch_device);
                        const size_t arity = spec.inputs.size();
                        return std::unique_ptr<ModelBackend>(std::make_unique<TorchScriptBackend>(
                            spec, std::move(module), torch_device, std::move(positions), arity,
                            std::move(tuning), streams_));
                      });
  }

  bool CudaUsable() const override { return info_.cuda_usable; }
  int CudaDeviceCount() const override { return info_.cuda_device_count; }
  void ReleaseCachedMemory() override {
    if (info_.cuda_usable) c10::cuda::CUDACachingAllocator::emptyCache();
  }

 private:
  const std::shared_ptr<StreamRecycler> streams_ = std::make_shared<StreamRecycler>();
  ConvolutionTuning TuneConvolutions(const ModelSpec& spec, const torch::jit::Module& module,
                                     const torch::Device& device) ABSL_LOCKS_EXCLUDED(global_flag_mutex_) {
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

std::unique_ptr<BackendFactory> MakeTorchBackendFactory(const RuntimeInfo& info) {
  return std::make_unique<TorchBackendFactory>(info);
}

std::unique_ptr<BackendFactory> MakeTorchBackendFactory() { return MakeTorchBackendFactory(ProbeRuntime()); }

}  // namespace sluice
