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
#include "server/frontend/model_queries.h"
#include "server/frontend/shared_memory.h"

namespace sluice {

// One output the request names, and the form it wants it in.
struct RequestedOutput {
  std::string name;
  bool binary = false;  // its "binary_data" parameter (default: the request's binary_data_output)
  std::optional<SharedMemoryReference>
      shared_memory;  // its shared_memory_* parameters: the bytes go there
};

// An inference request as the HTTP body gave it.
struct JsonInferRequest {
  std::unique_ptr<InferRequest> request;  // model name and version are the caller's to set
  std::vector<RequestedOutput> outputs;   // empty: every output, each in the default form
  bool binary_default = false;            // the request parameter binary_data_output

  // Whether output `name` goes into the response as binary data.
  bool Binary(const std::string& name) const;
  // Whether output `name` goes to a shared memory region (and into the response without data).
  bool InSharedMemory(const std::string& name) const;
};

// Parses an inference request body: a JSON object, or with `header_length` (the request's
// Inference-Header-Content-Length) that many bytes of JSON followed by the binary data of every
// input that has a binary_data_size parameter, in input order, with nothing left over. Inputs
// sent as JSON `data` (flat or nested, row-major) are converted to raw bytes the request owns;
// binary inputs are views of `body`, which must outlive the request. FP16 and BF16 have no JSON
// form (binary only). Each input sets exactly one of `data`, binary_data_size and
// shared_memory_region (Triton's rule); an input in shared memory views its slice through `shm`
// (which keeps the region mapped; null: FAILED_PRECONDITION, as shared memory is off). An output's
// shared_memory_* parameters are read into its RequestedOutput (binary_data true beside them is
// refused, as by Triton), for the caller to resolve. INVALID_ARGUMENT naming the tensor or field
// that is wrong.
StatusOr<JsonInferRequest> InferRequestFromJson(absl::string_view body,
                                                std::optional<size_t> header_length,
                                                SharedMemoryRefs* shm = nullptr);

// The HTTP path's output sink: each output's bytes in a string of its own, written once by the
// backend, then moved into the response body (binary) or printed (JSON).
class HttpOutputSink final : public OutputSink {
 public:
  struct Output {
    std::string name;
    DataType dtype = DataType::kFp32;
    Shape shape;
    std::string data;
    bool in_shared_memory = false;  // its bytes went to a region: described, no data
  };
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  // An output whose bytes went to shared memory (SharedMemorySink): listed, without data.
  void Describe(const OutputDescription& output);
  std::deque<Output>& outputs() { return outputs_; }

 private:
  std::deque<Output> outputs_;  // a deque: earlier outputs' memory stays where it is
};

// The body of a successful inference response: the JSON header first, then the bytes of every
// output `request` wants in binary, in output order (moved out of `outputs`, not copied). An
// output in shared memory has its name, datatype and shape only (as Triton).
// `header_length` gets the JSON's length when some output is binary (the response's
// Inference-Header-Content-Length), else 0. FP32 values print so that they parse back to the same
// float.
std::vector<std::string> InferResponseToJson(const std::string& model_name, int64_t version,
                                             const std::string& id, const JsonInferRequest& request,
                                             std::deque<HttpOutputSink::Output>* outputs,
                                             size_t* header_length);

// A protocol message as JSON, the way Triton's HTTP endpoints print them: field names as in the
// .proto, 64-bit integers as numbers, enums by name, maps as objects, every scalar field printed
// (also at its default), unset messages and oneof members left out.
std::string ProtoToJson(const google::protobuf::Message& message);

// The same for each element of a repeated message field, as a JSON array (the repository index).
std::string RepeatedProtoToJson(const google::protobuf::Message& message, const std::string& field);

// {"error": "<message>"}, always valid JSON: the message as CapMessage bounds it (message_text.h:
// at most kStatusMessageBytes, each byte of invalid UTF-8 shown as \xNN).
std::string ErrorJson(absl::string_view message);

// The body of a health answer, as KServe's clients read it: {"<key>": <holds>} ("live" or
// "ready"), with {"name": "<model>"} first for a model's readiness (`model` not empty).
std::string ConditionJson(absl::string_view key, bool holds, absl::string_view model = "");

// The "ready" field of a repository index request body (empty body: false). INVALID_ARGUMENT
// when the body is not a JSON object or "ready" is not a boolean.
StatusOr<bool> ParseIndexRequest(absl::string_view body);

// The body of POST /v2/[models/{m}/]trace/setting: {"<setting>": value, ...}, a value being a
// string, a number, an array of strings (trace_level) or null (clears the setting).
// INVALID_ARGUMENT for another JSON form.
StatusOr<TraceSettingsMap> ParseTraceSettingsJson(absl::string_view body);
// Trace settings as Triton's HTTP endpoint answers them: trace_level an array, the rest strings.
std::string TraceSettingsJson(const TraceSettingsMap& settings);

// Shared memory status as Triton's HTTP endpoint answers it: a JSON array of
// {"name", "key", "offset", "byte_size"} objects.
std::string SharedMemoryStatusJson(const std::vector<SharedMemoryStatusEntry>& entries);

// The body of POST /v2/systemsharedmemory/region/{r}/register: {"key": s, "offset": n (optional),
// "byte_size": n}. INVALID_ARGUMENT in Triton's words for a missing key or byte_size.
struct SystemSharedMemoryRegistration {
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};
StatusOr<SystemSharedMemoryRegistration> ParseSystemSharedMemoryRegister(absl::string_view body);

// The members of a repository load/unload body's "parameters" object (empty body: none), as
// Triton's HTTP endpoint reads them: strings (a "file:<path>" member is base64, decoded here to
// kBytes), booleans and integers. INVALID_ARGUMENT for a body that is not a JSON object, bad
// base64, or another kind of value.
StatusOr<std::vector<ControlParameter>> ParseControlRequest(absl::string_view body);

}  // namespace sluice
