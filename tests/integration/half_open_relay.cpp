#include "half_open_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

namespace framelink::integ {

namespace {

constexpr size_t kMaxBuffered = 256 * 1024;  // per direction, before the relay stops reading

sockaddr_in address(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  return a;
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

// One relayed connection: side 0 is the dialer's, side 1 the target's.
// Direction d carries side d to side 1 - d.
struct HalfOpenRelay::Pair {
  int fd[2] = {-1, -1};
  std::string buf[2];
  bool eof[2] = {false, false};   // side d ended its stream (read 0)
  bool shut[2] = {false, false};  // ... and the other side was told (SHUT_WR)
  // Side s failed (reset, or an error writing to it).  The other side learns
  // of it only over direction s, so not while that direction is blocked.
  bool failed[2] = {false, false};
  bool hung_up = false;  // poll reported POLLHUP/POLLERR: leave it out of poll while nothing moves

  ~Pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }

  // Moves what it can over direction d without blocking: reads from side d
  // into its buffer, writes the buffer to the other side and passes the end
  // of the stream on.  True when anything changed (bytes, an end, a failure).
  bool carry(int d);
};

bool HalfOpenRelay::Pair::carry(int d) {
  bool moved = false;
  const int src = d, dst = 1 - d;
  if (!failed[src] && !eof[d] && buf[d].size() < kMaxBuffered) {
    char chunk[64 * 1024];
    ssize_t n = ::recv(fd[src], chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buf[d].append(chunk, size_t(n));
      moved = true;
    } else if (n == 0) {
      eof[d] = moved = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      failed[src] = moved = true;
    }
  }
  if (!failed[dst] && !buf[d].empty()) {
    ssize_t n = ::send(fd[dst], buf[d].data(), buf[d].size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      buf[d].erase(0, size_t(n));
      moved = true;
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      failed[dst] = moved = true;
    }
  }
  if (eof[d] && buf[d].empty() && !shut[d] && !failed[dst]) {
    ::shutdown(fd[dst], SHUT_WR);
    shut[d] = moved = true;
  }
  return moved;
}

HalfOpenRelay::HalfOpenRelay(std::string listen_host, std::string target_host, int ports)
    : listen_host_(std::move(listen_host)), target_host_(std::move(target_host)) {
  for (int i = 0; i < ports; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = address(listen_host_, 0);
    INFO("relay bind " << listen_host_ << ": " << std::strerror(errno));
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    listeners_.push_back(fd);
    ports_.push_back(ntohs(a.sin_port));
  }
  thread_ = std::thread([this] { run(); });
}

HalfOpenRelay::~HalfOpenRelay() {
  stop_.store(true);
  thread_.join();
  for (int fd : listeners_) ::close(fd);
}

void HalfOpenRelay::run() {
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<pollfd> pfds;
  while (!stop_.load()) {
    const bool blocked[2] = {blocked_[0].load(), blocked_[1].load()};
    pfds.clear();
    for (int fd : listeners_) pfds.push_back({fd, POLLIN, 0});
    for (auto& p : pairs) {
      for (int side = 0; side < 2; ++side) {
        short events = 0;
        const int in = side, out = 1 - side;  // direction `in` reads this side, `out` writes it
        if (!blocked[in] && !p->eof[in] && p->buf[in].size() < kMaxBuffered) events |= POLLIN;
        if (!blocked[out] && !p->buf[out].empty()) events |= POLLOUT;
        pfds.push_back({p->hung_up || p->failed[side] ? -1 : p->fd[side], events, 0});
      }
    }
    // A short timeout: block() and heal() take effect within it.
    ::poll(pfds.data(), pfds.size(), 10);
    // Pairs accepted below have no pollfd yet: they are looked at next round.
    const size_t polled = pairs.size();

    for (size_t i = 0; i < listeners_.size(); ++i) {
      if ((pfds[i].revents & POLLIN) == 0) continue;
      int client = ::accept4(listeners_[i], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (client < 0) continue;
      accepted_.fetch_add(1);
      auto p = std::make_unique<Pair>();
      p->fd[0] = client;
      p->fd[1] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in target = address(target_host_, ports_[i]);
      // Loopback: the connect is done (or refused) at once.
      if (p->fd[1] < 0 || ::connect(p->fd[1], reinterpret_cast<sockaddr*>(&target), sizeof target) != 0) {
        continue;  // the dialer sees its connection close, as when nobody listens
      }
      setNonBlocking(p->fd[1]);
      int one = 1;
      for (int f : p->fd) ::setsockopt(f, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      pairs.push_back(std::move(p));
    }
    for (size_t k = 0; k < polled; ++k) {
      Pair& p = *pairs[k];
      const pollfd* pf = &pfds[listeners_.size() + 2 * k];
      if (((pf[0].revents | pf[1].revents) & (POLLHUP | POLLERR)) != 0) p.hung_up = true;
      bool moved = false;
      for (int d = 0; d < 2; ++d) {
        if (blocked[d]) continue;
        if (p.carry(d)) moved = true;
      }
      if (moved) p.hung_up = false;
    }
    // A pair ends once both streams ended, or once a failed side's failure
    // could reach the other side (its direction is not blocked).
    for (size_t k = 0; k < pairs.size();) {
      const Pair& p = *pairs[k];
      const bool done = p.shut[0] && p.shut[1] && p.buf[0].empty() && p.buf[1].empty();
      const bool failure_told = (p.failed[0] && !blocked[0]) || (p.failed[1] && !blocked[1]);
      if (done || failure_told) {
        pairs.erase(pairs.begin() + long(k));
      } else {
        ++k;
      }
    }
  }
}

}  // namespace framelink::integ
