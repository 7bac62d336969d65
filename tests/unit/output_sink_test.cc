// The connections an answer's sinks share, held and released (server/core/output_sink.h).
#include "server/core/output_sink.h"

#include <initializer_list>
#include <memory>
#include <utility>

#include <gtest/gtest.h>

namespace sluice {
namespace {

// Counts holds and releases; refuses to hold when told (a connection that closed meanwhile).
class CountingConnection final : public AnswerConnection {
 public:
  explicit CountingConnection(bool holdable = true) : holdable_(holdable) {}
  bool Hold() override {
    ++holds;
    return holdable_;
  }
  void Release() override { ++releases; }
  int holds = 0, releases = 0;

 private:
  const bool holdable_;
};

class SinkOn final : public OutputSink {
 public:
  explicit SinkOn(std::shared_ptr<AnswerConnection> connection)
      : connection_(std::move(connection)) {}
  StatusOr<char*> Allocate(const OutputDescription&) override {
    return absl::InternalError("not written");
  }
  std::shared_ptr<AnswerConnection> Connection() override { return connection_; }

 private:
  const std::shared_ptr<AnswerConnection> connection_;
};

TEST(AnswerConnectionsTest, HoldsOnlyConnectionsTwoAnswersShareAndReleasesWhatItHeld) {
  auto shared = std::make_shared<CountingConnection>();
  auto single = std::make_shared<CountingConnection>();
  auto closed = std::make_shared<CountingConnection>(/*holdable=*/false);
  SinkOn a(shared), b(shared), c(single), d(closed), e(closed), none(nullptr);
  TensorSink plain;  // a sink with no connection at all (the default)
  EXPECT_EQ(plain.Connection(), nullptr);
  {
    AnswerConnections connections;
    for (OutputSink* sink : std::initializer_list<OutputSink*>{&a, &c, &none, &d, &b, &e, &plain})
      connections.Add(sink);
    EXPECT_EQ(connections.Hold(), 1u);  // `closed` was asked but could not be held
    EXPECT_EQ(shared->holds, 1);
    EXPECT_EQ(single->holds, 0);
    EXPECT_EQ(closed->holds, 1);
    EXPECT_EQ(connections.Hold(), 1u);  // what is held is not held twice
    EXPECT_EQ(shared->holds, 1);
    connections.Release();
    EXPECT_EQ(shared->releases, 1);
    connections.Release();  // released once only
    EXPECT_EQ(shared->releases, 1);
    EXPECT_EQ(connections.Hold(), 1u);
  }  // destruction releases what is still held
  EXPECT_EQ(shared->releases, 2);
  EXPECT_EQ(single->releases, 0);
  EXPECT_EQ(closed->releases, 0);
}

}  // namespace
}  // namespace sluice
