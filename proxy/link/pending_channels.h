// The Sessions a listener has answered that wait for their data channel: by
// session id, the transport that must bring it and the token its dialer must
// prove on it.  Each transport's listener hands over what it accepts through
// hooks(); stop() ends every wait at once and refuses new ones.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "link/transport_registry.h"

namespace framelink {

class PendingChannels {
 public:
  using Channel = std::shared_ptr<transport::Transport>;

  // `fallback_token`: what a data channel for a session nobody waits for is
  // checked against (it is refused either way, once its handshake is done).
  explicit PendingChannels(std::string fallback_token) : fallback_token_(std::move(fallback_token)) {}

  using Ready = std::function<void(Channel)>;

  // Waits for the channel of `session_id` on `transport`: `ready` gets it,
  // once, on the thread of the listener that accepted it, or null when
  // stop() ends the wait.  False when the id is taken or stop() ran.
  bool add(uint64_t session_id, const TransportEntry* transport, std::string token, Ready ready);
  // The Session stopped waiting (timed out, or its peer went away).  False:
  // its `ready` was called or is being called (it must be waited for).
  bool remove(uint64_t session_id);
  // The hooks through which `t`'s listener hands over the channels it accepts.
  AcceptHooks hooks(const TransportEntry* t);
  void stop();

 private:
  struct Pending {
    const TransportEntry* transport = nullptr;
    std::string token;
    Ready ready;
  };
  void fulfil(uint64_t session_id, const TransportEntry* transport, Channel channel);

  const std::string fallback_token_;
  LogLimiter log_;  // strangers can send channels for sessions nobody waits for
  Mutex mutex_;
  std::map<uint64_t, Pending> pending_ FL_GUARDED_BY(mutex_);
  bool stopped_ FL_GUARDED_BY(mutex_) = false;
};

}  // namespace framelink
