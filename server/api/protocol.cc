#include "server/api/protocol.h"

#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

template <typename Wire, typename Field>
Status CopyTyped(const Field& values, const TensorView& view, std::string* out) {
  if constexpr (std::is_integral_v<Wire> && !std::is_same_v<Wire, bool>) {
    for (const auto value : values) {
      using Source = std::decay_t<decltype(value)>;
      if constexpr (sizeof(Wire) < sizeof(Source)) {
        if (value < static_cast<Source>(std::numeric_limits<Wire>::min()) ||
            value > static_cast<Source>(std::numeric_limits<Wire>::max())) {
          return absl::InvalidArgumentError(
              absl::StrCat("input '", view.name, "': value ", value, " does not fit ",
                           DataTypeName(view.dtype)));
        }
      }
    }
  }
  out->resize(static_cast<size_t>(values.size()) * sizeof(Wire));
  char* cursor = out->data();
  for (const auto value : values) {
    const Wire wire = static_cast<Wire>(value);
    std::memcpy(cursor, &wire, sizeof(Wire));
    cursor += sizeof(Wire);
  }
  return absl::OkStatus();
}

// Converts typed contents of `view.dtype` into raw little-endian bytes in `out`. Returns the
// number of values found through `count`.
Status TypedToRaw(const inference::InferTensorContents& contents, const TensorView& view,
                  std::string* out, int64_t* count) {
  switch (view.dtype) {
    case DataType::kBool:
      *count = contents.bool_contents_size();
      return CopyTyped<bool>(contents.bool_contents(), view, out);
    case DataType::kInt8:
      *count = contents.int_contents_size();
      return CopyTyped<int8_t>(contents.int_contents(), view, out);
    case DataType::kInt16:
      *count = contents.int_contents_size();
      return CopyTyped<int16_t>(contents.int_contents(), view, out);
    case DataType::kInt32:
      *count = contents.int_contents_size();
      return CopyTyped<int32_t>(contents.int_contents(), view, out);
    case DataType::kInt64:
      *count = contents.int64_contents_size();
      return CopyTyped<int64_t>(contents.int64_contents(), view, out);
    case DataType::kUint8:
      *count = contents.uint_contents_size();
      return CopyTyped<uint8_t>(contents.uint_contents(), view, out);
    case DataType::kFp32:
      *count = contents.fp32_contents_size();
      return CopyTyped<float>(contents.fp32_contents(), view, out);
    case DataType::kFp64:
      *count = contents.fp64_contents_size();
      return CopyTyped<double>(contents.fp64_contents(), view, out);
    case DataType::kBytes:
      *count = contents.bytes_contents_size();
      for (const std::string& element : contents.bytes_contents()) AppendBytesElement(element, out);
      return absl::OkStatus();
    case DataType::kFp16:
    case DataType::kBf16:
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", view.name, "': ", DataTypeName(view.dtype),
          " has no typed contents field in the protocol; send it in raw_input_contents"));
  }
  return absl::InvalidArgumentError("unsupported datatype");
}

// The number of values set across every typed field, to spot values in the wrong field.
int64_t TypedValueCount(const inference::InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
         c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

}  // namespace

StatusOr<std::unique_ptr<InferRequest>> InferRequestFromProto(const inference::ModelInferRequest& proto) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = proto.model_name();
  request->id = proto.id();
  const bool raw = proto.raw_input_contents_size() > 0;
  if (raw && proto.raw_input_contents_size() != proto.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", proto.raw_input_contents_size(), " entries for ",
        proto.inputs_size(), " inputs; send one entry per input, in the order of `inputs`"));
  }
  request->inputs.reserve(proto.inputs_size());
  for (int i = 0; i < proto.inputs_size(); ++i) {
    const auto& input = proto.inputs(i);
    TensorView view;
    view.name = input.name();
    const std::optional<DataType> dtype = ParseDataTypeName(input.datatype());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", input.name(), "': datatype '", input.datatype(),
          "' is not supported (", SupportedDataTypeNames(), ")"));
    }
    view.dtype = *dtype;
    view.shape.assign(input.shape().begin(), input.shape().end());
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(view.shape));
    const int64_t typed_values = input.has_contents() ? TypedValueCount(input.contents()) : 0;
    if (raw) {
      if (typed_values > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", input.name(), "' has typed contents while the request also uses "
            "raw_input_contents; use one or the other for all inputs"));
      }
      const std::string& bytes = proto.raw_input_contents(i);
      view.data = bytes.data();
      view.byte_size = bytes.size();
    } else {
      if (typed_values == 0 && elements > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", input.name(), "' has no data: set its typed `contents` or send "
            "raw_input_contents"));
      }
      auto buffer = std::make_unique<std::string>();
      int64_t count = 0;
      SLUICE_RETURN_IF_ERROR(TypedToRaw(input.contents(), view, buffer.get(), &count));
      if (count != typed_values) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", input.name(), "' of datatype ", input.datatype(),
            " has values in a typed field that does not belong to it"));
      }
      if (count != elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", input.name(), "' has ", count, " typed values, but shape ",
            ShapeToString(view.shape), " needs ", elements));
      }
      view.data = buffer->data();
      view.byte_size = buffer->size();
      request->owned_buffers.push_back(std::move(buffer));
    }
    request->inputs.push_back(std::move(view));
  }
  for (const auto& output : proto.outputs()) request->requested_outputs.push_back(output.name());
  // Triton's "timeout" parameter: the queue timeout in microseconds (ModelHandle applies it when
  // the model allows overrides). Other parameters are ignored, as Triton ignores unknown ones.
  auto timeout = proto.parameters().find("timeout");
  if (timeout != proto.parameters().end() &&
      timeout->second.parameter_choice_case() == inference::InferParameter::kInt64Param &&
      timeout->second.int64_param() > 0) {
    request->parameters.timeout_us = timeout->second.int64_param();
  }
  return request;
}

void FillInferResponseHeader(const InferRequest& request, int64_t version, inference::ModelInferResponse* proto) {
  proto->set_model_name(request.model_name);
  proto->set_model_version(std::to_string(version));
  proto->set_id(request.id);
}

StatusOr<char*> ResponseSink::Allocate(const OutputDescription& output) {
  auto* tensor = response_->add_outputs();
  tensor->set_name(output.name);
  tensor->set_datatype(std::string(DataTypeName(output.dtype)));
  for (int64_t dim : output.shape) tensor->add_shape(dim);
  std::string* bytes = response_->add_raw_output_contents();
  bytes->resize(output.byte_size);
  return bytes->data();
}

void AddBatchSizeChoice(const BatchSizeChoice& choice, inference::ModelConfig* config) {
  if (!choice.measured) return;
  auto& parameters = *config->mutable_parameters();
  parameters[kAutoBatchSizesChosenKey].set_string_value(choice.SizesText());
  parameters[kAutoBatchSizesRatesKey].set_string_value(choice.RatesText());
}

void FillModelMetadata(const ModelSpec& spec, const std::vector<int64_t>& versions,
                       inference::ModelMetadataResponse* proto) {
  proto->set_name(spec.name);
  proto->set_platform(spec.platform);
  for (int64_t version : versions) proto->add_versions(std::to_string(version));
  auto add = [&](const TensorSpec& tensor, auto* list) {
    auto* meta = list->Add();
    meta->set_name(tensor.name);
    meta->set_datatype(std::string(DataTypeName(tensor.dtype)));
    for (int64_t dim : spec.FullShape(tensor)) meta->add_shape(dim);
  };
  for (const TensorSpec& input : spec.inputs) {
    if (!input.filled_by_server) add(input, proto->mutable_inputs());  // clients do not send it
  }
  for (const TensorSpec& output : spec.outputs) add(output, proto->mutable_outputs());
}

void FillModelStatistics(const std::string& name, int64_t version, const ModelStatsSnapshot& stats,
                         inference::ModelStatistics* proto) {
  auto fill = [](const DurationStat& from, inference::StatisticDuration* to) {
    to->set_count(from.count);
    to->set_ns(from.ns);
  };
  proto->set_name(name);
  proto->set_version(std::to_string(version));
  proto->set_last_inference(stats.last_inference_ms);
  proto->set_inference_count(stats.inference_count);
  proto->set_execution_count(stats.execution_count);
  auto* inference = proto->mutable_inference_stats();
  fill(stats.success, inference->mutable_success());
  fill(stats.fail, inference->mutable_fail());
  fill(stats.queue, inference->mutable_queue());
  fill(stats.compute_input, inference->mutable_compute_input());
  fill(stats.compute_infer, inference->mutable_compute_infer());
  fill(stats.compute_output, inference->mutable_compute_output());
  for (const auto& [size, batch] : stats.batches) {
    auto* out = proto->add_batch_stats();
    out->set_batch_size(size);
    fill(batch.compute_input, out->mutable_compute_input());
    fill(batch.compute_infer, out->mutable_compute_infer());
    fill(batch.compute_output, out->mutable_compute_output());
  }
}

}  // namespace sluice
