#include "server/batching/shape_padding.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// Copies the box both shapes share (per dimension, the smaller size) from `source` to
// `destination`, row-major. Positions of `destination` outside the box are left as they are.
void CopyCommonBox(const char* source, const Shape& source_shape, char* destination,
                   const Shape& destination_shape, size_t element_size) {
  const size_t rank = source_shape.size();
  if (rank == 0) {
    std::memcpy(destination, source, element_size);
    return;
  }
  Shape box(rank);
  for (size_t d = 0; d < rank; ++d) box[d] = std::min(source_shape[d], destination_shape[d]);
  for (int64_t size : box) {
    if (size == 0) return;
  }
  // Strides in elements; the innermost dimension of the box is copied in one memcpy per row.
  std::vector<int64_t> source_stride(rank, 1), destination_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    source_stride[d - 1] = source_stride[d] * source_shape[d];
    destination_stride[d - 1] = destination_stride[d] * destination_shape[d];
  }
  const size_t row_bytes = static_cast<size_t>(box[rank - 1]) * element_size;
  std::vector<int64_t> index(rank, 0);
  for (;;) {
    int64_t source_offset = 0, destination_offset = 0;
    for (size_t d = 0; d + 1 < rank; ++d) {
      source_offset += index[d] * source_stride[d];
      destination_offset += index[d] * destination_stride[d];
    }
    std::memcpy(destination + destination_offset * static_cast<int64_t>(element_size),
                source + source_offset * static_cast<int64_t>(element_size), row_bytes);
    // Next row: an odometer over every dimension but the innermost.
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++index[d] < box[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

int Offset(const ModelSpec& spec) { return spec.batches() ? 1 : 0; }

}  // namespace

StatusOr<PaddedLengths> PadRequest(const ModelSpec& spec, InferRequest* request) {
  const PaddingSpec& padding = spec.padding;
  PaddedLengths padded;
  padded.lengths.assign(padding.axes.size(), -1);
  padded.buckets.assign(padding.axes.size(), -1);
  std::vector<std::string> length_source(padding.axes.size());
  for (const BucketDim& bucketed : padding.dims) {
    if (!bucketed.is_input) continue;
    for (const TensorView& input : request->inputs) {
      if (input.name != bucketed.tensor) continue;
      const int64_t length = input.shape.at(Offset(spec) + bucketed.dim);
      const std::string here =
          absl::StrCat("input '", input.name, "' dimension ", Offset(spec) + bucketed.dim);
      int64_t& known = padded.lengths[bucketed.axis];
      if (known >= 0 && known != length) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inputs disagree on padded axis '", padding.axes[bucketed.axis].name,
            "': ", length_source[bucketed.axis], " is ", known, ", ", here, " is ", length));
      }
      known = length;
      length_source[bucketed.axis] = here;
    }
  }
  for (size_t axis = 0; axis < padding.axes.size(); ++axis) {
    if (padded.lengths[axis] < 0) continue;
    if (padded.lengths[axis] == 0) {
      // Padding an empty axis would allocate from the other, declared dimensions alone.
      return absl::InvalidArgumentError(absl::StrCat(length_source[axis], " is 0; padded axis '",
                                                     padding.axes[axis].name,
                                                     "' needs at least one position"));
    }
    const std::vector<int64_t>& sizes = padding.axes[axis].sizes;
    auto bucket = std::lower_bound(sizes.begin(), sizes.end(), padded.lengths[axis]);
    if (bucket == sizes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          length_source[axis], " is ", padded.lengths[axis], ", above the largest bucket (",
          sizes.back(), ") of padded axis '", padding.axes[axis].name, "' of model '", spec.name,
          "'; send at most ", sizes.back(), " or add a larger bucket to sluice.buckets"));
    }
    padded.buckets[axis] = *bucket;
  }
  // Padded on the host: an ensemble step's held outputs come here first.
  SLUICE_RETURN_IF_ERROR(request->LoadHeldInputs());
  for (TensorView& input : request->inputs) {
    Shape target = input.shape;
    for (const BucketDim& bucketed : padding.dims) {
      if (bucketed.is_input && bucketed.tensor == input.name) {
        target[Offset(spec) + bucketed.dim] = padded.buckets[bucketed.axis];
      }
    }
    if (target == input.shape) continue;
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(target));
    const size_t element_size = ElementSize(input.dtype);
    const std::string pad = ScalarBytes(input.dtype, padding.pad_value);
    auto buffer = std::make_unique<std::string>();
    buffer->reserve(static_cast<size_t>(elements) * element_size);
    for (int64_t i = 0; i < elements; ++i) buffer->append(pad);
    CopyCommonBox(input.data, input.shape, buffer->data(), target, element_size);
    input.shape = std::move(target);
    input.data = buffer->data();
    input.byte_size = buffer->size();
    request->owned_buffers.push_back(std::move(buffer));
  }
  if (!padding.lengths_input.empty()) {
    const TensorSpec* declared = nullptr;
    for (const TensorSpec& input : spec.inputs) {
      if (input.name == padding.lengths_input) declared = &input;
    }
    const DataType dtype = declared ? declared->dtype : DataType::kInt64;
    const int64_t rows = spec.batches() ? request->batch_size : 1;
    Shape shape;
    if (spec.batches()) shape.push_back(rows);
    shape.push_back(static_cast<int64_t>(padding.axes.size()));
    std::string bytes;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t length : padded.lengths)
        bytes.append(ScalarBytes(dtype, static_cast<double>(length)));
    }
    request->AddOwnedInput(padding.lengths_input, dtype, std::move(shape), std::move(bytes));
  }
  return padded;
}

UnpaddingSink::UnpaddingSink(std::shared_ptr<const ModelSpec> spec, PaddedLengths padded,
                             OutputSink* inner)
    : spec_(std::move(spec)), padded_(std::move(padded)), inner_(inner) {}

StatusOr<char*> UnpaddingSink::Allocate(const OutputDescription& output) {
  bool follows_padding = false;
  for (const BucketDim& bucketed : spec_->padding.dims) {
    if (!bucketed.is_input && bucketed.tensor == output.name &&
        padded_.lengths[bucketed.axis] >= 0) {
      follows_padding = true;
    }
  }
  // Once one output waits here, the later ones do too, so the caller's sink sees them in order.
  if (!follows_padding && kept_.outputs().empty()) return inner_->Allocate(output);
  return kept_.Allocate(output);
}

Status UnpaddingSink::Finish() {
  for (Tensor& output : kept_.outputs()) {
    Shape target = output.shape;
    for (const BucketDim& bucketed : spec_->padding.dims) {
      if (bucketed.is_input || bucketed.tensor != output.name) continue;
      if (padded_.lengths[bucketed.axis] < 0) continue;
      const size_t dim = static_cast<size_t>(Offset(*spec_) + bucketed.dim);
      if (dim >= output.shape.size() || output.shape[dim] != padded_.buckets[bucketed.axis]) {
        return absl::InternalError(absl::StrCat(
            "output '", output.name, "' of model '", spec_->name, "' has shape ",
            ShapeToString(output.shape), ", but sluice.bucket_dims says its dimension ", dim,
            " follows padded axis '", spec_->padding.axes[bucketed.axis].name, "' (padded to ",
            padded_.buckets[bucketed.axis], ")"));
      }
      target[dim] = padded_.lengths[bucketed.axis];
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(target));
    const size_t element_size = ElementSize(output.dtype);
    const size_t bytes = static_cast<size_t>(elements) * element_size;
    SLUICE_ASSIGN_OR_RETURN(char* destination, inner_->Allocate({output.name, output.dtype, target,
                                                                 bytes, MemoryType::kCpu}));
    if (target == output.shape) {
      if (bytes > 0) std::memcpy(destination, output.data.data(), bytes);
    } else {
      CopyCommonBox(output.data.data(), output.shape, destination, target, element_size);
    }
  }
  return absl::OkStatus();
}

PaddingScheduler::PaddingScheduler(ModelSpec spec, std::unique_ptr<Scheduler> inner,
                                   std::shared_ptr<ModelStats> stats)
    : spec_(std::make_shared<const ModelSpec>(std::move(spec))),
      inner_(std::move(inner)),
      stats_(std::move(stats)) {}

void PaddingScheduler::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                               InferCompletion done) {
  StatusOr<PaddedLengths> padded = PadRequest(*spec_, request.get());
  if (!padded.ok()) {
    if (stats_) stats_->RecordRejected(padded.status(), request->protocol);
    done(padded.status());
    return;
  }
  auto unpadding = std::make_shared<UnpaddingSink>(spec_, *std::move(padded), sink);
  OutputSink* inner_sink = unpadding.get();
  inner_->Enqueue(std::move(request), inner_sink,
                  [unpadding, done = std::move(done)](Status status) mutable {
                    if (status.ok()) status = unpadding->Finish();
                    done(std::move(status));
                  });
}

StatusOr<WarmupReport> PaddingScheduler::WarmUp(std::vector<WarmupRequest> requests,
                                                const std::atomic<bool>* abandon) {
  for (WarmupRequest& warmup : requests) {
    StatusOr<PaddedLengths> padded = PadRequest(*spec_, warmup.request.get());
    if (!padded.ok()) {
      return Status(padded.status().code(),
                    absl::StrCat("warm-up ", warmup.label, ": ", padded.status().message()));
    }
  }
  return inner_->WarmUp(std::move(requests), abandon);
}

}  // namespace sluice
