#include "server/core/output_sink.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/bytes_tensor.h"

namespace sluice {

StatusOr<char*> TensorSink::Allocate(const OutputDescription& output) {
  Tensor& tensor = outputs_.emplace_back();
  tensor.name = output.name;
  tensor.dtype = output.dtype;
  tensor.shape = output.shape;
  // On the heap even when short enough for the string's inline buffer: the memory handed out
  // must survive outputs_ growing (moving a string keeps its heap buffer, not its inline one).
  tensor.data.reserve(std::max<size_t>(output.byte_size, sizeof(std::string)));
  tensor.data.resize(output.byte_size);
  bytes_ += output.byte_size;
  return tensor.data.data();
}

Status OutputSink::Hold(const OutputDescription& output, std::shared_ptr<HeldTensor>) {
  return absl::InternalError(
      absl::StrCat("output '", output.name, "' was handed held to a sink that does not take it"));
}

void AnswerConnections::Add(OutputSink* sink) {
  std::shared_ptr<AnswerConnection> connection = sink->Connection();
  if (connection == nullptr) return;
  for (Entry& entry : entries_) {
    if (entry.connection == connection) {
      ++entry.answers;
      return;
    }
  }
  entries_.push_back(Entry{std::move(connection), 1, false});
}

size_t AnswerConnections::Hold() {
  size_t held = 0;
  for (Entry& entry : entries_) {
    if (entry.answers >= 2 && !entry.held) entry.held = entry.connection->Hold();
    if (entry.held) ++held;
  }
  return held;
}

void AnswerConnections::Release() {
  for (Entry& entry : entries_) {
    if (!entry.held) continue;
    entry.connection->Release();
    entry.held = false;
  }
}

Status DeliverOutputs(absl::Span<const HostOutput> outputs, absl::Span<const OutputTarget> targets,
                      bool batched) {
  int64_t total_rows = 0;
  for (const OutputTarget& target : targets) total_rows += target.rows;
  if (batched) {
    for (const HostOutput& output : outputs) {
      if (output.shape.empty() || output.shape[0] < total_rows) {
        return absl::InternalError(absl::StrCat(
            "output '", *output.name, "' has shape ", ShapeToString(output.shape),
            ", which does not start with the batch dimension (", total_rows, " rows)"));
      }
    }
  }
  // BYTES rows have no fixed size: where each row starts, found once per output (nothing is
  // allocated for models without strings: this runs for every batch).
  std::vector<std::vector<size_t>> bytes_rows;
  if (batched) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const HostOutput& output = outputs[i];
      if (output.dtype != DataType::kBytes) continue;
      bytes_rows.resize(outputs.size());
      const Shape row_shape(output.shape.begin() + 1, output.shape.end());
      SLUICE_ASSIGN_OR_RETURN(const int64_t per_row, ElementCount(row_shape));
      bytes_rows[i] = BytesRowOffsets(std::string_view(output.data, output.byte_size),
                                      output.shape[0], per_row);
    }
  }
  auto deliver = [&](const HostOutput& output, int64_t first_row,
                     const OutputTarget& target) -> Status {
    Shape shape = output.shape;
    size_t offset = 0;
    size_t bytes = output.byte_size;
    if (batched && output.dtype == DataType::kBytes) {
      const std::vector<size_t>& rows = bytes_rows[static_cast<size_t>(&output - outputs.data())];
      offset = rows[static_cast<size_t>(first_row)];
      bytes = rows[static_cast<size_t>(first_row + target.rows)] - offset;
      shape[0] = target.rows;
    } else if (batched) {
      const size_t row_bytes = shape[0] == 0 ? 0 : output.byte_size / static_cast<size_t>(shape[0]);
      offset = static_cast<size_t>(first_row) * row_bytes;
      bytes = static_cast<size_t>(target.rows) * row_bytes;
      shape[0] = target.rows;
    }
    const OutputDescription description{*output.name, output.dtype, shape, bytes, output.memory};
    if (output.holder != nullptr && output.dtype != DataType::kBytes &&
        target.sink->TakesHeld(*output.name)) {
      SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<HeldTensor> held,
                              output.holder->Rows(first_row, shape));
      return target.sink->Hold(description, std::move(held));
    }
    if (output.data == nullptr && bytes > 0) {
      return absl::InternalError(
          absl::StrCat("output '", *output.name, "' was not brought to the host"));
    }
    SLUICE_ASSIGN_OR_RETURN(char* destination, target.sink->Allocate(description));
    if (bytes > 0) std::memcpy(destination, output.data + offset, bytes);
    return absl::OkStatus();
  };
  int64_t row = 0;
  for (const OutputTarget& target : targets) {
    if (target.requested == nullptr || target.requested->empty()) {
      for (const HostOutput& output : outputs) SLUICE_RETURN_IF_ERROR(deliver(output, row, target));
    } else {
      for (const std::string& name : *target.requested) {
        const HostOutput* found = nullptr;
        for (const HostOutput& output : outputs) {
          if (*output.name == name) found = &output;
        }
        if (found == nullptr) {
          return absl::InternalError(absl::StrCat("the model has no output '", name, "'"));
        }
        SLUICE_RETURN_IF_ERROR(deliver(*found, row, target));
      }
    }
    row += target.rows;
  }
  return absl::OkStatus();
}

}  // namespace sluice
