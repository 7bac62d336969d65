#include "server/http/http_codec.h"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"
#include "server/core/message_text.h"
#include "server/frontend/request_parameters.h"

namespace sluice {
namespace {

// Iterative parsing (no recursion, so no stack overflow on hostile nesting); NaN and Infinity
// accepted as FP values, as Python's json module writes them.
constexpr unsigned kParseFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag;
using Writer = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                 rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;
constexpr int kMaxNesting = 64;  // of tensor data arrays

Status ParseDocument(absl::string_view json, rapidjson::Document* document) {
  document->Parse<kParseFlags>(json.data(), json.size());
  if (document->HasParseError()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON: ",
                     rapidjson::GetParseError_En(document->GetParseError()), " (at byte ",
                     document->GetErrorOffset(), ")"));
  }
  if (!document->IsObject())
    return absl::InvalidArgumentError("the request body is not a JSON object");
  return absl::OkStatus();
}

const rapidjson::Value* Member(const rapidjson::Value& object, const char* name) {
  auto it = object.FindMember(name);
  return it == object.MemberEnd() ? nullptr : &it->value;
}

// A JSON value as the shared parameter reader sees it.
ParameterValue ValueOf(const rapidjson::Value& json) {
  ParameterValue value;
  if (json.IsBool()) {
    value.kind = ParameterValue::Kind::kBool;
    value.boolean = json.GetBool();
  } else if (json.IsUint64()) {
    value.kind = ParameterValue::Kind::kUint64;
    value.uint64 = json.GetUint64();
  } else if (json.IsInt64()) {
    value.kind = ParameterValue::Kind::kInt64;
    value.int64 = json.GetInt64();
  } else if (json.IsNumber()) {
    value.kind = ParameterValue::Kind::kDouble;
    value.number = json.GetDouble();
  } else if (json.IsString()) {
    value.kind = ParameterValue::Kind::kString;
    value.text = absl::string_view(json.GetString(), json.GetStringLength());
  }
  return value;
}

// The parameter `key` of a "parameters" object (null: none), as the shared readers see it.
std::optional<ParameterValue> FindParameter(const rapidjson::Value* parameters,
                                            absl::string_view key) {
  if (parameters == nullptr) return std::nullopt;
  auto found = parameters->FindMember(rapidjson::Value(
      rapidjson::StringRef(key.data(), static_cast<rapidjson::SizeType>(key.size()))));
  if (found == parameters->MemberEnd()) return std::nullopt;
  return ValueOf(found->value);
}

template <typename T>
void AppendBytes(T value, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

// One JSON element of `dtype` appended to `out` as wire bytes.
Status AppendElement(const rapidjson::Value& value, DataType dtype, const std::string& name,
                     std::string* out) {
  auto integer = [&](auto type_tag) -> Status {
    using T = decltype(type_tag);
    if (!value.IsInt64() && !value.IsUint64()) {
      return absl::InvalidArgumentError(absl::StrCat("input '", QuoteClientText(name),
                                                     "' of datatype ", DataTypeName(dtype),
                                                     " has a value that is not an integer"));
    }
    const bool fits =
        value.IsInt64()
            ? value.GetInt64() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                  (std::is_same_v<T, int64_t> ||
                   value.GetInt64() <= static_cast<int64_t>(std::numeric_limits<T>::max()))
            : false;  // only past INT64_MAX is a value Uint64 but not Int64
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", QuoteClientText(name), "': a value does not fit ", DataTypeName(dtype)));
    }
    AppendBytes(static_cast<T>(value.GetInt64()), out);
    return absl::OkStatus();
  };
  switch (dtype) {
    case DataType::kBool:
      if (!value.IsBool()) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", QuoteClientText(name),
                         "' of datatype BOOL has a value that is not true or false"));
      }
      out->push_back(value.GetBool() ? 1 : 0);
      return absl::OkStatus();
    case DataType::kUint8:
      return integer(uint8_t{});
    case DataType::kInt8:
      return integer(int8_t{});
    case DataType::kInt16:
      return integer(int16_t{});
    case DataType::kInt32:
      return integer(int32_t{});
    case DataType::kInt64:
      return integer(int64_t{});
    case DataType::kFp32:
    case DataType::kFp64:
      if (!value.IsNumber()) {
        return absl::InvalidArgumentError(absl::StrCat("input '", QuoteClientText(name),
                                                       "' of datatype ", DataTypeName(dtype),
                                                       " has a value that is not a number"));
      }
      if (dtype == DataType::kFp32) {
        AppendBytes(static_cast<float>(value.GetDouble()), out);
      } else {
        AppendBytes(value.GetDouble(), out);
      }
      return absl::OkStatus();
    case DataType::kBytes:
      if (!value.IsString()) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", QuoteClientText(name),
                         "' of datatype BYTES has a value that is not a string"));
      }
      AppendBytesElement(std::string_view(value.GetString(), value.GetStringLength()), out);
      return absl::OkStatus();
    case DataType::kFp16:
    case DataType::kBf16:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input '", QuoteClientText(name), "': ", DataTypeName(dtype),
                   " has no JSON form; send it as binary data (binary_data_size)"));
}

// Flattens `data` (a scalar, or arrays nested in any way) row-major into `out`.
Status AppendData(const rapidjson::Value& data, DataType dtype, const std::string& name, int depth,
                  std::string* out, int64_t* count) {
  if (!data.IsArray()) {
    ++*count;
    return AppendElement(data, dtype, name, out);
  }
  if (depth >= kMaxNesting) {
    return absl::InvalidArgumentError(absl::StrCat("input '", QuoteClientText(name),
                                                   "': data is nested more than ", kMaxNesting,
                                                   " arrays deep"));
  }
  for (const rapidjson::Value& element : data.GetArray()) {
    SLUICE_RETURN_IF_ERROR(AppendData(element, dtype, name, depth + 1, out, count));
  }
  return absl::OkStatus();
}

// A parameters object's boolean `key`; `fallback` when absent.
StatusOr<bool> BoolParameter(const rapidjson::Value* parameters, const char* key, bool fallback,
                             const std::string& where) {
  if (parameters == nullptr) return fallback;
  const rapidjson::Value* value = Member(*parameters, key);
  if (value == nullptr) return fallback;
  if (!value->IsBool()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": parameter '", key, "' must be true or false"));
  }
  return value->GetBool();
}

Status CheckParameters(const rapidjson::Value* parameters, const std::string& where) {
  if (parameters != nullptr && !parameters->IsObject()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'parameters' must be a JSON object"));
  }
  return absl::OkStatus();
}

void WriteElements(const HttpOutputSink::Output& output, Writer* writer) {
  if (output.dtype == DataType::kBytes) {
    // The model's str values, as JSON strings (Triton's JSON form of BYTES).
    for (std::string_view element : SplitBytesTensor(output.data)) {
      writer->String(element.data(), static_cast<rapidjson::SizeType>(element.size()));
    }
    return;
  }
  const char* data = output.data.data();
  const size_t size = ElementSize(output.dtype);
  const size_t count = size == 0 ? 0 : output.data.size() / size;
  auto each = [&](auto type_tag, auto write) {
    using T = decltype(type_tag);
    for (size_t i = 0; i < count; ++i) {
      T value;
      std::memcpy(&value, data + i * sizeof(T), sizeof(T));
      write(value);
    }
  };
  switch (output.dtype) {
    case DataType::kBool:
      each(uint8_t{}, [&](uint8_t v) { writer->Bool(v != 0); });
      break;
    case DataType::kUint8:
      each(uint8_t{}, [&](uint8_t v) { writer->Uint(v); });
      break;
    case DataType::kInt8:
      each(int8_t{}, [&](int8_t v) { writer->Int(v); });
      break;
    case DataType::kInt16:
      each(int16_t{}, [&](int16_t v) { writer->Int(v); });
      break;
    case DataType::kInt32:
      each(int32_t{}, [&](int32_t v) { writer->Int(v); });
      break;
    case DataType::kInt64:
      each(int64_t{}, [&](int64_t v) { writer->Int64(v); });
      break;
    // A float widened to double prints as the shortest decimal that reads back as that double,
    // which narrows back to the same float.
    case DataType::kFp32:
      each(float{}, [&](float v) { writer->Double(static_cast<double>(v)); });
      break;
    case DataType::kFp64:
      each(double{}, [&](double v) { writer->Double(v); });
      break;
    case DataType::kFp16:
    case DataType::kBf16:
      break;  // refused before the request ran (binary only)
    case DataType::kBytes:
      break;  // written above
  }
}

void WriteMessage(const google::protobuf::Message& message, Writer* writer);

void WriteValue(const google::protobuf::Message& message,
                const google::protobuf::FieldDescriptor* field, int index, Writer* writer) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      writer->Int(repeated ? r->GetRepeatedInt32(message, field, index)
                           : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      writer->Int64(repeated ? r->GetRepeatedInt64(message, field, index)
                             : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      writer->Uint(repeated ? r->GetRepeatedUInt32(message, field, index)
                            : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      writer->Uint64(repeated ? r->GetRepeatedUInt64(message, field, index)
                              : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      writer->Double(repeated ? r->GetRepeatedDouble(message, field, index)
                              : r->GetDouble(message, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      writer->Double(repeated ? r->GetRepeatedFloat(message, field, index)
                              : r->GetFloat(message, field));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      writer->Bool(repeated ? r->GetRepeatedBool(message, field, index)
                            : r->GetBool(message, field));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* value =
          repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field);
      writer->String(value->name().c_str(), static_cast<rapidjson::SizeType>(value->name().size()));
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& value =
          repeated ? r->GetRepeatedStringReference(message, field, index, &scratch)
                   : r->GetStringReference(message, field, &scratch);
      writer->String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessage(
          repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field),
          writer);
      break;
  }
}

void WriteMessage(const google::protobuf::Message& message, Writer* writer) {
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const google::protobuf::Reflection* reflection = message.GetReflection();
  writer->StartObject();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (!field->is_repeated() && field->has_presence() && !reflection->HasField(message, field))
      continue;
    writer->Key(field->name().c_str(), static_cast<rapidjson::SizeType>(field->name().size()));
    if (field->is_map()) {
      writer->StartObject();
      const int size = reflection->FieldSize(message, field);
      const google::protobuf::FieldDescriptor* key = field->message_type()->map_key();
      const google::protobuf::FieldDescriptor* value = field->message_type()->map_value();
      for (int j = 0; j < size; ++j) {
        const google::protobuf::Message& entry = reflection->GetRepeatedMessage(message, field, j);
        const google::protobuf::Reflection* entry_reflection = entry.GetReflection();
        std::string name;
        switch (key->cpp_type()) {
          case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
            name = entry_reflection->GetString(entry, key);
            break;
          case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
            name = std::to_string(entry_reflection->GetInt32(entry, key));
            break;
          case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
            name = std::to_string(entry_reflection->GetInt64(entry, key));
            break;
          case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
            name = std::to_string(entry_reflection->GetUInt32(entry, key));
            break;
          case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
            name = std::to_string(entry_reflection->GetUInt64(entry, key));
            break;
          case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
            name = entry_reflection->GetBool(entry, key) ? "true" : "false";
            break;
          default:
            break;
        }
        writer->Key(name.c_str(), static_cast<rapidjson::SizeType>(name.size()));
        WriteValue(entry, value, -1, writer);
      }
      writer->EndObject();
    } else if (field->is_repeated()) {
      writer->StartArray();
      const int size = reflection->FieldSize(message, field);
      for (int j = 0; j < size; ++j) WriteValue(message, field, j, writer);
      writer->EndArray();
    } else {
      WriteValue(message, field, -1, writer);
    }
  }
  writer->EndObject();
}

}  // namespace

bool JsonInferRequest::Binary(const std::string& name) const {
  for (const RequestedOutput& output : outputs) {
    if (output.name == name) return output.binary;
  }
  return binary_default;
}

bool JsonInferRequest::InSharedMemory(const std::string& name) const {
  for (const RequestedOutput& output : outputs) {
    if (output.name == name) return output.shared_memory.has_value();
  }
  return false;
}

StatusOr<JsonInferRequest> InferRequestFromJson(absl::string_view body,
                                                std::optional<size_t> header_length,
                                                SharedMemoryRefs* shm) {
  if (header_length && *header_length > body.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Inference-Header-Content-Length is ",
                                                   *header_length, " but the body has only ",
                                                   body.size(), " bytes"));
  }
  const absl::string_view json = header_length ? body.substr(0, *header_length) : body;
  size_t binary_offset = header_length ? *header_length : body.size();
  rapidjson::Document document;
  SLUICE_RETURN_IF_ERROR(ParseDocument(json, &document));

  JsonInferRequest parsed;
  parsed.request = std::make_unique<InferRequest>();
  InferRequest& request = *parsed.request;
  if (const rapidjson::Value* id = Member(document, "id"); id != nullptr) {
    if (!id->IsString()) return absl::InvalidArgumentError("'id' must be a string");
    request.id.assign(id->GetString(), id->GetStringLength());
  }
  const rapidjson::Value* parameters = Member(document, "parameters");
  SLUICE_RETURN_IF_ERROR(CheckParameters(parameters, "the request"));
  SLUICE_ASSIGN_OR_RETURN(parsed.binary_default,
                          BoolParameter(parameters, "binary_data_output", false, "the request"));
  if (parameters != nullptr) {
    SLUICE_RETURN_IF_ERROR(ReadRequestParameters(
        [parameters](absl::string_view key) { return FindParameter(parameters, key); },
        &request.parameters));
  }

  const rapidjson::Value* inputs = Member(document, "inputs");
  if (inputs == nullptr || !inputs->IsArray()) {
    return absl::InvalidArgumentError("the request has no 'inputs' array");
  }
  request.inputs.reserve(inputs->Size());
  for (const rapidjson::Value& input : inputs->GetArray()) {
    if (!input.IsObject())
      return absl::InvalidArgumentError("each element of 'inputs' must be a JSON object");
    const rapidjson::Value* name = Member(input, "name");
    if (name == nullptr || !name->IsString()) {
      return absl::InvalidArgumentError("an input has no 'name' string");
    }
    TensorView view;
    view.name.assign(name->GetString(), name->GetStringLength());
    const rapidjson::Value* datatype = Member(input, "datatype");
    if (datatype == nullptr || !datatype->IsString()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", QuoteClientText(view.name), "' has no 'datatype' string"));
    }
    const std::optional<DataType> dtype = ParseDataTypeName(datatype->GetString());
    if (!dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", QuoteClientText(view.name), "': datatype '",
                       QuoteClientText({datatype->GetString(), datatype->GetStringLength()}),
                       "' is not supported (", SupportedDataTypeNames(), ")"));
    }
    view.dtype = *dtype;
    const rapidjson::Value* shape = Member(input, "shape");
    if (shape == nullptr || !shape->IsArray()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", QuoteClientText(view.name), "' has no 'shape' array"));
    }
    for (const rapidjson::Value& dim : shape->GetArray()) {
      if (!dim.IsInt64() || dim.GetInt64() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input '", QuoteClientText(view.name),
                         "': shape must be a list of non-negative integers"));
      }
      view.shape.push_back(dim.GetInt64());
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(view.shape));
    const std::string where = absl::StrCat("input '", QuoteClientText(view.name), "'");
    const rapidjson::Value* input_parameters = Member(input, "parameters");
    SLUICE_RETURN_IF_ERROR(CheckParameters(input_parameters, where));
    const rapidjson::Value* binary_size =
        input_parameters != nullptr ? Member(*input_parameters, "binary_data_size") : nullptr;
    const rapidjson::Value* data = Member(input, "data");
    SLUICE_ASSIGN_OR_RETURN(const std::optional<SharedMemoryReference> in_shm,
                            ReadSharedMemoryReference(
                                [input_parameters](absl::string_view key) {
                                  return FindParameter(input_parameters, key);
                                },
                                where));
    if (const int forms = (data != nullptr) + (binary_size != nullptr) + in_shm.has_value();
        forms != 1) {
      // Triton's sentence, then which fields were set.
      std::string error = absl::StrCat(where,
                                       ": Input must set only one of the following fields: 'data', "
                                       "'binary_data_size' in 'parameters', "
                                       "'shared_memory_region' in 'parameters'. But ",
                                       forms == 0 ? "no field is set" : "set");
      if (data != nullptr) absl::StrAppend(&error, " 'data'");
      if (binary_size != nullptr) absl::StrAppend(&error, " 'binary_data_size'");
      if (in_shm) absl::StrAppend(&error, " 'shared_memory_region'");
      return absl::InvalidArgumentError(error);
    }
    if (in_shm) {
      if (shm == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, " names shared memory region '", QuoteClientText(in_shm->region),
                         "', but shared memory is not available here"));
      }
      SLUICE_RETURN_IF_ERROR(shm->ResolveInput(*in_shm, &view, &request));
    } else if (binary_size != nullptr) {
      if (!header_length) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         " is binary (binary_data_size) but the request has no "
                         "Inference-Header-Content-Length header"));
      }
      if (!binary_size->IsUint64()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": binary_data_size must be a non-negative integer"));
      }
      const uint64_t size = binary_size->GetUint64();
      if (size > body.size() - binary_offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has binary_data_size ", size, " but only ", body.size() - binary_offset,
            " bytes of binary data are left in the body"));
      }
      view.data = body.data() + binary_offset;
      view.byte_size = size;
      binary_offset += size;
    } else {
      auto buffer = std::make_unique<std::string>();
      // Not from the shape alone, which the client chose: every JSON value takes at least a byte.
      buffer->reserve(std::min(static_cast<size_t>(elements), json.size()) *
                      ElementSize(view.dtype));
      int64_t count = 0;
      SLUICE_RETURN_IF_ERROR(AppendData(*data, view.dtype, view.name, 0, buffer.get(), &count));
      if (count != elements) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has ", count, " values in 'data', but shape ",
                         ShapeToString(view.shape), " needs ", elements));
      }
      view.data = buffer->data();
      view.byte_size = buffer->size();
      request.owned_buffers.push_back(std::move(buffer));
    }
    request.inputs.push_back(std::move(view));
  }
  if (binary_offset != body.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body has ", body.size() - binary_offset,
                     " bytes after the JSON header and the binary inputs it declares"));
  }

  if (const rapidjson::Value* outputs = Member(document, "outputs"); outputs != nullptr) {
    if (!outputs->IsArray()) return absl::InvalidArgumentError("'outputs' must be an array");
    for (const rapidjson::Value& output : outputs->GetArray()) {
      const rapidjson::Value* name = output.IsObject() ? Member(output, "name") : nullptr;
      if (name == nullptr || !name->IsString()) {
        return absl::InvalidArgumentError(
            "each element of 'outputs' must be an object with a 'name' string");
      }
      RequestedOutput requested;
      requested.name.assign(name->GetString(), name->GetStringLength());
      const std::string where = absl::StrCat("output '", QuoteClientText(requested.name), "'");
      const rapidjson::Value* output_parameters = Member(output, "parameters");
      SLUICE_RETURN_IF_ERROR(CheckParameters(output_parameters, where));
      SLUICE_RETURN_IF_ERROR(ReadOutputParameters(
          [output_parameters](absl::string_view key) {
            return FindParameter(output_parameters, key);
          },
          requested.name, &request));
      SLUICE_ASSIGN_OR_RETURN(requested.binary, BoolParameter(output_parameters, "binary_data",
                                                              parsed.binary_default, where));
      SLUICE_ASSIGN_OR_RETURN(requested.shared_memory,
                              ReadSharedMemoryReference(
                                  [output_parameters](absl::string_view key) {
                                    return FindParameter(output_parameters, key);
                                  },
                                  where));
      if (requested.shared_memory) {
        SLUICE_ASSIGN_OR_RETURN(const bool binary,
                                BoolParameter(output_parameters, "binary_data", false, where));
        if (binary) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": Output can't set both 'shared_memory_region' and 'binary_data'"));
        }
        requested.binary = false;
      }
      request.requested_outputs.push_back(requested.name);
      parsed.outputs.push_back(std::move(requested));
    }
  }
  return parsed;
}

StatusOr<char*> HttpOutputSink::Allocate(const OutputDescription& output) {
  Output& out = outputs_.emplace_back();
  out.name = output.name;
  out.dtype = output.dtype;
  out.shape = output.shape;
  out.data.resize(output.byte_size);
  return out.data.data();
}

void HttpOutputSink::Describe(const OutputDescription& output) {
  Output& out = outputs_.emplace_back();
  out.name = output.name;
  out.dtype = output.dtype;
  out.shape = output.shape;
  out.in_shared_memory = true;
}

std::vector<std::string> InferResponseToJson(const std::string& model_name, int64_t version,
                                             const std::string& id, const JsonInferRequest& request,
                                             std::deque<HttpOutputSink::Output>* outputs,
                                             size_t* header_length) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  writer.Key("model_name");
  writer.String(model_name.data(), static_cast<rapidjson::SizeType>(model_name.size()));
  writer.Key("model_version");
  const std::string version_text = std::to_string(version);
  writer.String(version_text.data(), static_cast<rapidjson::SizeType>(version_text.size()));
  if (!id.empty()) {
    writer.Key("id");
    writer.String(id.data(), static_cast<rapidjson::SizeType>(id.size()));
  }
  writer.Key("outputs");
  writer.StartArray();
  std::vector<std::string> body(1);
  for (HttpOutputSink::Output& output : *outputs) {
    writer.StartObject();
    writer.Key("name");
    writer.String(output.name.data(), static_cast<rapidjson::SizeType>(output.name.size()));
    writer.Key("datatype");
    writer.String(DataTypeName(output.dtype));
    writer.Key("shape");
    writer.StartArray();
    for (int64_t dim : output.shape) writer.Int64(dim);
    writer.EndArray();
    if (output.in_shared_memory) {
      // described only: the client reads the bytes from its region
    } else if (request.Binary(output.name)) {
      writer.Key("parameters");
      writer.StartObject();
      writer.Key("binary_data_size");
      writer.Uint64(output.data.size());
      writer.EndObject();
      body.push_back(std::move(output.data));
    } else {
      writer.Key("data");
      writer.StartArray();
      WriteElements(output, &writer);
      writer.EndArray();
    }
    writer.EndObject();
  }
  writer.EndArray();
  writer.EndObject();
  body[0].assign(buffer.GetString(), buffer.GetSize());
  *header_length = body.size() > 1 ? body[0].size() : 0;
  return body;
}

std::string ProtoToJson(const google::protobuf::Message& message) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  WriteMessage(message, &writer);
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string RepeatedProtoToJson(const google::protobuf::Message& message,
                                const std::string& field_name) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  const google::protobuf::FieldDescriptor* field =
      message.GetDescriptor()->FindFieldByName(field_name);
  writer.StartArray();
  if (field != nullptr && field->is_repeated() &&
      field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
    const int size = message.GetReflection()->FieldSize(message, field);
    for (int i = 0; i < size; ++i)
      WriteMessage(message.GetReflection()->GetRepeatedMessage(message, field, i), &writer);
  }
  writer.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string ErrorJson(absl::string_view message) {
  const std::string capped =
      CapMessage(message);  // the writer copies bytes as they are: valid UTF-8 first
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  writer.Key("error");
  writer.String(capped.data(), static_cast<rapidjson::SizeType>(capped.size()));
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string ConditionJson(absl::string_view key, bool holds, absl::string_view model) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  if (!model.empty()) {
    writer.Key("name");
    writer.String(model.data(), static_cast<rapidjson::SizeType>(model.size()));
  }
  writer.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  writer.Bool(holds);
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

StatusOr<bool> ParseIndexRequest(absl::string_view body) {
  if (body.empty()) return false;
  rapidjson::Document document;
  SLUICE_RETURN_IF_ERROR(ParseDocument(body, &document));
  return BoolParameter(&document, "ready", false, "the repository index request");
}

StatusOr<TraceSettingsMap> ParseTraceSettingsJson(absl::string_view body) {
  TraceSettingsMap update;
  if (body.empty()) return update;
  rapidjson::Document document;
  SLUICE_RETURN_IF_ERROR(ParseDocument(body, &document));
  for (const auto& member : document.GetObject()) {
    const std::string key(member.name.GetString(), member.name.GetStringLength());
    std::vector<std::string>& values = update[key];
    auto one = [&](const rapidjson::Value& value) -> Status {
      if (value.IsString()) {
        values.emplace_back(value.GetString(), value.GetStringLength());
      } else if (value.IsInt64()) {
        values.push_back(std::to_string(value.GetInt64()));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("trace setting '", QuoteClientText(key),
                         "' must be a string, an integer, an array of strings or null"));
      }
      return absl::OkStatus();
    };
    if (member.value.IsNull()) continue;  // cleared
    if (member.value.IsArray()) {
      for (const auto& each : member.value.GetArray()) SLUICE_RETURN_IF_ERROR(one(each));
      if (values.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "trace setting '", QuoteClientText(key), "' is an empty array; use null to clear it"));
      }
    } else {
      SLUICE_RETURN_IF_ERROR(one(member.value));
    }
  }
  return update;
}

std::string TraceSettingsJson(const TraceSettingsMap& settings) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartObject();
  for (const auto& [key, values] : settings) {
    writer.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
    const bool list = key == "trace_level";
    if (list) writer.StartArray();
    for (const std::string& value : values) {
      writer.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
      if (!list) break;
    }
    if (!list && values.empty()) writer.String("");
    if (list) writer.EndArray();
  }
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string SharedMemoryStatusJson(const std::vector<SharedMemoryStatusEntry>& entries) {
  rapidjson::StringBuffer buffer;
  Writer writer(buffer);
  writer.StartArray();
  for (const SharedMemoryStatusEntry& entry : entries) {
    writer.StartObject();
    writer.Key("name");
    writer.String(entry.name.data(), static_cast<rapidjson::SizeType>(entry.name.size()));
    writer.Key("key");
    writer.String(entry.key.data(), static_cast<rapidjson::SizeType>(entry.key.size()));
    writer.Key("offset");
    writer.Uint64(entry.offset);
    writer.Key("byte_size");
    writer.Uint64(entry.byte_size);
    writer.EndObject();
  }
  writer.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

StatusOr<SystemSharedMemoryRegistration> ParseSystemSharedMemoryRegister(absl::string_view body) {
  rapidjson::Document document;
  SLUICE_RETURN_IF_ERROR(ParseDocument(body, &document));
  SystemSharedMemoryRegistration registration;
  const rapidjson::Value* key = Member(document, "key");
  if (key == nullptr)
    return absl::InvalidArgumentError("Shared memory register request has no 'key' field");
  if (!key->IsString())
    return absl::InvalidArgumentError("Shared memory register request: 'key' must be a string");
  registration.key.assign(key->GetString(), key->GetStringLength());
  if (const rapidjson::Value* offset = Member(document, "offset"); offset != nullptr) {
    if (!offset->IsUint64()) {
      return absl::InvalidArgumentError(
          "Shared memory register request: 'offset' must be a non-negative integer");
    }
    registration.offset = offset->GetUint64();
  }
  const rapidjson::Value* byte_size = Member(document, "byte_size");
  if (byte_size == nullptr) {
    return absl::InvalidArgumentError("Shared memory register request has no 'byte_size' field");
  }
  if (!byte_size->IsUint64()) {
    return absl::InvalidArgumentError(
        "Shared memory register request: 'byte_size' must be a non-negative integer");
  }
  registration.byte_size = byte_size->GetUint64();
  return registration;
}

StatusOr<std::vector<ControlParameter>> ParseControlRequest(absl::string_view body) {
  std::vector<ControlParameter> parameters;
  if (body.empty()) return parameters;
  rapidjson::Document document;
  SLUICE_RETURN_IF_ERROR(ParseDocument(body, &document));
  const rapidjson::Value* members = Member(document, "parameters");
  SLUICE_RETURN_IF_ERROR(CheckParameters(members, "the request"));
  if (members == nullptr) return parameters;
  for (const auto& member : members->GetObject()) {
    ControlParameter& parameter = parameters.emplace_back();
    parameter.key.assign(member.name.GetString(), member.name.GetStringLength());
    const rapidjson::Value& value = member.value;
    if (value.IsString()) {
      const absl::string_view text(value.GetString(), value.GetStringLength());
      if (absl::StartsWith(parameter.key,
                           "file:")) {  // file contents travel as base64, as in Triton
        parameter.kind = ControlParameter::Kind::kBytes;
        if (!absl::Base64Unescape(text, &parameter.value)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "load parameter '", QuoteClientText(parameter.key), "' is not valid base64"));
        }
      } else {
        parameter.kind = ControlParameter::Kind::kString;
        parameter.value = std::string(text);
      }
    } else if (value.IsBool()) {
      parameter.kind = ControlParameter::Kind::kBool;
      parameter.value = value.GetBool() ? "true" : "false";
    } else if (value.IsInt64()) {
      parameter.kind = ControlParameter::Kind::kInt64;
      parameter.value = std::to_string(value.GetInt64());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", QuoteClientText(parameter.key),
                       "' must be a string, a boolean or an integer"));
    }
  }
  return parameters;
}

}  // namespace sluice
