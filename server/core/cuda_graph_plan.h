// Which batches of a GPU instance run as CUDA graphs (optimization { cuda { graphs: true } }):
// the policy, free of CUDA and LibTorch, so that it is unit-tested here; TorchInstance
// (server/runtime/torch_common.h) does what it says.
//
// A shape (the key: every input's dtype and dims) runs eagerly for its first `eager_runs` passes:
// the TorchScript profiling executor records and specialises on them, and cuDNN's benchmark
// search runs on the first, so what a capture records is the steady plan. The next pass of that
// shape captures it (at warm-up, which runs every shape of a finite plan sluice.warmup_runs
// times, 3 by default: so every such shape is captured before ready), and later passes replay it.
// At most `max_graphs` shapes per instance are captured; the rest run eagerly. A shape whose
// capture failed runs eagerly for good; a replay whose answer differs from the eager pass beyond
// the eager passes' own run-to-run difference turns graphs off for the whole instance.
// Counters for the statistics. Not thread-safe: one per instance, on its worker thread.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

namespace sluice {

// Eager passes of a shape before its capture (the profiling executor's two; see above).
inline constexpr int kCudaGraphEagerRuns = 2;

class CudaGraphPlan {
 public:
  enum class Action { kEager, kCapture, kReplay };

  // `eager_runs`: passes of a shape before its capture (at least 1).
  CudaGraphPlan(int max_graphs, int eager_runs = kCudaGraphEagerRuns);

  // What to do with a pass of shape `key` now. kCapture is returned once per shape; the caller
  // then reports Captured or CaptureFailed before the next call.
  Action Next(const std::string& key);
  // Records one replay of `key` (Next said kReplay and it ran).
  void Replayed() { ++replays_; }
  void Captured(const std::string& key, int64_t capture_us);
  // The shape runs eagerly from now on (the caller logs why).
  void CaptureFailed(const std::string& key);
  // The capture pass did not get as far as capturing (its eager forward failed): the shape's
  // next pass captures instead.
  void Retry(const std::string& key);
  // A replay's answer differed from the eager pass: no graphs for this instance any more (the
  // captured ones are dropped by the caller).
  void TurnOff(std::string reason);

  bool off() const { return !off_reason_.empty(); }
  const std::string& off_reason() const { return off_reason_; }
  int graphs() const { return graphs_; }
  int64_t replays() const { return replays_; }
  int64_t eager_passes() const { return eager_passes_; }
  int64_t capture_us() const { return capture_us_; }
  int failed_shapes() const { return failed_; }

 private:
  enum class State { kCounting, kCapturing, kCaptured, kFailed };
  struct Shape {
    State state = State::kCounting;
    int runs = 0;
  };

  const int max_graphs_;
  const int eager_runs_;
  std::unordered_map<std::string, Shape> shapes_;
  std::string off_reason_;
  int graphs_ = 0;
  int failed_ = 0;
  int64_t replays_ = 0;
  int64_t eager_passes_ = 0;
  int64_t capture_us_ = 0;
};

}  // namespace sluice
