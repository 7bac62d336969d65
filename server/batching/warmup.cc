#include "server/batching/warmup.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/batching/batch_sizes.h"
#include "server/core/bytes_tensor.h"
#include "server/core/cuda_graph_plan.h"
#include "server/core/validation.h"

namespace sluice {
namespace {

std::unique_ptr<InferRequest> NewRequest(const ModelSpec& spec) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = spec.name;
  request->id = "warmup";
  return request;
}

StatusOr<std::string> SampleBytes(const WarmupSampleSpec& sample, const WarmupInputSpec& input,
                                  const Shape& shape, const std::filesystem::path& model_directory,
                                  std::mt19937* random) {
  SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(shape));
  const bool strings = input.dtype == DataType::kBytes;
  const size_t bytes = static_cast<size_t>(elements) * ElementSize(input.dtype);
  switch (input.source) {
    case WarmupInputSpec::Source::kZero:
      return ZeroElements(input.dtype, elements);
    case WarmupInputSpec::Source::kRandom: {
      // Values in [0, 1) for floating types and 0..9 for integers: valid for any model input,
      // and never NaN (random bytes could be).
      const bool floating = input.dtype == DataType::kFp16 || input.dtype == DataType::kBf16 ||
                            input.dtype == DataType::kFp32 || input.dtype == DataType::kFp64;
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      std::uniform_int_distribution<int> digit(0, 9);
      std::string data;
      data.reserve(bytes);
      for (int64_t i = 0; i < elements; ++i) {
        data +=
            ScalarBytes(input.dtype, floating ? unit(*random) : digit(*random));  // BYTES: "0".."9"
      }
      return data;
    }
    case WarmupInputSpec::Source::kFile: {
      const std::filesystem::path path = model_directory / "warmup" / input.file;
      std::ifstream file(path, std::ios::binary);
      if (!file) {
        return absl::InvalidArgumentError(absl::StrCat("model_warmup '", sample.name, "' input '",
                                                       input.name, "': cannot read ",
                                                       path.string()));
      }
      std::ostringstream contents;
      contents << file.rdbuf();
      std::string data = contents.str();
      if (strings) {
        // Triton's input_data_file for strings: the serialized elements (4-byte length, bytes).
        SLUICE_RETURN_IF_ERROR(
            CheckBytesTensor(absl::StrCat("model_warmup '", sample.name, "' input '", input.name,
                                          "' (", path.string(), ")"),
                             data, elements, /*require_utf8=*/true));
      } else if (data.size() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model_warmup '", sample.name, "' input '", input.name, "': ", path.string(), " has ",
            data.size(), " bytes, shape ", ShapeToString(shape), " of ", DataTypeName(input.dtype),
            " needs ", bytes));
      }
      return data;
    }
  }
  return absl::InternalError("unknown warm-up data source");
}

}  // namespace

StatusOr<std::vector<WarmupRequest>> BuildWarmupRequests(
    const ModelSpec& spec, const ShapePlan& plan, const std::filesystem::path& model_directory) {
  std::vector<WarmupRequest> requests;
  if (spec.warmup && plan.finite) {
    const bool timed = AutoBatchSizesOffReason(spec, plan, true).empty();
    for (const ShapePlan::Entry& entry : plan.shapes) {
      WarmupRequest warmup;
      warmup.label = entry.label;
      warmup.runs = spec.warmup_runs;
      // With CUDA graphs every shape is captured before ready (its pass after the eager ones,
      // CudaGraphPlan), and one replay follows: the last run, which costs start from when no
      // timed runs follow, is then what serving runs, not the capture.
      if (spec.cuda_graphs) warmup.runs = std::max(spec.warmup_runs, kCudaGraphEagerRuns + 1) + 1;
      if (timed) {
        warmup.timed_runs = kBatchSizeTimedRuns;
        warmup.timed_budget = kBatchSizeTimedBudget;
        warmup.max_timed_runs = kBatchSizeMaxTimedRuns;
      }
      warmup.batch_size = entry.batch_size;
      warmup.request = NewRequest(spec);
      warmup.request->batch_size = std::max<int64_t>(entry.batch_size, 1);
      for (size_t i = 0; i < spec.inputs.size(); ++i) {
        const TensorSpec& input = spec.inputs[i];
        if (input.filled_by_server) continue;
        SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(entry.input_shapes[i]));
        warmup.request->AddOwnedInput(input.name, input.dtype, entry.input_shapes[i],
                                      ZeroElements(input.dtype, elements));
      }
      requests.push_back(std::move(warmup));
    }
  }
  std::mt19937 random(20261129);
  for (const WarmupSampleSpec& sample : spec.warmup_samples) {
    WarmupRequest warmup;
    warmup.label = absl::StrCat("model_warmup '", sample.name, "'");
    warmup.runs = sample.count;
    warmup.request = NewRequest(spec);
    for (const WarmupInputSpec& input : sample.inputs) {
      Shape shape;
      if (spec.batches()) shape.push_back(sample.batch_size);
      shape.insert(shape.end(), input.dims.begin(), input.dims.end());
      SLUICE_ASSIGN_OR_RETURN(std::string bytes,
                              SampleBytes(sample, input, shape, model_directory, &random));
      warmup.request->AddOwnedInput(input.name, input.dtype, std::move(shape), std::move(bytes));
    }
    if (Status valid = ValidateRequest(spec, warmup.request.get()); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(warmup.label, ": ", valid.message()));
    }
    requests.push_back(std::move(warmup));
  }
  return requests;
}

InferRequest ViewOf(const InferRequest& request) {
  InferRequest view;
  view.model_name = request.model_name;
  view.model_version = request.model_version;
  view.id = request.id;
  view.inputs = request.inputs;
  view.requested_outputs = request.requested_outputs;
  view.batch_size = request.batch_size;
  return view;
}

Duration MedianOf(std::vector<Duration> runs) {
  std::nth_element(runs.begin(), runs.begin() + runs.size() / 2, runs.end());
  return runs[runs.size() / 2];
}

StatusOr<std::vector<WarmupPass>> RunWarmupOnInstance(
    int instance, const std::vector<WarmupRequest>& requests, const std::atomic<bool>* abandon,
    const TimeSource& clock, const std::function<Status(const InferRequest&)>& run) {
  // One run of requests[i]: how long it took, or why it failed.
  auto run_once = [&](size_t i) -> StatusOr<Duration> {
    if (abandon != nullptr && abandon->load()) {
      return absl::CancelledError("warm-up abandoned: the server is shutting down");
    }
    const TimePoint started = clock.Now();
    if (Status status = run(*requests[i].request); !status.ok()) {
      return Status(status.code(), absl::StrCat("warm-up ", requests[i].label, " on instance ",
                                                instance, " failed: ", status.message()));
    }
    return clock.Now() - started;
  };
  std::vector<WarmupPass> passes(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    WarmupPass& pass = passes[i];
    pass.instance = instance;
    pass.label = requests[i].label;
    pass.batch_size = requests[i].batch_size;
    for (int run_index = 0; run_index < std::max(1, requests[i].runs); ++run_index) {
      SLUICE_ASSIGN_OR_RETURN(const Duration took, run_once(i));
      if (run_index == 0) pass.first_run = took;
      pass.last_run = took;
    }
  }
  // Timed runs in rounds, one run of every request that still wants one per round, so that a
  // busy spell of the host (another process on this core or its hyperthread sibling) slows
  // every batch size alike instead of the one being timed then.
  std::vector<std::vector<Duration>> timed(requests.size());
  std::vector<Duration> totals(requests.size(), Duration::zero());
  auto wants_more = [&](size_t i) {
    const WarmupRequest& warmup = requests[i];
    const int done = static_cast<int>(timed[i].size());
    const int min_timed = std::max(0, warmup.timed_runs);
    if (done < min_timed) return true;
    return done < warmup.max_timed_runs && totals[i] < warmup.timed_budget;
  };
  for (bool any = true; any;) {
    any = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!wants_more(i)) continue;
      any = true;
      SLUICE_ASSIGN_OR_RETURN(const Duration took, run_once(i));
      timed[i].push_back(took);
      totals[i] += took;
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!timed[i].empty()) passes[i].median_timed = MedianOf(std::move(timed[i]));
  }
  return passes;
}

void WarmupCollector::Report(StatusOr<std::vector<WarmupPass>>&& passes) {
  MutexLock lock(&mutex_);
  if (passes.ok()) {
    for (WarmupPass& pass : *passes) passes_.push_back(std::move(pass));
  } else if (failure_.ok()) {
    failure_ = std::move(passes).status();
  } else {
    passes = std::vector<WarmupPass>{};  // drop a later failure's message here, under the lock
  }
  if (--remaining_ == 0) done_.SignalAll();
}

StatusOr<WarmupReport> WarmupCollector::Wait() {
  MutexLock lock(&mutex_);
  while (remaining_ != 0) done_.Wait(&mutex_);
  if (!failure_.ok()) return failure_;
  WarmupReport report;
  report.passes = std::move(passes_);
  std::stable_sort(
      report.passes.begin(), report.passes.end(),
      [](const WarmupPass& a, const WarmupPass& b) { return a.instance < b.instance; });
  return report;
}

}  // namespace sluice
