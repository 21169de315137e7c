// Proof of life from the data agent's own thread, for a supervisor that
// kills a daemon that stops giving it (systemd's watchdog).  It is the agent
// that beats, not a timer thread: an agent stuck in a loop or a blocking call
// stops the beats while the rest of the process may still look alive.
#pragma once

#include <cstdint>
#include <functional>

namespace framelink {

struct AgentHeartbeat {
  // At most this often, on the agent's clock; the agent checks it with its
  // deadlines (every 10 ms while busy, at least every 50 ms while idle), so
  // a beat may come that much later.  0: no heartbeat.
  uint64_t period_ns = 0;
  // Called on the agent's thread; must not block.
  std::function<void()> beat;

  bool enabled() const noexcept { return period_ns > 0 && beat != nullptr; }
};

}  // namespace framelink
