// Backoff for a polling loop that must behave on a 2-core machine: spin a
// little (the next frame often comes within microseconds), then yield, then
// tell the caller to sleep in epoll.
#pragma once

#include <sched.h>

#include <cstdint>

namespace framelink {

class IdleStrategy {
 public:
  IdleStrategy(uint32_t spins, uint32_t yields) : spins_(spins), yields_(yields) {}

  // Returns true when the caller should block (epoll) now.
  bool idle(uint64_t work_count) noexcept {
    if (work_count > 0) {
      idle_rounds_ = 0;
      return false;
    }
    ++idle_rounds_;
    if (idle_rounds_ <= spins_) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return false;
    }
    if (idle_rounds_ <= spins_ + yields_) {
      ::sched_yield();
      return false;
    }
    return true;
  }

  void reset() noexcept { idle_rounds_ = 0; }

 private:
  uint32_t spins_;
  uint32_t yields_;
  uint32_t idle_rounds_ = 0;
};

}  // namespace framelink
