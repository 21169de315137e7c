// framelinkd as a whole: the data agent, the attach server, the peer links
// and the metrics endpoint, started and stopped in order.  Tests can run one
// in-process (port 0, socket in a temp dir).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_heartbeat.h"
#include "common/result.h"
#include "config/config.h"
#include "hand_over.h"

namespace framelink {

class Daemon {
 public:
  // `heartbeat`: beaten by the data agent while it runs (systemd's watchdog
  // in framelinkd; none in tests).
  // `inherited`: what the daemon before this one handed over (hot restart,
  // hand_over.h): its attach listener and clients are taken over.
  static Result<std::unique_ptr<Daemon>> start(Config config, AgentHeartbeat heartbeat = {},
                                               std::vector<NamedFd> inherited = {});
  virtual ~Daemon() = default;

  virtual uint16_t grpcPort() const noexcept = 0;
  virtual uint16_t dataPort() const noexcept = 0;
  virtual uint16_t metricsPort() const noexcept = 0;
  virtual const Config& config() const noexcept = 0;
  // What it serves now, in one line (Metrics::summary): for systemctl status.
  virtual std::string statusLine() const = 0;
  virtual void stop() = 0;
  // Stops for a hot restart: the frames in progress end within
  // drain_timeout_ms, new ones stay in their producers' rings, and the
  // attach listener and every client go to `store` (systemd's file
  // descriptor store in framelinkd) for the next daemon, the clients still
  // attached.  `store` returns false when they could not be kept: then the
  // clients see this daemon go and attach again.  Returns the clients handed over.
  using HandOverStore = std::function<bool(std::vector<NamedFd>& fds)>;
  virtual size_t stopAndHandOver(const HandOverStore& store) = 0;

  // Where a reload reads the configuration again (framelinkd: its command
  // line, and the file that names); none: a reload is refused.
  virtual void setConfigSource(std::function<Result<Config>()> source) = 0;
  // What a reload did.
  struct ReloadOutcome {
    bool refused = false;
    std::string error;                  // refused: why, as a start would say it
    std::string hash;                   // of the configuration running after it
    std::vector<std::string> applied;   // what changed now (planReload)
    std::vector<std::string> restart;   // changed options that wait for a restart
    std::vector<std::string> warnings;  // the new routes' (Config::routeWarnings)
    std::string json() const;
  };
  // SIGHUP, `systemctl reload`, `framelink reload`: reads the configuration
  // again and applies what can change while it runs (config_reload.h); one
  // that does not parse is refused and the running one stays.  Logged.
  virtual ReloadOutcome reload() = 0;
};

}  // namespace framelink
