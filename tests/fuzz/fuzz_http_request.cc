// Fuzzes what an HTTP client controls: an inference request body (JSON, or a JSON header of a
// length the first bytes choose followed by binary tensor data), decoded, validated against a
// model config (BYTES inputs included), and answered (every decoded input printed back as an
// output, in JSON and as binary). Nothing may crash, trip a sanitizer, or allocate from a declared
// shape the body does not back.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/core/validation.h"
#include "server/http/http_codec.h"

namespace {

sluice::ModelSpec Spec() {
  sluice::ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.inputs = {{"x", sluice::DataType::kFp32, {-1}},
                 {"ids", sluice::DataType::kInt64, {2}},
                 {"text", sluice::DataType::kBytes, {-1}}};
  spec.outputs = {{"y", sluice::DataType::kFp32, {-1}}};
  return spec;
}

}  // namespace

// Layout: byte 0 bit 0 set: bytes 1-2 are the Inference-Header-Content-Length (little endian),
// the body follows; else the body is everything after byte 0.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::optional<size_t> header_length;
  size_t offset = 1;
  if ((data[0] & 1) != 0) {
    if (size < 3) return 0;
    header_length = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
    offset = 3;
  }
  // A copy the size of the body, so that AddressSanitizer sees reads past its end.
  const std::string body(reinterpret_cast<const char*>(data) + offset, size - offset);
  auto parsed = sluice::InferRequestFromJson(body, header_length);
  if (!parsed.ok()) return 0;
  static const sluice::ModelSpec spec = Spec();
  const bool valid = sluice::ValidateRequest(spec, parsed->request.get()).ok();
  std::deque<sluice::HttpOutputSink::Output> outputs;
  for (const sluice::TensorView& input : parsed->request->inputs) {
    if (input.dtype == sluice::DataType::kBytes) {
      // Strings are printed back only once validation has checked their framing, as the server
      // only ever prints what a model returned.
      if (!valid) continue;
      sluice::HttpOutputSink::Output& output = outputs.emplace_back();
      output.name = input.name;
      output.dtype = input.dtype;
      output.shape = input.shape;
      output.data.assign(input.data, input.byte_size);
      continue;
    }
    const size_t element = sluice::ElementSize(input.dtype);
    if (element == 0 || input.byte_size % element != 0) continue;
    sluice::HttpOutputSink::Output& output = outputs.emplace_back();
    output.name = input.name;
    output.dtype = input.dtype;
    output.shape = {static_cast<int64_t>(input.byte_size / element)};
    output.data.assign(input.data, input.byte_size);
  }
  size_t response_header = 0;
  (void)sluice::InferResponseToJson("m", 1, parsed->request->id, *parsed, &outputs,
                                    &response_header);
  return 0;
}
