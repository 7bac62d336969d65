// Test doubles for the backend seam, and small helpers and data the unit tests share.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/batching/scheduler.h"
#include "server/core/backend.h"
#include "server/core/bytes_tensor.h"
#include "server/core/request_trace.h"

namespace sluice::testing {

// A one-request warm-up (Scheduler::WarmUp) of `rows` x `width` INT32 zeros in input `input`,
// labelled "batch=<rows>"; the request owns its bytes.
inline std::vector<WarmupRequest> ZeroWarmup(int64_t rows, int64_t width,
                                             const std::string& input = "x") {
  std::vector<WarmupRequest> warmup(1);
  warmup[0].label = "batch=" + std::to_string(rows);
  warmup[0].request = std::make_unique<InferRequest>();
  warmup[0].request->batch_size = rows;
  auto zeros = std::make_unique<std::string>(static_cast<size_t>(rows * width * 4), '\0');
  warmup[0].request->inputs.push_back(
      {input, DataType::kInt32, {rows, width}, zeros->data(), zeros->size(), {}});
  warmup[0].request->owned_buffers.push_back(std::move(zeros));
  return warmup;
}

// True once `condition` holds, false if it still does not after `timeout`. For state another
// thread changes that has no signal to wait on (a count of in-flight requests, a statistic):
// polls, yielding the CPU between looks rather than sleeping a guessed time.
inline bool Eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::yield();
  }
  return true;
}

// What a test gets back for one request: the outputs its TensorSink received.
struct Outputs {
  std::vector<Tensor> outputs;
};
inline StatusOr<Outputs> Collected(const Status& status, TensorSink& sink) {
  if (!status.ok()) return status;
  return Outputs{std::move(sink.outputs())};
}

// A fake's whole-batch outputs handed to the targets: split by rows when the execution has
// several targets, whole to a lone one.
// Held bytes: what FakeBackend hands out held (hold_outputs), and what tests feed as held
// inputs. `device` kHost: readable in place (host_data); a GPU ordinal: acts as a device's, whose
// bytes only CopyToHost reads.
class HostHeldTensor final : public HeldTensor {
 public:
  HostHeldTensor(DataType dtype, Shape shape, std::string bytes, int device = kHost)
      : HeldTensor(dtype, std::move(shape), bytes.size(), device), bytes_(std::move(bytes)) {}
  const std::string& bytes() const { return bytes_; }
  Status CopyToHost(char* to) const override {
    if (!bytes_.empty()) std::memcpy(to, bytes_.data(), bytes_.size());
    return absl::OkStatus();
  }
  const char* host_data() const override { return device() == kHost ? bytes_.data() : nullptr; }

 private:
  const std::string bytes_;
};

// Rows of a fake's output as HostHeldTensors.
class HostHolder final : public OutputHolder {
 public:
  HostHolder(const Tensor* tensor, bool batched) : tensor_(tensor), batched_(batched) {}
  StatusOr<std::shared_ptr<HeldTensor>> Rows(int64_t first_row, const Shape& shape) const override {
    size_t offset = 0, bytes = tensor_->data.size();
    if (batched_ && tensor_->shape[0] > 0) {
      const size_t row_bytes = bytes / static_cast<size_t>(tensor_->shape[0]);
      offset = static_cast<size_t>(first_row) * row_bytes;
      bytes = static_cast<size_t>(shape[0]) * row_bytes;
    }
    return std::make_shared<HostHeldTensor>(tensor_->dtype, shape,
                                            tensor_->data.substr(offset, bytes));
  }

 private:
  const Tensor* const tensor_;
  const bool batched_;
};

// A sink that takes every output held, as an ensemble's step sink takes those a later step reads,
// and sets `ledger` on each tensor it takes; outputs it is given as bytes land in `bytes`.
class HoldingSink final : public OutputSink {
 public:
  bool TakesHeld(const std::string&) const override { return true; }
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    return bytes.Allocate(output);
  }
  Status Hold(const OutputDescription& output, std::shared_ptr<HeldTensor> tensor) override {
    tensor->set_ledger(ledger);
    names.push_back(output.name);
    held.push_back(std::move(tensor));
    return absl::OkStatus();
  }
  TensorSink bytes;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<HeldTensor>> held;
  std::shared_ptr<CopyLedger> ledger = std::make_shared<CopyLedger>();
};

// `hold`: every output also has a holder (targets whose sinks take held outputs get them held).
// `memory`: where the outputs are said to come from.
inline Status Deliver(const std::vector<Tensor>& outputs, absl::Span<const OutputTarget> targets,
                      bool hold = false, MemoryType memory = MemoryType::kCpu) {
  const bool batched = targets.size() > 1;
  std::vector<HostHolder> holders;
  holders.reserve(outputs.size());
  std::vector<HostOutput> host;
  for (const Tensor& tensor : outputs) {
    holders.emplace_back(&tensor, batched);
    host.push_back({&tensor.name, tensor.dtype, tensor.shape, tensor.data.data(),
                    tensor.data.size(), memory, hold ? &holders.back() : nullptr});
  }
  return DeliverOutputs(host, targets, batched);
}

// `request` with its held inputs readable as bytes, as a runtime reads them: a request's whole
// HostHeldTensor in place, an assembled batch's held rows gathered (counted as copied on the
// device). Null when it holds nothing.
inline std::unique_ptr<InferRequest> ReadHeld(const InferRequest& request) {
  if (!request.HasHeldInputs()) return nullptr;
  auto readable = std::make_unique<InferRequest>();
  readable->model_name = request.model_name;
  readable->id = request.id;
  readable->batch_size = request.batch_size;
  readable->requested_outputs = request.requested_outputs;
  for (TensorView view : request.inputs) {
    const auto* whole = view.held.size() == 1 && view.data == nullptr
                            ? dynamic_cast<const HostHeldTensor*>(view.held[0].tensor.get())
                            : nullptr;
    if (whole != nullptr && whole->byte_size() == view.byte_size) {
      view.data = whole->bytes().data();
    } else if (!view.held.empty()) {
      auto bytes = std::make_unique<std::string>(view.byte_size, '\0');
      if (view.data != nullptr) bytes->assign(view.data, view.byte_size);
      for (const HeldRows& rows : view.held) {
        const size_t row_bytes =
            rows.tensor->byte_size() / static_cast<size_t>(rows.tensor->shape()[0]);
        rows.tensor->CopyToHost(bytes->data() + static_cast<size_t>(rows.first_row) * row_bytes)
            .IgnoreError();
        rows.tensor->Count(/*on_device=*/true, rows.tensor->byte_size());
      }
      view.data = bytes->data();
      readable->owned_buffers.push_back(std::move(bytes));
    }
    view.held.clear();
    readable->inputs.push_back(std::move(view));
  }
  return readable;
}

// `elements` in the serialized form of a BYTES tensor (server/core/bytes_tensor.h).
inline std::string Serialize(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& element : elements) AppendBytesElement(element, &out);
  return out;
}

// The smallest model configuration the repository tests build on: INPUT__0 FP32 [3, -1] ->
// OUTPUT__0 INT64 [2], max_batch_size 8.
inline constexpr char kMinimal[] = R"pb(
  platform: "pytorch_libtorch"
  max_batch_size: 8
  input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, -1 ] } ]
  output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 2 ] } ]
)pb";

// Answers every request with one INT64 output "y" of shape [1] whose bytes are the request's id,
// or with whatever `behaviour` returns (see Deliver). Can be held at a gate to keep a request in
// flight.
class FakeBackend final : public ModelBackend {
 public:
  using Behaviour = std::function<StatusOr<std::vector<Tensor>>(const InferRequest&)>;

  explicit FakeBackend(Behaviour behaviour = nullptr) : behaviour_(std::move(behaviour)) {}

  std::vector<std::string> Warnings() const override { return warnings; }
  std::vector<std::string> warnings;  // set before the backend is handed out
  // What LastGraphRun says after each Execute, in order (then kNone); set before handing it out.
  std::vector<GraphRun> graph_runs;
  GraphRun LastGraphRun() const override { return last_graph_run_; }
  // What LastPhases says after every Execute; set before handing it out.
  std::optional<DevicePhases> phases;
  // When set, LastPhases says {0, forward_time(request), 0} after each Execute instead.
  std::function<Duration(const InferRequest&)> forward_time;
  std::optional<DevicePhases> LastPhases() const override {
    return forward_time ? last_forward_ : phases;
  }
  // Hands outputs held (HostHeldTensor) to sinks that take them, as a runtime leaves its
  // outputs on its device; set before handing it out.
  bool hold_outputs = false;
  // Where the outputs it gives as bytes come from (kCpuPinned: as a GPU's); set before use.
  MemoryType output_memory = MemoryType::kCpu;
  // What Tuning() says (the convolution rewrite's counts); set before handing it out.
  ConvolutionTuning tuning;
  ConvolutionTuning Tuning() const override { return tuning; }

  Status Execute(const InferRequest& request, absl::Span<const OutputTarget> targets) override {
    last_graph_run_ =
        next_graph_run_ < graph_runs.size() ? graph_runs[next_graph_run_++] : GraphRun::kNone;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++started_;
      started_cv_.notify_all();
      gate_cv_.wait(lock, [this] { return open_ || passes_ > 0; });
      if (!open_) --passes_;
    }
    ++executed_;
    if (forward_time) last_forward_ = DevicePhases{Duration(0), forward_time(request), Duration(0)};
    if (behaviour_) {
      const std::unique_ptr<InferRequest> readable = ReadHeld(request);
      if (readable) ++held_inputs_;
      SLUICE_ASSIGN_OR_RETURN(std::vector<Tensor> outputs,
                              behaviour_(readable ? *readable : request));
      return Deliver(outputs, targets, hold_outputs, output_memory);
    }
    return Deliver({{"y", DataType::kInt64, {1}, request.id}}, targets, hold_outputs);
  }

  // While closed, Execute blocks after counting itself as started.
  void CloseGate() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    gate_cv_.notify_all();
  }
  // Lets one Execute through the closed gate (one held there now, or the next to come).
  void AllowOne() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++passes_;
    gate_cv_.notify_all();
  }
  void WaitStarted(int count) {
    std::unique_lock<std::mutex> lock(mutex_);
    started_cv_.wait(lock, [&] { return started_ >= count; });
  }
  int executed() const { return executed_; }
  // Executions whose request (or batch) had held inputs.
  int held_inputs() const { return held_inputs_; }
  int started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_;
  }

 private:
  GraphRun last_graph_run_ = GraphRun::kNone;  // the worker thread's, read right after Execute
  std::optional<DevicePhases> last_forward_;   // likewise
  size_t next_graph_run_ = 0;
  Behaviour behaviour_;
  std::mutex mutex_;
  std::condition_variable gate_cv_, started_cv_;
  bool open_ = true;
  int passes_ = 0;  // AllowOne's, not used yet
  int started_ = 0;
  std::atomic<int> executed_{0};
  std::atomic<int> held_inputs_{0};
};

// A FakeBackend (so it can be held at its gate) that echoes input "x" as output "y" (same type,
// shape and bytes) and notes the thread each execution ran on. Outlives the backends it makes.
class ThreadNotingEcho {
 public:
  std::unique_ptr<FakeBackend> Backend() {
    return std::make_unique<FakeBackend>(
        [this](const InferRequest& request) -> StatusOr<std::vector<Tensor>> {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            threads_.push_back(std::this_thread::get_id());
          }
          const TensorView& x = request.inputs[0];
          return std::vector<Tensor>{{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}};
        });
  }
  std::vector<std::thread::id> Threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::thread::id> threads_;
};

// The model EchoBackend serves: "x" INT32 [-1] -> "y" INT32 [-1], max_batch_size 8.
inline ModelSpec EchoSpec() {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.inputs = {{"x", DataType::kInt32, {-1}}};
  spec.outputs = {{"y", DataType::kInt32, {-1}}};
  return spec;
}

// A model that echoes input "x" as output "y" (same bytes and shape) and, with `with_sum`, also
// returns "sum" (INT64 [rows, 1]: each row's byte sum), and remembers the batch sizes it saw.
// Counts the output bytes it copies into sinks. Fails a batch when any row starts with the bytes
// EE EE EE EE (a "poisoned" request).
class EchoBackend final : public ModelBackend {
 public:
  explicit EchoBackend(bool with_sum = false) : with_sum_(with_sum) {}

  Status Execute(const InferRequest& request, absl::Span<const OutputTarget> targets) override {
    const TensorView& x = request.inputs.at(0);
    for (int64_t row = 0; row < request.batch_size; ++row) {
      const size_t row_bytes = x.byte_size / static_cast<size_t>(request.batch_size);
      if (row_bytes >= 4 && std::memcmp(x.data + row * row_bytes, "\xEE\xEE\xEE\xEE", 4) == 0) {
        return absl::InternalError("poisoned row");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      batch_sizes_.push_back(request.batch_size);
    }
    const std::string y_name = "y", sum_name = "sum";
    std::vector<HostOutput> outputs;
    outputs.push_back({&y_name, x.dtype, x.shape, x.data, x.byte_size, MemoryType::kCpu});
    std::vector<int64_t> sums;
    if (with_sum_) {
      const size_t row_bytes = x.byte_size / static_cast<size_t>(request.batch_size);
      for (int64_t row = 0; row < request.batch_size; ++row) {
        int64_t sum = 0;
        for (size_t k = 0; k < row_bytes; ++k)
          sum += static_cast<unsigned char>(x.data[row * row_bytes + k]);
        sums.push_back(sum);
      }
      outputs.push_back({&sum_name,
                         DataType::kInt64,
                         {request.batch_size, 1},
                         reinterpret_cast<const char*>(sums.data()),
                         sums.size() * 8,
                         MemoryType::kCpu});
    }
    // Count what reaches the sinks: every Allocate is one copy of that many bytes.
    std::vector<CountingSink> counting;
    std::vector<OutputTarget> counted(targets.begin(), targets.end());
    counting.reserve(counted.size());
    for (OutputTarget& target : counted) {
      counting.emplace_back(target.sink, &bytes_copied_);
      target.sink = &counting.back();
    }
    return DeliverOutputs(outputs, counted, /*batched=*/true);
  }
  size_t bytes_copied() const { return bytes_copied_; }
  std::unique_ptr<StagingBuffer> AllocateStaging(size_t bytes) override {
    ++staging_allocations_;
    return ModelBackend::AllocateStaging(bytes);
  }
  std::vector<int64_t> batch_sizes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return batch_sizes_;
  }
  int staging_allocations() const { return staging_allocations_; }

 private:
  class CountingSink final : public OutputSink {
   public:
    CountingSink(OutputSink* inner, std::atomic<size_t>* bytes) : inner_(inner), bytes_(bytes) {}
    StatusOr<char*> Allocate(const OutputDescription& output) override {
      *bytes_ += output.byte_size;
      return inner_->Allocate(output);
    }

   private:
    OutputSink* inner_;
    std::atomic<size_t>* bytes_;
  };
  const bool with_sum_;
  std::mutex mutex_;
  std::vector<int64_t> batch_sizes_;
  std::atomic<int> staging_allocations_{0};
  std::atomic<size_t> bytes_copied_{0};
};

// Loads FakeBackends; files named in `failures` fail to load with that message.
class FakeBackendFactory final : public BackendFactory {
 public:
  explicit FakeBackendFactory(bool cuda = false, int gpus = 0) : cuda_(cuda), gpus_(gpus) {}

  StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadInstances(
      const ModelSpec& spec, const std::filesystem::path& file, const Device& device,
      int count) override {
    std::lock_guard<std::mutex> lock(mutex_);
    calls.push_back({device.ToString(), count});
    std::vector<std::unique_ptr<ModelBackend>> instances;
    for (int i = 0; i < count; ++i) {
      loads.push_back({spec.name, file.string(), device.ToString(), spec.intra_op_threads,
                       spec.cudnn_benchmark});
      for (const std::string& key :
           {spec.name, spec.name + "/" + file.parent_path().filename().string()}) {
        auto failure = failures.find(key);
        if (failure != failures.end()) return absl::InternalError(failure->second);
      }
      if (auto bytes = instance_bytes.find(spec.name); bytes != instance_bytes.end()) {
        allocated_[device.ToString()] += bytes->second;
      }
      auto backend = std::make_unique<FakeBackend>();
      if (closed_gates) backend->CloseGate();
      backend->warnings = warnings;
      if (configure) configure(spec, device, backend.get());
      backends.push_back(backend.get());
      instances.push_back(std::move(backend));
    }
    loaded_.notify_all();
    return instances;
  }
  FakeBackend* backend(size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    return index < backends.size() ? backends[index] : nullptr;
  }
  // backend(index) once a load on another thread has made it, or null after 10 s.
  FakeBackend* WaitBackend(size_t index) {
    std::unique_lock<std::mutex> lock(mutex_);
    loaded_.wait_for(lock, std::chrono::seconds(10), [&] { return index < backends.size(); });
    return index < backends.size() ? backends[index] : nullptr;
  }
  bool CudaUsable() const override { return cuda_; }
  int CudaDeviceCount() const override { return gpus_; }
  // What the loads so far allocated on `device` (instance_bytes); nothing is given back, so a
  // load's measurement is its own instances' bytes.
  MemoryReading ReadMemory(const Device& device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t bytes = allocated_[device.ToString()];
    return {bytes, bytes};
  }
  bool ResetPeakMemory(const Device& /*device*/) override { return true; }
  uint64_t DeviceMemoryBytes(const Device& device) override {
    return device.cuda ? uint64_t{80} << 30 : 0;
  }
  size_t load_count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls.size();
  }

  struct LoadCall {
    std::string model, file, device;
    int intra_op_threads = 0;
    bool cudnn_benchmark = false;
  };
  std::vector<LoadCall> loads;                     // one per instance
  std::vector<std::pair<std::string, int>> calls;  // one per LoadInstances: device, count
  std::map<std::string, std::string> failures;     // "model" or "model/version" -> load error
  bool closed_gates = false;                       // backends start with their gate closed
  std::vector<std::string> warnings;               // what each backend's Warnings() says
  // Every backend loaded (owned by the schedulers; a probe the loader released is gone).
  std::vector<FakeBackend*> backends;
  // Called on every backend before it is handed out (under the factory's lock).
  std::function<void(const ModelSpec&, const Device&, FakeBackend*)> configure;
  std::map<std::string, uint64_t> instance_bytes;  // model -> the bytes each instance allocates

 private:
  std::map<std::string, uint64_t> allocated_;  // device -> bytes
  std::mutex mutex_;
  std::condition_variable loaded_;
  const bool cuda_;
  const int gpus_;
};

// A span sink that keeps what it is given (thread-safe), for tests of tracing.
class SpanRecorder final : public SpanSink {
 public:
  void Export(SpanData span) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spans_.push_back(std::move(span));
    }
    exported_.notify_all();
  }
  // Blocks until at least `count` spans were exported or `timeout` passed; true when they were.
  bool AwaitSpans(size_t count, std::chrono::seconds timeout = std::chrono::seconds(10)) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return exported_.wait_for(lock, timeout, [&] { return spans_.size() >= count; });
  }
  std::vector<SpanData> spans() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spans_;
  }
  // The one span named `name` (a default SpanData, which fails the caller's checks, when there is
  // not exactly one).
  SpanData Named(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    SpanData found;
    int count = 0;
    for (const SpanData& span : spans_) {
      if (span.name == name) {
        found = span;
        ++count;
      }
    }
    return count == 1 ? found : SpanData{};
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable exported_;
  std::vector<SpanData> spans_;
};

}  // namespace sluice::testing
