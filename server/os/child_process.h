// Runs a program as a child process and collects what it says: for work the server must not do in
// its own address space, such as a first load of an operator library, whose static initializers
// may abort the process that loads it (server/runtime/operator_libraries.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

struct ChildOptions {
  std::chrono::milliseconds timeout{30000};  // then the child is killed (SIGKILL)
  size_t max_output = 64 << 10;              // bytes kept of each of stdout and stderr
};

// How a child ended and what it wrote.
struct ChildOutcome {
  int exit_code = -1;      // its exit status, when it exited
  int signal = 0;          // the signal that ended it (SIGKILL after a timeout), 0 when it exited
  bool timed_out = false;  // it ran past ChildOptions::timeout and was killed
  std::string out;         // the first max_output bytes of its stdout
  std::string err;         // the last max_output bytes of its stderr (where an abort's reason is)
  bool succeeded() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exited with status 3", "was killed by signal 6 (Aborted)", "did not finish within 30 s".
  std::string Describe() const;
};

// Starts argv[0] (a path; no PATH search) with `argv`, the parent's environment, stdin on
// /dev/null and no signals blocked or ignored (the server blocks its shutdown signals and
// ignores SIGPIPE; the child must not inherit that), waits for it to end within the timeout and
// returns how it ended. Safe to call from any thread of a multi-threaded process (posix_spawn; the
// pipes are close-on-exec, so a concurrent spawn elsewhere does not keep them open). INTERNAL
// when the child cannot be started (argv[0] is not executable: the reason is in the message).
absl::StatusOr<ChildOutcome> RunChildProcess(const std::vector<std::string>& argv,
                                             const ChildOptions& options = {});

}  // namespace sluice
