// Sluice's model parameters (config.pbtxt `parameters { key: "sluice.*" ... }`), declared once:
// name, kind, default, where it applies and what it means. The parser reads every one of them
// through this table (ReadInt, ReadBool), refuses a sluice.* key the table does not know (naming
// the nearest), and the reference in docs/guide/model-repository.md is generated from it
// (ModelParameterReference; a test fails when the two differ).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "server/core/status.h"

namespace sluice {

enum class ParameterKind {
  kBool,  // "true" or "false"
  kInt,   // an integer in [min, max]
  kText,  // parsed by its own rule (the parser's), documented in `values`
};

struct ModelParameter {
  absl::string_view name;  // "sluice.max_shape_groups"
  ParameterKind kind = ParameterKind::kText;
  int64_t default_value = 0;  // kBool (0 or 1) and kInt: the value when the key is absent
  int64_t min = 0, max = 0;   // kInt: the accepted range
  // The reference's columns. `values`: empty for kBool ("true / false") and kInt ("min..max");
  // `default_text`: empty for kBool and kInt (from default_value).
  absl::string_view values;
  absl::string_view default_text;
  absl::string_view applies;  // where it acts: "every model", "dynamic_batching", ...
  absl::string_view meaning;  // one line of Markdown (links relative to docs/guide/)
};

// Every parameter, in the reference's order.
absl::Span<const ModelParameter> ModelParameters();

// The parameter `name`; the caller names one the table has (a programming error otherwise: it
// aborts, so a parser that reads an undeclared name fails in every test that loads a model).
const ModelParameter& ModelParameterNamed(absl::string_view name);

// INVALID_ARGUMENT for the first sluice.* key of `parameters` that is neither a parameter nor
// one the ModelConfig answer writes back (sluice.auto_batch_sizes.*), naming the nearest
// parameter when it looks like a misspelling.
Status CheckModelParameterNames(const std::map<std::string, std::string>& parameters);

// A kInt parameter: its value in `parameters`, or its default when absent; INVALID_ARGUMENT
// naming the range when the value is not an integer within it.
StatusOr<int64_t> ReadInt(const std::map<std::string, std::string>& parameters,
                          absl::string_view name);
// A kBool parameter: its value, or `fallback` when absent (the table's default unless the model
// makes it depend on something else, as sluice.warmup on string inputs).
StatusOr<bool> ReadBool(const std::map<std::string, std::string>& parameters,
                        absl::string_view name);
StatusOr<bool> ReadBool(const std::map<std::string, std::string>& parameters,
                        absl::string_view name, bool fallback);

// A kText parameter's value, or null when absent (its own rule parses it).
const std::string* ReadText(const std::map<std::string, std::string>& parameters,
                            absl::string_view name);

// The reference table in Markdown, as docs/guide/model-repository.md holds it between
// kReferenceBegin and kReferenceEnd.
std::string ModelParameterReference();
inline constexpr absl::string_view kReferenceBegin =
    "<!-- model parameters: generated from server/repository/model_parameters.cc -->";
inline constexpr absl::string_view kReferenceEnd = "<!-- end of model parameters -->";

}  // namespace sluice
