// Triton's classification extension, written once for both protocols: a requested output with
// the parameter "classification" = k (gRPC: InferRequestedOutputTensor.parameters; HTTP: the
// output's "parameters") is answered as its k highest-scoring classes instead of the tensor.
//
// The answer is a BYTES tensor of shape [batch, k] ([k] for a model without batching): for each
// batch row, over that row's elements flattened, the k largest values, highest first, each as
// "<score>:<index>" with ":<label>" appended when the output's label_filename has a non-empty
// line `index`. Scores are printed as C's "%f" prints them (6 decimals) for FP16, BF16, FP32 and
// FP64, as integers for the integer types; k is at most the row's element count.
//
// Where Sluice differs from Triton: equal scores are ordered by index (Triton leaves their order
// unspecified), NaN ranks below every number, and FP16 and BF16 outputs are classified (Triton
// refuses them; Sluice converts each element to float first). BOOL and BYTES are refused, with
// Triton's words, when the request is validated (CheckClassifiable, core/validation.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"
#include "server/core/validation.h"

namespace sluice {

// The classes of one output: the serialized BYTES tensor (server/core/bytes_tensor.h) and its
// shape.
struct ClassifiedOutput {
  Shape shape;
  std::string bytes;
};

// The top `count` (>= 1) classes of each row of an output of `dtype` and `shape` whose row-major
// bytes are `data`; `batched`: the first dimension is the batch (one row per batch entry), else
// the whole output is one row. `labels` may be null. INVALID_ARGUMENT for a type
// CheckClassifiable refuses, or bytes that do not match the shape.
StatusOr<ClassifiedOutput> TopClasses(DataType dtype, const Shape& shape, absl::string_view data,
                                      bool batched, int64_t count,
                                      const std::vector<std::string>* labels);

// Wraps the sink a front end answers into for a request with classifications: the outputs to
// classify are written into memory of its own, and each is handed on to `inner` as its classes,
// in the order the outputs were allocated, before the next output is allocated or on Finish. It
// relies on the OutputSink contract that an output's bytes are written before the next Allocate on
// the same sink and before the completion runs. Thread-compatible, as every sink.
class ClassifyingSink final : public OutputSink {
 public:
  // `inner` outlives this sink; `spec`: the model the request runs on (read here, not kept);
  // `classifications`: the request's (validated).
  ClassifyingSink(OutputSink* inner, const ModelSpec& spec,
                  const std::vector<ClassificationRequest>& classifications);

  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::shared_ptr<AnswerConnection> Connection() override { return inner_->Connection(); }

  // Hands the last classified output on; called once the request's outputs are written (its
  // completion, on success), before the answer is sent. The error of the inner sink, if any.
  Status Finish();

 private:
  struct Wanted {
    std::string output;
    int64_t count = 0;
    std::shared_ptr<const std::vector<std::string>> labels;
  };
  // The output allocated here and not yet handed on.
  struct Pending {
    const Wanted* wanted = nullptr;
    DataType dtype = DataType::kFp32;
    Shape shape;
    std::string data;
  };

  Status HandOn();

  OutputSink* inner_;
  bool batched_;
  std::vector<Wanted> wanted_;
  Pending pending_;
};

}  // namespace sluice
