#include "client/tensor_io.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/bytes_tensor.h"

namespace sluice {
namespace {

StatusOr<DataType> NpyDescrType(absl::string_view descr) {
  if (descr.size() < 2)
    return absl::InvalidArgumentError(absl::StrCat("bad dtype descr '", descr, "'"));
  const char order = descr[0];
  const absl::string_view kind = descr.substr(1);
  if (order == '>') {
    return absl::InvalidArgumentError("big-endian .npy data is not supported; save little-endian");
  }
  if (kind == "b1") return DataType::kBool;
  if (kind == "u1") return DataType::kUint8;
  if (kind == "i1") return DataType::kInt8;
  if (kind == "i2") return DataType::kInt16;
  if (kind == "i4") return DataType::kInt32;
  if (kind == "i8") return DataType::kInt64;
  if (kind == "f2") return DataType::kFp16;
  if (kind == "f4") return DataType::kFp32;
  if (kind == "f8") return DataType::kFp64;
  return absl::InvalidArgumentError(absl::StrCat(".npy dtype '", descr, "' is not supported"));
}

// Value of `key` in the header dict: "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
absl::string_view HeaderValue(absl::string_view header, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "':");
  size_t pos = header.find(quoted);
  if (pos == absl::string_view::npos) return {};
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(pos + quoted.size()));
  if (!rest.empty() && rest[0] == '(') return rest.substr(0, rest.find(')') + 1);
  if (!rest.empty() && rest[0] == '\'') return rest.substr(1, rest.find('\'', 1) - 1);
  return rest.substr(0, rest.find_first_of(",}"));
}

template <typename T>
T Load(const std::string& data, size_t index) {
  T value;
  std::memcpy(&value, data.data() + index * sizeof(T), sizeof(T));
  return value;
}

}  // namespace

StatusOr<Tensor> ParseNpy(absl::string_view bytes, const std::string& name) {
  static constexpr absl::string_view kMagic("\x93NUMPY", 6);
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "': not a .npy file"));
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0;
  size_t offset = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    offset = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    for (int i = 3; i >= 0; --i)
      header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    offset = 12;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", name, "': unsupported .npy version ", major));
  }
  if (bytes.size() < offset + header_len) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "': truncated .npy header"));
  }
  const absl::string_view header = bytes.substr(offset, header_len);
  if (HeaderValue(header, "fortran_order") != "False") {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", name,
                     "': Fortran-ordered .npy data is not supported; save a C-contiguous array"));
  }
  Tensor tensor;
  tensor.name = name;
  SLUICE_ASSIGN_OR_RETURN(tensor.dtype, NpyDescrType(HeaderValue(header, "descr")));
  absl::string_view shape_text = HeaderValue(header, "shape");
  if (shape_text.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "': .npy header has no shape"));
  }
  shape_text = shape_text.substr(1, shape_text.size() - 2);
  for (absl::string_view part : absl::StrSplit(shape_text, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", name, "': bad .npy shape '", shape_text, "'"));
    }
    tensor.shape.push_back(dim);
  }
  SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(tensor.shape));
  const size_t expected = static_cast<size_t>(elements) * ElementSize(tensor.dtype);
  const absl::string_view data = bytes.substr(offset + header_len);
  if (data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "': .npy holds ", data.size(),
                                                   " data bytes, its shape needs ", expected));
  }
  tensor.data.assign(data.data(), data.size());
  return tensor;
}

StatusOr<Tensor> ReadNpyFile(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return ParseNpy(buffer.str(), name);
}

StatusOr<Tensor> RandomTensor(const std::string& name, DataType dtype, const Shape& shape,
                              std::mt19937_64& rng) {
  SLUICE_ASSIGN_OR_RETURN(const int64_t elements, ElementCount(shape));
  if (dtype == DataType::kBytes) {
    // Short lowercase words: any string model can take them.
    Tensor tensor{name, dtype, shape, ""};
    std::uniform_int_distribution<int> length(1, 8), letter('a', 'z');
    for (int64_t i = 0; i < elements; ++i) {
      std::string word(static_cast<size_t>(length(rng)), 'a');
      for (char& c : word) c = static_cast<char>(letter(rng));
      AppendBytesElement(word, &tensor.data);
    }
    return tensor;
  }
  Tensor tensor{name, dtype, shape, std::string(elements * ElementSize(dtype), '\0')};
  std::uniform_real_distribution<float> real(0.0f, 1.0f);
  std::uniform_int_distribution<int> integer(0, 9);
  auto store = [&](auto value, int64_t i) {
    std::memcpy(tensor.data.data() + i * sizeof(value), &value, sizeof(value));
  };
  for (int64_t i = 0; i < elements; ++i) {
    switch (dtype) {
      case DataType::kBool:
        store(static_cast<uint8_t>(integer(rng) % 2), i);
        break;
      case DataType::kUint8:
        store(static_cast<uint8_t>(integer(rng)), i);
        break;
      case DataType::kInt8:
        store(static_cast<int8_t>(integer(rng)), i);
        break;
      case DataType::kInt16:
        store(static_cast<int16_t>(integer(rng)), i);
        break;
      case DataType::kInt32:
        store(static_cast<int32_t>(integer(rng)), i);
        break;
      case DataType::kInt64:
        store(static_cast<int64_t>(integer(rng)), i);
        break;
      case DataType::kFp32:
        store(real(rng), i);
        break;
      case DataType::kFp64:
        store(static_cast<double>(real(rng)), i);
        break;
      case DataType::kFp16: {
        // Values k/1024 in [0, 1): exact in FP16 (exponent bias 15, 10 mantissa bits).
        const float value = static_cast<float>(integer(rng) * 100 % 1024) / 1024.0f;
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof(bits));
        uint16_t half = 0;
        if (value != 0.0f) {
          const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
          half = static_cast<uint16_t>((exponent << 10) | ((bits >> 13) & 0x3ff));
        }
        store(half, i);
        break;
      }
      case DataType::kBf16: {
        const float value = real(rng);
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof(bits));
        store(static_cast<uint16_t>(bits >> 16), i);
        break;
      }
      case DataType::kBytes:
        break;  // above
    }
  }
  return tensor;
}

double ElementAsDouble(const Tensor& tensor, size_t i) {
  switch (tensor.dtype) {
    case DataType::kBool:
    case DataType::kUint8:
      return Load<uint8_t>(tensor.data, i);
    case DataType::kInt8:
      return Load<int8_t>(tensor.data, i);
    case DataType::kInt16:
      return Load<int16_t>(tensor.data, i);
    case DataType::kInt32:
      return Load<int32_t>(tensor.data, i);
    case DataType::kInt64:
      return static_cast<double>(Load<int64_t>(tensor.data, i));
    case DataType::kFp16:
      return HalfToFloat(Load<uint16_t>(tensor.data, i));
    case DataType::kBf16: {
      const uint32_t bits = static_cast<uint32_t>(Load<uint16_t>(tensor.data, i)) << 16;
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;
    }
    case DataType::kFp32:
      return Load<float>(tensor.data, i);
    case DataType::kFp64:
      return Load<double>(tensor.data, i);
    case DataType::kBytes:
      return 0.0;  // no number: see PreviewValues
  }
  return 0.0;
}

std::string PreviewValues(const Tensor& tensor, size_t max_values) {
  if (tensor.dtype == DataType::kBytes) {
    const std::vector<std::string_view> elements = SplitBytesTensor(tensor.data);
    std::string text = "[";
    for (size_t i = 0; i < elements.size() && i < max_values; ++i) {
      absl::StrAppend(&text, i ? ", " : "", "\"",
                      absl::CHexEscape(absl::string_view(elements[i].data(), elements[i].size())),
                      "\"");
    }
    if (elements.size() > max_values)
      absl::StrAppend(&text, ", ... (", elements.size(), " values)");
    return text + "]";
  }
  const size_t count = tensor.data.size() / ElementSize(tensor.dtype);
  std::string text = "[";
  for (size_t i = 0; i < count && i < max_values; ++i) {
    absl::StrAppend(&text, i ? ", " : "", ElementAsDouble(tensor, i));
  }
  if (count > max_values) absl::StrAppend(&text, ", ... (", count, " values)");
  return text + "]";
}

}  // namespace sluice
