#include "server/core/model_spec.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice {

const char* CudnnBenchmarkModeName(CudnnBenchmarkMode mode) {
  switch (mode) {
    case CudnnBenchmarkMode::kAuto:
      return "auto";
    case CudnnBenchmarkMode::kOn:
      return "on";
    case CudnnBenchmarkMode::kOff:
      return "off";
  }
  return "auto";
}

const char* SequenceControlKindName(SequenceControlKind kind) {
  switch (kind) {
    case SequenceControlKind::kStart:
      return "CONTROL_SEQUENCE_START";
    case SequenceControlKind::kEnd:
      return "CONTROL_SEQUENCE_END";
    case SequenceControlKind::kReady:
      return "CONTROL_SEQUENCE_READY";
    case SequenceControlKind::kCorrId:
      return "CONTROL_SEQUENCE_CORRID";
  }
  return "CONTROL_SEQUENCE_START";
}

StatusOr<CudnnBenchmarkMode> ParseCudnnBenchmarkMode(std::string_view text) {
  for (CudnnBenchmarkMode mode :
       {CudnnBenchmarkMode::kAuto, CudnnBenchmarkMode::kOn, CudnnBenchmarkMode::kOff}) {
    if (text == CudnnBenchmarkModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be \"auto\", \"on\" or \"off\", found '", std::string(text), "'"));
}

std::optional<int> IndexSuffix(const std::string& name) {
  const size_t pos = name.rfind("__");
  int index = 0;
  if (pos == std::string::npos || !absl::SimpleAtoi(name.substr(pos + 2), &index) || index < 0) {
    return std::nullopt;
  }
  return index;
}

std::optional<std::vector<int>> PositionsBySuffix(const std::vector<TensorSpec>& tensors,
                                                  size_t count) {
  std::vector<int> positions;
  std::vector<bool> taken(count, false);
  for (const TensorSpec& tensor : tensors) {
    std::optional<int> index = IndexSuffix(tensor.name);
    if (!index || static_cast<size_t>(*index) >= count || taken[*index]) return std::nullopt;
    taken[*index] = true;
    positions.push_back(*index);
  }
  return positions;
}

namespace {

// `actual` (batch dimension first when `batched`, then `from`'s rank) with `to`'s dimensions: each
// -1 of `to` takes the size at the next -1 of `from`, in order.
Shape Transfer(const Shape& actual, const Shape& from, const Shape& to, bool batched) {
  const size_t first = batched ? 1 : 0;
  Shape shape;
  shape.reserve(first + to.size());
  if (batched && !actual.empty()) shape.push_back(actual.front());
  size_t next = 0;  // the next position of `from` to look for a -1 at
  for (int64_t dim : to) {
    if (dim != -1) {
      shape.push_back(dim);
      continue;
    }
    while (next < from.size() && from[next] != -1) ++next;
    const size_t at = first + next;
    shape.push_back(next < from.size() && at < actual.size() ? actual[at] : -1);
    ++next;
  }
  return shape;
}

}  // namespace

Shape ModelSpec::ModelFullShape(const TensorSpec& tensor) const {
  if (!tensor.reshape) return FullShape(tensor);
  Shape shape;
  if (batches()) shape.push_back(-1);
  shape.insert(shape.end(), tensor.reshape->begin(), tensor.reshape->end());
  return shape;
}

Shape ModelSpec::ToModelShape(const TensorSpec& tensor, const Shape& client) const {
  if (!tensor.reshape) return client;
  return Transfer(client, tensor.dims, *tensor.reshape, batches());
}

Shape ModelSpec::ToClientShape(const TensorSpec& tensor, const Shape& model) const {
  if (!tensor.reshape) return model;
  return Transfer(model, *tensor.reshape, tensor.dims, batches());
}

const TensorSpec* FindTensor(const std::vector<TensorSpec>& tensors, const std::string& name) {
  for (const TensorSpec& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

TensorSpec* FindTensor(std::vector<TensorSpec>& tensors, const std::string& name) {
  return const_cast<TensorSpec*>(
      FindTensor(static_cast<const std::vector<TensorSpec>&>(tensors), name));
}

size_t DeclaredIndex(const std::vector<TensorSpec>& tensors, const std::string& name) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return 0;
}

}  // namespace sluice
