// What the tcp and rdma data listeners share: one thread runs every
// handshake in progress side by side, each with a deadline, in one poll()
// over a wake fd, the listening fd and each handshake's own fd.  A peer that
// stalls half-way holds one entry until its deadline and delays nobody.
//
//   for (;;) {
//     table.expire(Clock::now(), onTimedOut);
//     auto w = table.wait(wake_fd, listen_fd, Clock::time_point::max(), fdOf);
//     if (w != HandshakeWait::kReady) return;
//     table.advanceReady(advance);                // handshakes that made progress
//     if (table.listenReady()) accept(table.pending());
//   }
#pragma once

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <vector>

namespace framelink::transport {

enum class HandshakeWait {
  kReady,   // something may have happened (also: interrupted by a signal)
  kWoken,   // the wake fd: the listener stops
  kFailed,  // poll() failed; errno says why
};

// `Pending` is one handshake in progress, with a `deadline` member.
template <typename Pending>
class HandshakeTable {
 public:
  using Clock = std::chrono::steady_clock;

  std::vector<Pending>& pending() noexcept { return pending_; }
  size_t size() const noexcept { return pending_.size(); }

  // Drops every handshake whose deadline passed, after on_expired(p).
  template <typename OnExpired>
  void expire(Clock::time_point now, OnExpired&& on_expired) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now < it->deadline) {
        ++it;
        continue;
      }
      on_expired(*it);
      it = pending_.erase(it);
    }
  }

  // Waits for the wake fd, `listen_fd` (-1: not now) or the fd of any
  // handshake (fd_of(p)), at most until the first deadline or `until`.
  template <typename FdOf>
  HandshakeWait wait(int wake_fd, int listen_fd, Clock::time_point until, FdOf&& fd_of) {
    fds_.clear();
    fds_.push_back({wake_fd, POLLIN, 0});
    fds_.push_back({listen_fd, POLLIN, 0});
    auto next = until;
    for (const auto& p : pending_) {
      fds_.push_back({fd_of(p), POLLIN, 0});
      next = std::min(next, p.deadline);
    }
    int timeout_ms = -1;
    if (next != Clock::time_point::max()) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<long long>(ms, 1, 60'000));
    }
    if (::poll(fds_.data(), fds_.size(), timeout_ms) < 0) {
      if (errno != EINTR) return HandshakeWait::kFailed;
      for (auto& f : fds_) f.revents = 0;
    }
    return fds_[0].revents != 0 ? HandshakeWait::kWoken : HandshakeWait::kReady;
  }

  // After wait(): whether the listening fd has something to accept.
  bool listenReady() const noexcept { return fds_.size() > 1 && fds_[1].fd >= 0 && fds_[1].revents != 0; }

  // After wait(): advance(p) for each handshake whose fd had something;
  // those it is finished with (it returns true: handed on or dropped) go.
  template <typename Advance>
  void advanceReady(Advance&& advance) {
    std::vector<bool> done(pending_.size(), false);  // indices into pending_ match fds_[2..]
    for (size_t i = 0; i < pending_.size() && i + 2 < fds_.size(); ++i) {
      if (fds_[i + 2].revents != 0) done[i] = advance(pending_[i]);
    }
    for (size_t i = pending_.size(); i-- > 0;) {
      if (done[i]) pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

 private:
  std::vector<Pending> pending_;
  std::vector<pollfd> fds_;
};

}  // namespace framelink::transport
