// The seam between scheduling and execution. server/runtime implements it with LibTorch; tests
// implement it with fakes. Nothing here pulls in torch.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/cord.h"

#include "server/core/clock.h"
#include "server/core/device.h"
#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/output_sink.h"
#include "server/os/process_memory.h"
#include "server/core/status.h"

namespace sluice {

// Host memory that batch inputs are assembled in. On a GPU instance it is pinned, so that the
// copy to the device can be asynchronous.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual char* data() = 0;
  virtual size_t size() const = 0;
  // Whether what is assembled here is copied on to a device (a GPU instance's pinned memory).
  virtual bool ForDevice() const { return false; }
};

// Plain heap memory: what CPU instances and test fakes use.
class HeapStagingBuffer final : public StagingBuffer {
 public:
  explicit HeapStagingBuffer(size_t bytes) : data_(new char[bytes]), size_(bytes) {}
  char* data() override { return data_.get(); }
  size_t size() const override { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

// How an instance's convolutions carry the model's cuDNN benchmark decision (ModelSpec).
struct ConvolutionTuning {
  int convolutions = 0;  // convolution calls found in the model's graphs
  int rewritten = 0;  // ...that now carry the decision (and the server's cuDNN flags) as constants
  std::string fallback;  // non-empty: why some could not; those follow LibTorch's global flag
};

// Where one Execute's time went on the device, for the batch-cycle decomposition (InstancePool):
// the inputs' copy to the device, the forward pass, the outputs' copy back. On a GPU instance from
// CUDA events recorded on the instance's stream between those steps, so `forward` is the time the
// device took from the inputs' arrival to the last kernel's end, gaps while the host was still
// launching kernels included; on the CPU from the clock.
struct DevicePhases {
  Duration to_device{0};
  Duration forward{0};
  Duration to_host{0};
};

// One loaded model instance on one device. Thread-compatible: a scheduler calls Execute from one
// worker thread at a time per instance.
class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  // Runs one forward pass over `batch` (a validated request, or several requests' rows assembled
  // into one) and hands each target its rows of the outputs it asked for (DeliverOutputs: one
  // copy per output per request). `targets` cover the batch's rows in order; rows past the last
  // target are padding and go nowhere. Never throws: model failures are statuses (INTERNAL,
  // RESOURCE_EXHAUSTED for out of memory); when one comes back, a target's sink may hold part
  // of the outputs, and the caller discards them.
  virtual Status Execute(const InferRequest& batch, absl::Span<const OutputTarget> targets) = 0;

  // A staging buffer of at least `bytes` for this instance's batch inputs. Called from the
  // instance's worker thread and, with stage ahead (InstancePool::Options::stage_ahead), from its
  // stager thread, at the same time: thread-safe. Buffers are reused across batches (see
  // StagingPool).
  virtual std::unique_ptr<StagingBuffer> AllocateStaging(size_t bytes) {
    return std::make_unique<HeapStagingBuffer>(bytes);
  }

  virtual ConvolutionTuning Tuning() const { return {}; }

  // What serves but deserves an operator's word (the model loader logs each once per version).
  virtual std::vector<std::string> Warnings() const { return {}; }

  // What the last Execute did with a CUDA graph (optimization.cuda.graphs): read by the caller
  // on the same thread right after Execute, for the metrics.
  enum class GraphRun { kNone, kCaptured, kReplayed };
  virtual GraphRun LastGraphRun() const { return GraphRun::kNone; }

  // The phases of the last Execute, read by the caller on the same thread right after it
  // returned OK; nullopt when this backend does not measure them (or did not for that pass).
  virtual std::optional<DevicePhases> LastPhases() const { return std::nullopt; }
};

// Marks a status as fatal for the whole process (a sticky CUDA error: every later kernel on
// that device fails too). The scheduler reports such failures so that the server stops being
// live and an orchestrator restarts it.
inline constexpr char kFatalPayloadUrl[] = "type.sluice/fatal";
inline Status MarkFatal(Status status) {
  status.SetPayload(kFatalPayloadUrl, absl::Cord("1"));
  return status;
}
inline bool IsFatal(const Status& status) {
  return status.GetPayload(kFatalPayloadUrl).has_value();
}

// Loads model instances. Thread-safe.
class BackendFactory {
 public:
  virtual ~BackendFactory() = default;
  // Loads `count` (>= 1) instances of the model in `model_file` on `device`, all or none. A
  // runtime may share between them what they can share (an AOTInductor package's weights);
  // each instance still runs on its own worker thread.
  virtual StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadInstances(
      const ModelSpec& spec, const std::filesystem::path& model_file, const Device& device,
      int count) = 0;
  // One instance.
  StatusOr<std::unique_ptr<ModelBackend>> Load(const ModelSpec& spec,
                                               const std::filesystem::path& model_file,
                                               const Device& device) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ModelBackend>> instances,
                            LoadInstances(spec, model_file, device, 1));
    return std::move(instances.front());
  }
  // Whether CUDA is usable (a driver, a GPU, and a CUDA build of the runtime), and how many GPUs.
  virtual bool CudaUsable() const = 0;
  virtual int CudaDeviceCount() const = 0;
  // Gives memory cached for instances that no longer exist back to the system (LibTorch's CUDA
  // caching allocator keeps freed device blocks reserved, its host allocator freed pinned
  // blocks). Called after model versions are unloaded.
  virtual void ReleaseCachedMemory() {}

  // The memory models hold on `device`, for measuring a load (one at a time: VersionLoader). For
  // a GPU the runtime's device allocator (bytes allocated now, and the most since
  // ResetPeakMemory); for the CPU the process's resident set (ReadProcessMemory). The defaults
  // read the process for the CPU and nothing (zeros) for a GPU.
  virtual MemoryReading ReadMemory(const Device& device) {
    return device.cuda ? MemoryReading{} : ReadProcessMemory();
  }
  // False when no peak could be reset (then a measurement reads the current figure, not the peak).
  virtual bool ResetPeakMemory(const Device& device) { return !device.cuda && ResetProcessPeak(); }
  // A GPU's memory in bytes (0: unknown, or the CPU), which --model-load-gpu-limit's fraction is
  // of.
  virtual uint64_t DeviceMemoryBytes(const Device& /*device*/) { return 0; }
};

}  // namespace sluice
