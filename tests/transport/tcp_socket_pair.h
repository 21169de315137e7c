// A connected loopback TCP socket pair for the tcp transport's tests, both
// ends' buffers set to `buffer_bytes` (0: the kernel's autotuning) before the
// connection is made, so that the window follows them.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <utility>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"

namespace framelink::transport::testing {

// {dialer, accepted}.
inline std::pair<UniqueFd, UniqueFd> socketPair(int buffer_bytes) {
  auto sized = [buffer_bytes](int fd) {
    if (buffer_bytes <= 0) return;
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes) == 0);
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes) == 0);
  };
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener.valid());
  sized(listener.get());  // accepted sockets inherit it
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  UniqueFd dialer(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(dialer.valid());
  sized(dialer.get());
  REQUIRE(::connect(dialer.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  UniqueFd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(accepted.valid());
  return {std::move(dialer), std::move(accepted)};
}

}  // namespace framelink::transport::testing
