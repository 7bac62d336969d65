// Model specs and backends that the batching tests share (shape plans, padding, warm-up, batch
// sizes).
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "server/batching/dynamic_batcher.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"
#include "tests/unit/fakes.h"

namespace sluice::testing {

// "x" FP32 [3, 4] in, "y" FP32 [2] out, batches of up to `max_batch_size` rows.
inline ModelSpec FixedSpec(int max_batch_size) {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = max_batch_size;
  spec.inputs = {{"x", DataType::kFp32, {3, 4}}};
  spec.outputs = {{"y", DataType::kFp32, {2}}};
  return spec;
}

// A sequence model: "x" [-1 (seq), 2] padded to buckets 4 and 8 with -1, "lengths" [1] filled
// by the server with each row's true length; output "y" follows "x" along the padded axis.
inline ModelSpec PaddedSpec() {
  ModelSpec spec;
  spec.name = "seq";
  spec.max_batch_size = 4;
  spec.inputs = {{"x", DataType::kInt32, {-1, 2}}, {"lengths", DataType::kInt64, {1}}};
  spec.inputs[1].filled_by_server = true;
  spec.outputs = {{"y", DataType::kInt32, {-1, 2}}};
  spec.padding.axes = {{"seq", {4, 8}}};
  spec.padding.dims = {{"x", true, 0, 0}, {"y", false, 0, 0}};
  spec.padding.pad_value = -1;
  spec.padding.lengths_input = "lengths";
  return spec;
}

// Without dynamic_batching: one request per forward pass, on the steady clock.
inline std::unique_ptr<DynamicBatcher> OneAtATime(const ModelSpec& spec,
                                                  std::unique_ptr<ModelBackend> backend) {
  static SteadyTimeSource clock;
  std::vector<std::unique_ptr<ModelBackend>> instances;
  instances.push_back(std::move(backend));
  DynamicBatcher::Options options;
  options.queue.one_request_per_batch = true;
  options.queue.max_batch_size = std::max(1, spec.max_batch_size);
  options.clock = &clock;
  return *DynamicBatcher::Create(spec, std::move(instances), options);
}

// Echoes input "x" as output "y", like fakes.h's EchoBackend, and records the thread of each call.
class ThreadRecordingEcho final : public ModelBackend {
 public:
  Status Execute(const InferRequest& request, absl::Span<const OutputTarget> targets) override {
    const TensorView& x = request.inputs.at(0);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.insert(std::this_thread::get_id());
      shapes_.push_back(x.shape);
    }
    return Deliver({{"y", x.dtype, x.shape, std::string(x.data, x.byte_size)}}, targets);
  }
  std::set<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }
  std::vector<Shape> shapes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return shapes_;
  }

 private:
  std::mutex mutex_;
  std::set<std::thread::id> threads_;
  std::vector<Shape> shapes_;
};

}  // namespace sluice::testing
