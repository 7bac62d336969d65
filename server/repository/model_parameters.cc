#include "server/repository/model_parameters.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"

#include "server/core/message_text.h"
#include "server/core/model_spec.h"

namespace sluice {
namespace {

using Kind = ParameterKind;

// Every parameter, in the order of the reference. Links are relative to docs/guide/.
constexpr ModelParameter kParameters[] = {
    {"sluice.pad_batch_to_preferred", Kind::kBool, 0, 0, 0, "", "", "dynamic_batching",
     "pad each batch with zero rows up to the next preferred batch size (or `max_batch_size`), so "
     "the model sees a fixed set of batch sizes ([Batching](batching.md#padding))"},
    {"sluice.stage_ahead", Kind::kBool, 0, 0, 0, "",
     "`true` for a model with one instance, on a GPU; else `false`", "dynamic_batching",
     "while every instance is busy, form a batch of the largest size at once and assemble it while "
     "the running batch computes, so that it starts the moment that one ends ([Staging "
     "ahead](batching.md#staging-ahead))"},
    {"sluice.max_shape_groups", Kind::kInt, 16, 1, 4096, "", "", "dynamic_batching",
     "shape groups that may wait at once per model version; a request with a further shape gets "
     "`UNAVAILABLE` ([Batching](batching.md#shape-groups))"},
    {"sluice.max_queued_bytes", Kind::kInt, 256 << 20, 1, int64_t{1} << 40, "bytes, 1..2^40",
     "268435456 (256 MiB)", "every model",
     "input bytes that may wait per model version ([Admission "
     "control](batching.md#admission-control))"},
    {"sluice.auto_batch_sizes", Kind::kBool, 1, 0, 0, "", "", "dynamic_batching",
     "choose the batch sizes the batcher forms by timing them at warm-up, where the model has no "
     "`preferred_batch_size`, and with `sluice.pad_batch_to_preferred` how many real rows are "
     "worth padding up ([Batch sizes by measurement](batching.md#batch-sizes-by-measurement)"
     "); the choice is answered in `ModelConfig` as `sluice.auto_batch_sizes.chosen` and "
     "`sluice.auto_batch_sizes.rows_per_second`"},
    {"sluice.run_on_receiving_thread", Kind::kBool, 0, 0, 0, "", "", "every stateless model",
     "run a lone gRPC request on the thread that received it when an instance is idle ([Running on "
     "the receiving thread](batching.md#running-on-the-receiving-thread))"},
    {"sluice.run_on_receiving_thread_max_us", Kind::kInt, kRunOnReceivingThreadMaxUs, 1, 1000000,
     "", "", "with `sluice.run_on_receiving_thread`",
     "only for a model whose lone request took at most this long (microseconds) in warm-up"},
    {"sluice.latency_target_us", Kind::kInt, 0, 1, int64_t{3600} * 1000000,
     "microseconds, 1..3600000000", "off", "every stateless model",
     "batch and refuse so that answers leave within this target ([Latency "
     "target](batching.md#latency-target))"},
    {"sluice.buckets", Kind::kText, 0, 0, 0, "`axis=size,size,...[; axis=...]`", "none",
     "inputs with a variable dimension",
     "padding buckets: named axes and their sizes ([Padding buckets](gpu.md#padding-buckets))"},
    {"sluice.bucket_dims", Kind::kText, 0, 0, 0, "`tensor:dim=axis, ...`", "none",
     "with `sluice.buckets`", "which dimensions of which tensors follow each bucket axis"},
    {"sluice.pad_value", Kind::kText, 0, 0, 0, "a number", "0", "with `sluice.buckets`",
     "what padded positions hold"},
    {"sluice.lengths_input", Kind::kText, 0, 0, 0, "an input name", "none", "with `sluice.buckets`",
     "an INT32/INT64 input the server fills with each row's true lengths"},
    {"sluice.warmup", Kind::kBool, 1, 0, 0, "", "`true` (`false` for a model with a STRING input)",
     "every model",
     "warm every shape of the model up before it reports ready ([Warm-up](gpu.md#warm-up-before-"
     "ready))"},
    {"sluice.warmup_runs", Kind::kInt, 3, 1, 100, "", "", "every model",
     "runs per shape and instance at warm-up"},
    {"sluice.cudnn_benchmark", Kind::kText, 0, 0, 0, "`auto`, `on`, `off`", "`--cudnn-benchmark`",
     "GPU instances",
     "cuDNN benchmark mode for this model ([Benchmark mode per model](gpu.md#benchmark-mode-per-"
     "model))"},
    {"sluice.cuda_wait", Kind::kText, 0, 0, 0, "`spin`, `blocking`", "`spin`", "GPU instances",
     "how a GPU instance waits for its batch's results ([Waiting for the "
     "GPU](gpu.md#waiting-for-the-gpu))"},
    {"sluice.cuda_graphs_max", Kind::kInt, 16, 1, 1024, "", "", "GPU instances with CUDA graphs",
     "input shapes captured into CUDA graphs per instance ([CUDA graphs](gpu.md#cuda-graphs))"},
    {"sluice.pinned", Kind::kBool, 0, 0, 0, "", "", "every model",
     "never unload this model to make room within a memory budget ([Models on "
     "demand](model-control.md#models-on-demand-and-the-memory-budget))"},
    {"sluice.operator_libraries", Kind::kText, 0, 0, 0, "comma-separated paths", "none",
     "every model",
     "operator libraries to load for this model ([Operator "
     "libraries](model-repository.md#operator-libraries-and-detection-models))"},
};

// What the ModelConfig answer reports (AddBatchSizeChoice); a config written back from such an
// answer loads, and these are ignored (measured again).
constexpr absl::string_view kReportedParameters[] = {kAutoBatchSizesChosenKey,
                                                     kAutoBatchSizesRatesKey};

// Levenshtein distance: insertions, deletions and substitutions of one character each.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const ModelParameter* Find(absl::string_view name) {
  for (const ModelParameter& parameter : kParameters) {
    if (parameter.name == name) return &parameter;
  }
  return nullptr;
}

const ModelParameter& Declared(absl::string_view name, Kind kind) {
  const ModelParameter& parameter = ModelParameterNamed(name);
  if (parameter.kind != kind) std::abort();  // read as what it is not declared as
  return parameter;
}

}  // namespace

absl::Span<const ModelParameter> ModelParameters() { return kParameters; }

const ModelParameter& ModelParameterNamed(absl::string_view name) {
  const ModelParameter* parameter = Find(name);
  if (parameter == nullptr) std::abort();  // a parser reads a name the table does not declare
  return *parameter;
}

Status CheckModelParameterNames(const std::map<std::string, std::string>& parameters) {
  for (const auto& [key, value] : parameters) {
    if (!absl::StartsWith(key, "sluice.") || Find(key) != nullptr) continue;
    if (std::find(std::begin(kReportedParameters), std::end(kReportedParameters), key) !=
        std::end(kReportedParameters)) {
      continue;
    }
    // The nearest known name, when it is near enough to be a misspelling (a third of it).
    const ModelParameter* nearest = nullptr;
    size_t best = key.size() / 3 + 1;
    for (const ModelParameter& known : kParameters) {
      const size_t distance = EditDistance(key, known.name);
      if (distance < best) {
        best = distance;
        nearest = &known;
      }
    }
    std::vector<absl::string_view> names;
    for (const ModelParameter& known : kParameters) names.push_back(known.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown parameter '", QuoteClientText(key), "'",
        nearest != nullptr ? absl::StrCat(": did you mean '", nearest->name, "'?") : std::string(),
        " (Sluice knows: ", absl::StrJoin(names, ", "), ")"));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> ReadInt(const std::map<std::string, std::string>& parameters,
                          absl::string_view name) {
  const ModelParameter& parameter = Declared(name, Kind::kInt);
  const auto it = parameters.find(std::string(name));
  if (it == parameters.end()) return parameter.default_value;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < parameter.min || value > parameter.max) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " must be an integer in [",
                                                   parameter.min, ", ", parameter.max, "], found '",
                                                   QuoteClientText(it->second), "'"));
  }
  return value;
}

StatusOr<bool> ReadBool(const std::map<std::string, std::string>& parameters,
                        absl::string_view name) {
  return ReadBool(parameters, name, Declared(name, Kind::kBool).default_value != 0);
}

StatusOr<bool> ReadBool(const std::map<std::string, std::string>& parameters,
                        absl::string_view name, bool fallback) {
  Declared(name, Kind::kBool);
  const auto it = parameters.find(std::string(name));
  if (it == parameters.end()) return fallback;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat("parameter ", name,
                                                 " must be \"true\" or \"false\", found '",
                                                 QuoteClientText(it->second), "'"));
}

const std::string* ReadText(const std::map<std::string, std::string>& parameters,
                            absl::string_view name) {
  Declared(name, Kind::kText);
  const auto it = parameters.find(std::string(name));
  return it == parameters.end() ? nullptr : &it->second;
}

std::string ModelParameterReference() {
  std::string out = absl::StrCat(kReferenceBegin, "\n",
                                 "| parameter | values | default | applies to | meaning |\n"
                                 "| --- | --- | --- | --- | --- |\n");
  for (const ModelParameter& parameter : kParameters) {
    std::string values(parameter.values), fallback(parameter.default_text);
    if (parameter.kind == Kind::kBool) {
      if (values.empty()) values = "`true`, `false`";
      if (fallback.empty()) fallback = parameter.default_value != 0 ? "`true`" : "`false`";
    } else if (parameter.kind == Kind::kInt) {
      if (values.empty()) values = absl::StrCat(parameter.min, "..", parameter.max);
      if (fallback.empty()) fallback = absl::StrCat(parameter.default_value);
    }
    absl::StrAppend(&out, "| `", parameter.name, "` | ", values, " | ", fallback, " | ",
                    parameter.applies, " | ", parameter.meaning, " |\n");
  }
  absl::StrAppend(&out, kReferenceEnd, "\n");
  return out;
}

}  // namespace sluice
