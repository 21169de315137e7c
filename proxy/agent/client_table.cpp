#include "agent/client_table.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "common/log_fields.h"
#include "framelink/status_name.hpp"

namespace framelink {

AgentClient& ClientTable::add(std::shared_ptr<ClientSession> session) {
  const uint64_t id = session->id;
  AgentClient& c = clients_[id];
  c.session = std::move(session);
  polled_stale_ = true;
  return c;
}

void ClientTable::erase(uint64_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  if (it->second.stream != kNoName) names_.release(it->second.stream);
  clients_.erase(it);
  polled_stale_ = true;
}

bool ClientTable::prepareSleep() {
  bool ready = false;
  for (auto& [id, c] : clients_) {
    if (c.session->gone) continue;
    // A paused producer's frames are not this daemon's work any more.
    const bool paused = producers_paused_ && c.session->role == FL_ROLE_PRODUCER;
    if (!fl_ring_prepare_sleep(c.session->segments->submitRing()) && !paused) ready = true;
  }
  return !ready;
}

void ClientTable::endSleep(std::span<const uint64_t> rang) {
  for (auto& [id, c] : clients_) {
    if (!c.session->gone) fl_ring_end_sleep(c.session->segments->submitRing());
  }
  for (const uint64_t id : rang) {
    AgentClient* c = find(id);
    if (c != nullptr && !c->session->gone) drainDoorbell(c->session->submit_doorbell.get());
  }
}

void ClientTable::detach(ClientSession& c, int status, const std::string& why) {
  if (c.gone) return;
  const LogScope scope(LogFields{.client = c.id, .stream = c.stream});
  log_detached_.error("client {} (pid {}, stream '{}'): {}: {}; detaching it", c.id, c.pid, c.stream,
                      statusName(status), why);
  __atomic_store_n(&c.segments->header()->daemon_state, uint32_t{FL_DAEMON_DETACHED}, __ATOMIC_RELEASE);
  // The attach thread sees the shutdown as a hang-up and reports CmdClientGone.
  ::shutdown(c.socket.get(), SHUT_RDWR);
  c.gone = true;
}

}  // namespace framelink
