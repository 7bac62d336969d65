#include "server/os/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace sluice {
namespace {

// Closes a descriptor once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  void Reset(int fd) {
    Close();
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Keeps the first (head) or last (tail) `limit` bytes of what is appended.
void Keep(std::string* into, const char* data, size_t size, size_t limit, bool tail) {
  into->append(data, size);
  if (into->size() <= limit) return;
  if (tail) {
    into->erase(0, into->size() - limit);
  } else {
    into->resize(limit);
  }
}

}  // namespace

std::string ChildOutcome::Describe() const {
  if (timed_out) return "did not finish in time and was killed";
  if (signal != 0)
    return absl::StrCat("was killed by signal ", signal, " (", strsignal(signal), ")");
  return absl::StrCat("exited with status ", exit_code);
}

absl::StatusOr<ChildOutcome> RunChildProcess(const std::vector<std::string>& argv,
                                             const ChildOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  Fd out_read(out_pipe[0]), out_write(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  Fd err_read(err_pipe[0]), err_write(err_pipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // dup2 clears close-on-exec on the copy.
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", strerror(spawned)));
  }
  out_write.Close();
  err_write.Close();

  ChildOutcome outcome;
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  char buffer[8192];
  while (out_read.get() >= 0 || err_read.get() >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      outcome.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
    const int ready = poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      Fd& fd = i == 0 ? out_read : err_read;
      const ssize_t n = read(fd.get(), buffer, sizeof(buffer));
      if (n > 0) {
        Keep(i == 0 ? &outcome.out : &outcome.err, buffer, static_cast<size_t>(n),
             options.max_output, i == 1);
      } else if (n == 0 || errno != EINTR) {
        fd.Close();
      }
    }
  }
  // Both pipes closed (or the time is up): a child that closed them and goes on running still
  // gets only the time that is left.
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, outcome.timed_out ? 0 : WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (done == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        outcome.timed_out = true;
        kill(pid, SIGKILL);
      } else {
        usleep(5000);
      }
    }
  }
  if (WIFEXITED(status)) {
    outcome.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    outcome.signal = WTERMSIG(status);
  }
  return outcome;
}

}  // namespace sluice
