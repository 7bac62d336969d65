// Test doubles for the backend seam.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/core/backend.h"

namespace sluice::testing {

// Answers every request with one INT64 output holding the request's id parsed as a number, or
// with whatever `behaviour` returns. Can be held at a gate to keep a request in flight.
class FakeBackend final : public ModelBackend {
 public:
  using Behaviour = std::function<StatusOr<InferResponse>(const InferRequest&)>;

  explicit FakeBackend(Behaviour behaviour = nullptr) : behaviour_(std::move(behaviour)) {}

  StatusOr<InferResponse> Execute(const InferRequest& request) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++started_;
      started_cv_.notify_all();
      gate_cv_.wait(lock, [this] { return open_; });
    }
    ++executed_;
    if (behaviour_) return behaviour_(request);
    InferResponse response;
    response.outputs.push_back({"y", DataType::kInt64, {1}, request.id});
    return response;
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
  void WaitStarted(int count) {
    std::unique_lock<std::mutex> lock(mutex_);
    started_cv_.wait(lock, [&] { return started_ >= count; });
  }
  int executed() const { return executed_; }
  int started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_;
  }

 private:
  Behaviour behaviour_;
  std::mutex mutex_;
  std::condition_variable gate_cv_, started_cv_;
  bool open_ = true;
  int started_ = 0;
  std::atomic<int> executed_{0};
};

// A model that echoes input "x" as output "y" (same bytes and shape) and remembers the batch
// sizes it saw. Fails a batch when any row starts with the bytes EE EE EE EE (a "poisoned"
// request).
class EchoBackend final : public ModelBackend {
 public:
  StatusOr<InferResponse> Execute(const InferRequest& request) override {
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
    InferResponse response;
    response.outputs.push_back({"y", x.dtype, x.shape, std::string(x.data, x.byte_size)});
    return response;
  }
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
  std::mutex mutex_;
  std::vector<int64_t> batch_sizes_;
  std::atomic<int> staging_allocations_{0};
};

// Loads FakeBackends; files named in `failures` fail to load with that message.
class FakeBackendFactory final : public BackendFactory {
 public:
  explicit FakeBackendFactory(bool cuda = false, int gpus = 0) : cuda_(cuda), gpus_(gpus) {}

  StatusOr<std::unique_ptr<ModelBackend>> Load(const ModelSpec& spec, const std::filesystem::path& file,
                                               const Device& device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    loads.push_back({spec.name, file.string(), device.ToString(), spec.intra_op_threads});
    for (const std::string& key : {spec.name, spec.name + "/" + file.parent_path().filename().string()}) {
      auto failure = failures.find(key);
      if (failure != failures.end()) return absl::InternalError(failure->second);
    }
    auto backend = std::make_unique<FakeBackend>();
    if (closed_gates) backend->CloseGate();
    backends.push_back(backend.get());
    return std::unique_ptr<ModelBackend>(std::move(backend));
  }
  FakeBackend* backend(size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    return index < backends.size() ? backends[index] : nullptr;
  }
  bool CudaUsable() const override { return cuda_; }
  int CudaDeviceCount() const override { return gpus_; }

  struct LoadCall {
    std::string model, file, device;
    int intra_op_threads = 0;
  };
  std::vector<LoadCall> loads;
  std::map<std::string, std::string> failures;  // "model" or "model/version" -> load error
  bool closed_gates = false;             // backends start with their gate closed
  std::vector<FakeBackend*> backends;    // every backend loaded (owned by the schedulers)

 private:
  std::mutex mutex_;
  const bool cuda_;
  const int gpus_;
};

}  // namespace sluice::testing
