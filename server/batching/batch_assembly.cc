#include "server/batching/batch_assembly.h"

#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

const TensorView* FindInput(const InferRequest& request, const std::string& name) {
  for (const TensorView& input : request.inputs) {
    if (input.name == name) return &input;
  }
  return nullptr;
}

}  // namespace

char* StagingPool::Get(size_t index, size_t bytes) {
  if (buffers_.size() <= index) buffers_.resize(index + 1);
  std::unique_ptr<StagingBuffer>& buffer = buffers_[index];
  if (!buffer || buffer->size() < bytes) {
    // Grow geometrically so that slowly growing batches do not reallocate every time.
    const size_t grown = buffer ? std::max(bytes, buffer->size() * 2) : bytes;
    buffer = backend_->AllocateStaging(std::max<size_t>(grown, 64));
    ++allocations_;
  }
  return buffer->data();
}

InferRequest AssembleBatch(const ModelSpec& spec, const FormedBatch& batch, StagingPool* pool) {
  const InferRequest& first = *batch.requests.front().request;
  InferRequest assembled;
  assembled.model_name = first.model_name;
  assembled.model_version = first.model_version;
  assembled.batch_size = batch.padded_rows;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].sequence_state) continue;  // the runtime fills it from its state store
    // This input of each request, looked up once.
    absl::InlinedVector<const TensorView*, 32> inputs;
    inputs.reserve(batch.requests.size());
    for (const PendingRequest& pending : batch.requests)
      inputs.push_back(FindInput(*pending.request, spec.inputs[i].name));
    const TensorView* model_input = inputs.front();
    size_t total = 0;
    if (model_input->dtype == DataType::kBytes) {
      // Rows of strings have no fixed size; padding rows hold empty strings (each a zero length),
      // as many per row as the group's shape has.
      for (const TensorView* input : inputs) total += input->byte_size;
      int64_t per_row = 1;
      for (size_t d = 1; d < model_input->shape.size(); ++d) per_row *= model_input->shape[d];
      total += static_cast<size_t>(batch.padded_rows - batch.rows) * static_cast<size_t>(per_row) *
               kBytesLengthSize;
    } else {
      // Every request of a batch has the same non-batch shape (one group), so the same row size.
      const size_t row_bytes = model_input->byte_size / static_cast<size_t>(first.batch_size);
      total = row_bytes * static_cast<size_t>(batch.padded_rows);
    }
    TensorView view;
    // Rows held on a device stay there (the runtime gathers them on it); rows held in host memory
    // are copied in like bytes, counted as copied within host memory, or through the host when
    // the buffer goes on to a device. The staging buffer is used only when some rows are on the
    // host.
    int64_t row = 0;
    bool any_host = false;
    for (size_t r = 0; r < inputs.size(); ++r) {
      const TensorView* input = inputs[r];
      if (input->held.empty() || input->held.front().tensor->host_data() != nullptr) {
        any_host = true;
      } else {
        view.held.push_back({row, input->held.front().tensor});
      }
      row += batch.requests[r].request->batch_size;
    }
    char* staging = any_host ? pool->Get(i, total) : nullptr;
    const bool to_device = any_host && pool->ForDevice(i);
    size_t offset = 0;
    for (const TensorView* input : inputs) {
      if (any_host && input->byte_size > 0) {
        const HeldTensor* held = input->held.empty() ? nullptr : input->held.front().tensor.get();
        if (held == nullptr) {
          std::memcpy(staging + offset, input->data, input->byte_size);
        } else if (held->host_data() != nullptr) {
          std::memcpy(staging + offset, held->host_data(), input->byte_size);
          held->Count(/*on_device=*/!to_device, input->byte_size);
        } else {
          std::memset(staging + offset, 0, input->byte_size);  // the runtime's to fill
        }
      }
      offset += input->byte_size;
    }
    if (any_host && total > offset) std::memset(staging + offset, 0, total - offset);
    view.name = model_input->name;
    view.dtype = model_input->dtype;
    view.shape = model_input->shape;
    view.shape[0] = batch.padded_rows;
    view.data = staging;
    view.byte_size = total;
    assembled.inputs.push_back(std::move(view));
  }
  if (!spec.sequence_batching.states.empty()) {
    assembled.state_rows.reserve(static_cast<size_t>(batch.padded_rows));
    for (const PendingRequest& pending : batch.requests) {
      const InferRequest& request = *pending.request;
      if (!request.state_rows.empty()) {
        assembled.state_rows.insert(assembled.state_rows.end(), request.state_rows.begin(),
                                    request.state_rows.end());
      } else {
        assembled.state_rows.resize(
            assembled.state_rows.size() + static_cast<size_t>(request.batch_size), StateRow{});
      }
    }
    assembled.state_rows.resize(static_cast<size_t>(batch.padded_rows), StateRow{});
  }
  return assembled;
}

}  // namespace sluice
