#include "link/pending_channels.h"

namespace framelink {

bool PendingChannels::add(uint64_t session_id, const TransportEntry* transport, std::string token,
                          Ready ready) {
  MutexLock lock(mutex_);
  if (stopped_ || pending_.count(session_id) != 0) return false;
  Pending& p = pending_[session_id];
  p.transport = transport;
  p.token = std::move(token);
  p.ready = std::move(ready);
  return true;
}

bool PendingChannels::remove(uint64_t session_id) {
  MutexLock lock(mutex_);
  return pending_.erase(session_id) != 0;
}

AcceptHooks PendingChannels::hooks(const TransportEntry* t) {
  return AcceptHooks{
      [this, t](uint64_t session_id) {
        MutexLock lock(mutex_);
        auto it = pending_.find(session_id);
        return it != pending_.end() && it->second.transport == t;
      },
      [this, t](uint64_t session_id, Channel channel) { fulfil(session_id, t, std::move(channel)); },
      [this](uint64_t session_id) {
        MutexLock lock(mutex_);
        auto it = pending_.find(session_id);
        return it != pending_.end() ? it->second.token : fallback_token_;
      }};
}

void PendingChannels::fulfil(uint64_t session_id, const TransportEntry* transport, Channel channel) {
  Ready ready;
  {
    MutexLock lock(mutex_);
    auto it = pending_.find(session_id);
    if (it == pending_.end() || it->second.transport != transport) {
      log_.warn("a {} data channel for unknown session {:016x} was refused", transport->name(), session_id);
      return;
    }
    ready = std::move(it->second.ready);
    pending_.erase(it);
  }
  ready(std::move(channel));
}

void PendingChannels::stop() {
  std::map<uint64_t, Pending> ended;
  {
    MutexLock lock(mutex_);
    stopped_ = true;
    ended.swap(pending_);
  }
  // A Session waiting for its data channel ends now, not at its timeout.
  for (auto& [id, p] : ended) p.ready(nullptr);
}

}  // namespace framelink
