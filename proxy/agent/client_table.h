// The data agent's side of the client rings: every attached client, its
// submit ring drained round-robin (a bounded number of descriptors each per
// round, so one busy client cannot starve the others), its completions
// pushed, and a client that corrupts its rings detached without disturbing
// anyone else.  What a descriptor means is the outbound and inbound parts'
// business; this part only moves them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agent/agent_state.h"
#include "attach/attach_server.h"
#include "attach/client_session.h"
#include "common/log_limit.h"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"
#include "metrics/metrics.h"

namespace framelink {

class ClientTable {
 public:
  static constexpr size_t kMaxSubmitsPerRound = 64;

  ClientTable(Metrics& metrics, NameTable& names) : metrics_(metrics), names_(names) {}

  AgentClient& add(std::shared_ptr<ClientSession> session);
  AgentClient* find(uint64_t id) {
    auto it = clients_.find(id);
    return it == clients_.end() ? nullptr : &it->second;
  }
  // Forgets the client (and its claim on its stream's name).
  void erase(uint64_t id);
  std::map<uint64_t, AgentClient>& all() { return clients_; }
  const std::map<uint64_t, AgentClient>& all() const { return clients_; }

  // Pops up to kMaxSubmitsPerRound descriptors from each attached client's
  // submit ring and hands each to `handle(AgentClient&, const fl_submit_desc&)`,
  // which may detach clients.  Returns the descriptors handled.
  template <typename Handle>
  size_t drainRings(Handle&& handle);
  // What a client put in its ring before it went away, all of it.
  template <typename Handle>
  void drainAll(AgentClient& c, Handle&& handle);

  // From now on producers' rings are left as they are (a hot restart: the
  // next daemon takes what they hold); consumers' are still drained.
  void pauseProducers() { producers_paused_ = true; }

  // Announces sleep on every submit ring; false when one has work after all
  // (a client pushed before it saw the flag).
  bool prepareSleep();
  // Clears the sleep flags after a sleep, and the submit doorbells of the
  // clients in `rang` (those epoll reported readable; any other one that
  // holds something is reported, and read, after the next sleep).
  void endSleep(std::span<const uint64_t> rang);

  // Kicks a misbehaving client out: marks its segment detached and shuts its
  // attach socket down (the attach thread then reports it gone).
  void detach(ClientSession& c, int status, const std::string& why);
  // Pushes a completion; a client whose completion ring is full or corrupt
  // is detached.
  // The client hears of it at wakeReaders(), once for every completion
  // pushed to it before.
  void complete(ClientSession& c, uint32_t slot, int status, uint64_t sequence, uint64_t length,
                uint64_t frame_id, uint32_t readers = 0, uint32_t released = 0) {
    const bool first = !c.completions_unannounced;
    if (!c.complete(slot, status, sequence, length, frame_id, readers, released)) {
      detach(c, FL_ERR_RING_CORRUPT, "its completion ring is full or corrupt");
      return;
    }
    if (!first || !c.completions_unannounced) return;
    auto it = clients_.find(c.id);
    if (it != clients_.end() && it->second.session.get() == &c) {
      unannounced_.push_back(it->second.session);
    } else {
      c.wakeIfAsleep();  // not (or no longer) in the table: at once
    }
  }
  // Rings the completion doorbell of every client that got completions since
  // the last call and sleeps on them: the agent calls it at the end of each
  // round, before it may sleep, and before it stops.
  void wakeReaders() {
    for (const auto& s : unannounced_) s->wakeIfAsleep();
    unannounced_.clear();
  }

  // Detach lines, at most as many per second as the attach server logs
  // attaches: a local user attaching in a loop must not flood the log.
  LogLimiter& detachLog() { return log_detached_; }

 private:
  Metrics& metrics_;
  NameTable& names_;
  LogLimiter log_detached_{std::chrono::seconds(1), AttachServer::kLoggedAttachesPerSecond};
  std::map<uint64_t, AgentClient> clients_;
  // The clients drainRings polls, in id order: rebuilt after a client is
  // added or forgotten (map nodes stay put until then), so that a round
  // costs a pointer per client, not a lookup.
  std::vector<AgentClient*> polled_;
  // Sessions with completions not yet announced (wakeReaders); shared so
  // that one forgotten meanwhile is still safe to look at.
  std::vector<std::shared_ptr<ClientSession>> unannounced_;
  bool polled_stale_ = false;
  bool producers_paused_ = false;
};

template <typename Handle>
size_t ClientTable::drainRings(Handle&& handle) {
  size_t work = 0;
  if (polled_stale_) {
    polled_.clear();
    for (auto& [id, c] : clients_) polled_.push_back(&c);
    polled_stale_ = false;
  }
  // Handlers may detach clients (they are skipped from then on); one that
  // forgets a client ends the round here, before a pointer could dangle.
  for (size_t k = 0; k < polled_.size() && !polled_stale_; ++k) {
    AgentClient* c = polled_[k];
    if (c->session->gone) continue;
    if (producers_paused_ && c->session->role == FL_ROLE_PRODUCER) continue;
    ClientSession& s = *c->session;
    fl_ring_header* ring = s.segments->submitRing();
    for (size_t i = 0; i < kMaxSubmitsPerRound; ++i) {
      fl_submit_desc desc;  // private copy: validated before use
      fl_ring_result r = fl_ring_pop(ring, s.ring_capacity, sizeof(desc), &desc);
      if (r == FL_RING_EMPTY) break;
      if (r == FL_RING_CORRUPT) {
        metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
        detach(s, FL_ERR_RING_CORRUPT, "its submit ring indices are corrupt (tail beyond head + capacity)");
        break;
      }
      ++work;
      handle(*c, desc);
      if (polled_stale_ || s.gone) break;
    }
  }
  return work;
}

template <typename Handle>
void ClientTable::drainAll(AgentClient& c, Handle&& handle) {
  ClientSession& s = *c.session;
  fl_ring_header* ring = s.segments->submitRing();
  fl_submit_desc desc;
  while (!s.gone && fl_ring_pop(ring, s.ring_capacity, sizeof(desc), &desc) == FL_RING_OK) handle(c, desc);
}

}  // namespace framelink
