// framelinkd as a whole: the data agent, the attach server, the peer links
// and the metrics endpoint, started and stopped in order.  Tests can run one
// in-process (port 0, socket in a temp dir).
#pragma once

#include <memory>

#include "common/result.h"
#include "config/config.h"

namespace framelink {

class Daemon {
 public:
  static Result<std::unique_ptr<Daemon>> start(Config config);
  virtual ~Daemon() = default;

  virtual uint16_t grpcPort() const noexcept = 0;
  virtual uint16_t dataPort() const noexcept = 0;
  virtual uint16_t metricsPort() const noexcept = 0;
  virtual const Config& config() const noexcept = 0;
  virtual void stop() = 0;
};

}  // namespace framelink
