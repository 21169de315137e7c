#include "child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "cli_util.h"

namespace framelink::cli {

pid_t forkChild(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 1;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "framelink-bench: %s\n", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

static int decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int waitChild(pid_t pid, int timeout_ms) {
  if (pid <= 0) return 0;
  int status = 0;
  if (timeout_ms < 0) {
    while (waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) return 1;
    }
    return decode(status);
  }
  const uint64_t deadline = monotonicNs() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return decode(status);
    if (r < 0 && errno != EINTR) return 1;
    if (monotonicNs() >= deadline) return -1;
    usleep(5000);  // a light poll: this process must not steal CPU from what it measures
  }
}

void stopChild(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  if (waitChild(pid, grace_ms) < 0) {
    ::kill(pid, SIGKILL);
    waitChild(pid, -1);
  }
}

}  // namespace framelink::cli
