#include "server/core/message_text.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

#include "server/core/bytes_tensor.h"
#include "server/core/infer_request.h"

namespace sluice {
namespace {

std::string Repeat(absl::string_view piece, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; ++i) out.append(piece.data(), piece.size());
  return out;
}

TEST(QuoteClientTextTest, LeavesUsualNamesAsTheyAre) {
  for (const std::string name : {"", "resnet50", "my-model_v2.onnx", "naïve café", "中文",
                                 "🙂 ok", "quotes ' and \" and \\ stay", "INPUT__0"}) {
    EXPECT_EQ(QuoteClientText(name), name);
  }
}

TEST(QuoteClientTextTest, ShowsControlsAsEscapes) {
  EXPECT_EQ(QuoteClientText("a\nb"), "a\\x0Ab");
  EXPECT_EQ(QuoteClientText("tab\there\r"), "tab\\x09here\\x0D");
  EXPECT_EQ(QuoteClientText(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(QuoteClientText("\x1b[31mred"), "\\x1B[31mred");
  EXPECT_EQ(QuoteClientText("del\x7f"), "del\\x7F");
  EXPECT_EQ(QuoteClientText("c1\xc2\x85"), "c1\\u0085");  // NEXT LINE
  EXPECT_EQ(QuoteClientText("\xe2\x80\xae"
                            "txt.exe"),
            "\\u202Etxt.exe");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(QuoteClientText("a\xe2\x80\xa8"
                            "b"),
            "a\\u2028b");                                                      // LINE SEPARATOR
  EXPECT_EQ(QuoteClientText("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");  // isolates
  EXPECT_EQ(QuoteClientText("\xc2\xa0"), "\xc2\xa0");  // NO-BREAK SPACE is text
}

TEST(QuoteClientTextTest, ShowsEveryByteOfInvalidUtf8AsAnEscape) {
  EXPECT_EQ(QuoteClientText("\xff"), "\\xFF");
  EXPECT_EQ(QuoteClientText("a\x80"
                            "b"),
            "a\\x80b");  // a lone continuation byte
  EXPECT_EQ(QuoteClientText("\xe4\xb8"
                            "a"),
            "\\xE4\\xB8a");                                                // a sequence cut short
  EXPECT_EQ(QuoteClientText("\xe4\xb8"), "\\xE4\\xB8");                    // cut short by the end
  EXPECT_EQ(QuoteClientText("\xc0\xaf"), "\\xC0\\xAF");                    // overlong '/'
  EXPECT_EQ(QuoteClientText("\xe0\x80\xaf"), "\\xE0\\x80\\xAF");           // overlong, 3 bytes
  EXPECT_EQ(QuoteClientText("\xed\xa0\x80"), "\\xED\\xA0\\x80");           // a UTF-16 surrogate
  EXPECT_EQ(QuoteClientText("\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(QuoteClientText("\xf4\x8f\xbf\xbf"), "\xf4\x8f\xbf\xbf");  // U+10FFFF itself is valid
}

TEST(QuoteClientTextTest, KeepsARenderingOfExactlyTheBoundWhole) {
  const std::string exact(kQuotedClientTextBytes, 'a');
  EXPECT_EQ(QuoteClientText(exact), exact);
  // Escapes count at their rendered size: 32 controls render as 128 bytes.
  const std::string controls(32, '\x01');
  EXPECT_EQ(QuoteClientText(controls), Repeat("\\x01", 32));
}

TEST(QuoteClientTextTest, CutsOneByteOverTheBoundAndNamesTheSize) {
  const std::string result = QuoteClientText(std::string(kQuotedClientTextBytes + 1, 'a'));
  EXPECT_EQ(result, std::string(128 - 14, 'a') + "...(129 bytes)");
  EXPECT_EQ(result.size(), kQuotedClientTextBytes);
}

TEST(QuoteClientTextTest, CutsLongTextShortAndValid) {
  const std::string huge(40000, 'x');
  const std::string result = QuoteClientText(huge);
  EXPECT_LE(result.size(), kQuotedClientTextBytes);
  EXPECT_EQ(result, std::string(128 - 16, 'x') + "...(40000 bytes)");
  EXPECT_EQ(QuoteClientText(std::string(16 << 20, 'y')).size(), kQuotedClientTextBytes);
}

TEST(QuoteClientTextTest, CutsOnACharacterBoundary) {
  // 1 + 2 * 100 = 201 bytes; 114 bytes are left before "...(201 bytes)": 'a' and 56 two-byte
  // characters make 113, a 57th would make 115.
  const std::string result = QuoteClientText("a" + Repeat("é", 100));
  EXPECT_EQ(result, "a" + Repeat("é", 56) + "...(201 bytes)");
  EXPECT_TRUE(IsValidUtf8(result));
  // Four-byte characters: 28 of them (112 bytes) fit before "...(400 bytes)".
  EXPECT_EQ(QuoteClientText(Repeat("🙂", 100)), Repeat("🙂", 28) + "...(400 bytes)");
}

TEST(QuoteClientTextTest, NeverSplitsAnEscape) {
  // 100 controls render as 400 bytes: 28 escapes (112 bytes) fit before "...(100 bytes)".
  EXPECT_EQ(QuoteClientText(std::string(100, '\x01')), Repeat("\\x01", 28) + "...(100 bytes)");
  EXPECT_EQ(QuoteClientText(Repeat("\xff", 100)), Repeat("\\xFF", 28) + "...(100 bytes)");
}

TEST(QuoteClientTextTest, ABoundBelowTheFloorCountsAsTheFloor) {
  const std::string result = QuoteClientText(std::string(1000, 'z'), 0);
  EXPECT_EQ(result, std::string(kMinMessageTextBytes - 15, 'z') + "...(1000 bytes)");
  EXPECT_EQ(result.size(), kMinMessageTextBytes);
}

TEST(QuoteClientTextTest, AnyBytesGiveShortValidUtf8) {
  std::mt19937 random(7);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(random() % 400, '\0');
    for (char& byte : bytes) byte = static_cast<char>(random() % 256);
    const size_t bound = 32 + random() % 200;
    const std::string quoted = QuoteClientText(bytes, bound);
    EXPECT_TRUE(IsValidUtf8(quoted)) << round;
    EXPECT_LE(quoted.size(), bound) << round;
    for (char c : quoted) EXPECT_FALSE(c >= 0 && c < 0x20) << round;
  }
}

TEST(CapMessageTest, KeepsValidMessagesWithTheirLinesAsTheyAre) {
  const std::string message =
      "the model raised:\n  File \"model.py\", line 3\n\tRuntimeError: naïve 🙂";
  EXPECT_EQ(CapMessage(message), message);
  EXPECT_EQ(CapMessage(std::string(kStatusMessageBytes, 'm')),
            std::string(kStatusMessageBytes, 'm'));
}

TEST(CapMessageTest, EscapesInvalidUtf8Only) {
  EXPECT_EQ(CapMessage("unknown model 'a\xff\xfe' \x01"), "unknown model 'a\\xFF\\xFE' \x01");
  EXPECT_EQ(CapMessage("\xe4\xb8"), "\\xE4\\xB8");
}

TEST(CapMessageTest, CutsAtTheBoundOnACharacterBoundary) {
  const std::string over(kStatusMessageBytes + 1, 'm');
  EXPECT_EQ(CapMessage(over), std::string(4096 - 15, 'm') + "...(4097 bytes)");
  // 'm' then three-byte characters: 4081 bytes are left before "...(6001 bytes)"; 'm' and 1360
  // characters make exactly 4081.
  const std::string wide = "m" + Repeat("中", 2000);
  EXPECT_EQ(CapMessage(wide), "m" + Repeat("中", 1360) + "...(6001 bytes)");
  const std::string huge = CapMessage(std::string(2 << 20, '\xff'));
  EXPECT_LE(huge.size(), kStatusMessageBytes);
  EXPECT_TRUE(IsValidUtf8(huge));
}

// Sequence ids sent as strings reach messages and logs through CorrelationId::ToString.
TEST(QuoteClientTextTest, AStringSequenceIdIsQuotedThroughIt) {
  CorrelationId id;
  id.is_text = true;
  id.text = "session\n" + std::string(1000, 's');
  EXPECT_EQ(id.ToString(), "'session\\x0A" + std::string(128 - 11 - 15, 's') + "...(1008 bytes)'");
  id.text = "session-42";
  EXPECT_EQ(id.ToString(), "'session-42'");
  const CorrelationId number{42, "", false};
  EXPECT_EQ(number.ToString(), "42");
}

}  // namespace
}  // namespace sluice
