#include "server/core/cuda_graph_plan.h"

#include <algorithm>
#include <utility>

namespace sluice {
namespace {

// Shapes counted toward a capture, per graph allowed: a model with open-ended shapes sees new
// ones for ever, and the counts must not grow with them.
constexpr size_t kTrackedShapesPerGraph = 4;

}  // namespace

CudaGraphPlan::CudaGraphPlan(int max_graphs, int eager_runs)
    : max_graphs_(std::max(max_graphs, 0)), eager_runs_(std::max(eager_runs, 1)) {}

CudaGraphPlan::Action CudaGraphPlan::Next(const std::string& key) {
  if (off()) {
    ++eager_passes_;
    return Action::kEager;
  }
  auto it = shapes_.find(key);
  if (it == shapes_.end()) {
    if (graphs_ >= max_graphs_ ||
        shapes_.size() >= kTrackedShapesPerGraph * static_cast<size_t>(std::max(max_graphs_, 1))) {
      ++eager_passes_;
      return Action::kEager;
    }
    it = shapes_.emplace(key, Shape{}).first;
  }
  Shape& shape = it->second;
  switch (shape.state) {
    case State::kCaptured:
      return Action::kReplay;
    case State::kFailed:
    case State::kCapturing:  // the caller did not report: treat it as eager until it does
      ++eager_passes_;
      return Action::kEager;
    case State::kCounting:
      break;
  }
  ++eager_passes_;  // a capture pass answers from its eager run too
  if (shape.runs < eager_runs_ || graphs_ >= max_graphs_) {
    shape.runs = std::min(shape.runs + 1, eager_runs_);
    return Action::kEager;
  }
  shape.state = State::kCapturing;
  return Action::kCapture;
}

void CudaGraphPlan::Captured(const std::string& key, int64_t capture_us) {
  auto it = shapes_.find(key);
  if (it == shapes_.end() || it->second.state != State::kCapturing) return;
  it->second.state = State::kCaptured;
  ++graphs_;
  capture_us_ += capture_us;
}

void CudaGraphPlan::CaptureFailed(const std::string& key) {
  auto it = shapes_.find(key);
  if (it == shapes_.end() || it->second.state != State::kCapturing) return;
  it->second.state = State::kFailed;
  ++failed_;
}

void CudaGraphPlan::Retry(const std::string& key) {
  auto it = shapes_.find(key);
  if (it != shapes_.end() && it->second.state == State::kCapturing)
    it->second.state = State::kCounting;
}

void CudaGraphPlan::TurnOff(std::string reason) {
  off_reason_ = reason.empty() ? "turned off" : std::move(reason);
  shapes_.clear();
  graphs_ = 0;
}

}  // namespace sluice
