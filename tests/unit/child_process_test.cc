#include "server/os/child_process.h"
#include "server/core/status.h"

#include <csignal>
#include <string>

#include <gtest/gtest.h>

namespace sluice {
namespace {

StatusOr<ChildOutcome> Shell(const std::string& script, ChildOptions options = {}) {
  return RunChildProcess({"/bin/sh", "-c", script}, options);
}

TEST(ChildProcessTest, CollectsOutputAndExitStatus) {
  StatusOr<ChildOutcome> outcome = Shell("echo out; echo err >&2; exit 3");
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->exit_code, 3);
  EXPECT_EQ(outcome->signal, 0);
  EXPECT_FALSE(outcome->succeeded());
  EXPECT_EQ(outcome->out, "out\n");
  EXPECT_EQ(outcome->err, "err\n");
  EXPECT_EQ(outcome->Describe(), "exited with status 3");
}

TEST(ChildProcessTest, SucceedsOnExitZero) {
  StatusOr<ChildOutcome> outcome = Shell("true");
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->succeeded());
}

TEST(ChildProcessTest, ReportsTheSignalThatEndedIt) {
  StatusOr<ChildOutcome> outcome = Shell("echo dying >&2; kill -ABRT $$");
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->signal, SIGABRT);
  EXPECT_FALSE(outcome->succeeded());
  EXPECT_NE(outcome->Describe().find("signal 6"), std::string::npos) << outcome->Describe();
  EXPECT_EQ(outcome->err, "dying\n");
}

TEST(ChildProcessTest, KillsAChildThatRunsPastTheTimeout) {
  ChildOptions options;
  options.timeout = std::chrono::milliseconds(200);
  StatusOr<ChildOutcome> outcome = Shell("sleep 30", options);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->timed_out);
  EXPECT_EQ(outcome->signal, SIGKILL);
  EXPECT_FALSE(outcome->succeeded());
}

TEST(ChildProcessTest, KillsAChildThatClosedItsOutputAndHangs) {
  ChildOptions options;
  options.timeout = std::chrono::milliseconds(200);
  StatusOr<ChildOutcome> outcome = Shell("exec >&- 2>&-; sleep 30", options);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->timed_out);
}

TEST(ChildProcessTest, KeepsTheHeadOfStdoutAndTheTailOfStderr) {
  ChildOptions options;
  options.max_output = 4;
  StatusOr<ChildOutcome> outcome = Shell("printf 0123456789; printf abcdefgh >&2", options);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->out, "0123");
  EXPECT_EQ(outcome->err, "efgh");
}

TEST(ChildProcessTest, TheChildInheritsNoBlockedOrIgnoredSignals) {
  sigset_t block, previous;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &previous);
  auto old_pipe = std::signal(SIGPIPE, SIG_IGN);
  // The masks a program started by the child inherits through exec (grep reading its own
  // /proc/self/status: SigBlk and SigIgn in hexadecimal). Not the shell's own status, read by
  // another process: the shell blocks signals for a moment around each fork.
  StatusOr<ChildOutcome> outcome = Shell("exec grep -E '^Sig(Blk|Ign)' /proc/self/status");
  std::signal(SIGPIPE, old_pipe);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_NE(outcome->out.find("SigBlk:\t0000000000000000"), std::string::npos) << outcome->out;
  // SIGPIPE is bit 13 (0x1000): not ignored.
  const size_t ign = outcome->out.find("SigIgn:\t");
  ASSERT_NE(ign, std::string::npos);
  const unsigned long long ignored = std::stoull(outcome->out.substr(ign + 8, 16), nullptr, 16);
  EXPECT_EQ(ignored & (1ull << (SIGPIPE - 1)), 0u) << outcome->out;
}

TEST(ChildProcessTest, AProgramThatDoesNotExistIsAnError) {
  StatusOr<ChildOutcome> outcome = RunChildProcess({"/nonexistent/program"});
  // posix_spawn reports the failed exec either as its own error or as exit status 127.
  if (outcome.ok()) {
    EXPECT_EQ(outcome->exit_code, 127);
  } else {
    EXPECT_NE(outcome.status().message().find("/nonexistent/program"), std::string::npos);
  }
  EXPECT_FALSE(RunChildProcess({}).ok());
}

}  // namespace
}  // namespace sluice
