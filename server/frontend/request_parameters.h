// The request parameters Sluice acts on, read in one place for both codecs: the gRPC codec
// (protocol.cc) and the JSON codec (json_protocol.cc) each turn their own parameter
// representation into ParameterValue and call ReadRequestParameters, so a parameter means the same
// and is refused with the same words over gRPC and over HTTP.
//
//   parameter        accepted value                         meaning (RequestParameters)
//   timeout          integer >= 0 (gRPC int64 or uint64,    queue timeout in microseconds; 0: the
//                    HTTP a JSON integer)                   model's default (see
//                    ModelHandle::Submit)
//   sequence_id      integer >= 0, or a string              the sequence (stateful models)
//   sequence_start   boolean                                the sequence's first request
//   sequence_end     boolean                                the sequence's last request
//
// Anything else is refused INVALID_ARGUMENT naming the parameter. Parameters not in the table are
// left alone: Triton ignores those it does not know, and the codec-specific ones (HTTP's
// binary_data_output, the shared_memory_* of a tensor) are their codec's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

#include "server/core/infer_request.h"
#include "server/core/status.h"

namespace sluice {

// One request parameter's value as a codec decoded it: an InferParameter's choice (gRPC) or a
// JSON value (HTTP: a non-negative integer is kUint64, a negative one kInt64, a fraction kDouble).
// `text` views the codec's message, which outlives the read.
struct ParameterValue {
  enum class Kind { kBool, kInt64, kUint64, kDouble, kString, kOther };
  Kind kind = Kind::kOther;  // kOther: unset (gRPC), null, an array or an object (JSON)
  bool boolean = false;
  int64_t int64 = 0;
  uint64_t uint64 = 0;
  double number = 0;
  absl::string_view text;
};

// The value of the request parameter `key`, or nullopt when the request does not carry it.
using ParameterFinder = absl::FunctionRef<std::optional<ParameterValue>(absl::string_view key)>;

// Reads the parameters of the table above into `*parameters` (the others keep their values).
Status ReadRequestParameters(ParameterFinder find, RequestParameters* parameters);

// Reads the parameters of requested output `output` that Sluice acts on beside the codec's own:
// "classification" (Triton's classification extension), an integer >= 0, the classes per batch
// row to answer instead of the tensor; 0 (as absent) asks for the tensor. A count above 0 is
// added to request->classifications; one beside the output's shared_memory_region is refused (the
// classes are written into the response, never into the client's region).
Status ReadOutputParameters(ParameterFinder find, const std::string& output, InferRequest* request);

}  // namespace sluice
