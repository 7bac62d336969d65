#include "server/core/tensor.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice {

StatusOr<int64_t> ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has too many elements"));
    }
    count *= dim;
  }
  return count;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

Status LoadHeldRows(TensorView* view, std::string* bytes) {
  if (view->data != nullptr) {
    bytes->assign(view->data, view->byte_size);
  } else {
    bytes->assign(view->byte_size, '\0');
  }
  for (const HeldRows& rows : view->held) {
    const HeldTensor& tensor = *rows.tensor;
    size_t offset = 0;
    if (rows.first_row > 0) {
      const int64_t count = tensor.shape().empty() ? 0 : tensor.shape()[0];
      if (count <= 0) {
        return absl::InternalError(absl::StrCat("held rows of input '", view->name,
                                                "' start past row 0 without a batch dimension"));
      }
      offset =
          static_cast<size_t>(rows.first_row) * (tensor.byte_size() / static_cast<size_t>(count));
    }
    if (offset + tensor.byte_size() > bytes->size()) {
      return absl::InternalError(absl::StrCat("held rows of input '", view->name, "' end past its ",
                                              view->byte_size, " bytes"));
    }
    SLUICE_RETURN_IF_ERROR(tensor.ReadInto(bytes->data() + offset));
    // Host-held bytes were copied within the memory they live in; a device's crossed to the host.
    tensor.Count(/*on_device=*/tensor.host_data() != nullptr, tensor.byte_size());
  }
  view->data = bytes->data();
  view->held.clear();
  return absl::OkStatus();
}

}  // namespace sluice
