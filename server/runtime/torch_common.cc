#include "server/runtime/torch_common.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <shared_mutex>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/bytes_tensor.h"
#include "server/core/runtime_log.h"

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
  if (on_stream != cudaSuccess && on_stream != cudaErrorNotReady)
    return static_cast<int>(on_stream);
  return static_cast<int>(last);
}

}  // namespace

at::ScalarType ToScalarType(DataType type) {
  switch (type) {
    case DataType::kBool:
      return at::kBool;
    case DataType::kUint8:
      return at::kByte;
    case DataType::kInt8:
      return at::kChar;
    case DataType::kInt16:
      return at::kShort;
    case DataType::kInt32:
      return at::kInt;
    case DataType::kInt64:
      return at::kLong;
    case DataType::kFp16:
      return at::kHalf;
    case DataType::kBf16:
      return at::kBFloat16;
    case DataType::kFp32:
      return at::kFloat;
    case DataType::kFp64:
      return at::kDouble;
    case DataType::kBytes:
      break;  // List[str]: no tensor holds it
  }
  return at::kFloat;
}

at::Device ToTorchDevice(const Device& device) {
  return device.cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                     : at::Device(at::kCPU);
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
    : tensor_(at::empty({static_cast<int64_t>(bytes)},
                        at::TensorOptions().dtype(at::kByte).pinned_memory(true))) {}

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

namespace {

// Bytes per row of a batch's output (its first dimension the rows).
size_t RowBytes(const at::Tensor& whole) {
  return whole.dim() == 0 || whole.size(0) == 0
             ? 0
             : whole.nbytes() / static_cast<size_t>(whole.size(0));
}

}  // namespace

TorchHeldTensor::TorchHeldTensor(at::Tensor whole, int64_t first_row, DataType dtype, Shape shape)
    : HeldTensor(dtype, shape,
                 first_row < 0 ? whole.nbytes() : RowBytes(whole) * static_cast<size_t>(shape[0]),
                 whole.is_cuda() ? whole.device().index() : kHost),
      whole_(std::move(whole)),
      first_row_(first_row),
      host_data_(
          whole_.is_cuda() || whole_.nbytes() == 0
              ? nullptr
              : static_cast<const char*>(whole_.const_data_ptr()) +
                    (first_row < 0 ? 0 : RowBytes(whole_) * static_cast<size_t>(first_row))) {}

at::Tensor TorchHeldTensor::tensor() const {
  // Every row of the batch (a batch of one request): the tensor itself, no view to make.
  if (first_row_ < 0 || (first_row_ == 0 && whole_.size(0) == shape()[0])) return whole_;
  return whole_.narrow(0, first_row_, shape()[0]);
}

Status TorchHeldTensor::CopyToHost(char* to) const {
  if (byte_size() == 0) return absl::OkStatus();
  if (host_data_ != nullptr) {
    std::memcpy(to, host_data_, byte_size());
    return absl::OkStatus();
  }
  return CatchTorch("copying a held tensor to the host", [&]() -> Status {
    // Synchronous: pageable host memory (the producer's work on the tensor is already done).
    const at::Tensor rows = tensor();
    at::from_blob(to, rows.sizes(), at::TensorOptions().dtype(rows.scalar_type())).copy_(rows);
    return absl::OkStatus();
  });
}

namespace {

// One output handed out held: `whole` (contiguous, complete) is sliced by rows, without a copy.
class TensorHolder final : public OutputHolder {
 public:
  // `copied`: `whole` is a copy the delivery made to hand it out (counted on each slice).
  TensorHolder(at::Tensor whole, DataType dtype, bool batched, bool copied)
      : whole_(std::move(whole)), dtype_(dtype), batched_(batched), copied_(copied) {}

  StatusOr<std::shared_ptr<HeldTensor>> Rows(int64_t first_row, const Shape& shape) const override {
    auto held = std::make_shared<TorchHeldTensor>(whole_, batched_ ? first_row : -1, dtype_, shape);
    if (copied_) held->set_copied_at_birth(held->byte_size());
    return held;
  }

 private:
  const at::Tensor whole_;
  const DataType dtype_;
  const bool batched_;
  const bool copied_;
};

// Whether `value` lies in memory the batch's host inputs view (a CPU model that returns its
// input): the caller's bytes or a staging buffer, neither of which outlives the batch.
bool ViewsInputBytes(const at::Tensor& value, const InferRequest& batch) {
  if (value.is_cuda() || value.nbytes() == 0) return false;
  const char* start = static_cast<const char*>(value.storage().data());
  const char* end = start + value.storage().nbytes();
  for (const TensorView& input : batch.inputs) {
    if (input.data == nullptr) continue;
    if (start < input.data + input.byte_size && input.data < end) return true;
  }
  return false;
}

}  // namespace

Status OutputDelivery::Deliver(const std::vector<c10::IValue>& outputs, const InferRequest& request,
                               absl::Span<const OutputTarget> targets, bool reused) {
  const std::vector<TensorSpec>& declared = spec_->outputs;
  // Only the outputs some target asked for are checked and delivered; brought to the host only
  // those that a target needs there, held only those that a target takes held.
  absl::InlinedVector<bool, 8> wanted(declared.size(), false);
  absl::InlinedVector<bool, 8> to_host(declared.size(), false);
  absl::InlinedVector<bool, 8> to_hold(declared.size(), false);
  for (const OutputTarget& target : targets) {
    auto want = [&](size_t i) {
      wanted[i] = true;
      const bool held =
          declared[i].dtype != DataType::kBytes && target.sink->TakesHeld(declared[i].name);
      (held ? to_hold : to_host)[i] = true;
    };
    if (target.requested == nullptr || target.requested->empty()) {
      // Every output but a state output the config does not list: that one is the server's
      // (SequenceStateStore), never a client's (validation refuses it by name).
      for (size_t i = 0; i < declared.size(); ++i) {
        if (!declared[i].state_only) want(i);
      }
      continue;
    }
    for (const std::string& name : *target.requested) want(DeclaredIndex(declared, name));
  }
  std::vector<at::Tensor> host(declared.size());
  std::vector<std::optional<TensorHolder>> holders(declared.size());
  // Serialized List[str] outputs and their shapes; left empty (no allocation) without strings.
  std::vector<std::string> strings;
  std::vector<Shape> string_shapes;
  for (size_t i = 0; i < declared.size(); ++i) {
    if (!wanted[i]) continue;
    if (declared[i].dtype == DataType::kBytes) {
      strings.resize(declared.size());
      string_shapes.resize(declared.size());
      SLUICE_ASSIGN_OR_RETURN(string_shapes[i],
                              SerializeStrings(declared[i], outputs[i], request, &strings[i]));
      continue;
    }
    if (!outputs[i].isTensor()) {
      return absl::InternalError(
          absl::StrCat("model '", spec_->name, "' returned a ", outputs[i].tagKind(),
                       " for output '", declared[i].name, "', not a tensor (config.pbtxt declares ",
                       DataTypeName(declared[i].dtype), ")"));
    }
    const at::Tensor& value = outputs[i].toTensor();
    SLUICE_RETURN_IF_ERROR(Check(declared[i], value, request));
    if (to_host[i]) host[i] = ToHost(i, value);
    if (to_hold[i]) {
      // Copied (before the wait below, so the copy is done when it is handed out) where the
      // tensor would not outlive this batch as it is; sliced by rows otherwise. A CPU instance
      // hands out host tensors (a model that made a CUDA one: copied here, synchronously).
      at::Tensor held = value;
      bool copy = true;
      if (stream_ == nullptr && value.is_cuda()) {
        held = value.to(at::kCPU).contiguous();
      } else if (reused || ViewsInputBytes(value, request) || !value.is_contiguous()) {
        held = value.clone(at::MemoryFormat::Contiguous);
      } else {
        copy = false;
      }
      holders[i].emplace(std::move(held), declared[i].dtype, spec_->batches(), copy);
    }
  }
  if (marks_ != nullptr) marks_->Set(PhaseMarks::kOutputsQueued);
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
      const at::Tensor& value = outputs[i].toTensor();
      output.shape.assign(value.sizes().begin(), value.sizes().end());
      // Clients see `dims` where the config reshapes the model's output.
      if (declared[i].reshape) output.shape = spec_->ToClientShape(declared[i], output.shape);
      output.byte_size = value.nbytes();
      if (host[i].defined()) output.data = static_cast<const char*>(host[i].data_ptr());
      output.memory = stream_ != nullptr ? MemoryType::kCpuPinned : MemoryType::kCpu;
      if (holders[i]) output.holder = &*holders[i];
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
    pinned = at::empty({std::max<int64_t>(bytes, 64)},
                       at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  at::Tensor view = pinned.narrow(0, 0, bytes).view(value.scalar_type()).view(value.sizes());
  view.copy_(value, /*non_blocking=*/true);
  return view;
}

StatusOr<Shape> OutputDelivery::SerializeStrings(const TensorSpec& declared,
                                                 const c10::IValue& value,
                                                 const InferRequest& request,
                                                 std::string* bytes) const {
  const std::string& model = spec_->name;
  auto not_strings = [&](const std::string& what) {
    return absl::InternalError(
        absl::StrCat("model '", model, "' returned ", what, " for output '", declared.name,
                     "', which config.pbtxt declares TYPE_STRING: return a List[str]"));
  };
  if (!value.isList()) return not_strings(absl::StrCat("a ", value.tagKind()));
  const c10::List<c10::IValue> list = value.toList();
  size_t total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue element = list.get(i);
    if (!element.isString())
      return not_strings(absl::StrCat("a list holding a ", element.tagKind()));
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
        "model '", model, "' returned ", count, " strings for output '", declared.name,
        "', but config.pbtxt declares ", ShapeToString(spec_->FullShape(declared)),
        spec_->batches()
            ? absl::StrCat(" with batch size ", rows, " (the list is split evenly over the rows)")
            : ""));
  }
  return shape;
}

Status OutputDelivery::Check(const TensorSpec& declared, const at::Tensor& value,
                             const InferRequest& request) const {
  const std::string& model = spec_->name;
  std::optional<DataType> dtype = FromScalarType(value.scalar_type());
  if (!dtype || *dtype != declared.dtype) {
    return absl::InternalError(absl::StrCat(
        "model '", model, "' produced ", c10::toString(value.scalar_type()), " for output '",
        declared.name, "', but config.pbtxt declares ", DataTypeName(declared.dtype)));
  }
  Shape shape(value.sizes().begin(), value.sizes().end());
  const Shape expected = spec_->ModelFullShape(declared);
  bool matches = shape.size() == expected.size();
  for (size_t i = 0; matches && i < shape.size(); ++i) {
    matches = expected[i] == -1 || expected[i] == shape[i];
  }
  if (matches && spec_->batches()) matches = shape[0] == request.batch_size;
  if (!matches) {
    return absl::InternalError(absl::StrCat(
        "model '", model, "' produced shape ", ShapeToString(shape), " for output '", declared.name,
        "', but config.pbtxt declares ", ShapeToString(expected),
        declared.reshape ? " (its reshape)" : "",
        spec_->batches() ? absl::StrCat(" with batch size ", request.batch_size) : ""));
  }
  return absl::OkStatus();
}

namespace {

// A BYTES input (validated, or assembled from validated requests) as the one flat List[str] a
// TorchScript model takes: every element of every row, in order, padding rows as empty strings.
c10::IValue StringList(const TensorView& input) {
  const std::vector<std::string_view> elements =
      SplitBytesTensor(std::string_view(input.data, input.byte_size));
  c10::List<std::string> list;
  list.reserve(elements.size());
  for (std::string_view element : elements) list.push_back(std::string(element));
  return list;
}

// The largest difference between two answers, output by output, in float32 (float64 for FP64
// outputs): equal values (infinities too) and NaN where both are NaN count as no difference, a
// NaN on one side only as an infinite one; infinite when their dtypes or shapes differ.
double LargestDifference(const std::vector<c10::IValue>& a, const std::vector<c10::IValue>& b) {
  constexpr double kInfinite = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return kInfinite;
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].isTensor() || !b[i].isTensor()) return kInfinite;
    const at::Tensor x = a[i].toTensor();
    const at::Tensor y = b[i].toTensor();
    if (x.scalar_type() != y.scalar_type() || !x.sizes().equals(y.sizes())) return kInfinite;
    if (x.numel() == 0 || at::equal(x, y)) continue;
    // Integers and booleans differ or not: float32 would hide differences above 2^24.
    if (!at::isFloatingType(x.scalar_type())) return kInfinite;
    const at::ScalarType type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor xf = x.to(type), yf = y.to(type);
    const at::Tensor same = at::logical_or(at::eq(xf, yf), at::logical_and(xf.isnan(), yf.isnan()));
    at::Tensor difference = at::sub(xf, yf).abs();
    difference = at::nan_to_num(difference, kInfinite, kInfinite, kInfinite);
    difference = at::where(same, at::zeros_like(difference), difference);
    largest = std::max(largest, difference.max().item<double>());
  }
  return largest;
}

// Capturing and replaying CUDA graphs touch LibTorch's process-wide state: the device's default
// generator, which every graph registers and a capture marks as capturing (a replay elsewhere
// meanwhile throws), and the caching allocator's capture routing (emptying the cache during a
// capture asserts). Captures therefore run alone, replays together, and graphs are destroyed
// and the cache emptied only while no capture runs.
std::shared_mutex& GraphMutex() {
  static std::shared_mutex mutex;
  return mutex;
}

// Set when a failed capture left LibTorch's capture state in a way this process could not undo:
// every instance then runs without graphs (see AbandonCapture).
std::atomic<bool> graphs_unusable{false};

// at::cuda::CUDAGraph with what undoing an abandoned capture needs of its protected state.
class InspectableGraph final : public at::cuda::CUDAGraph {
 public:
  bool capture_ended() const { return capture_ended_; }
  // What capture_end's epilogue does for the generators this graph registered: they are no
  // longer capturing. Only while no capture runs anywhere (GraphMutex held exclusively).
  void EndGeneratorCapture() {
    for (auto& [state, increment] : captured_generator_states_) state->capturing_ = false;
  }
};

// After a capture that failed between capture_begin (or during it) and a successful capture_end:
// ends the stream's capture (capture_end, which throws once the capture is invalid, before its
// own clean-up), then what that clean-up would have done: the device and host allocators'
// routing into the pool and the use of the pool that capture_begin took (released only where
// the routing was found and ended, so never twice), and the generators' capturing state. Holds
// GraphMutex exclusively. A stream that is still capturing afterwards cannot be trusted: graphs
// are then off for the process.
void AbandonCapture(InspectableGraph& graph, const c10::cuda::CUDAStream& stream,
                    c10::MempoolId_t pool) {
  ForwardFailure ignored;
  TryTorch(
      [&] {
        graph.capture_end();
        return 0;
      },
      &ignored);
  if (!graph.capture_ended()) {
    const c10::DeviceIndex device = stream.device_index();
    if (TryTorch(
            [&] {
              c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
              return 0;
            },
            &ignored)) {
      TryTorch(
          [&] {
            c10::cuda::CUDACachingAllocator::releasePool(device, pool);
            return 0;
          },
          &ignored);
    }
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    if (TryTorch(
            [&] {
              host->end_allocate_to_pool(pool);
              return 0;
            },
            &ignored)) {
      TryTorch(
          [&] {
            host->release_pool(pool);
            return 0;
          },
          &ignored);
    }
    graph.EndGeneratorCapture();
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t queried = cudaStreamIsCapturing(stream.stream(), &capture);
  (void)cudaGetLastError();  // a capture's error is not sticky: clear it for the next pass
  if (queried != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    graphs_unusable.store(true);
    LogRuntimeWarning(
        "event=cuda_graphs_off scope=process reason=\"a failed capture could not be ended on its "
        "stream: every model "
        "runs without graphs until the server restarts\"");
  }
}

std::string ShapeKey(const ModelSpec& spec, const InferRequest& batch) {
  std::string key;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    for (const TensorView& view : batch.inputs) {
      if (view.name != spec.inputs[i].name) continue;
      absl::StrAppend(&key, i == 0 ? "" : " ", view.name, ":", DataTypeName(view.dtype), "[",
                      absl::StrJoin(view.shape, ","), "]");
    }
  }
  return key;
}

}  // namespace

struct TorchInstance::CapturedGraph {
  // The graph is destroyed while no capture runs (GraphMutex): its destructor unregisters it
  // from the device's generator and gives its pool back. Never destroyed by a thread that holds
  // GraphMutex.
  ~CapturedGraph() {
    outputs.clear();
    inputs.clear();
    std::unique_lock<std::shared_mutex> lock(GraphMutex());
    ForwardFailure ignored;
    TryTorch(
        [&] {
          graph->reset();
          return 0;
        },
        &ignored);  // CUDAGraph::reset: what may throw, caught
    graph.reset();  // the destructor unregisters it from the device's generator, under the lock too
  }
  std::unique_ptr<InspectableGraph> graph = std::make_unique<InspectableGraph>();
  std::vector<at::Tensor> inputs;    // static, config order (undefined where an input is absent)
  std::vector<c10::IValue> outputs;  // static, config order: what a replay writes
};

TorchInstance::TorchInstance(ModelSpec spec, at::Device device,
                             std::shared_ptr<StreamRecycler> streams)
    : spec_(std::move(spec)),
      device_(device),
      stream_(std::move(streams), device_),
      marks_(stream_.get()),
      delivery_(&spec_, stream_.get(), &marks_),
      intra_op_threads_(device_.is_cuda() ? 0 : spec_.intra_op_threads),
      inputs_reshaped_(std::any_of(spec_.inputs.begin(), spec_.inputs.end(),
                                   [](const TensorSpec& input) { return input.reshape; })),
      states_(SequenceStateStore::Create(spec_, device_)) {
  if (!spec_.cuda_graphs) return;
  const auto strings = [](const std::vector<TensorSpec>& tensors) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [](const TensorSpec& t) { return t.dtype == DataType::kBytes; });
  };
  if (!device_.is_cuda()) {
    graphs_ignored_ = "optimization.cuda.graphs is ignored: the instance runs on the CPU";
  } else if (spec_.format == ModelFormat::kAotInductor) {
    graphs_ignored_ =
        "optimization.cuda.graphs is ignored for AOTInductor packages: their runner records CUDA "
        "events on each run, "
        "which a capture cannot hold";
  } else if (states_ != nullptr) {
    graphs_ignored_ =
        "optimization.cuda.graphs is ignored for a model with implicit sequence state: each pass "
        "gathers its rows' states by slot, which a replay of fixed addresses cannot follow";
  } else if (strings(spec_.inputs) || strings(spec_.outputs)) {
    graphs_ignored_ =
        "optimization.cuda.graphs is ignored: TYPE_STRING tensors live on the host, outside any "
        "graph";
  } else {
    graph_plan_ = std::make_unique<CudaGraphPlan>(spec_.cuda_graphs_max);
  }
}

// Out of line: CapturedGraph is complete here. The graphs go first (members in reverse order),
// their pool with them, then the stream is synchronised and handed back.
TorchInstance::~TorchInstance() = default;  // each graph takes GraphMutex as it goes

std::vector<std::string> TorchInstance::Warnings() const {
  if (graphs_ignored_.empty()) return {};
  return {graphs_ignored_};
}

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
  // A held input was made on another instance's stream and goes back to that stream's memory
  // pool when the batch is released: nothing may still read it here by then. A delivery waits
  // for the stream; a pass that failed before it waits here.
  if (stream != nullptr && (!status || !status->ok()) && batch.HasHeldInputs()) {
    CatchTorch("stream synchronize", [&]() -> Status {
      stream->synchronize();
      return absl::OkStatus();
    }).IgnoreError();
  }
  if (status) return *std::move(status);
  if (stream != nullptr) {
    failure.cuda_error = QueryCudaError(*stream);
    const std::optional<int64_t> ooms_after = OutOfMemoryCount(stream->device_index());
    failure.allocator_out_of_memory = ooms_before && ooms_after && *ooms_after > *ooms_before;
  }
  return ForwardFailureStatus(absl::StrCat("model '", spec_.name, "' failed"), failure);
}

std::vector<c10::IValue> TorchInstance::DeclaredInputs(const InferRequest& batch) const {
  std::vector<c10::IValue> inputs(spec_.inputs.size());
  for (const TensorView& input : batch.inputs) {
    inputs[DeclaredIndex(spec_.inputs, input.name)] =
        input.dtype == DataType::kBytes ? StringList(input) : c10::IValue(InputTensor(input));
  }
  return inputs;
}

void PhaseMarks::Set(Mark mark) {
  if (stream_ != nullptr) {
    if (!events_[mark]) events_[mark].emplace(cudaEventDefault);  // with timing
    events_[mark]->record(*stream_);
  } else {
    times_[mark] = std::chrono::steady_clock::now();
  }
  marked_ |= 1u << mark;
}

std::optional<DevicePhases> PhaseMarks::Read() {
  if (marked_ != (1u << kMarks) - 1) return std::nullopt;
  auto between = [&](Mark from, Mark to) -> Duration {
    if (stream_ == nullptr) return std::chrono::duration_cast<Duration>(times_[to] - times_[from]);
    const double ms = events_[from]->elapsed_time(*events_[to]);
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms));
  };
  try {
    return DevicePhases{between(kBegin, kInputsQueued), between(kInputsQueued, kForwardQueued),
                        between(kForwardQueued, kOutputsQueued)};
  } catch (const std::exception&) {
    return std::nullopt;  // an event not completed (a failed pass): nothing to say
  }
}

Status TorchInstance::Run(const InferRequest& batch, absl::Span<const OutputTarget> targets) {
  last_graph_run_ = GraphRun::kNone;
  last_phases_.reset();
  marks_.Clear();
  const Status status =
      graph_plan_ != nullptr ? RunWithGraphs(batch, targets) : RunEagerly(batch, targets);
  // A capture pass mixes the eager pass with the capture: its marks say nothing of serving.
  if (status.ok() && last_graph_run_ != GraphRun::kCaptured) last_phases_ = marks_.Read();
  return status;
}

void TorchInstance::TurnGraphsOff(const std::string& reason) {
  graph_plan_->TurnOff(reason);
  graphs_.clear();  // not under GraphMutex: each graph takes it as it goes
  LogRuntimeWarning(absl::StrCat("event=cuda_graphs_off model=", spec_.name, " reason=\"", reason,
                                 "\" (every shape of this instance runs without a graph)"));
}

Status TorchInstance::RunWithGraphs(const InferRequest& batch,
                                    absl::Span<const OutputTarget> targets) {
  if (!graph_plan_->off() && graphs_unusable.load())
    TurnGraphsOff("graphs are off for the process (see above)");
  const std::string key = ShapeKey(spec_, batch);
  const CudaGraphPlan::Action action = graph_plan_->Next(key);
  if (action == CudaGraphPlan::Action::kReplay) {
    CapturedGraph& captured = *graphs_.at(key);
    ForwardFailure failure;
    marks_.Set(PhaseMarks::kBegin);
    const bool replayed =
        TryTorch(
            [&] {
              for (const TensorView& view : batch.inputs) {
                // The request's bytes stay alive and untouched until completion
                // (InferRequest contract); from pinned staging memory the copy is
                // asynchronous on the stream.
                const size_t index = DeclaredIndex(spec_.inputs, view.name);
                at::Tensor& input = captured.inputs[index];
                if (view.data != nullptr) {
                  Shape reshaped;  // the model's shape, where the config reshapes the input
                  if (inputs_reshaped_)
                    reshaped = spec_.ToModelShape(spec_.inputs[index], view.shape);
                  const at::Tensor host = at::from_blob(
                      const_cast<char*>(view.data), inputs_reshaped_ ? reshaped : view.shape,
                      at::TensorOptions().dtype(ToScalarType(view.dtype)));
                  input.copy_(host, /*non_blocking=*/true);
                } else {
                  input.zero_();  // every row held: padding rows zero
                }
                // Held rows go into the static input on the device.
                GatherHeld(view, input);
              }
              marks_.Set(PhaseMarks::kInputsQueued);
              std::shared_lock<std::shared_mutex> lock(GraphMutex());
              captured.graph->replay();
              marks_.Set(PhaseMarks::kForwardQueued);
              return 0;
            },
            &failure)
            .has_value();
    if (replayed) {
      graph_plan_->Replayed();
      last_graph_run_ = GraphRun::kReplayed;
      return delivery_.Deliver(captured.outputs, batch, targets, /*reused=*/true);
    }
    // A replay that fails leaves nothing half done on the stream (it launches as one): this
    // batch runs eagerly, and so does everything after it on this instance.
    (void)cudaGetLastError();
    marks_.Clear();
    TurnGraphsOff(absl::StrCat("a replay of shape ", key,
                               " failed: ", TruncateTorchMessage(failure.message)));
  } else if (action == CudaGraphPlan::Action::kCapture) {
    // Whatever throws before the capture is settled (an out of memory in the eager pass, say),
    // the shape's next pass captures instead: Execute turns the exception into this batch's error.
    struct RetryUnlessSettled {
      CudaGraphPlan* plan;
      const std::string& key;
      bool settled = false;
      ~RetryUnlessSettled() {
        if (!settled) plan->Retry(key);
      }
    } pending{graph_plan_.get(), key};
    const std::vector<c10::IValue> inputs = DeclaredInputs(batch);
    StatusOr<std::vector<c10::IValue>> eager = Forward(inputs, batch);
    if (!eager.ok()) return eager.status();
    Status captured = CaptureGraph(key, inputs, *eager, batch);
    pending.settled = true;
    if (captured.ok()) {
      last_graph_run_ = GraphRun::kCaptured;
    } else if (!graph_plan_->off()) {
      graph_plan_->CaptureFailed(key);
      LogRuntimeWarning(absl::StrCat("event=cuda_graph_failed model=", spec_.name, " shape=\"", key,
                                     "\" reason=\"", captured.message(),
                                     "\" (this shape runs without a graph)"));
    }
    return delivery_.Deliver(*eager, batch, targets);
  }
  return RunEagerly(batch, targets);
}

Status TorchInstance::RunEagerly(const InferRequest& batch,
                                 absl::Span<const OutputTarget> targets) {
  marks_.Set(PhaseMarks::kBegin);
  std::vector<c10::IValue> inputs = DeclaredInputs(batch);
  if (states_ != nullptr) states_->Gather(batch, &inputs);
  marks_.Set(PhaseMarks::kInputsQueued);
  SLUICE_ASSIGN_OR_RETURN(std::vector<c10::IValue> outputs, Forward(std::move(inputs), batch));
  if (states_ != nullptr) SLUICE_RETURN_IF_ERROR(states_->Keep(batch, outputs));
  marks_.Set(PhaseMarks::kForwardQueued);
  return delivery_.Deliver(outputs, batch, targets);
}

Status TorchInstance::CaptureGraph(const std::string& key, const std::vector<c10::IValue>& inputs,
                                   const std::vector<c10::IValue>& eager,
                                   const InferRequest& batch) {
  const auto started = std::chrono::steady_clock::now();
  // Declared before the lock's scope: a graph dropped here is destroyed after the lock is gone.
  auto captured = std::make_unique<CapturedGraph>();
  std::vector<c10::IValue> statics;
  for (const c10::IValue& input : inputs) {
    captured->inputs.push_back(input.isTensor() ? input.toTensor().clone() : at::Tensor());
    statics.push_back(input.isTensor() ? c10::IValue(captured->inputs.back()) : c10::IValue());
  }
  stream_.get()->synchronize();  // the eager pass and the copies are done before the capture
  {
    std::unique_lock<std::shared_mutex> lock(GraphMutex());
    if (graphs_unusable.load())
      return absl::FailedPreconditionError("graphs are off for the process");
    if (graph_pool_ == c10::MempoolId_t{0, 0}) graph_pool_ = at::cuda::graph_pool_handle();
    bool capturing = false;
    ForwardFailure failure;
    std::optional<Status> forward = TryTorch(
        [&]() -> Status {
          // Thread-local mode: another thread allocating or synchronising while this one
          // captures (a model serving during this one's load) does not break the capture.
          capturing = true;  // from before capture_begin: it may fail half way, too
          captured->graph->capture_begin(graph_pool_, cudaStreamCaptureModeThreadLocal);
          StatusOr<std::vector<c10::IValue>> outputs = Forward(statics, batch);
          captured->graph->capture_end();
          capturing = false;
          if (!outputs.ok()) return outputs.status();
          captured->outputs = *std::move(outputs);
          return absl::OkStatus();
        },
        &failure);
    if (!forward && capturing) AbandonCapture(*captured->graph, *stream_.get(), graph_pool_);
    if (!forward) {
      graph_pool_ = {
          0, 0};  // that pool may have no graph left to hold it: the next capture takes a new one
      return absl::FailedPreconditionError(
          absl::StrCat("the capture failed: ", TruncateTorchMessage(failure.message)));
    }
    if (!forward->ok()) {
      graph_pool_ = {0, 0};
      return *forward;
    }
  }
  for (const c10::IValue& output : captured->outputs) {
    if (!output.isTensor()) {
      graph_pool_ = {0, 0};
      return absl::FailedPreconditionError("an output is not a tensor");
    }
  }
  // One replay, checked against the eager pass of the same inputs: equal, or within twice what
  // two more eager passes differ from it by (a model with nondeterministic kernels).
  ForwardFailure check_failure;
  std::optional<Status> checked = TryTorch(
      [&]() -> Status {
        {
          std::shared_lock<std::shared_mutex> lock(GraphMutex());
          captured->graph->replay();
        }
        const double difference = LargestDifference(captured->outputs, eager);
        if (difference == 0) return absl::OkStatus();
        double noise = 0;
        for (int i = 0; i < 2; ++i) {
          StatusOr<std::vector<c10::IValue>> again = Forward(inputs, batch);
          if (!again.ok()) return again.status();
          noise = std::max(noise, LargestDifference(*again, eager));
        }
        if (std::isfinite(noise) && difference <= 2 * noise) return absl::OkStatus();
        return absl::AbortedError(absl::StrCat(
            "the replay of shape ", key, " differs from the eager pass by ", difference,
            ", more than twice what eager passes differ by (", noise, ")"));
      },
      &check_failure);
  if (!checked || !checked->ok()) {
    graph_pool_ = {0, 0};
    if (checked && absl::IsAborted(*checked)) {
      TurnGraphsOff(std::string(checked->message()));
      return absl::FailedPreconditionError(checked->message());
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the check of its replay failed: ",
        checked ? std::string(checked->message()) : TruncateTorchMessage(check_failure.message)));
  }
  const int64_t capture_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - started)
                                 .count();
  graph_plan_->Captured(key, capture_us);
  graphs_[key] = std::move(captured);
  LogRuntimeInfo(absl::StrCat("event=cuda_graph_captured model=", spec_.name, " shape=\"", key,
                              "\" capture_us=", capture_us, " graphs=", graph_plan_->graphs()));
  return absl::OkStatus();
}

std::unique_lock<std::shared_mutex> WaitForGraphCaptures() {
  return std::unique_lock<std::shared_mutex>(GraphMutex());
}

std::unique_ptr<StagingBuffer> TorchInstance::AllocateStaging(size_t bytes) {
  if (!device_.is_cuda()) return ModelBackend::AllocateStaging(bytes);
  return std::make_unique<PinnedStagingBuffer>(bytes);
}

at::Tensor TorchInstance::InputTensor(const TensorView& view) const {
  // The request's bytes stay alive and untouched until completion (InferRequest contract).
  // The model's shape: the client's unless the config reshapes this input (`dims` -> `reshape`).
  Shape reshaped;
  if (inputs_reshaped_) {
    reshaped = spec_.ToModelShape(spec_.inputs[DeclaredIndex(spec_.inputs, view.name)], view.shape);
  }
  const Shape& shape = inputs_reshaped_ ? reshaped : view.shape;
  const at::TensorOptions options = at::TensorOptions().dtype(ToScalarType(view.dtype));
  if (view.held.empty() || view.data != nullptr) {
    // On the CPU a staging buffer with held rows is written below: it is this instance's.
    at::Tensor tensor = at::from_blob(const_cast<char*>(view.data), shape, options);
    if (device_.is_cuda()) tensor = tensor.to(device_, /*non_blocking=*/true);
    GatherHeld(view, tensor);
    return tensor;
  }
  const HeldTensor& first = *view.held.front().tensor;
  if (view.held.size() == 1 && view.held.front().first_row == 0 &&
      first.byte_size() == view.byte_size) {
    return FromHeld(first, shape);  // the producer's tensor itself
  }
  at::Tensor tensor = at::zeros(shape, options.device(device_));
  GatherHeld(view, tensor);
  return tensor;
}

void TorchInstance::GatherHeld(const TensorView& view, at::Tensor& batch) const {
  for (const HeldRows& rows : view.held) {
    const HeldTensor& held = *rows.tensor;
    at::Tensor destination =
        spec_.batches() ? batch.narrow(0, rows.first_row, held.shape()[0]) : batch;
    const std::vector<int64_t> sizes = destination.sizes().vec();
    if (const auto* ours = dynamic_cast<const TorchHeldTensor*>(&held)) {
      // One copy, wherever the rows are: within a device, between two, or across the host.
      const at::Tensor source = ours->tensor();
      const bool crosses = source.is_cuda() != destination.is_cuda();
      destination.copy_(source.reshape(sizes), /*non_blocking=*/!crosses);
      held.Count(/*on_device=*/!crosses, held.byte_size());
    } else {
      destination.copy_(FromHeld(held, sizes), /*non_blocking=*/device_.is_cuda());
      held.Count(/*on_device=*/true, held.byte_size());
    }
  }
}

at::Tensor TorchInstance::FromHeld(const HeldTensor& held, const Shape& shape) const {
  if (const auto* ours = dynamic_cast<const TorchHeldTensor*>(&held)) {
    at::Tensor tensor = ours->tensor();
    if (!tensor.sizes().equals(shape)) tensor = tensor.reshape(shape);  // a config's reshape
    if (tensor.device() == device_) return tensor;
    // Between two GPUs the copy stays on devices; between a GPU and the CPU it crosses the host
    // (to the CPU it is synchronous: a CPU forward has no stream to wait on).
    const bool crosses = tensor.is_cuda() != device_.is_cuda();
    held.Count(/*on_device=*/!crosses, held.byte_size());
    return tensor.to(device_, /*non_blocking=*/device_.is_cuda());
  }
  // Another runtime's: its bytes through host memory.
  at::Tensor host = at::empty(shape, at::TensorOptions().dtype(ToScalarType(held.dtype())));
  const Status copied = held.ReadInto(static_cast<char*>(host.data_ptr()));
  TORCH_CHECK(copied.ok(), "reading a held input: ", std::string(copied.message()));
  held.Count(/*on_device=*/false, held.byte_size());
  return device_.is_cuda() ? host.to(device_, /*non_blocking=*/true) : host;
}

}  // namespace sluice
