// Which input shapes a model can be handed, and whether cuDNN's benchmark mode pays for it.
//
// cuDNN's benchmark mode times several convolution algorithms the first time it sees an input
// shape and keeps the fastest: it pays when a model sees a few shapes over and over, and costs a
// search for every new shape when shapes keep changing. A model's shape set is finite when every
// variable (-1) dimension of its inputs is covered by a padding bucket; with the batch sizes the
// schedulers can form, that is a list of shapes which the server warms up before it reports the
// model ready.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/core/model_spec.h"

namespace sluice {

struct ShapePlan {
  // One shape the model can see: the batch size (0 for a model without a batch dimension) and
  // each client-sent input's full shape (padded), in config order. A lengths input
  // (sluice.lengths_input) is not listed; the padding stage adds it.
  struct Entry {
    int64_t batch_size = 0;
    std::vector<int64_t> bucket_sizes;  // one per padding axis
    std::vector<Shape> input_shapes;    // per spec.inputs entry; empty for server-filled inputs
    std::string label;                  // "batch=4 image[4,3,32,32]", for logs
  };
  bool finite = false;
  std::string why_not;               // when not finite: what makes the set open-ended, in words
  std::vector<int64_t> batch_sizes;  // what the schedulers can hand the model, ascending
  std::vector<Entry> shapes;         // empty when not finite
};

// The batch sizes a model instance can be handed: {0} without a batch dimension; the preferred
// sizes and max_batch_size with sluice.pad_batch_to_preferred; otherwise 1..max_batch_size.
// Stops after `limit` + 1 sizes (max_batch_size comes from a config file and may be huge), so a
// result longer than `limit` means "more than limit".
std::vector<int64_t> SchedulableBatchSizes(const ModelSpec& spec, size_t limit = SIZE_MAX);

// Not finite either when it would hold more than kMaxPlanShapes shapes: warming them all up
// would take too long, and benchmark mode would keep searching.
inline constexpr size_t kMaxPlanShapes = 4096;
ShapePlan ComputeShapePlan(const ModelSpec& spec);

struct CudnnBenchmarkDecision {
  bool benchmark = false;
  std::string reason;  // one phrase for the log and the metrics
  // The auto rule's "on" for a TorchScript model's fixed shapes: a measurement on a GPU may
  // overrule it (server/manager/cudnn_measurement.h). False where the operator decided.
  bool measurable = false;
};

// auto: on for a finite shape set, off otherwise; on/off: as asked. The model's own
// sluice.cudnn_benchmark parameter takes precedence over the server's --cudnn-benchmark.
CudnnBenchmarkDecision DecideCudnnBenchmark(CudnnBenchmarkMode server_mode, const ModelSpec& spec,
                                            const ShapePlan& plan);

}  // namespace sluice
