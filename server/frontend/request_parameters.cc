#include "server/frontend/request_parameters.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

std::string Describe(const ParameterValue& value) {
  switch (value.kind) {
    case ParameterValue::Kind::kBool:
      return value.boolean ? "true" : "false";
    case ParameterValue::Kind::kInt64:
      return absl::StrCat(value.int64);
    case ParameterValue::Kind::kUint64:
      return absl::StrCat(value.uint64);
    case ParameterValue::Kind::kDouble:
      return absl::StrCat(value.number);
    case ParameterValue::Kind::kString:
      return absl::StrCat("the string \"", QuoteClientText(value.text), "\"");
    case ParameterValue::Kind::kOther:
      break;
  }
  return "no value of a usable type";
}

// A non-negative integer that fits int64; nullopt for anything else.
std::optional<int64_t> NonNegativeInt64(const ParameterValue& value) {
  if (value.kind == ParameterValue::Kind::kInt64 && value.int64 >= 0) return value.int64;
  if (value.kind == ParameterValue::Kind::kUint64 &&
      value.uint64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(value.uint64);
  }
  return std::nullopt;
}

Status ReadBool(ParameterFinder find, absl::string_view key, bool* out) {
  const std::optional<ParameterValue> value = find(key);
  if (!value) return absl::OkStatus();
  if (value->kind != ParameterValue::Kind::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request parameter '", key, "' must be a boolean, found ", Describe(*value)));
  }
  *out = value->boolean;
  return absl::OkStatus();
}

}  // namespace

Status ReadRequestParameters(ParameterFinder find, RequestParameters* parameters) {
  if (const std::optional<ParameterValue> timeout = find("timeout")) {
    const std::optional<int64_t> microseconds = NonNegativeInt64(*timeout);
    if (!microseconds) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the request parameter 'timeout' must be a non-negative integer (microseconds), found ",
          Describe(*timeout)));
    }
    parameters->timeout_us = *microseconds;
  }
  if (const std::optional<ParameterValue> priority = find("priority")) {
    const std::optional<int64_t> level = NonNegativeInt64(*priority);
    if (!level) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request parameter 'priority' must be a non-negative integer (1 is the "
                       "highest level; 0: the model's "
                       "default), found ",
                       Describe(*priority)));
    }
    parameters->priority = static_cast<uint64_t>(*level);
  }
  if (const std::optional<ParameterValue> id = find("sequence_id")) {
    CorrelationId& sequence = parameters->sequence.id;
    switch (id->kind) {
      case ParameterValue::Kind::kInt64:
        if (id->int64 < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("the request parameter 'sequence_id' must not be negative, found ",
                           id->int64, "; send a non-negative integer or a string"));
        }
        sequence.number = static_cast<uint64_t>(id->int64);
        break;
      case ParameterValue::Kind::kUint64:
        sequence.number = id->uint64;
        break;
      case ParameterValue::Kind::kString:
        sequence.is_text = true;
        sequence.text.assign(id->text.data(), id->text.size());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "the request parameter 'sequence_id' must be an integer or a string, found ",
            Describe(*id)));
    }
  }
  SLUICE_RETURN_IF_ERROR(ReadBool(find, "sequence_start", &parameters->sequence.start));
  return ReadBool(find, "sequence_end", &parameters->sequence.end);
}

Status ReadOutputParameters(ParameterFinder find, const std::string& output,
                            InferRequest* request) {
  const std::optional<ParameterValue> classification = find("classification");
  if (!classification) return absl::OkStatus();
  const std::optional<int64_t> count = NonNegativeInt64(*classification);
  if (!count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output '", QuoteClientText(output),
        "': the parameter 'classification' must be a non-negative integer (the classes to answer "
        "per batch row), found ",
        Describe(*classification)));
  }
  if (*count == 0) return absl::OkStatus();
  if (find("shared_memory_region")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output '", QuoteClientText(output),
        "': classification cannot be written to shared memory; ask for the classes without "
        "'shared_memory_region'"));
  }
  request->classifications.push_back({output, *count});
  return absl::OkStatus();
}

}  // namespace sluice
