// BYTES tensors (Triton's TYPE_STRING) in the one serialized form Sluice uses from the wire to the
// runtime and back: every element is a 4-byte little-endian length followed by that many bytes (no
// terminator), elements back to back in row-major order. It is the protocol's raw form, so a
// request's bytes go to the model without re-encoding, and the rows of several requests batch by
// concatenation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/status.h"

namespace sluice {

inline constexpr size_t kBytesLengthSize = 4;

// Appends one element to `out`.
void AppendBytesElement(std::string_view element, std::string* out);

// `elements` empty strings: what padding rows and zero warm-up data hold.
std::string EmptyBytesElements(int64_t elements);

// `elements` zeros of `dtype` in its bytes; for BYTES, empty strings.
std::string ZeroElements(DataType dtype, int64_t elements);

// OK when `data` holds exactly `elements` elements, each (when `require_utf8`) valid UTF-8.
// INVALID_ARGUMENT otherwise, `what` ("input 'TEXT'") leading the message, which says which
// element is wrong and how: a length running past the end of the data, fewer or more elements
// than the shape needs, bytes after the last element, invalid UTF-8. Reads at most `data`; a
// hostile `elements` costs nothing (each element takes at least kBytesLengthSize bytes).
Status CheckBytesTensor(std::string_view what, std::string_view data, int64_t elements,
                        bool require_utf8);

// The elements of `data`, which CheckBytesTensor accepted, as views into it.
std::vector<std::string_view> SplitBytesTensor(std::string_view data);

// Where each of `rows` rows of `elements_per_row` elements starts in `data` (checked, with
// rows * elements_per_row elements), and then data.size(): rows + 1 offsets.
std::vector<size_t> BytesRowOffsets(std::string_view data, int64_t rows, int64_t elements_per_row);

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past U+10FFFF. On failure,
// `*bad_offset` (when not null) is the offset of the first byte of the bad sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace sluice
