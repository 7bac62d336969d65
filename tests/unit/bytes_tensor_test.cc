// BYTES tensors (server/core/bytes_tensor.h): the serialized form, the checks of malformed
// buffers, and strict UTF-8.
#include "server/core/bytes_tensor.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"

#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using testing::Serialize;

TEST(BytesTensorTest, SerializedFormIsLengthThenBytes) {
  const std::string data = Serialize({"ab", "", "\xc3\xa9"});
  EXPECT_EQ(data, std::string("\x02\0\0\0ab\0\0\0\0\x02\0\0\0\xc3\xa9", 16));
  EXPECT_TRUE(CheckBytesTensor("x", data, 3, true).ok());
  EXPECT_THAT(SplitBytesTensor(data), ::testing::ElementsAre("ab", "", "\xc3\xa9"));
  EXPECT_EQ(EmptyBytesElements(2), std::string(8, '\0'));
  EXPECT_TRUE(CheckBytesTensor("x", "", 0, true).ok());
  // Rows of two elements each: where each row starts.
  const std::string rows = Serialize({"a", "bb", "", "cccc", "d", ""});
  EXPECT_THAT(BytesRowOffsets(rows, 3, 2), ::testing::ElementsAre(0u, 11u, 23u, rows.size()));
}

TEST(BytesTensorTest, EveryMalformedBufferIsRefusedWithItsReason) {
  const std::string two = Serialize({"ab", "cd"});
  struct Case {
    std::string data;
    int64_t elements;
    std::string message;
  };
  const std::vector<Case> cases = {
      {two, 3, "x has 2 BYTES elements but its shape needs 3"},
      {two, 1, "x has 6 bytes after its 1 BYTES element"},
      {two.substr(0, 11), 2, "BYTES element 1 has length 2, but only 1 bytes are left"},
      {two + std::string("\x01\0", 2), 3, "BYTES element 2 has a truncated length (2 of 4 bytes)"},
      {std::string("\xff\xff\xff\xff", 4), 1, "has length 4294967295, but only 0 bytes are left"},
      {Serialize({"ok", "\xc3"}), 2, "BYTES element 1 is not valid UTF-8 (at its byte 0)"},
      {"", 5, "x has 0 BYTES elements but its shape needs 5"},
      // A hostile element count costs nothing: the data runs out first.
      {two, std::numeric_limits<int64_t>::max(), "x has 2 BYTES elements but its shape needs"},
  };
  for (const Case& c : cases) {
    const Status status = CheckBytesTensor("x", c.data, c.elements, /*require_utf8=*/true);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(CheckBytesTensor("x", Serialize({"\xc3"}), 1, /*require_utf8=*/false).ok());
}

TEST(BytesTensorTest, Utf8IsStrict) {
  for (const char* valid : {"", "plain", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                            "\xf4\x8f\xbf\xbf", "\xef\xbf\xbd", "\x7f"}) {
    EXPECT_TRUE(IsValidUtf8(valid)) << valid;
  }
  struct Bad {
    std::string text;
    size_t offset;
  };
  for (const Bad& bad : std::vector<Bad>{{"a\x80", 1},             // continuation byte alone
                                         {"\xc0\xaf", 0},          // overlong '/'
                                         {"\xc1\xbf", 0},          // overlong
                                         {"\xe0\x80\xaf", 0},      // overlong 3-byte
                                         {"\xed\xa0\x80", 0},      // UTF-16 surrogate
                                         {"\xf0\x80\x80\xaf", 0},  // overlong 4-byte
                                         {"\xf4\x90\x80\x80", 0},  // past U+10FFFF
                                         {"\xf5\x80\x80\x80", 0},  // no such lead byte
                                         {"ab\xe4\xb8", 2},        // truncated at the end
                                         {"\xe4\x41\x41", 0}}) {   // a continuation missing
    size_t offset = 99;
    EXPECT_FALSE(IsValidUtf8(bad.text, &offset)) << absl::CHexEscape(bad.text);
    EXPECT_EQ(offset, bad.offset) << absl::CHexEscape(bad.text);
  }
}

}  // namespace
}  // namespace sluice
