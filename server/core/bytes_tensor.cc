#include "server/core/bytes_tensor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

uint32_t ReadLength(const char* at) {
  uint32_t length = 0;
  std::memcpy(&length, at,
              sizeof(length));  // little-endian hosts only, as the rest of the wire code
  return length;
}

}  // namespace

void AppendBytesElement(std::string_view element, std::string* out) {
  const uint32_t length = static_cast<uint32_t>(element.size());
  char prefix[kBytesLengthSize];
  std::memcpy(prefix, &length, sizeof(prefix));
  out->append(prefix, sizeof(prefix));
  out->append(element);
}

std::string EmptyBytesElements(int64_t elements) {
  return std::string(static_cast<size_t>(elements) * kBytesLengthSize, '\0');
}

std::string ZeroElements(DataType dtype, int64_t elements) {
  if (dtype == DataType::kBytes) return EmptyBytesElements(elements);
  return std::string(static_cast<size_t>(elements) * ElementSize(dtype), '\0');
}

Status CheckBytesTensor(std::string_view what_view, std::string_view data, int64_t elements,
                        bool require_utf8) {
  const absl::string_view what(what_view.data(),
                               what_view.size());  // absl's own type in this build
  size_t offset = 0;
  int64_t found = 0;
  while (offset < data.size()) {
    if (found == elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has ", data.size() - offset,
                                                     " bytes after its ", elements,
                                                     " BYTES element", elements == 1 ? "" : "s"));
    }
    if (data.size() - offset < kBytesLengthSize) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": BYTES element ", found,
                                                     " has a truncated length (",
                                                     data.size() - offset, " of 4 bytes)"));
    }
    const uint32_t length = ReadLength(data.data() + offset);
    offset += kBytesLengthSize;
    if (length > data.size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": BYTES element ", found,
                                                     " has length ", length, ", but only ",
                                                     data.size() - offset, " bytes are left"));
    }
    size_t bad = 0;
    if (require_utf8 && !IsValidUtf8(data.substr(offset, length), &bad)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": BYTES element ", found,
                                                     " is not valid UTF-8 (at its byte ", bad,
                                                     "); the model takes it as str"));
    }
    offset += length;
    ++found;
  }
  if (found != elements) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", found, " BYTES element",
                                                   found == 1 ? "" : "s", " but its shape needs ",
                                                   elements));
  }
  return absl::OkStatus();
}

std::vector<std::string_view> SplitBytesTensor(std::string_view data) {
  std::vector<std::string_view> elements;
  size_t offset = 0;
  while (offset + kBytesLengthSize <= data.size()) {
    const uint32_t length = ReadLength(data.data() + offset);
    offset += kBytesLengthSize;
    elements.push_back(data.substr(offset, length));
    offset += length;
  }
  return elements;
}

std::vector<size_t> BytesRowOffsets(std::string_view data, int64_t rows, int64_t elements_per_row) {
  std::vector<size_t> offsets;
  offsets.reserve(static_cast<size_t>(rows) + 1);
  size_t offset = 0;
  for (int64_t row = 0; row < rows; ++row) {
    offsets.push_back(offset);
    for (int64_t e = 0; e < elements_per_row && offset + kBytesLengthSize <= data.size(); ++e) {
      offset += kBytesLengthSize + ReadLength(data.data() + offset);
    }
    offset = std::min(offset, data.size());  // never past the end, even for unchecked data
  }
  offsets.push_back(data.size());
  return offsets;
}

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;   // no overlong 3-byte forms
      if (lead == 0xed) high = 0x9f;  // no UTF-16 surrogates
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;   // no overlong 4-byte forms
      if (lead == 0xf4) high = 0x8f;  // nothing past U+10FFFF
    }
    bool valid = length > 0 && size - i >= length && bytes[i + 1] >= low && bytes[i + 1] <= high;
    for (size_t k = 2; valid && k < length; ++k) valid = (bytes[i + k] & 0xc0) == 0x80;
    if (!valid) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += length;
  }
  return true;
}

}  // namespace sluice
