// What a reload (SIGHUP, `systemctl reload framelinkd`, `framelink reload`)
// does with the configuration read again while the daemon runs.  Some options
// apply live -- the peers and their routes, addresses, tokens and certificate
// names, link.token, log_level and the frame timeouts; every other change is
// named and waits for a restart, the daemon keeping its running value.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "config/config.h"

namespace framelink {

struct ReloadPlan {
  // The running configuration with the live changes of the file applied;
  // every option that needs a restart keeps its running value.
  Config next;
  // What changes now, one line each: "[daemon] log_level info -> debug",
  // "[[peer]] c added (dials 10.0.0.3:7700)", "[link] token rotated".
  std::vector<std::string> applied;
  // The changed options that take effect at the next restart, as "[section] key".
  std::vector<std::string> restart;
};

// `read`: the configuration as parseConfig gave it now; `running`: the one in effect.
ReloadPlan planReload(const Config& running, const Config& read);

// Copies what a reload changes while the daemon runs from `from` into
// `into`, and nothing else: planReload and the data agent's copy share it.
void copyReloadable(const Config& from, Config& into);

// A short digest (16 hex digits) of everything that configures the daemon,
// secrets included, so that a rotated token changes it too: doctor and
// /stats show the running one's, `framelinkd --check-config` the file's.
std::string configHash(const Config& config);

// The configuration the threads outside the data agent read (the gRPC
// handlers, the dialers, the admin snapshot): swapped whole by a reload, so
// that a reader holds one consistent snapshot for as long as it needs.
class LiveConfig {
 public:
  explicit LiveConfig(Config config) : current_(std::make_shared<const Config>(std::move(config))) {}
  std::shared_ptr<const Config> get() const {
    MutexLock lock(mutex_);
    return current_;
  }
  void set(std::shared_ptr<const Config> next) {
    MutexLock lock(mutex_);
    current_ = std::move(next);
  }

 private:
  mutable Mutex mutex_;
  std::shared_ptr<const Config> current_ FL_GUARDED_BY(mutex_);
};

}  // namespace framelink
