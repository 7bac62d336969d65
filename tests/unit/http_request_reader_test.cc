// HttpRequestReader: every framing rule on bytes alone, fed whole and one byte at a time.
#include "server/http/http_request_reader.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

struct Outcome {
  HttpRequestReader::Event event = HttpRequestReader::Event::kNeedMore;
  int code = 0;
  std::string error;
  std::string method;
  std::string target;
  std::string body;
  bool keep_alive = false;
  bool expect_continue = false;
  size_t left = 0;  // bytes after the request, unread
};

// Feeds `bytes` in pieces of `step` bytes until the request completes or fails.
Outcome Read(const std::string& bytes, size_t step = 0, HttpReaderLimits limits = {}) {
  HttpRequestReader reader(limits);
  Outcome outcome;
  size_t at = 0;
  if (step == 0) step = bytes.size() + 1;
  while (true) {
    const size_t end = std::min(bytes.size(), at + step);
    absl::string_view piece(bytes.data() + at, end - at);
    HttpRequestReader::Step result = reader.Feed(piece);
    at += result.consumed;
    if (result.event == HttpRequestReader::Event::kHead) {
      outcome.expect_continue = reader.head().expect_continue;
      continue;
    }
    if (result.event == HttpRequestReader::Event::kNeedMore) {
      if (at >= bytes.size()) {
        outcome.event = result.event;
        return outcome;
      }
      continue;
    }
    outcome.event = result.event;
    outcome.code = reader.error_code();
    outcome.error = reader.error();
    if (result.event == HttpRequestReader::Event::kComplete) {
      outcome.method = reader.head().method;
      outcome.target = reader.head().target;
      outcome.keep_alive = reader.head().keep_alive;
      outcome.body = reader.body();
    }
    outcome.left = bytes.size() - at;
    return outcome;
  }
}

class EveryStep : public ::testing::TestWithParam<size_t> {};

TEST_P(EveryStep, AGetAndAContentLengthPost) {
  Outcome get = Read("GET /v2/health/ready?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", GetParam());
  ASSERT_EQ(get.event, HttpRequestReader::Event::kComplete) << get.error;
  EXPECT_EQ(get.method, "GET");
  EXPECT_EQ(get.target, "/v2/health/ready?x=1");
  EXPECT_TRUE(get.keep_alive);
  Outcome post =
      Read("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET", GetParam());
  ASSERT_EQ(post.event, HttpRequestReader::Event::kComplete) << post.error;
  EXPECT_EQ(post.body, "hello");
  EXPECT_EQ(post.left, 3u);  // the next request's bytes stay unread
}

TEST_P(EveryStep, ChunkedBodiesWithExtensionsAndTrailers) {
  Outcome chunked = Read(
      "POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nChecksum: abc\r\n\r\n",
      GetParam());
  ASSERT_EQ(chunked.event, HttpRequestReader::Event::kComplete) << chunked.error;
  EXPECT_EQ(chunked.body, "hello world");
  EXPECT_EQ(chunked.left, 0u);
}

TEST_P(EveryStep, BareLineFeedsAndLeadingEmptyLinesAreAccepted) {
  Outcome outcome = Read("\r\n\nGET / HTTP/1.1\nHost: a\n\n", GetParam());
  ASSERT_EQ(outcome.event, HttpRequestReader::Event::kComplete) << outcome.error;
  EXPECT_EQ(outcome.target, "/");
}

INSTANTIATE_TEST_SUITE_P(HttpRequestReaderTest, EveryStep, ::testing::Values(0, 1, 2, 7));

struct Refusal {
  const char* name;
  std::string bytes;
  int code;
};

class Refused : public ::testing::TestWithParam<Refusal> {};

TEST_P(Refused, WithItsStatus) {
  for (size_t step : {size_t{0}, size_t{1}}) {
    Outcome outcome = Read(GetParam().bytes, step, HttpReaderLimits{1024, 8, 100});
    EXPECT_EQ(outcome.event, HttpRequestReader::Event::kError)
        << GetParam().name << " step " << step;
    EXPECT_EQ(outcome.code, GetParam().code) << GetParam().name << ": " << outcome.error;
    EXPECT_FALSE(outcome.error.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(
    HttpRequestReaderTest, Refused,
    ::testing::Values(
        // Request smuggling: a body framed two ways is refused, never resolved.
        Refusal{"ContentLengthTwice",
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 2\r\n\r\nhello",
                400},
        Refusal{"ContentLengthTwiceEqual",
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                400},
        Refusal{"ContentLengthList", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
                400},
        Refusal{"ContentLengthSigned", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
                400},
        Refusal{
            "ContentLengthAndChunked",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            400},
        Refusal{"ChunkedTwice",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
                "chunked\r\n\r\n",
                400},
        Refusal{"ChunkedOnHttp10", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        Refusal{"OtherTransferEncoding",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
        Refusal{"SpaceBeforeColon", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n", 400},
        Refusal{"ObsFold", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", 400},
        Refusal{"NoHostOnHttp11", "GET / HTTP/1.1\r\n\r\n", 400},
        Refusal{"HostTwice", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
        Refusal{"BareCr", "GET / HTTP/1.1\rHost: a\r\n\r\n", 400},
        Refusal{"ControlInValue", std::string("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n"),
                400},
        Refusal{"NulInValue", std::string("GET / HTTP/1.1\r\nHost: a\r\nX: a") + '\0' + "z\r\n\r\n",
                400},
        Refusal{"MalformedRequestLine", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        Refusal{"NoVersion", "GET /\r\nHost: a\r\n\r\n", 400},
        Refusal{"Http2", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
        // Chunk framing: a malformed size is a bad request, not a body too large.
        Refusal{"ChunkSizeNotHex",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
        Refusal{"ChunkSizeNegative",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", 400},
        Refusal{"ChunkSizeHuge",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: "
                "chunked\r\n\r\nffffffffffffffffff\r\n",
                400},
        Refusal{
            "ChunkDataNotFollowedByCrlf",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
            400},
        // Inside a chunked body only CRLF ends a line: a lenient and a strict reader would
        // disagree on where the next chunk starts.
        Refusal{
            "BareLfAfterChunkData",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\n0\r\n\r\n",
            400},
        Refusal{
            "BareLfEndsAChunkSize",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\nab\r\n0\r\n\r\n",
            400},
        Refusal{"BareLfEndsATrailer",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: v\n\r\n",
                400},
        Refusal{
            "ChunkSizeWithTrailingSpace",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nab\r\n0\r\n\r\n",
            400},
        // Only spaces and tabs surround a value: \v and \f are control bytes, not whitespace.
        Refusal{"VerticalTabBeforeChunked",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\x0b"
                "chunked\r\n\r\n0\r\n\r\n",
                400},
        Refusal{"FormFeedAfterContentLength",
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\x0c\r\n\r\nx", 400},
        Refusal{"ChunkOverTheLimit",
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n50\r\n" +
                    std::string(80, 'x') + "\r\n50\r\n",
                413},
        Refusal{"ContentLengthOverTheLimit",
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413},
        Refusal{"HeadOverTheLimit",
                "GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(2000, 'a') + "\r\n\r\n", 431},
        Refusal{"TooManyFields",
                "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: "
                "1\r\nH: 1\r\n\r\n",
                431},
        Refusal{"UnknownExpectation",
                "POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\n", 417}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return std::string(info.param.name); });

TEST(HttpRequestReaderTest, ChunkExtensionsMayFollowSpacesAndTabs) {
  Outcome outcome = Read(
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2 "
      "\t;x=1\r\nab\r\n0;y\r\n\r\n");
  ASSERT_EQ(outcome.event, HttpRequestReader::Event::kComplete) << outcome.error;
  EXPECT_EQ(outcome.body, "ab");
}

TEST(HttpRequestReaderTest, KeepAliveFollowsTheVersionAndConnection) {
  EXPECT_FALSE(Read("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").keep_alive);
  EXPECT_FALSE(Read("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(Read("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  EXPECT_TRUE(
      Read("GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade, keep-alive\r\n\r\n").keep_alive);
}

TEST(HttpRequestReaderTest, ExpectContinueOnlyWithABody) {
  EXPECT_TRUE(
      Read("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\nx")
          .expect_continue);
  EXPECT_FALSE(Read("GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n").expect_continue);
}

TEST(HttpRequestReaderTest, AbsoluteFormTargetsKeepTheirPath) {
  EXPECT_EQ(Read("GET http://h:8000/v2/models?x HTTP/1.1\r\nHost: h\r\n\r\n").target,
            "/v2/models?x");
  EXPECT_EQ(Read("GET http://h HTTP/1.1\r\nHost: h\r\n\r\n").target, "/");
}

TEST(HttpRequestReaderTest, ResetReadsTheNextRequestAndAnErrorStays) {
  HttpRequestReader reader;
  const std::string two = "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n";
  absl::string_view rest = two;
  // Head, then complete (a request without a body completes without another byte).
  HttpRequestReader::Step step = reader.Feed(rest);
  ASSERT_EQ(step.event, HttpRequestReader::Event::kHead);
  rest.remove_prefix(step.consumed);
  step = reader.Feed(rest);
  ASSERT_EQ(step.event, HttpRequestReader::Event::kComplete);
  EXPECT_EQ(step.consumed, 0u);
  EXPECT_EQ(reader.head().target, "/a");
  reader.Reset();
  EXPECT_FALSE(reader.started());
  step = reader.Feed(rest);
  ASSERT_EQ(step.event, HttpRequestReader::Event::kHead);
  rest.remove_prefix(step.consumed);
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(reader.Feed(rest).event, HttpRequestReader::Event::kComplete);
  EXPECT_EQ(reader.head().target, "/b");

  HttpRequestReader bad;
  EXPECT_EQ(bad.Feed("GET / HTTP/9.9\r\n\r\n").event, HttpRequestReader::Event::kError);
  EXPECT_EQ(bad.Feed("GET / HTTP/1.1\r\nHost: a\r\n\r\n").event, HttpRequestReader::Event::kError);
}

TEST(HttpRequestReaderTest, StartedAndInBodyTellWhereARequestIs) {
  HttpRequestReader reader;
  EXPECT_EQ(reader.Feed("\r\n").event, HttpRequestReader::Event::kNeedMore);
  EXPECT_FALSE(reader.started());  // empty lines before a request are not one
  EXPECT_EQ(reader.Feed("G").event, HttpRequestReader::Event::kNeedMore);
  EXPECT_TRUE(reader.started());
  EXPECT_FALSE(reader.in_body());
  EXPECT_EQ(reader.Feed("ET / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n").event,
            HttpRequestReader::Event::kHead);
  EXPECT_TRUE(reader.in_body());
  EXPECT_EQ(reader.body_remaining(), 4u);
  EXPECT_EQ(reader.Feed("ab").event, HttpRequestReader::Event::kNeedMore);
  EXPECT_EQ(reader.body_remaining(), 2u);
}

}  // namespace
}  // namespace sluice
