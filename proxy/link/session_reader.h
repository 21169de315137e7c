// One live peer session, from the moment its data channel is up: the data
// agent gets the link (CmdLinkUp, with fault injection wrapped around the
// transport when configured), every message the peer sends on the Session
// call (keepalives answered here), and CmdLinkDown when the call ends.  Runs
// on the thread that owns the call (a dialer, or a gRPC handler) until then.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agent/link_identity.h"
#include "common/thread_annotations.h"
#include "transport/transport.h"

namespace framelink {

struct Config;
class DataAgent;

// Calls `cancel` until disarmed, never after: what may end a call from
// another thread (the agent, a timer) goes through one, so that it cannot
// reach a call whose context is gone.
class CancelGuard {
 public:
  explicit CancelGuard(std::function<void()> cancel) : cancel_(std::move(cancel)) {}
  void fire() {
    MutexLock lock(mutex_);
    if (cancel_) cancel_();
  }
  void disarm() {
    MutexLock lock(mutex_);
    cancel_ = nullptr;
  }

 private:
  Mutex mutex_;
  std::function<void()> cancel_ FL_GUARDED_BY(mutex_);
};

// A link as it comes up: its id and who is at the other end.
struct LinkSessionInfo {
  uint64_t link_id = 0;
  LinkIdentity identity;
};

// `Stream`: the client or server side of the Session call; `cancel` ends
// that call.  Returns when the call ended.
template <typename Stream>
void runLinkSession(DataAgent& agent, const Config& config, const LinkSessionInfo& info,
                    std::shared_ptr<transport::Transport> t, Stream* stream, std::function<void()> cancel);

}  // namespace framelink
