// What the TorchScript and AOTInductor runtimes share: LibTorch exceptions as statuses, datatype
// and device mapping, pinned staging memory, recycled CUDA streams and the delivery of
// a forward pass's outputs. Includes LibTorch: for server/runtime's .cc files only.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/core/backend.h"
#include "server/core/cuda_graph_plan.h"
#include "server/core/mutex.h"
#include "server/runtime/cuda_failure.h"
#include "server/runtime/environment.h"
#include "server/runtime/operator_libraries.h"
#include "server/runtime/sequence_state.h"

namespace sluice {

// Runs `fn` and returns what it returned; when it throws, nullopt, with the exception's message
// and whether its type was an out of memory written into `*failure`.
template <typename Fn>
auto TryTorch(Fn&& fn, ForwardFailure* failure) -> std::optional<decltype(fn())> {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    failure->message = e.what_without_backtrace();
    failure->out_of_memory_type = true;
  } catch (const c10::Error& e) {
    failure->message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure->message = e.what();
  }
  return std::nullopt;
}

// Runs `fn`, turning LibTorch exceptions into statuses by their type and message alone
// (ForwardFailureStatus without CUDA evidence): for loading and housekeeping. A forward pass goes
// through TorchInstance::Execute, which also queries the device after a failure.
template <typename Fn>
auto CatchTorch(const std::string& what, Fn&& fn) -> decltype(fn()) {
  ForwardFailure failure;
  if (auto result = TryTorch(std::forward<Fn>(fn), &failure)) return *std::move(result);
  return ForwardFailureStatus(what, failure);
}

// BYTES has no scalar type (it maps to List[str]); the others map one to one.
at::ScalarType ToScalarType(DataType type);
at::Device ToTorchDevice(const Device& device);
std::optional<DataType> FromScalarType(at::ScalarType type);

// LibTorch's CPU pool (OpenMP in the torch wheel) takes its thread count per calling thread, and
// each instance has its own worker thread: sets it on the calling thread when it differs. 0: leave
// LibTorch's default.
void ApplyIntraOpThreads(int threads);

class PinnedStagingBuffer final : public StagingBuffer {
 public:
  explicit PinnedStagingBuffer(size_t bytes);
  char* data() override { return static_cast<char*>(tensor_.data_ptr()); }
  size_t size() const override { return tensor_.nbytes(); }
  bool ForDevice() const override { return true; }

 private:
  at::Tensor tensor_;
};

// Holds off CUDA graph captures (of every instance) while it lives: emptying LibTorch's caching
// allocator during a capture breaks it. For BackendFactory::ReleaseCachedMemory.
std::unique_lock<std::shared_mutex> WaitForGraphCaptures();

// CUDA streams for GPU instances: an instance hands its stream back when it is destroyed, and
// the next instance on that device takes it again. LibTorch keeps a cuBLAS workspace (32 MiB on
// Hopper) per (cuBLAS handle, stream) pair for the life of the process; handles already return
// to LibTorch's pool when an instance's worker thread ends, so reusing streams too keeps the
// pairs, and their workspaces, bounded by the instances alive at once. A fresh pool stream per
// load would leave one more workspace behind on every reload that unloading never gives back.
// Thread-safe.
class StreamRecycler {
 public:
  c10::cuda::CUDAStream Take(c10::DeviceIndex device) ABSL_LOCKS_EXCLUDED(mutex_);
  // `stream` must have no work pending for its owner any more.
  void Give(c10::cuda::CUDAStream stream) ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  Mutex mutex_;
  std::unordered_map<c10::DeviceIndex, std::vector<c10::cuda::CUDAStream>> free_
      ABSL_GUARDED_BY(mutex_);
};

// A GPU instance's CUDA stream, taken from the recycler and given back (after synchronising) when
// the instance goes. Empty on a CPU instance.
class InstanceStream {
 public:
  InstanceStream(std::shared_ptr<StreamRecycler> streams, const at::Device& device);
  ~InstanceStream();
  InstanceStream(const InstanceStream&) = delete;
  InstanceStream& operator=(const InstanceStream&) = delete;
  c10::cuda::CUDAStream* get() { return stream_ ? &*stream_ : nullptr; }

 private:
  std::shared_ptr<StreamRecycler> streams_;
  std::optional<c10::cuda::CUDAStream> stream_;
};

// The boundaries of one Execute (begin, inputs queued, forward queued, outputs queued), for
// ModelBackend::LastPhases: CUDA events with timing on the instance's stream on a GPU (about a
// microsecond each to record and to read), the clock on the CPU. Read once the stream was waited
// for. Worker thread only.
class PhaseMarks {
 public:
  enum Mark { kBegin, kInputsQueued, kForwardQueued, kOutputsQueued, kMarks };
  explicit PhaseMarks(c10::cuda::CUDAStream* stream) : stream_(stream) {}
  void Clear() { marked_ = 0; }
  void Set(Mark mark);
  // The three phases when every mark was set since Clear and (GPU) every event completed.
  std::optional<DevicePhases> Read();

 private:
  c10::cuda::CUDAStream* const stream_;
  std::array<std::optional<at::cuda::CUDAEvent>, kMarks> events_;  // GPU, made at the first mark
  std::array<std::chrono::steady_clock::time_point, kMarks> times_{};  // CPU
  unsigned marked_ = 0;                                                // a bit per mark
};

// A tensor of this runtime handed out held (OutputSink::Hold): contiguous, on the device that
// made it, its producer's work on it done.
class TorchHeldTensor final : public HeldTensor {
 public:
  // Rows [first_row, first_row + shape[0]) of `whole` (contiguous), or all of it when
  // `first_row` is -1. `shape`: the caller's (the config's dims where it reshapes). Made without
  // a LibTorch operator (no dispatch, no view): a batch hands out one per caller.
  TorchHeldTensor(at::Tensor whole, int64_t first_row, DataType dtype, Shape shape);
  // The rows as a tensor on the device that made them (a view of `whole`).
  at::Tensor tensor() const;
  Status CopyToHost(char* to) const override;
  const char* host_data() const override { return host_data_; }

 private:
  const at::Tensor whole_;
  const int64_t first_row_;
  const char* const host_data_;  // CPU tensors only
};

// Checks a forward pass's outputs against the config, brings the ones some target asked for to
// the host, holds the ones a target takes held (OutputSink::TakesHeld) where they are, and hands
// each target its rows (DeliverOutputs). One per instance: it keeps that instance's pinned output
// buffers. Worker thread only.
class OutputDelivery {
 public:
  // `spec` outlives this; `stream`: the instance's stream on a GPU, null on the CPU; `marks`
  // (may be null) gets kOutputsQueued once the outputs' copies are queued.
  OutputDelivery(const ModelSpec* spec, c10::cuda::CUDAStream* stream, PhaseMarks* marks = nullptr)
      : spec_(spec), stream_(stream), marks_(marks) {}

  // `outputs`: one value per declared output, config order: a tensor, or a List[str] for a
  // TYPE_STRING output (serialized per server/core/bytes_tensor.h; its elements split evenly over
  // the batch's rows). `request` is the batch they came from (its batch_size is what a batched
  // output's first dimension must be). `reused`: the outputs are a CUDA graph's static outputs,
  // which the next replay overwrites, so an output handed out held is a copy of them.
  Status Deliver(const std::vector<c10::IValue>& outputs, const InferRequest& request,
                 absl::Span<const OutputTarget> targets, bool reused = false);

 private:
  Status Check(const TensorSpec& declared, const at::Tensor& value,
               const InferRequest& request) const;
  // A List[str] output serialized into `bytes`; returns its shape (the batch's rows first when
  // the model batches, then the declared dims with -1 resolved).
  StatusOr<Shape> SerializeStrings(const TensorSpec& declared, const c10::IValue& value,
                                   const InferRequest& request, std::string* bytes) const;
  // Output `index` in contiguous host memory. CPU: the tensor itself when it is contiguous (the
  // sink copy is then the only one). GPU: an asynchronous copy into this instance's pinned buffer
  // for that output (reused, grown when a larger batch needs it); the caller synchronises.
  at::Tensor ToHost(size_t index, const at::Tensor& value);
  // Waits until everything queued on the stream is done, as the spec's sluice.cuda_wait says.
  void WaitForStream();

  const ModelSpec* const spec_;
  c10::cuda::CUDAStream* const stream_;
  PhaseMarks* const marks_;
  std::vector<at::Tensor> pinned_outputs_;   // GPU: per declared output, bytes
  std::optional<at::cuda::CUDAEvent> done_;  // GPU with sluice.cuda_wait "blocking"
};

// What a LibTorch model instance of either format is around its forward pass: the instance's
// CUDA stream on a GPU (made current for the pass, so instances on one GPU overlap), its CPU
// thread count on the CPU (the manager's split), inference mode, LibTorch exceptions as
// statuses, pinned staging memory on a GPU, CUDA graphs where the config asks for them, and the
// delivery of the outputs, and the sequences' implicit state (SequenceStateStore: gathered into
// the state inputs before Forward, the state outputs kept after it). Subclasses run the model
// (Forward). Thread-compatible, like every ModelBackend.
//
// CUDA graphs (ModelSpec::cuda_graphs, on a GPU instance of a model without TYPE_STRING tensors):
// CudaGraphPlan says per input shape whether a pass runs eagerly, captures or replays. A capture
// pass answers from an eager forward, then captures Forward on static copies of its inputs into
// a graph (thread-local capture mode, so other threads' allocations and synchronisations during
// a load do not break it; the instance's private memory pool, shared by its graphs), replays it
// once and compares with the eager answer: equal, or within what a second eager pass differs by;
// otherwise graphs are off for the instance. A failed capture leaves that shape eager. A replay
// copies the batch's inputs into the static inputs, replays on the instance's stream and delivers
// the static outputs (the delivery synchronises before the next replay can overwrite them).
class TorchInstance : public ModelBackend {
 public:
  TorchInstance(ModelSpec spec, at::Device device, std::shared_ptr<StreamRecycler> streams);
  ~TorchInstance() override;

  Status Execute(const InferRequest& batch, absl::Span<const OutputTarget> targets) final;
  // Pinned host memory on a GPU instance, so the host-to-device copy can be asynchronous.
  std::unique_ptr<StagingBuffer> AllocateStaging(size_t bytes) final;
  // Why graphs the config asked for are not used on this instance (a CPU instance, strings).
  std::vector<std::string> Warnings() const override;
  GraphRun LastGraphRun() const override { return last_graph_run_; }
  std::optional<DevicePhases> LastPhases() const override { return last_phases_; }
  // What the model's init library returned for this instance (operator_libraries.h): its fini
  // hook runs once the instance is gone (this base outlives the derived class's model).
  void HoldInitState(std::unique_ptr<ModelInitState> state) { init_state_ = std::move(state); }

 protected:
  // One forward pass (under the stream guard, the thread count and inference mode). `inputs`:
  // one value per declared input, config order: a tensor on the instance's device, or List[str]
  // for a TYPE_STRING input. Returns one value per declared output, config order (see
  // OutputDelivery::Deliver). Must not synchronise with the host when graphs are on (a capture
  // that does fails, and that shape runs eagerly).
  virtual StatusOr<std::vector<c10::IValue>> Forward(std::vector<c10::IValue> inputs,
                                                     const InferRequest& batch) = 0;

  const ModelSpec& spec() const { return spec_; }
  const at::Device& device() const { return device_; }
  c10::cuda::CUDAStream* stream() { return stream_.get(); }  // null on the CPU

 private:
  struct CapturedGraph;

  Status Run(const InferRequest& batch, absl::Span<const OutputTarget> targets);
  Status RunWithGraphs(const InferRequest& batch, absl::Span<const OutputTarget> targets);
  // One pass without a graph: inputs, Forward, delivery, each boundary marked (marks_).
  Status RunEagerly(const InferRequest& batch, absl::Span<const OutputTarget> targets);
  // Turns graphs off for this instance for good, with one log line.
  void TurnGraphsOff(const std::string& reason);
  // Captures `key` from `inputs` and checks one replay against `eager`; errors say why not
  // (a replay that differs beyond the eager passes' own difference turns graphs off first).
  Status CaptureGraph(const std::string& key, const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& eager, const InferRequest& batch);
  // The batch's inputs in config order (InputTensor, or List[str] for BYTES).
  std::vector<c10::IValue> DeclaredInputs(const InferRequest& batch) const;
  // `view`'s bytes as a tensor, without a copy on the CPU; on a GPU copied to the device
  // (asynchronously from pinned staging memory, on the instance's stream; the delivery
  // synchronises before the staging buffer is reused). A held input that is the whole tensor
  // and on this device is used as it is; held rows of an assembled batch are copied into it
  // on the device (each copy counted on its tensor, HeldTensor::Count).
  at::Tensor InputTensor(const TensorView& view) const;
  // A held tensor on this instance's device, shaped `shape`: moved here when it is elsewhere,
  // through host memory when it is not this runtime's (counted).
  at::Tensor FromHeld(const HeldTensor& held, const Shape& shape) const;
  // Copies `view`'s held rows into their rows of `batch` (a tensor of the view's full shape on
  // this device), each counted on its tensor.
  void GatherHeld(const TensorView& view, at::Tensor& batch) const;

  std::unique_ptr<ModelInitState> init_state_;  // declared first: destroyed last
  const ModelSpec spec_;
  const at::Device device_;
  InstanceStream stream_;
  PhaseMarks marks_;                         // worker thread only
  OutputDelivery delivery_;                  // worker thread only
  std::optional<DevicePhases> last_phases_;  // of the last Execute that delivered
  const int intra_op_threads_;               // CPU instances only (0: LibTorch's default)
  const bool inputs_reshaped_;               // some input has a config reshape
  // The sequences' implicit state (null unless the config keeps some). Worker thread only.
  std::unique_ptr<SequenceStateStore> states_;
  std::string graphs_ignored_;  // why the config's graphs are not used here; empty otherwise
  // Graphs: null unless they are on for this instance. Declared after stream_, so the graphs and
  // their pool go before the stream is handed back. Worker thread only.
  std::unique_ptr<CudaGraphPlan> graph_plan_;
  std::unordered_map<std::string, std::unique_ptr<CapturedGraph>> graphs_;
  std::pair<unsigned long long, unsigned long long> graph_pool_{0, 0};  // at::cuda::MempoolId_t
  GraphRun last_graph_run_ = GraphRun::kNone;
};

}  // namespace sluice
