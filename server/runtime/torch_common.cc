#include "server/runtime/torch_common.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

// The caching allocator's count of allocations it could not satisfy on `device` (after freeing
// its cache and retrying); nullopt where the allocator keeps no statistics (the cudaMallocAsync
// backend throws instead).
std::optional<int64_t> OutOfMemoryCount(c10::DeviceIndex device) {
  try {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device).num_ooms;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// After a failed forward pass: the stream's state, or the thread's last error when the stream is
// clean. A sticky error is returned by both; a non-sticky one left behind is cleared here, so the
// next batch does not inherit it.
int QueryCudaError(const c10::cuda::CUDAStream& stream) {
  const cudaError_t on_stream = cudaStreamQuery(stream.stream());
  const cudaError_t last = cudaGetLastError();
  if (on_stream != cudaSuccess && on_stream != cudaErrorNotReady) return static_cast<int>(on_stream);
  return static_cast<int>(last);
}

}  // namespace

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
    case DataType::kBytes: break;  // List[str]: no tensor holds it
  }
  return at::kFloat;
}

at::Device ToTorchDevice(const Device& device) {
  return device.cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index)) : at::Device(at::kCPU);
}

std::optional<DataType> FromScalarType(at::ScalarType type) {
  for (DataType candidate : kAllDataTypes) {
    if (HasFixedSize(candidate) && ToScalarType(candidate) == type) return candidate;
  }
  return std::nullopt;
}

void ApplyIntraOpThreads(int threads) {
  thread_local int configured_threads = 0;
  if (threads > 0 && configured_threads != threads) {
    at::set_num_threads(threads);
    configured_threads = threads;
  }
}

PinnedStagingBuffer::PinnedStagingBuffer(size_t bytes)
    : tensor_(at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true))) {}

c10::cuda::CUDAStream StreamRecycler::Take(c10::DeviceIndex device) {
  MutexLock lock(&mutex_);
  std::vector<c10::cuda::CUDAStream>& free = free_[device];
  if (free.empty()) return c10::cuda::getStreamFromPool(false, device);
  const c10::cuda::CUDAStream stream = free.back();
  free.pop_back();
  return stream;
}

void StreamRecycler::Give(c10::cuda::CUDAStream stream) {
  MutexLock lock(&mutex_);
  free_[stream.device_index()].push_back(stream);
}

InstanceStream::InstanceStream(std::shared_ptr<StreamRecycler> streams, const at::Device& device)
    : streams_(std::move(streams)) {
  if (device.is_cuda()) stream_ = streams_->Take(device.index());
}

InstanceStream::~InstanceStream() {
  if (!stream_) return;
  // Nothing of ours may still run on it when the next instance takes it.
  CatchTorch("stream synchronize", [&]() -> Status {
    stream_->synchronize();
    return absl::OkStatus();
  }).IgnoreError();
  streams_->Give(*stream_);
}

Status OutputDelivery::Deliver(const std::vector<c10::IValue>& outputs, const InferRequest& request,
                               absl::Span<const OutputTarget> targets) {
  const std::vector<TensorSpec>& declared = spec_->outputs;
  // Only the outputs some target asked for are checked, brought to the host and delivered.
  std::vector<bool> wanted(declared.size(), false);
  for (const OutputTarget& target : targets) {
    if (target.requested == nullptr || target.requested->empty()) {
      wanted.assign(wanted.size(), true);
      break;
    }
    for (const std::string& name : *target.requested) wanted[DeclaredIndex(declared, name)] = true;
  }
  std::vector<at::Tensor> host(declared.size());
  // Serialized List[str] outputs and their shapes; left empty (no allocation) without strings.
  std::vector<std::string> strings;
  std::vector<Shape> string_shapes;
  for (size_t i = 0; i < declared.size(); ++i) {
    if (!wanted[i]) continue;
    if (declared[i].dtype == DataType::kBytes) {
      strings.resize(declared.size());
      string_shapes.resize(declared.size());
      SLUICE_ASSIGN_OR_RETURN(string_shapes[i], SerializeStrings(declared[i], outputs[i], request, &strings[i]));
      continue;
    }
    if (!outputs[i].isTensor()) {
      return absl::InternalError(absl::StrCat("model '", spec_->name, "' returned a ", outputs[i].tagKind(),
                                              " for output '", declared[i].name, "', not a tensor (config.pbtxt declares ",
                                              DataTypeName(declared[i].dtype), ")"));
    }
    const at::Tensor& value = outputs[i].toTensor();
    SLUICE_RETURN_IF_ERROR(Check(declared[i], value, request));
    host[i] = ToHost(i, value);
  }
  // The device-to-pinned copies were queued on the instance's stream; wait for all of them once.
  if (stream_ != nullptr) WaitForStream();
  std::vector<HostOutput> delivered;
  for (size_t i = 0; i < declared.size(); ++i) {
    if (!wanted[i]) continue;
    HostOutput output;
    output.name = &declared[i].name;
    output.dtype = declared[i].dtype;
    if (declared[i].dtype == DataType::kBytes) {
      output.shape = std::move(string_shapes[i]);
      output.data = strings[i].data();
      output.byte_size = strings[i].size();
      output.memory = MemoryType::kCpu;
    } else {
      output.shape.assign(outputs[i].toTensor().sizes().begin(), outputs[i].toTensor().sizes().end());
      output.data = static_cast<const char*>(host[i].data_ptr());
      output.byte_size = host[i].nbytes();
      output.memory = stream_ != nullptr ? MemoryType::kCpuPinned : MemoryType::kCpu;
    }
    delivered.push_back(std::move(output));
  }
  return DeliverOutputs(delivered, targets, spec_->batches());
}

void OutputDelivery::WaitForStream() {
  if (!spec_->cuda_blocking_wait) {
    stream_->synchronize();
    return;
  }
  if (!done_) done_.emplace(cudaEventBlockingSync | cudaEventDisableTiming);
  done_->record(*stream_);
  done_->synchronize();
}

at::Tensor OutputDelivery::ToHost(size_t index, const at::Tensor& value) {
  // A CPU instance whose model made a tensor on a GPU (device='cuda' inside a traced model):
  // copied to the host (a no-op for CPU tensors), never read through a device pointer.
  if (stream_ == nullptr) return value.to(at::kCPU).contiguous();
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

StatusOr<Shape> OutputDelivery::SerializeStrings(const TensorSpec& declared, const c10::IValue& value,
                                                 const InferRequest& request, std::string* bytes) const {
  const std::string& model = spec_->name;
  auto not_strings = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("model '", model, "' returned ", what, " for output '", declared.name,
                                            "', which config.pbtxt declares TYPE_STRING: return a List[str]"));
  };
  if (!value.isList()) return not_strings(absl::StrCat("a ", value.tagKind()));
  const c10::List<c10::IValue> list = value.toList();
  size_t total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue element = list.get(i);
    if (!element.isString()) return not_strings(absl::StrCat("a list holding a ", element.tagKind()));
    total += kBytesLengthSize + element.toStringRef().size();
  }
  bytes->reserve(total);
  for (size_t i = 0; i < list.size(); ++i) AppendBytesElement(list.get(i).toStringRef(), bytes);

  const int64_t count = static_cast<int64_t>(list.size());
  const int64_t rows = spec_->batches() ? request.batch_size : 1;
  const int64_t per_row = rows > 0 ? count / rows : 0;
  Shape shape;
  if (spec_->batches()) shape.push_back(rows);
  bool fits = rows > 0 && count % rows == 0;
  if (declared.dims.empty()) {
    fits = fits && per_row == 1;
  } else {
    fits = fits && (declared.dims[0] == -1 || declared.dims[0] == per_row);
    shape.push_back(per_row);
  }
  if (!fits) {
    return absl::InternalError(absl::StrCat(
        "model '", model, "' returned ", count, " strings for output '", declared.name, "', but config.pbtxt declares ",
        ShapeToString(spec_->FullShape(declared)),
        spec_->batches() ? absl::StrCat(" with batch size ", rows, " (the list is split evenly over the rows)") : ""));
  }
  return shape;
}

Status OutputDelivery::Check(const TensorSpec& declared, const at::Tensor& value, const InferRequest& request) const {
  const std::string& model = spec_->name;
  std::optional<DataType> dtype = FromScalarType(value.scalar_type());
  if (!dtype || *dtype != declared.dtype) {
    return absl::InternalError(absl::StrCat("model '", model, "' produced ", c10::toString(value.scalar_type()),
                                            " for output '", declared.name, "', but config.pbtxt declares ",
                                            DataTypeName(declared.dtype)));
  }
  Shape shape(value.sizes().begin(), value.sizes().end());
  const Shape expected = spec_->FullShape(declared);
  bool matches = shape.size() == expected.size();
  for (size_t i = 0; matches && i < shape.size(); ++i) {
    matches = expected[i] == -1 || expected[i] == shape[i];
  }
  if (matches && spec_->batches()) matches = shape[0] == request.batch_size;
  if (!matches) {
    return absl::InternalError(absl::StrCat(
        "model '", model, "' produced shape ", ShapeToString(shape), " for output '", declared.name,
        "', but config.pbtxt declares ", ShapeToString(expected),
        spec_->batches() ? absl::StrCat(" with batch size ", request.batch_size) : ""));
  }
  return absl::OkStatus();
}

TorchInstance::TorchInstance(ModelSpec spec, at::Device device, std::shared_ptr<StreamRecycler> streams)
    : spec_(std::move(spec)),
      device_(device),
      stream_(std::move(streams), device_),
      delivery_(&spec_, stream_.get()),
      intra_op_threads_(device_.is_cuda() ? 0 : spec_.intra_op_threads) {}

Status TorchInstance::Execute(const InferRequest& batch, absl::Span<const OutputTarget> targets) {
  c10::cuda::CUDAStream* stream = stream_.get();
  // Read before the pass (not kept from the last failure), so that another instance's out of
  // memory on the same device is not charged to this one unless both fail at once.
  const std::optional<int64_t> ooms_before =
      stream != nullptr ? OutOfMemoryCount(stream->device_index()) : std::nullopt;
  ForwardFailure failure;
  std::optional<Status> status = TryTorch(
      [&]() -> Status {
        std::optional<c10::cuda::CUDAStreamGuard> guard;
        if (stream != nullptr) guard.emplace(*stream);
        ApplyIntraOpThreads(intra_op_threads_);
        c10::InferenceMode inference_mode;
        return Run(batch, targets);
      },
      &failure);
  if (status) return *std::move(status);
  if (stream != nullptr) {
    failure.cuda_error = QueryCudaError(*stream);
    const std::optional<int64_t> ooms_after = OutOfMemoryCount(stream->device_index());
    failure.allocator_out_of_memory = ooms_before && ooms_after && *ooms_after > *ooms_before;
  }
  return ForwardFailureStatus(absl::StrCat("model '", spec_.name, "' failed"), failure);
}

std::unique_ptr<StagingBuffer> TorchInstance::AllocateStaging(size_t bytes) {
  if (!device_.is_cuda()) return ModelBackend::AllocateStaging(bytes);
  return std::make_unique<PinnedStagingBuffer>(bytes);
}

at::Tensor TorchInstance::InputTensor(const TensorView& view) const {
  // The request's bytes stay alive and untouched until completion (InferRequest contract).
  at::Tensor tensor = at::from_blob(const_cast<char*>(view.data), view.shape,
                                    at::TensorOptions().dtype(ToScalarType(view.dtype)));
  if (device_.is_cuda()) tensor = tensor.to(device_, /*non_blocking=*/true);
  return tensor;
}

}  // namespace sluice
