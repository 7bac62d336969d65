// Fuzzes what a client controls: the bytes of a ModelInferRequest, decoded, converted to our
// request type, validated against model configs (strings included, split back by rows), and
// padded to buckets. Nothing may crash,
// trip a sanitizer, or allocate from a declared shape the bytes do not back.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "grpc_service.pb.h"
#include "server/batching/shape_padding.h"
#include "server/core/validation.h"
#include "server/grpc/grpc_codec.h"

namespace {

sluice::ModelSpec BatchedSpec() {
  sluice::ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.inputs = {{"INPUT__0", sluice::DataType::kFp32, {3, -1}},
                 {"ids", sluice::DataType::kInt64, {-1}}};
  spec.outputs = {{"OUTPUT__0", sluice::DataType::kFp32, {-1}}};
  return spec;
}

sluice::ModelSpec PaddedSpec() {
  sluice::ModelSpec spec;
  spec.name = "seq";
  spec.max_batch_size = 4;
  spec.inputs = {{"tokens", sluice::DataType::kInt32, {-1, 2}},
                 {"mask", sluice::DataType::kBool, {-1}},
                 {"lengths", sluice::DataType::kInt64, {1}}};
  spec.inputs[2].filled_by_server = true;
  spec.outputs = {{"y", sluice::DataType::kInt32, {-1, 2}}};
  spec.padding.axes = {{"seq", {4, 16, 64}}};
  spec.padding.dims = {{"tokens", true, 0, 0}, {"mask", true, 0, 0}, {"y", false, 0, 0}};
  spec.padding.pad_value = -1;
  spec.padding.lengths_input = "lengths";
  return spec;
}

sluice::ModelSpec UnbatchedSpec() {
  sluice::ModelSpec spec;
  spec.name = "u";
  spec.inputs = {{"x", sluice::DataType::kFp16, {2, 2}}};
  spec.outputs = {{"y", sluice::DataType::kFp16, {2, 2}}};
  return spec;
}

sluice::ModelSpec StringSpec() {
  sluice::ModelSpec spec;
  spec.name = "text";
  spec.max_batch_size = 8;
  spec.inputs = {{"text", sluice::DataType::kBytes, {-1}}};
  spec.outputs = {{"text", sluice::DataType::kBytes, {-1}}};
  return spec;
}

// A validated string request's text handed back as the model's output, split over two callers
// by rows (DeliverOutputs finds each row's bytes by element count).
void EchoStrings(const sluice::InferRequest& request) {
  const sluice::TensorView& text = request.inputs.front();
  static const std::string kName = "text";
  const sluice::HostOutput output{&kName,    text.dtype,     text.shape,
                                  text.data, text.byte_size, sluice::MemoryType::kCpu};
  sluice::TensorSink first, second;
  const int64_t rows = text.shape.front();
  const sluice::OutputTarget targets[] = {{rows / 2, nullptr, &first},
                                          {rows - rows / 2, nullptr, &second}};
  (void)sluice::DeliverOutputs({&output, 1}, targets, /*batched=*/true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const sluice::ModelSpec specs[] = {BatchedSpec(), PaddedSpec(), UnbatchedSpec(),
                                            StringSpec()};
  inference::ModelInferRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto request = sluice::InferRequestFromProto(proto);
  if (!request.ok()) return 0;
  for (const sluice::ModelSpec& spec : specs) {
    if (!sluice::ValidateRequest(spec, request->get()).ok()) continue;
    if (spec.name == "text") EchoStrings(**request);
    if (spec.padding.enabled()) {
      auto padded = sluice::PadRequest(spec, request->get());
      if (!padded.ok()) continue;
      // What the model would answer: an output that follows the padded axis, cut back.
      static const std::string kOutput = "y";
      const sluice::TensorView& tokens = (*request)->inputs.front();
      sluice::TensorSink caller;
      sluice::UnpaddingSink sink(std::make_shared<const sluice::ModelSpec>(spec), *padded, &caller);
      auto memory = sink.Allocate({kOutput, sluice::DataType::kInt32, tokens.shape,
                                   tokens.byte_size, sluice::MemoryType::kCpu});
      if (memory.ok() && tokens.byte_size > 0) std::memcpy(*memory, tokens.data, tokens.byte_size);
      (void)sink.Finish();
    }
    return 0;
  }
  return 0;
}
