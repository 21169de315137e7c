// One live peer session, from the moment its data channel is up: the data
// agent gets the link (CmdLinkUp, with fault injection wrapped around the
// transport when configured), every message the peer sends on the Session
// call (keepalives answered here), and CmdLinkDown when the call ends.  Fed
// by the call's reactor (session_reactor.h) on the session queue's thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agent/link_identity.h"
#include "common/thread_annotations.h"
#include "framelink/v1/link.pb.h"
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

class SessionWriter;
class KeepaliveNews;
struct SessionBacklog;

// What a live session keeps between the peer's messages, whatever the call
// it runs on.  Made as the link comes up: posts CmdLinkUp to the agent.
class SessionInbox {
 public:
  SessionInbox(DataAgent& agent, const Config& config, const LinkSessionInfo& info,
               std::shared_ptr<transport::Transport> t, std::shared_ptr<SessionWriter> writer,
               std::shared_ptr<CancelGuard> guard);
  // Takes the message the peer sent (`msg` is then a fresh one to read the
  // next into).  False: the session is to end (the peer floods it), why().
  bool take(std::shared_ptr<v1::PeerMessage>& msg);
  const std::string& why() const { return why_; }
  // The call ended: the writer stops, the agent gets CmdLinkDown.
  void down();

 private:
  DataAgent& agent_;
  const uint64_t link_id_;
  std::shared_ptr<SessionWriter> writer_;
  std::shared_ptr<CancelGuard> guard_;
  std::shared_ptr<SessionBacklog> backlog_;
  std::shared_ptr<KeepaliveNews> news_;
  std::string why_;  // why this side ended the call, if it did
};

}  // namespace framelink
