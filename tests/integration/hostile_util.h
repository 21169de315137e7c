// What the hostile-neighbour tests (test_hostile*.cpp, test_attach_limits.cpp)
// share: a daemon pair with metrics on, the check that SIGTERM still stops a
// daemon at once, a tcp connection that says a few bytes and stalls, and a
// second local user.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
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

// Runs `body` in a child process as nobody:nogroup (a second local user;
// the tests run as root, as CI does); returns its exit code.  `body` runs
// in a forked child: no Catch macros there.  -1 when it did not exit normally.
template <typename Body>
int runAsNobody(Body body) {
  REQUIRE(::geteuid() == 0);  // "needs root to switch to a second user"
  ::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNogroup) != 0 || ::setuid(kNobody) != 0) ::_exit(250);
    ::_exit(body());
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace framelink::integ
