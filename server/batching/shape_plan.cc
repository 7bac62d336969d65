#include "server/batching/shape_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// The padding axis that covers dimension `dim` of input `name`, or -1.
int AxisOf(const PaddingSpec& padding, const std::string& name, int dim) {
  for (const BucketDim& bucketed : padding.dims) {
    if (bucketed.is_input && bucketed.tensor == name && bucketed.dim == dim) return bucketed.axis;
  }
  return -1;
}

}  // namespace

std::vector<int64_t> SchedulableBatchSizes(const ModelSpec& spec, size_t limit) {
  if (!spec.batches()) return {0};
  std::vector<int64_t> sizes;
  if (spec.dynamic_batching.enabled && spec.dynamic_batching.pad_to_preferred) {
    for (int size : spec.dynamic_batching.preferred_batch_sizes) sizes.push_back(size);
    if (sizes.empty() || sizes.back() != spec.max_batch_size) sizes.push_back(spec.max_batch_size);
    return sizes;
  }
  for (int64_t size = 1; size <= spec.max_batch_size && sizes.size() <= limit; ++size)
    sizes.push_back(size);
  return sizes;
}

ShapePlan ComputeShapePlan(const ModelSpec& spec) {
  ShapePlan plan;
  // Count before building the shapes: max_batch_size and the buckets come from a config file.
  std::vector<int64_t> batch_sizes = SchedulableBatchSizes(spec, kMaxPlanShapes);
  size_t count = batch_sizes.size();
  for (const BucketAxis& axis : spec.padding.axes) {
    count = count > kMaxPlanShapes ? count : count * axis.sizes.size();
  }
  if (count > kMaxPlanShapes) {
    plan.why_not = absl::StrCat("more than ", kMaxPlanShapes,
                                " shapes (batch sizes x buckets); pad "
                                "batches with sluice.pad_batch_to_preferred or use fewer buckets");
    return plan;
  }
  plan.batch_sizes = std::move(batch_sizes);
  for (const TensorSpec& input : spec.inputs) {
    if (input.filled_by_server) continue;
    for (size_t d = 0; d < input.dims.size(); ++d) {
      if (input.dims[d] == -1 && AxisOf(spec.padding, input.name, static_cast<int>(d)) < 0) {
        plan.why_not = absl::StrCat("input '", input.name, "' dimension ", d,
                                    " is variable (-1) and has no padding bucket");
        return plan;
      }
    }
  }
  plan.finite = true;
  // Every combination of one bucket size per axis (the first axis varies slowest).
  std::vector<std::vector<int64_t>> combinations = {{}};
  for (const BucketAxis& axis : spec.padding.axes) {
    std::vector<std::vector<int64_t>> extended;
    for (const auto& prefix : combinations) {
      for (int64_t size : axis.sizes) {
        extended.push_back(prefix);
        extended.back().push_back(size);
      }
    }
    combinations = std::move(extended);
  }
  for (int64_t batch : plan.batch_sizes) {
    for (const auto& buckets : combinations) {
      ShapePlan::Entry entry;
      entry.batch_size = batch;
      entry.bucket_sizes = buckets;
      entry.label = spec.batches() ? absl::StrCat("batch=", batch) : "";
      for (const TensorSpec& input : spec.inputs) {
        Shape shape;
        if (!input.filled_by_server) {
          if (spec.batches()) shape.push_back(batch);
          for (size_t d = 0; d < input.dims.size(); ++d) {
            const int axis = AxisOf(spec.padding, input.name, static_cast<int>(d));
            shape.push_back(axis >= 0 ? buckets[axis] : input.dims[d]);
          }
          absl::StrAppend(&entry.label, entry.label.empty() ? "" : " ", input.name,
                          ShapeToString(shape));
        }
        entry.input_shapes.push_back(std::move(shape));
      }
      plan.shapes.push_back(std::move(entry));
    }
  }
  return plan;
}

CudnnBenchmarkDecision DecideCudnnBenchmark(CudnnBenchmarkMode server_mode, const ModelSpec& spec,
                                            const ShapePlan& plan) {
  if (spec.format == ModelFormat::kAotInductor) {
    // A package has no graph to rewrite: its convolutions read LibTorch's process-wide flag
    // (--cudnn-benchmark on sets it) and TF32 was fixed when it was compiled.
    const bool on = server_mode == CudnnBenchmarkMode::kOn;
    return {
        on,
        absl::StrCat(
            "AOTInductor package: convolutions follow the process-wide flag (--cudnn-benchmark=",
            CudnnBenchmarkModeName(server_mode), ")",
            spec.cudnn_benchmark_override ? "; sluice.cudnn_benchmark applies to TorchScript only"
                                          : "",
            "; TF32 was fixed at compile time")};
  }
  const CudnnBenchmarkMode mode = spec.cudnn_benchmark_override.value_or(server_mode);
  const char* source =
      spec.cudnn_benchmark_override ? "sluice.cudnn_benchmark" : "--cudnn-benchmark";
  switch (mode) {
    case CudnnBenchmarkMode::kOn:
      return {true, absl::StrCat(source, "=on")};
    case CudnnBenchmarkMode::kOff:
      return {false, absl::StrCat(source, "=off")};
    case CudnnBenchmarkMode::kAuto:
      break;
  }
  if (plan.finite) {
    return {true, absl::StrCat("fixed shapes (", plan.shapes.size(), " in the set)"),
            /*measurable=*/true};
  }
  return {false, absl::StrCat("variable shapes: ", plan.why_not)};
}

}  // namespace sluice
