// What Sluice knows about a model after its config.pbtxt was parsed and validated
// (server/repository builds it); the batching, runtime and api stages read it, never the proto.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/status.h"
#include "server/core/tensor.h"

namespace sluice {

// One declared input or output. `dims` exclude the batch dimension; -1 matches any size.
struct TensorSpec {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape dims;
  // The server fills this input (the true lengths of padded axes, sluice.lengths_input, or a
  // sequence_batching control input); clients must not send it, and ModelMetadata does not list
  // it. `filled_with` says with what, for the error a client that sends it gets.
  bool filled_by_server = false;
  std::string filled_with{};
  // An output's label_filename (relative to the model's directory; empty: none) and, once the
  // repository has read that file, its lines: label i names class index i (Triton's
  // classification labels). Shared: a spec is copied per version.
  std::string label_filename{};
  std::shared_ptr<const std::vector<std::string>> labels{};
  // The config's `reshape`, when it differs from `dims`: the shape the model takes (an input) or
  // makes (an output), without the batch dimension. Clients see `dims`; each -1 of `reshape`
  // stands for the size at the matching -1 of `dims`, in order (as many on both sides). Unset for
  // BYTES, whose List[str] is flat either way.
  std::optional<Shape> reshape{};
  // An output that carries a sequence's implicit state (SequenceStateSpec::output) without being
  // listed in the config's `output`: the runtime keeps it for the sequence's next request;
  // clients never see it (metadata, requested outputs, "every output").
  bool state_only = false;
  // An input the runtime fills from the sequence's kept state (SequenceStateSpec::input); it is
  // filled_by_server too, and absent from requests and assembled batches.
  bool sequence_state = false;
};

// Binding declared tensors to a model's positional arguments or returned values (Triton's
// PyTorch naming convention), shared by both PyTorch runtimes:
// "INPUT__3" -> 3; nullopt without a `__<non-negative integer>` suffix.
std::optional<int> IndexSuffix(const std::string& name);
// For each declared tensor, its position (an argument, or an element of the returned tuple): by
// `__<index>` suffix when every name has a distinct one below `count`, else nullopt.
std::optional<std::vector<int>> PositionsBySuffix(const std::vector<TensorSpec>& tensors,
                                                  size_t count);
// Index of `name` among `tensors` (0 when absent: requests are validated before they get there).
size_t DeclaredIndex(const std::vector<TensorSpec>& tensors, const std::string& name);
// The tensor named `name` among `tensors`, or null.
const TensorSpec* FindTensor(const std::vector<TensorSpec>& tensors, const std::string& name);
TensorSpec* FindTensor(std::vector<TensorSpec>& tensors, const std::string& name);

// The config platform of AOTInductor packages (.pt2), Triton's name for them.
inline constexpr char kTorchAotiPlatform[] = "torch_aoti";
// The config platform of ensembles (a pipeline of other models, ensemble_scheduling).
inline constexpr char kEnsemblePlatform[] = "ensemble";

// Where an instance group asks to run (Triton's ModelInstanceGroup.Kind).
enum class InstanceKind { kAuto, kGpu, kCpu };

struct InstanceGroupSpec {
  InstanceKind kind = InstanceKind::kAuto;  // KIND_AUTO: the GPU when one is usable
  int count = 1;                            // instances per device
  std::vector<int> gpus;                    // empty: every visible GPU
};

// sluice.run_on_receiving_thread_max_us's default: a lone request measured at or below it may run
// on the thread that received it.
inline constexpr int64_t kRunOnReceivingThreadMaxUs = 100;

// The most priority levels a model may have (its config's priority_levels).
inline constexpr int kMaxPriorityLevels = 64;

// Triton's ModelQueuePolicy: the queue caps and timeout of a model's requests (of one priority
// level, with priority levels).
struct QueuePolicySpec {
  size_t max_queue_size = 0;            // waiting requests (per level); 0: --max-queue-size
  int64_t default_timeout_us = 0;       // queue timeout per request; 0: none
  bool allow_timeout_override = false;  // a request's "timeout" parameter (us) may set its own
  // timeout_action DELAY: a request past its queue timeout is not failed; it waits behind every
  // request of its level and the higher ones that has not timed out (no bound on that wait; the
  // client's own deadline still ends it). REJECT (false): it is answered DEADLINE_EXCEEDED.
  bool delay = false;
};

// Triton's dynamic_batching block, with Sluice's batching parameters (config `parameters`).
struct DynamicBatchingSpec {
  bool enabled = false;                    // a dynamic_batching block is present
  std::vector<int> preferred_batch_sizes;  // ascending, each in [1, max_batch_size]
  int64_t max_queue_delay_us = 0;          // how long the oldest request may wait for company
  // default_queue_policy: every request's, or with priority levels each level's without its own
  // priority_queue_policy entry.
  QueuePolicySpec default_policy;
  // Triton's priority_levels (0: none), default_priority_level (in [1, priority_levels] when there
  // are levels) and priority_queue_policy: each level's policy, index level - 1 (`priority_levels`
  // entries; a level the config does not name has default_policy). Level 1 is the highest: lower
  // levels go first. A request's "priority" parameter picks its level; 0, or a value above
  // priority_levels, means default_priority_level.
  int priority_levels = 0;
  int default_priority_level = 0;
  std::vector<QueuePolicySpec> level_policies;
  // preserve_ordering: a version's answers leave in the order its requests were taken into
  // batches (as Triton: requests answered without running, and cache hits, leave at once).
  bool preserve_ordering = false;
  // The policy of the level a request runs at (0: no levels).
  const QueuePolicySpec& PolicyOf(int level) const {
    return level >= 1 && level <= static_cast<int>(level_policies.size())
               ? level_policies[level - 1]
               : default_policy;
  }
  // The level of a request whose "priority" parameter is `priority` (0: no levels).
  int LevelOf(uint64_t priority) const {
    if (priority_levels == 0) return 0;
    return priority == 0 || priority > static_cast<uint64_t>(priority_levels)
               ? default_priority_level
               : static_cast<int>(priority);
  }
  // Whether any policy a request can get delays timed-out requests instead of failing them (with
  // levels, every level has its own entry).
  bool AnyDelay() const {
    if (level_policies.empty()) return default_policy.delay;
    for (const QueuePolicySpec& policy : level_policies) {
      if (policy.delay) return true;
    }
    return false;
  }
  // Sluice parameters (config `parameters`, string values):
  bool pad_to_preferred = false;  // sluice.pad_batch_to_preferred: pad rows up to the next
                                  // preferred size (or max_batch_size) so the model sees few shapes
  // sluice.stage_ahead; unset: on for GPU instances (InstancePool::StageAhead).
  std::optional<bool> stage_ahead;
  int max_shape_groups = 16;  // sluice.max_shape_groups: live shape groups per model version
  // sluice.max_queued_bytes: input bytes waiting per version, under every scheduler (read also
  // without dynamic_batching; see Admission)
  size_t max_queued_bytes = 256u << 20;
  // sluice.auto_batch_sizes: without preferred_batch_size, warm-up times every batch size and the
  // batcher forms a larger batch only where it serves more rows per second (server/batching/
  // batch_sizes.h).
  bool auto_batch_sizes = true;
  // sluice.run_on_receiving_thread (read also without dynamic_batching): a gRPC unary request
  // that would run at once (nothing queued, an instance idle) runs on the gRPC thread that
  // received it, saving the hand-offs to and from the worker, when warm-up measured a lone
  // request of this model at or below sluice.run_on_receiving_thread_max_us
  // (server/batching/caller_runs.h). Off by default: that thread reads no other call meanwhile.
  bool run_on_receiving_thread = false;
  int64_t run_on_receiving_thread_max_us = kRunOnReceivingThreadMaxUs;
  // sluice.latency_target_us (read also without dynamic_batching; 0: none): every request should
  // be answered within this many microseconds of its arrival. The batcher sizes batches and waits
  // for more requests from measured batch costs so that it is, and refuses at once a request that
  // cannot be (server/batching/batch_queue.h, "Latency target"). max_queue_delay_microseconds and
  // preferred_batch_size, when also given, are upper bounds.
  int64_t latency_target_us = 0;
};

// The ModelConfig answer's parameters with the measured choice ("1,2,4,8" and
// "1:25000,2:41000,..."); a config.pbtxt may carry them (written back from an answer) and they
// are ignored there.
inline constexpr const char* kAutoBatchSizesChosenKey = "sluice.auto_batch_sizes.chosen";
inline constexpr const char* kAutoBatchSizesRatesKey = "sluice.auto_batch_sizes.rows_per_second";

// Padding buckets: variable dimensions of inputs are padded up to the next bucket size so that a
// model sees a finite set of shapes (config parameters sluice.buckets, sluice.bucket_dims,
// sluice.pad_value, sluice.lengths_input; see docs/guide/gpu.md, "Padding buckets").
struct BucketAxis {
  std::string name;            // "seq"
  std::vector<int64_t> sizes;  // ascending, distinct, positive
};
struct BucketDim {
  std::string tensor;  // an input (padded) or an output (cut back to the true length)
  bool is_input = true;
  int dim = 0;   // index into the config `dims` (the batch dimension not counted)
  int axis = 0;  // index into PaddingSpec::axes
};
struct PaddingSpec {
  std::vector<BucketAxis> axes;  // empty: the model pads nothing
  std::vector<BucketDim> dims;
  double pad_value = 0;       // written into padded positions, converted to each input's type
  std::string lengths_input;  // empty, or an input the server fills per row: the true length
                              // of each axis, in axes order (shape [axes.size()])
  bool enabled() const { return !axes.empty(); }
};

// Triton's sequence_batching block: every sequence (correlation id) is bound to one slot of one
// instance for its lifetime; how slots share executions is the strategy (SequenceStrategy, and
// server/batching/sequence_batcher.h).
enum class SequenceControlKind { kStart, kEnd, kReady, kCorrId };
const char* SequenceControlKindName(SequenceControlKind kind);  // "CONTROL_SEQUENCE_START", ...

// One control input the server fills for every row of an execution. It is also listed in
// ModelSpec::inputs (filled_by_server, dims [1]) so that the runtime binds it like any input.
struct SequenceControlSpec {
  SequenceControlKind kind = SequenceControlKind::kStart;
  std::string input;                  // the model input it fills
  DataType dtype = DataType::kInt32;  // INT32, FP32 or BOOL; CORRID: INT64, INT32 or BYTES
  double false_value = 0;             // START/END/READY: the value when the flag is off
  double true_value = 1;              // ...and on
};

// One implicit state of a sequence model (Triton's sequence_batching `state`): the model takes
// the sequence's state as input `input` and returns the next one as output `output`; the runtime
// keeps it per sequence slot on the instance's device between requests (server/runtime/
// sequence_state.h). A sequence's first request, and a row without a sequence (a filler, warm-up),
// takes `initial`.
struct SequenceStateSpec {
  std::string input;   // in ModelSpec::inputs: filled_by_server, sequence_state
  std::string output;  // in ModelSpec::outputs: state_only unless the config lists it in `output`
  DataType dtype = DataType::kFp32;
  Shape dims;  // without the batch dimension; fixed (no -1)
  // initial_state data_file: a file in <model>/initial_state/ (row-major, dims' elements), read
  // by the repository at load into `initial`. Empty, or zero_data: zeros.
  std::string initial_file{};
  std::shared_ptr<const std::string> initial{};
};

// How sequences share an instance's executions.
//   kDirect  every sequence holds one batch slot (a row) of one instance; an execution carries at
//            most one request per slot, in the slot's row (fillers below busy slots).
//   kOldest  every sequence holds one of an instance's max_candidate_sequences candidate slots;
//            an execution packs the oldest requests of up to max_batch_size candidate sequences
//            (one each) into rows, in age order, with no fillers.
enum class SequenceStrategy { kDirect, kOldest };

struct SequenceBatchingSpec {
  bool enabled = false;  // a sequence_batching block is present
  SequenceStrategy strategy = SequenceStrategy::kDirect;
  // oldest: candidate sequences per instance, and the batch sizes it prefers (ascending; empty:
  // max_batch_size). With max_queue_delay_us > 0 an execution waits that long for the largest
  // preferred size (see SequenceSlots::FormBatch).
  int max_candidate_sequences = 0;
  std::vector<int> preferred_batch_sizes;
  std::vector<SequenceStateSpec> states;
  // A sequence that sends nothing for this long is ended and its slot freed (Triton's default 1 s).
  int64_t max_sequence_idle_us = 1000000;
  // direct strategy: with fewer than minimum_slot_utilization of an instance's slots holding a
  // request, an execution waits up to max_queue_delay_us for more (oldest: see above).
  int64_t max_queue_delay_us = 0;
  float minimum_slot_utilization = 0;
  std::vector<SequenceControlSpec> controls;
  // The CORRID control's type: which correlation ids are accepted (numbers that fit for INT64 and
  // INT32, strings for STRING). Without a CORRID control, any id.
  std::optional<DataType> correlation_id_type;

  // Sequence slots per instance: max_batch_size (at least 1) for direct, max_candidate_sequences
  // for oldest. The runtime keeps that many rows of each state per instance.
  int SlotsPerInstance(int max_batch_size) const {
    return strategy == SequenceStrategy::kOldest ? max_candidate_sequences
                                                 : (max_batch_size > 0 ? max_batch_size : 1);
  }
};

// One step of an ensemble (Triton's ensemble_scheduling.step): a request to another model whose
// inputs are ensemble tensors and whose outputs become ensemble tensors.
struct EnsembleStepSpec {
  std::string model;     // model_name
  int64_t version = -1;  // model_version; -1: the newest ready version
  // The version as ModelLookup::Find takes it: empty for the newest ready one.
  std::string VersionText() const { return version < 0 ? std::string() : std::to_string(version); }
  // (the step model's input, the ensemble tensor it reads), in the config's order
  std::vector<std::pair<std::string, std::string>> inputs;
  // (the step model's output, the ensemble tensor it writes), in the config's order
  std::vector<std::pair<std::string, std::string>> outputs;
};

// platform "ensemble": its `inputs` and `outputs` (ModelSpec) are ensemble tensors; every other
// tensor a step writes is internal. The parser checks what the configuration alone can tell (each
// tensor written once, read only after it is written, no cycle, every output written); the
// loader checks each step against its model (server/manager/ensemble_scheduler.h). Steps run as
// soon as the tensors they read exist.
struct EnsembleSpec {
  std::vector<EnsembleStepSpec> steps;
  // max_inflight_requests: at most this many requests of each step in its model at once, across
  // all of the ensemble's requests (the others wait in the ensemble, in order); 0: no limit.
  uint32_t max_inflight_requests = 0;
};

// One sample of Triton's model_warmup block.
struct WarmupInputSpec {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape dims;  // without the batch dimension
  enum class Source { kZero, kRandom, kFile } source = Source::kZero;
  std::string file;  // kFile: a file in <model>/warmup/
};
struct WarmupSampleSpec {
  std::string name;
  int batch_size = 1;
  int count = 1;  // runs of this sample
  std::vector<WarmupInputSpec> inputs;
};

// --cudnn-benchmark, and its per-model override (parameter sluice.cudnn_benchmark).
enum class CudnnBenchmarkMode { kAuto, kOn, kOff };
const char* CudnnBenchmarkModeName(CudnnBenchmarkMode mode);  // "auto", "on", "off"
// "auto", "on" or "off"; INVALID_ARGUMENT naming the three otherwise.
StatusOr<CudnnBenchmarkMode> ParseCudnnBenchmarkMode(std::string_view text);

// What a version's file is, from the config's platform.
enum class ModelFormat {
  kTorchScript,  // platform "pytorch_libtorch" (the default): model.pt
  kAotInductor,  // platform "torch_aoti": a torch.export AOTInductor package, model.pt2
};

struct ModelSpec {
  std::string name;
  std::string platform = "pytorch_libtorch";
  ModelFormat format = ModelFormat::kTorchScript;
  int max_batch_size = 0;  // 0: no batch dimension; >0: inputs carry it first, up to this size
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<InstanceGroupSpec> instance_groups;  // never empty after validation
  std::string model_filename = "model.pt";  // file inside each version directory (model.pt2 for
                                            // torch_aoti; see PackageFileFor for model.cpu.pt2)
  std::map<std::string, std::string> parameters;  // config `parameters`, string values
  DynamicBatchingSpec dynamic_batching;
  SequenceBatchingSpec sequence_batching;
  EnsembleSpec ensemble;  // platform "ensemble": its steps (empty otherwise)
  // CPU threads each instance's forward pass may use (config parameter INTRA_OP_THREAD_COUNT,
  // as Triton's PyTorch backend). 0 in the config: VersionLoader divides the cores among the
  // CPU instances of all models; 0 reaching the runtime: LibTorch's own default.
  int intra_op_threads = 0;
  PaddingSpec padding;
  // response_cache { enable: true }: identical requests are answered from the server's response
  // cache (when it has one, --cache-config) instead of running. Refused with sequence_batching.
  bool response_cache = false;
  // sluice.pinned: with --model-load-on-demand and a memory budget, never unloaded to make room
  // for another model (as the --load-model models).
  bool pinned = false;
  // Operator libraries loaded before the model (server/runtime/operator_libraries.h), as the
  // config writes them: sluice.operator_libraries (comma-separated) and Triton's
  // MODEL_INIT_LIBRARY (one library, whose init hook is called for each instance). Each is a path
  // relative to the model's directory or an --operator-library-dir, or an absolute path inside
  // one of them.
  std::vector<std::string> operator_libraries;
  std::string init_library;
  // Warm-up before the model reports ready (see server/batching/warmup.h).
  bool warmup = true;                            // sluice.warmup: false skips the shape warm-up
  int warmup_runs = 3;                           // sluice.warmup_runs: runs per shape and instance
  std::vector<WarmupSampleSpec> warmup_samples;  // Triton's model_warmup
  std::optional<CudnnBenchmarkMode> cudnn_benchmark_override;  // sluice.cudnn_benchmark
  // How a GPU instance's worker waits for its batch's results (sluice.cuda_wait): false, "spin"
  // (the default), synchronises the stream, which CUDA's default schedule turns into a spin while
  // the process has no more CUDA contexts than CPUs (a CPU busy for the whole GPU time, the least
  // latency); true, "blocking", waits on an event made with cudaEventBlockingSync (the thread
  // sleeps until the GPU is done: less CPU per request, a wake-up's latency more). Per instance,
  // unlike the process-wide device flag, which must be set before any CUDA context exists.
  bool cuda_blocking_wait = false;
  // optimization { cuda { graphs: true } } (Triton's field): a GPU instance captures each input
  // shape it runs into a CUDA graph after that shape's first runs (warm-up runs every shape of a
  // finite plan first), at most cuda_graphs_max per instance (sluice.cuda_graphs_max), and
  // replays it for later batches of that shape (see server/core/cuda_graph_plan.h). Ignored, with
  // one log line, on a CPU instance.
  bool cuda_graphs = false;
  int cuda_graphs_max = 16;
  // Decided by VersionLoader (see DecideCudnnBenchmark) before the instances load; the runtime
  // writes it into every convolution of the model's graph.
  bool cudnn_benchmark = false;

  bool batches() const { return max_batch_size > 0; }
  bool is_ensemble() const { return !ensemble.steps.empty(); }
  // Declared shape as clients see it: a leading -1 for the batch dimension when the model batches.
  Shape FullShape(const TensorSpec& tensor) const;
  // The same as the model sees it: `reshape` in place of `dims` when the tensor has one.
  Shape ModelFullShape(const TensorSpec& tensor) const;
  // A tensor's actual shape as the client has it (`client`: its batch dimension first when the
  // model batches, then dims' rank) as the model takes it, and back (`model`: the batch dimension,
  // then reshape's rank). The same shape when the tensor has no reshape.
  Shape ToModelShape(const TensorSpec& tensor, const Shape& client) const;
  Shape ToClientShape(const TensorSpec& tensor, const Shape& model) const;
};

inline Shape ModelSpec::FullShape(const TensorSpec& tensor) const {
  Shape shape;
  if (batches()) shape.push_back(-1);
  shape.insert(shape.end(), tensor.dims.begin(), tensor.dims.end());
  return shape;
}

}  // namespace sluice
