// The time the data agent runs on.  Production reads CLOCK_MONOTONIC; tests
// and a simulator hold a ManualClock and move it themselves, so credit and
// ACK deadlines, the idle strategy's phases and the stats period follow
// simulated time: a timeout test advances the clock instead of sleeping.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace framelink {

class AgentClock {
 public:
  virtual ~AgentClock() = default;
  // Nanoseconds on a monotonic scale; only differences mean anything.
  virtual uint64_t nowNs() const noexcept = 0;
};

class SteadyClock final : public AgentClock {
 public:
  uint64_t nowNs() const noexcept override {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
  }
};

// The process's one SteadyClock (it has no state).
inline const AgentClock& steadyClock() noexcept {
  static const SteadyClock kClock;
  return kClock;
}

// Stands still until told to move.  Safe to advance from another thread than
// the one reading it (a test thread and a running agent).  A threaded agent
// on a ManualClock should be configured with idle_spin_us = 0: its spin phase
// is measured on this clock, which does not move while it spins.
class ManualClock final : public AgentClock {
 public:
  // Starts well away from 0: the agent takes a deadline of 0 for "none".
  explicit ManualClock(uint64_t start_ns = 1'000'000'000ULL) noexcept : now_ns_(start_ns) {}
  uint64_t nowNs() const noexcept override { return now_ns_.load(std::memory_order_acquire); }
  void advanceNs(uint64_t ns) noexcept { now_ns_.fetch_add(ns, std::memory_order_acq_rel); }
  void advanceMs(uint64_t ms) noexcept { advanceNs(ms * 1'000'000ULL); }

 private:
  std::atomic<uint64_t> now_ns_;
};

}  // namespace framelink
