// Backoff for a polling loop that must behave on a 2-core machine: spin a
// little (the next frame often comes within microseconds), then yield, then
// tell the caller to sleep in epoll.
//
// The phases are measured in time, not in loop rounds: a round of the data
// agent costs ~0.5 us on a server core but 10-100x that under emulation (the
// Soft-RoCE guest), where a fixed number of rounds kept a daemon spinning for
// milliseconds after every event and starved the kernel threads that move
// the data.
#pragma once

#include <sched.h>

#include <cstdint>

namespace framelink {

class IdleStrategy {
 public:
  // Spins for `spin_ns` after the last round that did work, then yields for
  // as long again.  0: sleep as soon as a round finds nothing.
  explicit IdleStrategy(uint64_t spin_ns) noexcept : spin_ns_(spin_ns) {}

  // `now_ns` is the caller's clock (the data agent's AgentClock: CLOCK_MONOTONIC
  // in the daemon, a ManualClock in tests); only differences matter.  Returns
  // true when the caller should block (epoll) now.  Only work re-arms the spin
  // phase: after a sleep that brought nothing, the caller sleeps again at once.
  bool idle(uint64_t work_count, uint64_t now_ns) noexcept {
    if (work_count > 0) {
      last_work_ns_ = now_ns;
      return false;
    }
    const uint64_t idle_ns = now_ns - last_work_ns_;
    if (idle_ns < spin_ns_) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return false;
    }
    if (idle_ns < 2 * spin_ns_) {
      ::sched_yield();
      return false;
    }
    return true;
  }

 private:
  uint64_t spin_ns_;
  uint64_t last_work_ns_ = 0;
};

}  // namespace framelink
