// The connections an answer's sinks share, held and released (server/core/output_sink.h).
#include "server/core/output_sink.h"

#include <initializer_list>
#include <memory>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/fakes.h"

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

// An output with a holder goes held to the sinks that take it (its rows, no bytes copied) and as
// bytes to the others; strings always as bytes; an output kept only held cannot reach a sink that
// needs bytes.
TEST(DeliverOutputsTest, HeldToSinksThatTakeItBytesToTheOthers) {
  const std::string name = "y", strings_name = "s";
  const Tensor y{"y", DataType::kInt32, {3, 1}, std::string("\1\0\0\0\2\0\0\0\3\0\0\0", 12)};
  testing::HostHolder holder(&y, /*batched=*/true);
  std::string strings;
  for (const char* element : {"a", "b", "c"}) AppendBytesElement(element, &strings);
  testing::HostHolder strings_holder(nullptr, true);  // never asked: strings are not held
  std::vector<HostOutput> outputs = {
      {&name, DataType::kInt32, {3, 1}, y.data.data(), 12, MemoryType::kCpu, &holder},
      {&strings_name,
       DataType::kBytes,
       {3, 1},
       strings.data(),
       strings.size(),
       MemoryType::kCpu,
       &strings_holder}};
  testing::HoldingSink step;
  TensorSink caller;
  ASSERT_TRUE(DeliverOutputs(outputs, {{2, nullptr, &step}, {1, nullptr, &caller}}, true).ok());
  ASSERT_EQ(step.held.size(), 1u);
  EXPECT_EQ(step.names[0], "y");
  EXPECT_THAT(step.held[0]->shape(), ::testing::ElementsAre(2, 1));
  std::string first_rows(8, '\0');
  ASSERT_TRUE(step.held[0]->CopyToHost(first_rows.data()).ok());
  EXPECT_EQ(first_rows, y.data.substr(0, 8));
  ASSERT_EQ(step.bytes.outputs().size(), 1u);  // the strings
  EXPECT_EQ(step.bytes.outputs()[0].name, "s");
  ASSERT_EQ(caller.outputs().size(), 2u);
  EXPECT_EQ(caller.outputs()[0].data, y.data.substr(8, 4));

  outputs[0].data = nullptr;  // kept only held
  TensorSink late;
  const Status refused = DeliverOutputs(outputs, {{3, nullptr, &late}}, true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("output 'y' was not brought to the host"));

  // A sink that does not take held tensors refuses one handed to it anyway.
  EXPECT_EQ(late.Hold({name, DataType::kInt32, y.shape, 12, MemoryType::kCpu}, step.held[0]).code(),
            absl::StatusCode::kInternal);
}

// LoadHeldRows: a batch view's bytes and held rows as one host tensor, each held row counted
// (through the host from a device, within host memory from the host); the view then reads it.
TEST(DeliverOutputsTest, LoadHeldRowsBringsHeldRowsToTheHostAndCountsThem) {
  const std::string first = std::string("\1\0\0\0", 4);
  auto on_device = std::make_shared<testing::HostHeldTensor>(
      DataType::kInt32, Shape{1, 1}, std::string("\2\0\0\0", 4), /*device=*/0);
  auto on_host = std::make_shared<testing::HostHeldTensor>(DataType::kInt32, Shape{1, 1},
                                                           std::string("\3\0\0\0", 4));
  auto ledger = std::make_shared<CopyLedger>();
  on_device->set_ledger(ledger);
  on_host->set_ledger(ledger);
  std::string staging = first + std::string(8, '\x7f');
  TensorView view{"x",    DataType::kInt32,
                  {3, 1}, staging.data(),
                  12,     {HeldRows{1, on_device}, HeldRows{2, on_host}}};
  std::string loaded;
  ASSERT_TRUE(LoadHeldRows(&view, &loaded).ok());
  EXPECT_EQ(loaded, first + on_device->bytes() + on_host->bytes());
  EXPECT_EQ(view.data, loaded.data());
  EXPECT_TRUE(view.held.empty());
  EXPECT_EQ(ledger->through_host.load(), 4u);
  EXPECT_EQ(ledger->on_device.load(), 4u);

  TensorView too_short{"x", DataType::kInt32, {1, 1}, nullptr, 2, {HeldRows{0, on_host}}};
  const Status refused = LoadHeldRows(&too_short, &loaded);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("held rows of input 'x' end past its 2 bytes"));
}

}  // namespace
}  // namespace sluice
