#include "server/grpc/grpc_codec.h"

#include <cstring>
#include <limits>
#include <set>

#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"
#include "server/core/message_text.h"
#include "server/frontend/request_parameters.h"

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
          return absl::InvalidArgumentError(absl::StrCat("input '", QuoteClientText(view.name),
                                                         "': value ", value, " does not fit ",
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
          "input '", QuoteClientText(view.name), "': ", DataTypeName(view.dtype),
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

// An InferParameter as the shared parameter reader sees it.
ParameterValue ValueOf(const inference::InferParameter& parameter) {
  ParameterValue value;
  switch (parameter.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      value.kind = ParameterValue::Kind::kBool;
      value.boolean = parameter.bool_param();
      break;
    case inference::InferParameter::kInt64Param:
      value.kind = ParameterValue::Kind::kInt64;
      value.int64 = parameter.int64_param();
      break;
    case inference::InferParameter::kUint64Param:
      value.kind = ParameterValue::Kind::kUint64;
      value.uint64 = parameter.uint64_param();
      break;
    case inference::InferParameter::kDoubleParam:
      value.kind = ParameterValue::Kind::kDouble;
      value.number = parameter.double_param();
      break;
    case inference::InferParameter::kStringParam:
      value.kind = ParameterValue::Kind::kString;
      value.text = parameter.string_param();
      break;
    default:
      break;
  }
  return value;
}

using ParameterMap = google::protobuf::Map<std::string, inference::InferParameter>;

// Looks parameters up in `parameters` for the shared readers (request_parameters.h); the finder
// refers to the map, which outlives the read.
auto FinderOf(const ParameterMap& parameters) {
  return [&parameters](absl::string_view key) -> std::optional<ParameterValue> {
    auto found = parameters.find(std::string(key));
    if (found == parameters.end()) return std::nullopt;
    return ValueOf(found->second);
  };
}

}  // namespace

StatusOr<std::optional<SharedMemoryReference>> SharedMemoryReferenceOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& parameters,
    const std::string& what) {
  if (parameters.empty()) return std::nullopt;  // the common case: no lookups
  return ReadSharedMemoryReference(FinderOf(parameters), what);
}

StatusOr<std::unique_ptr<InferRequest>> InferRequestFromProto(
    const inference::ModelInferRequest& proto, SharedMemoryRefs* shm) {
  auto request = std::make_unique<InferRequest>();
  request->model_name = proto.model_name();
  request->id = proto.id();
  // Inputs in shared memory have no raw entry: the raw entries belong to the others, in order.
  // (Nothing is allocated for the common request whose inputs carry no parameters.)
  std::vector<std::optional<SharedMemoryReference>> in_shm;
  int shm_inputs = 0;
  for (int i = 0; i < proto.inputs_size(); ++i) {
    const auto& input = proto.inputs(i);
    if (input.parameters().empty()) continue;
    in_shm.resize(static_cast<size_t>(proto.inputs_size()));
    SLUICE_ASSIGN_OR_RETURN(
        in_shm[static_cast<size_t>(i)],
        SharedMemoryReferenceOf(input.parameters(),
                                absl::StrCat("input '", QuoteClientText(input.name()), "'")));
    if (in_shm[static_cast<size_t>(i)]) ++shm_inputs;
  }
  const bool raw = proto.raw_input_contents_size() > 0;
  for (int i = 0; raw && i < proto.inputs_size();
       ++i) {  // before the count: what is wrong is the mix
    const auto& input = proto.inputs(i);
    const bool in_region = !in_shm.empty() && in_shm[static_cast<size_t>(i)].has_value();
    if (!in_region && input.has_contents() && TypedValueCount(input.contents()) > 0) {
      // Triton's words (its example clients check them), then what to do.
      return absl::InvalidArgumentError(
          absl::StrCat("contents field must not be specified when using raw_input_contents for '",
                       QuoteClientText(input.name()), "' for model '", proto.model_name(),
                       "' (use one or the other for all inputs)"));
    }
  }
  if (raw && proto.raw_input_contents_size() != proto.inputs_size() - shm_inputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", proto.raw_input_contents_size(), " entries for ",
        proto.inputs_size() - shm_inputs, " inputs", shm_inputs > 0 ? " not in shared memory" : "",
        "; send one entry per input, in the order of `inputs`"));
  }
  int raw_index = 0;
  request->inputs.reserve(proto.inputs_size());
  for (int i = 0; i < proto.inputs_size(); ++i) {
    const auto& input = proto.inputs(i);
    TensorView view;
    view.name = input.name();
    const std::optional<DataType> dtype = ParseDataTypeName(input.datatype());
    if (!dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", QuoteClientText(input.name()), "': datatype '",
                       QuoteClientText(input.datatype()), "' is not supported (",
                       SupportedDataTypeNames(), ")"));
    }
    view.dtype = *dtype;
    view.shape.assign(input.shape().begin(), input.shape().end());
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(view.shape));
    const int64_t typed_values = input.has_contents() ? TypedValueCount(input.contents()) : 0;
    if (const std::optional<SharedMemoryReference>& reference =
            in_shm.empty() ? std::nullopt : in_shm[static_cast<size_t>(i)]) {
      const std::string what = absl::StrCat("input '", QuoteClientText(input.name()), "'");
      if (typed_values > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " is in shared memory and also has typed contents"));
      }
      if (shm == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " names shared memory region '", QuoteClientText(reference->region),
                         "', but shared memory is not available here"));
      }
      SLUICE_RETURN_IF_ERROR(shm->ResolveInput(*reference, &view, request.get()));
    } else if (raw) {
      const std::string& bytes = proto.raw_input_contents(raw_index++);
      view.data = bytes.data();
      view.byte_size = bytes.size();
    } else {
      if (typed_values == 0 && elements > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", QuoteClientText(input.name()),
                         "' has no data: set its typed `contents` or send "
                         "raw_input_contents"));
      }
      auto buffer = std::make_unique<std::string>();
      int64_t count = 0;
      SLUICE_RETURN_IF_ERROR(TypedToRaw(input.contents(), view, buffer.get(), &count));
      if (count != typed_values) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", QuoteClientText(input.name()), "' of datatype ", input.datatype(),
            " has values in a typed field that does not belong to it"));
      }
      if (count != elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", QuoteClientText(input.name()), "' has ", count, " typed values, but shape ",
            ShapeToString(view.shape), " needs ", elements));
      }
      view.data = buffer->data();
      view.byte_size = buffer->size();
      request->owned_buffers.push_back(std::move(buffer));
    }
    request->inputs.push_back(std::move(view));
  }
  for (const auto& output : proto.outputs()) {
    request->requested_outputs.push_back(output.name());
    if (output.parameters().empty()) continue;  // the common case: no lookups
    SLUICE_RETURN_IF_ERROR(
        ReadOutputParameters(FinderOf(output.parameters()), output.name(), request.get()));
  }
  if (!proto.parameters().empty()) {  // the common request carries none: no lookups
    SLUICE_RETURN_IF_ERROR(
        ReadRequestParameters(FinderOf(proto.parameters()), &request->parameters));
  }
  return request;
}

void FillInferResponseHeader(const InferRequest& request, int64_t version,
                             inference::ModelInferResponse* proto) {
  proto->set_model_name(request.model_name);
  proto->set_model_version(std::to_string(version));
  proto->set_id(request.id);
}

void ResponseSink::Describe(const OutputDescription& output) {
  auto* tensor = response_->add_outputs();
  tensor->set_name(output.name);
  tensor->set_datatype(std::string(DataTypeName(output.dtype)));
  for (int64_t dim : output.shape) tensor->add_shape(dim);
  response_->add_raw_output_contents();
}

std::shared_ptr<AnswerConnection> ResponseSink::Connection() {
  if (connections_ == nullptr || context_ == nullptr) return nullptr;
  return connections_->Find(context_->peer());
}

StatusOr<char*> ResponseSink::Allocate(const OutputDescription& output) {
  Describe(output);
  std::string* bytes =
      response_->mutable_raw_output_contents(response_->raw_output_contents_size() - 1);
  bytes->resize(output.byte_size);
  return bytes->data();
}

}  // namespace sluice
