// A userspace TCP relay between two daemons on loopback that can make the
// path between them half-open: it stops carrying one direction while every
// connection stays up, the way a blackholed route looks to the programs at
// either end (nothing arrives, nothing fails), and later carries it again.
//
// For each port it listens on `listen_host`:port and forwards every accepted
// connection to `target_host`:port -- the same port number, so a daemon that
// dials its peer's host with the data port the peer advertised in Hello
// reaches the relay too.  A blocked direction is not read: its bytes (and an
// end of stream) wait in the kernel's buffers and go on, in order, once
// healed.  New connections are accepted at all times and obey the same block.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace framelink::integ {

class HalfOpenRelay {
 public:
  // "Forward": from the dialer (the connection's accepting side) to the
  // target; "Back": from the target to the dialer.
  enum class Direction { kForward = 0, kBack = 1 };

  // `ports`: how many listeners; each binds `listen_host`:0 and forwards to
  // the port of the same number on `target_host`.  REQUIREs success.
  HalfOpenRelay(std::string listen_host, std::string target_host, int ports);
  ~HalfOpenRelay();
  HalfOpenRelay(const HalfOpenRelay&) = delete;
  HalfOpenRelay& operator=(const HalfOpenRelay&) = delete;

  uint16_t port(int i) const { return ports_.at(i); }
  const std::string& listenHost() const noexcept { return listen_host_; }

  void block(Direction d) noexcept { blocked_[static_cast<int>(d)].store(true); }
  void heal() noexcept {
    blocked_[0].store(false);
    blocked_[1].store(false);
  }
  // Connections accepted so far (a reconnect shows as a new one).
  uint64_t accepted() const noexcept { return accepted_.load(); }

 private:
  struct Pair;
  void run();

  std::string listen_host_, target_host_;
  std::vector<int> listeners_;
  std::vector<uint16_t> ports_;
  std::atomic<bool> blocked_[2] = {false, false};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::thread thread_;  // last: started once everything above is set
};

}  // namespace framelink::integ
