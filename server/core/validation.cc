#include "server/core/validation.h"

#include <algorithm>
#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

std::string ExpectedNames(const std::vector<TensorSpec>& specs) {
  std::string names;
  for (const TensorSpec& spec : specs) {
    if (spec.filled_by_server || spec.state_only) continue;  // not the client's
    absl::StrAppend(&names, names.empty() ? "" : ", ", spec.name);
  }
  return names;
}

// Compares against the model's full shape (FullShape) without building it: this runs for every
// input of every request, and only an error needs the expected shape spelt out.
Status CheckShape(const ModelSpec& model, const TensorSpec& spec, const TensorView& input) {
  auto mismatch = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", input.name, "' of model '", model.name, "': ", what, "; got shape ",
                     ShapeToString(input.shape), ", expected ",
                     ShapeToString(model.FullShape(spec)), " (-1: any size)"));
  };
  const size_t batch_dims = model.batches() ? 1 : 0;
  const size_t rank = batch_dims + spec.dims.size();
  if (input.shape.size() != rank) {
    return mismatch(
        absl::StrCat("rank ", input.shape.size(), " where the model takes rank ", rank));
  }
  for (size_t i = 0; i < rank; ++i) {
    const int64_t expected = i < batch_dims ? -1 : spec.dims[i - batch_dims];
    if (input.shape[i] < 0) return mismatch(absl::StrCat("dimension ", i, " is negative"));
    if (expected != -1 && input.shape[i] != expected) {
      return mismatch(absl::StrCat("dimension ", i, " is ", input.shape[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status ValidateRequest(const ModelSpec& spec, InferRequest* request) {
  // Which declared inputs came, by declaration index (no allocation for up to 16 inputs: this
  // runs for every request).
  absl::InlinedVector<bool, 16> seen(spec.inputs.size(), false);
  for (const TensorView& input : request->inputs) {
    const TensorSpec* declared = FindTensor(spec.inputs, input.name);
    if (declared == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected input '", QuoteClientText(input.name), "' for model '",
                       spec.name, "'; it takes: ", ExpectedNames(spec.inputs)));
    }
    const size_t index = static_cast<size_t>(declared - spec.inputs.data());
    if (seen[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input.name, "' is given more than once"));
    }
    seen[index] = true;
    if (declared->filled_by_server) {
      return absl::InvalidArgumentError(absl::StrCat("input '", input.name, "' of model '",
                                                     spec.name, "' is filled by the server with ",
                                                     declared->filled_with, "; do not send it"));
    }
    if (input.dtype != declared->dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input.name, "' has datatype ", DataTypeName(input.dtype),
                       ", model '", spec.name, "' expects ", DataTypeName(declared->dtype)));
    }
    SLUICE_RETURN_IF_ERROR(CheckShape(spec, *declared, input));
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(input.shape));
    if (input.dtype == DataType::kBytes) {
      // Every backend that takes BYTES hands the elements to the model as str, so they must be
      // UTF-8; checked here so that a bad request fails alone, before it can join a batch.
      SLUICE_RETURN_IF_ERROR(CheckBytesTensor(absl::StrCat("input '", input.name, "'"),
                                              std::string_view(input.data, input.byte_size),
                                              elements,
                                              /*require_utf8=*/true));
      continue;
    }
    // ElementCount bounds the count, not the bytes: 2^62 FP64 elements would wrap to 0 bytes.
    if (static_cast<uint64_t>(elements) >
        std::numeric_limits<uint64_t>::max() / ElementSize(input.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input.name, "': shape ", ShapeToString(input.shape), " of ",
                       DataTypeName(input.dtype), " has too many bytes"));
    }
    const uint64_t expected_bytes = static_cast<uint64_t>(elements) * ElementSize(input.dtype);
    if (input.byte_size != expected_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", input.name, "' has ", input.byte_size,
                       " bytes of data, but shape ", ShapeToString(input.shape), " of ",
                       DataTypeName(input.dtype), " needs ", expected_bytes));
    }
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const TensorSpec& declared = spec.inputs[i];
    if (!seen[i] && !declared.filled_by_server) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing input '", declared.name, "' for model '", spec.name, "'"));
    }
  }

  request->batch_size = 1;
  if (spec.batches()) {
    const int64_t batch = request->inputs.front().shape.front();
    for (const TensorView& input : request->inputs) {
      if (input.shape.front() != batch) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs disagree on the batch dimension: '", request->inputs.front().name,
                         "' has ", batch, ", '", input.name, "' has ", input.shape.front()));
      }
    }
    if (batch < 1 || batch > spec.max_batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch size ", batch, " is outside [1, ", spec.max_batch_size,
                       "] (max_batch_size of model '", spec.name, "')"));
    }
    request->batch_size = batch;
  }

  absl::InlinedVector<bool, 16> requested(spec.outputs.size(), false);
  for (const std::string& output : request->requested_outputs) {
    const TensorSpec* declared = FindTensor(spec.outputs, output);
    if (declared == nullptr || declared->state_only) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown requested output '", QuoteClientText(output), "' for model '",
                       spec.name, "'; it has: ", ExpectedNames(spec.outputs)));
    }
    const size_t index = static_cast<size_t>(declared - spec.outputs.data());
    if (requested[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", output, "' is requested more than once"));
    }
    requested[index] = true;
  }
  if (request->classifications.empty()) return absl::OkStatus();  // the common request
  absl::InlinedVector<bool, 16> classified(spec.outputs.size(), false);
  for (const ClassificationRequest& classification : request->classifications) {
    const TensorSpec* declared = FindTensor(spec.outputs, classification.output);
    const bool listed =
        std::find(request->requested_outputs.begin(), request->requested_outputs.end(),
                  classification.output) != request->requested_outputs.end();
    if (declared == nullptr || !listed) {
      return absl::InvalidArgumentError(absl::StrCat("classification of output '",
                                                     QuoteClientText(classification.output),
                                                     "', which the request does not ask for"));
    }
    if (classification.count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", classification.output, "': the class count must be at least 1"));
    }
    const size_t index = static_cast<size_t>(declared - spec.outputs.data());
    if (classified[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", classification.output, "' is classified more than once"));
    }
    classified[index] = true;
    if (Status classifiable = CheckClassifiable(declared->dtype); !classifiable.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", classification.output, "': ", classifiable.message()));
    }
  }
  return absl::OkStatus();
}

Status CheckClassifiable(DataType dtype) {
  if (dtype == DataType::kBool || dtype == DataType::kBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("class result not available for output due to unsupported type '",
                     DataTypeName(dtype), "'"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
