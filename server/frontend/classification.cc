#include "server/frontend/classification.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

template <typename T>
std::string ScoreText(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    return absl::StrFormat("%f", static_cast<double>(value));
  } else {
    return absl::StrCat(
        static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(value));
  }
}

// Whether element a ranks before element b: higher score first, NaN below every number, equal
// scores by index. A strict weak order even with NaNs (which `>` alone is not).
template <typename T>
bool RanksBefore(const T* values, size_t a, size_t b) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool a_nan = std::isnan(values[a]);
    const bool b_nan = std::isnan(values[b]);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && values[a] != values[b]) return values[a] > values[b];
  } else {
    if (values[a] != values[b]) return values[a] > values[b];
  }
  return a < b;
}

// Appends the top `k` of the `n` values of one row to `out`.
template <typename T>
void AppendRow(const T* values, size_t n, size_t k, const std::vector<std::string>* labels,
               std::vector<size_t>* order, std::string* out) {
  order->resize(n);
  std::iota(order->begin(), order->end(), size_t{0});
  std::partial_sort(order->begin(), order->begin() + static_cast<std::ptrdiff_t>(k), order->end(),
                    [values](size_t a, size_t b) { return RanksBefore(values, a, b); });
  std::string element;
  for (size_t i = 0; i < k; ++i) {
    const size_t index = (*order)[i];
    element = absl::StrCat(ScoreText(values[index]), ":", index);
    if (labels != nullptr && index < labels->size() && !(*labels)[index].empty())
      absl::StrAppend(&element, ":", (*labels)[index]);
    AppendBytesElement(element, out);
  }
}

// Appends the top `k` of each of `rows` rows of `per_row` elements stored as `Stored`, each
// element read as `convert` gives it (FP16 and BF16 as float).
template <typename Stored, typename Convert = Stored (*)(Stored)>
void AppendRows(
    absl::string_view data, size_t rows, size_t per_row, size_t k,
    const std::vector<std::string>* labels, std::string* out,
    Convert convert = [](Stored value) { return value; }) {
  using Value = decltype(convert(Stored{}));
  std::vector<Value> row(per_row);
  std::vector<size_t> order;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < per_row; ++i) {
      Stored stored{};
      std::memcpy(&stored, data.data() + (r * per_row + i) * sizeof(Stored), sizeof(Stored));
      row[i] = convert(stored);
    }
    AppendRow(row.data(), per_row, k, labels, &order, out);
  }
}

}  // namespace

StatusOr<ClassifiedOutput> TopClasses(DataType dtype, const Shape& shape, absl::string_view data,
                                      bool batched, int64_t count,
                                      const std::vector<std::string>* labels) {
  SLUICE_RETURN_IF_ERROR(CheckClassifiable(dtype));
  if (count < 1) return absl::InvalidArgumentError("the class count must be at least 1");
  if (batched && shape.empty()) {
    return absl::InvalidArgumentError("a batched output has no batch dimension to classify by");
  }
  SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(shape));
  if (static_cast<size_t>(elements) * ElementSize(dtype) != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an output of shape ", ShapeToString(shape), " has ", data.size(), " bytes"));
  }
  const int64_t rows = batched ? shape.front() : 1;
  const int64_t per_row = rows == 0 ? 0 : elements / rows;
  const int64_t k = std::min(count, per_row);
  ClassifiedOutput classified;
  classified.shape = batched ? Shape{rows, k} : Shape{k};
  const auto r = static_cast<size_t>(rows);
  const auto n = static_cast<size_t>(per_row);
  const auto top = static_cast<size_t>(k);
  std::string* out = &classified.bytes;
  switch (dtype) {
    case DataType::kUint8:
      AppendRows<uint8_t>(data, r, n, top, labels, out);
      break;
    case DataType::kInt8:
      AppendRows<int8_t>(data, r, n, top, labels, out);
      break;
    case DataType::kInt16:
      AppendRows<int16_t>(data, r, n, top, labels, out);
      break;
    case DataType::kInt32:
      AppendRows<int32_t>(data, r, n, top, labels, out);
      break;
    case DataType::kInt64:
      AppendRows<int64_t>(data, r, n, top, labels, out);
      break;
    case DataType::kFp16:
      AppendRows<uint16_t>(data, r, n, top, labels, out, &HalfToFloat);
      break;
    case DataType::kBf16:
      AppendRows<uint16_t>(data, r, n, top, labels, out, &Bfloat16ToFloat);
      break;
    case DataType::kFp32:
      AppendRows<float>(data, r, n, top, labels, out);
      break;
    case DataType::kFp64:
      AppendRows<double>(data, r, n, top, labels, out);
      break;
    case DataType::kBool:
    case DataType::kBytes:
      break;  // refused above
  }
  return classified;
}

ClassifyingSink::ClassifyingSink(OutputSink* inner, const ModelSpec& spec,
                                 const std::vector<ClassificationRequest>& classifications)
    : inner_(inner), batched_(spec.batches()) {
  wanted_.reserve(classifications.size());
  for (const ClassificationRequest& classification : classifications) {
    Wanted wanted{classification.output, classification.count, nullptr};
    for (const TensorSpec& output : spec.outputs) {
      if (output.name == classification.output) wanted.labels = output.labels;
    }
    wanted_.push_back(std::move(wanted));
  }
}

StatusOr<char*> ClassifyingSink::Allocate(const OutputDescription& output) {
  SLUICE_RETURN_IF_ERROR(HandOn());
  const Wanted* wanted = nullptr;
  for (const Wanted& candidate : wanted_) {
    if (candidate.output == output.name) wanted = &candidate;
  }
  if (wanted == nullptr) return inner_->Allocate(output);
  pending_.wanted = wanted;
  pending_.dtype = output.dtype;
  pending_.shape = output.shape;
  pending_.data.resize(output.byte_size);
  return pending_.data.data();
}

Status ClassifyingSink::Finish() { return HandOn(); }

Status ClassifyingSink::HandOn() {
  if (pending_.wanted == nullptr) return absl::OkStatus();
  const Wanted& wanted = *pending_.wanted;
  pending_.wanted = nullptr;
  StatusOr<ClassifiedOutput> classes = TopClasses(pending_.dtype, pending_.shape, pending_.data,
                                                  batched_, wanted.count, wanted.labels.get());
  if (!classes.ok()) {
    return absl::Status(classes.status().code(),
                        absl::StrCat("output '", wanted.output, "': ", classes.status().message()));
  }
  SLUICE_ASSIGN_OR_RETURN(char* memory,
                          inner_->Allocate({wanted.output, DataType::kBytes, classes->shape,
                                            classes->bytes.size(), MemoryType::kCpu}));
  if (!classes->bytes.empty()) std::memcpy(memory, classes->bytes.data(), classes->bytes.size());
  return absl::OkStatus();
}

}  // namespace sluice
