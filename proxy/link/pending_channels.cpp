#include "link/pending_channels.h"

namespace framelink {

std::optional<std::future<PendingChannels::Channel>> PendingChannels::add(uint64_t session_id,
                                                                          const TransportEntry* transport,
                                                                          std::string token) {
  MutexLock lock(mutex_);
  if (stopped_ || pending_.count(session_id) != 0) return std::nullopt;
  Pending& p = pending_[session_id];
  p.transport = transport;
  p.token = std::move(token);
  return p.promise.get_future();
}

void PendingChannels::remove(uint64_t session_id) {
  MutexLock lock(mutex_);
  pending_.erase(session_id);
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
  std::promise<Channel> promise;
  {
    MutexLock lock(mutex_);
    auto it = pending_.find(session_id);
    if (it == pending_.end() || it->second.transport != transport) {
      log_.warn("a {} data channel for unknown session {:016x} was refused", transport->name(), session_id);
      return;
    }
    promise = std::move(it->second.promise);
    pending_.erase(it);
  }
  promise.set_value(std::move(channel));
}

void PendingChannels::stop() {
  std::map<uint64_t, Pending> ended;
  {
    MutexLock lock(mutex_);
    stopped_ = true;
    ended.swap(pending_);
  }
  // A Session waiting for its data channel ends now, not at its timeout.
  for (auto& [id, p] : ended) p.promise.set_value(nullptr);
}

}  // namespace framelink
