// What the hostile-neighbour tests (test_hostile*.cpp, test_attach_limits.cpp)
// share: a daemon pair with metrics on, the check that SIGTERM still stops a
// daemon at once, a tcp connection that says a few bytes and stalls, and a
// second local user.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"

namespace framelink::integ {

inline const std::vector<std::string> kMetrics = {"--metrics", "127.0.0.1:0"};

inline DaemonPair::Options pairOptions() {
  DaemonPair::Options o;
  o.extra_args = kMetrics;
  return o;
}

// SIGTERM must end the daemon cleanly (exit 0) within a second, whatever an
// attacker left pending.
inline void requireQuickCleanStop(DaemonProcess& d) {
  const auto start = std::chrono::steady_clock::now();
  const int status = d.terminate(Millis(1000));
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  INFO("framelinkd " << d.id() << " took " << took.count() << " ms to stop; wait status " << status);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

inline void clearNonBlocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  REQUIRE(fl >= 0);
  REQUIRE(::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0);
}

// Connects to 127.0.0.1:port and sends the first `bytes` bytes of nothing
// useful, then stalls (the caller closes it).
inline int stalledTcp(uint16_t port, size_t bytes) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  std::vector<char> junk(bytes, 'x');
  REQUIRE(::send(s, junk.data(), junk.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes));
  return s;
}
inline constexpr uid_t kNobody = 65534;
inline constexpr gid_t kNogroup = 65534;

// A forked child that runs `body` as uid:gid with no supplementary groups
// (another local user; the tests run as root, as CI does), dumpable as a
// process that user started would be (the setuid made it not).  Killed and
// reaped when it goes while still running.  `body` runs in the child: no
// Catch macros there.
class ChildAsUser {
 public:
  template <typename Body>
  ChildAsUser(uid_t uid, gid_t gid, Body body) {
    REQUIRE(::geteuid() == 0);  // "needs root to switch to another user"
    ::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(250);
      if (::prctl(PR_SET_DUMPABLE, 1) != 0) ::_exit(249);
      ::_exit(body());
    }
  }
  ~ChildAsUser() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ChildAsUser(const ChildAsUser&) = delete;
  ChildAsUser& operator=(const ChildAsUser&) = delete;

  // Its exit code; -1 when it did not exit normally, or not within `timeout` (then it is killed).
  int wait(Millis timeout) {
    int status = 0;
    pid_t reaped = 0;
    waitUntil([&] { return (reaped = ::waitpid(pid_, &status, WNOHANG)) != 0; }, timeout, Millis(5));
    if (reaped != pid_) return -1;  // the destructor kills it
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

// Runs `body` in a child process as nobody:nogroup and returns its exit
// code (-1 when it did not exit normally, or not within two minutes).
template <typename Body>
int runAsNobody(Body body) {
  return ChildAsUser(kNobody, kNogroup, body).wait(Millis(120000));
}

}  // namespace framelink::integ
