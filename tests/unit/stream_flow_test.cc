// A ModelStreamInfer stream's bookkeeping without gRPC or threads: every transition of
// stream_flow.h's table, driven event by event.
#include "server/grpc/stream_flow.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice {
namespace {

struct FakeCall {
  int id = 0;
};

class StreamFlowTest : public ::testing::Test {
 protected:
  using Flow = StreamFlow<FakeCall>;

  // Plans, naming each call by the order it was made in.
  Flow::Plan Next(bool leaving) {
    return flow_.Next(leaving, [this] { return std::make_unique<FakeCall>(FakeCall{++made_}); });
  }
  // One request read into the pending read's call, and the reaction's plan.
  FakeCall* Read(Flow::Plan* plan) {
    FakeCall* call = flow_.ReadDone(true);
    flow_.Submitted();
    *plan = Next(true);
    return call;
  }

  Flow flow_{2};  // two in flight at most
  int made_ = 0;
};

TEST_F(StreamFlowTest, ReadsUpToTheBoundThenWaitsForAWrite) {
  Flow::Plan plan = Next(false);
  ASSERT_NE(plan.read, nullptr);
  EXPECT_EQ(plan.read->id, 1);
  FakeCall* first = Read(&plan);
  EXPECT_EQ(first->id, 1);
  ASSERT_NE(plan.read, nullptr);  // one in flight: read on
  FakeCall* second = Read(&plan);
  EXPECT_EQ(plan.read, nullptr);  // two in flight: the bound
  EXPECT_EQ(flow_.in_flight(), 2);
  flow_.Answered(second);  // answers are written in answer order
  plan = Next(true);
  EXPECT_EQ(plan.write, second);
  EXPECT_EQ(plan.read, nullptr);  // written is what frees a place, not answered
  flow_.Answered(first);
  plan = Next(true);
  EXPECT_EQ(plan.write, nullptr);  // one write at a time
  EXPECT_TRUE(flow_.WriteDone(true));
  plan = Next(true);
  EXPECT_EQ(plan.write, first);
  ASSERT_NE(plan.read, nullptr);
  EXPECT_EQ(plan.read->id, 3);
  EXPECT_FALSE(plan.finish);
  EXPECT_EQ(flow_.phase(), Flow::Phase::kOpen);
}

TEST_F(StreamFlowTest, AHalfCloseFinishesOnceEveryAnswerIsWritten) {
  Flow::Plan plan = Next(false);
  FakeCall* call = Read(&plan);
  EXPECT_EQ(flow_.ReadDone(false), nullptr);  // the client half-closed
  EXPECT_EQ(flow_.phase(), Flow::Phase::kClientDone);
  plan = Next(true);
  EXPECT_EQ(plan.read, nullptr);
  EXPECT_FALSE(plan.finish);  // one still in flight
  flow_.Answered(call);
  plan = Next(true);
  EXPECT_EQ(plan.write, call);
  EXPECT_FALSE(plan.finish);  // its write is pending
  flow_.WriteDone(true);
  plan = Next(true);
  EXPECT_TRUE(plan.finish);
  EXPECT_EQ(flow_.phase(), Flow::Phase::kFinished);
  EXPECT_FALSE(Next(false).finish);  // planned once
}

TEST(StreamFlowBrokenTest, ABrokenWriteDropsWhatIsQueuedAndWhatIsAnsweredLaterAndTheNextRead) {
  StreamFlow<FakeCall> flow(3);
  int made = 0;
  auto next = [&](bool leaving) {
    return flow.Next(leaving, [&] { return std::make_unique<FakeCall>(FakeCall{++made}); });
  };
  next(false);
  FakeCall* first = flow.ReadDone(true);
  flow.Submitted();
  next(true);
  FakeCall* second = flow.ReadDone(true);
  flow.Submitted();
  auto plan = next(true);
  ASSERT_NE(plan.read, nullptr);  // a third read is pending when the stream breaks
  flow.Answered(first);
  plan = next(true);
  ASSERT_EQ(plan.write, first);
  EXPECT_FALSE(flow.WriteDone(false));  // the transport is gone
  EXPECT_EQ(flow.phase(), StreamFlow<FakeCall>::Phase::kBroken);
  flow.Answered(second);  // an answer after the break goes nowhere
  plan = next(true);
  EXPECT_EQ(plan.write, nullptr);
  EXPECT_EQ(plan.read, nullptr);
  EXPECT_FALSE(plan.finish);  // the read is pending
  EXPECT_EQ(next(true).finish, false);
  EXPECT_EQ(flow.ReadDone(true), nullptr);  // a request that arrives now is dropped
  plan = next(true);
  EXPECT_TRUE(plan.finish);
  EXPECT_EQ(flow.in_flight(), 0);
}

// The race this guards against: a request is read, and before the reactor has submitted it an
// answer's reaction plans the next read, whose request then reaches its model first (a sequence's
// step before the step it follows).
TEST(StreamFlowOrderTest, TheNextReadWaitsUntilTheRequestReadIsSubmitted) {
  StreamFlow<FakeCall> flow(4);
  int made = 0;
  auto next = [&](bool leaving) {
    return flow.Next(leaving, [&] { return std::make_unique<FakeCall>(FakeCall{++made}); });
  };
  ASSERT_NE(next(false).read, nullptr);
  FakeCall* first = flow.ReadDone(true);
  flow.Submitted();
  ASSERT_NE(next(true).read, nullptr);
  FakeCall* second = flow.ReadDone(true);  // read; its reactor has not submitted it yet
  flow.Answered(first);                    // meanwhile the first is answered on a worker
  auto plan = next(true);
  EXPECT_EQ(plan.write, first);
  EXPECT_EQ(plan.read, nullptr);  // not before `second` is submitted
  EXPECT_FALSE(plan.finish);
  flow.Submitted();
  plan = next(true);
  ASSERT_NE(plan.read, nullptr);
  EXPECT_EQ(plan.read->id, 3);
  EXPECT_EQ(flow.in_flight(), 2);
  (void)second;
}

TEST(StreamFlowOrderTest, ARequestAnsweredWhileItIsSubmittedIsWrittenBeforeTheNextRead) {
  StreamFlow<FakeCall> flow(4);
  auto next = [&](bool leaving) {
    return flow.Next(leaving, [] { return std::make_unique<FakeCall>(); });
  };
  next(false);
  FakeCall* call = flow.ReadDone(true);
  flow.Answered(call);  // answered inside its submission (e.g. refused at once)
  auto plan = next(true);
  EXPECT_EQ(plan.write, call);
  EXPECT_EQ(plan.read, nullptr);
  flow.WriteDone(true);
  EXPECT_EQ(next(true).read, nullptr);
  EXPECT_EQ(flow.in_flight(), 0);
  flow.Submitted();
  plan = next(true);  // the reader's reaction ends: read the next request
  ASSERT_NE(plan.read, nullptr);
  EXPECT_EQ(flow.ReadDone(false), nullptr);  // the client half-closed
  EXPECT_TRUE(next(true).finish);
}

TEST(StreamFlowOrderTest, AStreamThatBreaksWhileARequestIsSubmittedFinishesOnceItIsHandedOn) {
  StreamFlow<FakeCall> flow(4);
  auto next = [&](bool leaving) {
    return flow.Next(leaving, [] { return std::make_unique<FakeCall>(); });
  };
  next(false);
  FakeCall* first = flow.ReadDone(true);
  flow.Submitted();
  next(true);
  FakeCall* second = flow.ReadDone(true);  // being handed on (e.g. it waits for its model to load)
  next(true);  // the reader's reaction ends; the submission goes on elsewhere
  flow.Answered(first);
  auto plan = next(true);
  ASSERT_EQ(plan.write, first);
  EXPECT_FALSE(flow.WriteDone(false));  // the transport is gone
  next(true);
  flow.Answered(second);  // e.g. the load failed: answered (and dropped), then Submitted comes
  plan = next(true);
  EXPECT_EQ(flow.in_flight(), 0);
  EXPECT_FALSE(plan.finish);  // Submitted is still to touch the reactor: it must not finish yet
  flow.Enter();               // the submission's own reaction (StreamReactor::Submitted)
  flow.Submitted();
  plan = next(true);
  EXPECT_EQ(plan.read, nullptr);  // broken: no more reads
  EXPECT_TRUE(plan.finish);
}

TEST_F(StreamFlowTest, AnActiveReactionHoldsTheFinish) {
  Next(false);
  flow_.ReadDone(false);
  flow_.Enter();                    // e.g. a cancellation poking the stream's models
  EXPECT_FALSE(Next(true).finish);  // the half-close's reaction ends; the cancellation's has not
  EXPECT_TRUE(Next(true).finish);
}

TEST_F(StreamFlowTest, ARefusedStreamPlansNothing) {
  flow_.Refuse();
  const Flow::Plan plan = Next(false);
  EXPECT_EQ(plan.read, nullptr);
  EXPECT_EQ(plan.write, nullptr);
  EXPECT_FALSE(plan.finish);
}

}  // namespace
}  // namespace sluice
