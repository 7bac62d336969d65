#include "server/core/tensor.h"

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

}  // namespace sluice
