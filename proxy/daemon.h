// framelinkd as a whole: the data agent, the attach server, the peer links
// and the metrics endpoint, started and stopped in order.  Tests can run one
// in-process (port 0, socket in a temp dir).
#pragma once

#include <memory>

#include "agent/agent_heartbeat.h"
#include "common/result.h"
#include "config/config.h"

namespace framelink {

class Daemon {
 public:
  // `heartbeat`: beaten by the data agent while it runs (systemd's watchdog
  // in framelinkd; none in tests).
  static Result<std::unique_ptr<Daemon>> start(Config config, AgentHeartbeat heartbeat = {});
  virtual ~Daemon() = default;

  virtual uint16_t grpcPort() const noexcept = 0;
  virtual uint16_t dataPort() const noexcept = 0;
  virtual uint16_t metricsPort() const noexcept = 0;
  virtual const Config& config() const noexcept = 0;
  // What it serves now, in one line (Metrics::summary): for systemctl status.
  virtual std::string statusLine() const = 0;
  virtual void stop() = 0;
};

}  // namespace framelink
