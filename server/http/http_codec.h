// The KServe v2 REST binding's JSON <-> Sluice domain types, with Triton's binary tensor
// extension (Inference-Header-Content-Length, binary_data_size, binary_data,
// binary_data_output). Pure functions and an output sink: no state, no I/O. RapidJSON parses and
// writes; protocol messages print through protobuf reflection.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/strings/string_view.h"

#include "server/core/infer_request.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"

namespace sluice {

// One output the request names, and the form it wants it in.
struct RequestedOutput {
  std::string name;
  bool binary = false;  // its "binary_data" parameter (default: the request's binary_data_output)
};

// An inference request as the HTTP body gave it.
struct JsonInferRequest {
  std::unique_ptr<InferRequest> request;  // model name and version are the caller's to set
  std::vector<RequestedOutput> outputs;   // empty: every output, each in the default form
  bool binary_default = false;            // the request parameter binary_data_output

  // Whether output `name` goes into the response as binary data.
  bool Binary(const std::string& name) const;
};

// Parses an inference request body: a JSON object, or with `header_length` (the request's
// Inference-Header-Content-Length) that many bytes of JSON followed by the binary data of every
// input that has a binary_data_size parameter, in input order, with nothing left over. Inputs
// sent as JSON `data` (flat or nested, row-major) are converted to raw bytes the request owns;
// binary inputs are views of `body`, which must outlive the request. FP16 and BF16 have no JSON
// form (binary only). INVALID_ARGUMENT naming the tensor or field that is wrong.
StatusOr<JsonInferRequest> InferRequestFromJson(absl::string_view body, std::optional<size_t> header_length);

// The HTTP path's output sink: each output's bytes in a string of its own, written once by the
// backend, then moved into the response body (binary) or printed (JSON).
class HttpOutputSink final : public OutputSink {
 public:
  struct Output {
    std::string name;
    DataType dtype = DataType::kFp32;
    Shape shape;
    std::string data;
  };
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::deque<Output>& outputs() { return outputs_; }

 private:
  std::deque<Output> outputs_;  // a deque: earlier outputs' memory stays where it is
};

// The body of a successful inference response: the JSON header first, then the bytes of every
// output `request` wants in binary, in output order (moved out of `outputs`, not copied).
// `header_length` gets the JSON's length when some output is binary (the response's
// Inference-Header-Content-Length), else 0. FP32 values print so that they parse back to the same
// float.
std::vector<std::string> InferResponseToJson(const std::string& model_name, int64_t version, const std::string& id,
                                             const JsonInferRequest& request,
                                             std::deque<HttpOutputSink::Output>* outputs, size_t* header_length);

// A protocol message as JSON, the way Triton's HTTP endpoints print them: field names as in the
// .proto, 64-bit integers as numbers, enums by name, maps as objects, every scalar field printed
// (also at its default), unset messages and oneof members left out.
std::string ProtoToJson(const google::protobuf::Message& message);

// The same for each element of a repeated message field, as a JSON array (the repository index).
std::string RepeatedProtoToJson(const google::protobuf::Message& message, const std::string& field);

// {"error": "<message>"}.
std::string ErrorJson(absl::string_view message);

// The body of a health answer, as KServe's clients read it: {"<key>": <holds>} ("live" or
// "ready"), with {"name": "<model>"} first for a model's readiness (`model` not empty).
std::string ConditionJson(absl::string_view key, bool holds, absl::string_view model = "");

// The "ready" field of a repository index request body (empty body: false). INVALID_ARGUMENT
// when the body is not a JSON object or "ready" is not a boolean.
StatusOr<bool> ParseIndexRequest(absl::string_view body);

// The names in a repository load/unload body's "parameters" object (empty body: none).
StatusOr<std::vector<std::string>> ParseControlRequest(absl::string_view body);

}  // namespace sluice
