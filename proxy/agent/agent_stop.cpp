// How the data agent stops: at once, after a drain (the frames in progress
// end with their true status first), or for a hot restart (the drain, then
// every client left attached for the next daemon: handOverClients).
#include <spdlog/spdlog.h>

#include "agent/data_agent.h"
#include "framelink/framelink.h"

namespace framelink {

void DataAgent::stop(uint64_t drain_ms) {
  if (!thread_.joinable()) return;
  post(CmdStop{drain_ms});
  thread_.join();
}

void DataAgent::stopForHandOver(uint64_t drain_ms) {
  if (!thread_.joinable()) return;
  post(CmdStop{drain_ms, true});
  thread_.join();
}

std::vector<DataAgent::HandedClient> DataAgent::handOverClients() const {
  std::vector<HandedClient> out;
  if (!hand_over_) return out;
  for (const auto& [id, c] : clients_.all()) {
    if (c.session->gone) continue;
    HandedClient handed{c.session, {}};
    if (c.session->role == FL_ROLE_CONSUMER) {
      for (uint32_t slot = 0; slot < c.session->slots.size(); ++slot) {
        // Held by its application, or (past the drain's bound) still lent
        // to the other readers here: the next daemon keeps it from new frames.
        const SlotState state = c.session->slots[slot].state;
        if (state == SlotState::kDelivered || state == SlotState::kLent) handed.held_slots.push_back(slot);
      }
    }
    out.push_back(std::move(handed));
  }
  return out;
}

uint64_t DataAgent::framesInProgress() {
  uint64_t n = 0;
  for (auto& [id, c] : clients_.all()) {
    if (c.session->role == FL_ROLE_PRODUCER) {
      n += c.session->in_progress;
    } else if (hand_over_ && !c.session->gone) {
      // Handing over: a frame that landed here and is lent to the other
      // readers here ends first (the next daemon would not know to keep it).
      for (const SlotEntry& e : c.session->slots) n += e.state == SlotState::kLent ? 1 : 0;
    }
  }
  return n;
}

void DataAgent::beginStop(const CmdStop& stop) {
  if (stop.hand_over && !hand_over_) {
    // New frames wait in their rings for the next daemon.
    hand_over_ = true;
    clients_.pauseProducers();
  }
  const uint64_t n = framesInProgress();
  if (stop.drain_ms == 0 || n == 0 || drain_until_ns_ != 0) {
    running_ = false;
    return;
  }
  drain_from_ns_ = clock_.nowNs();
  drain_until_ns_ = drain_from_ns_ + stop.drain_ms * 1'000'000;
  if (!hand_over_) outbound_.startDraining();
  spdlog::info("stopping: draining {} frame{} in progress for {} ms at most; new frames {}", n,
               n == 1 ? "" : "s", stop.drain_ms,
               hand_over_ ? "wait in their rings for the next daemon" : "are refused (FL_ERR_SHUTDOWN)");
}

void DataAgent::checkDrain(uint64_t now_ns) {
  if (drain_until_ns_ == 0 || !running_) return;
  const uint64_t left = framesInProgress();
  if (left != 0 && now_ns < drain_until_ns_) return;
  const uint64_t ms = (now_ns - drain_from_ns_) / 1'000'000;
  if (left == 0) {
    spdlog::info("stopping: every frame in progress ended within {} ms", ms);
  } else {
    spdlog::warn(
        "stopping: {} frame{} still in progress after {} ms (drain_timeout_ms): they end "
        "FL_ERR_SHUTDOWN, and may have reached their consumers",
        left, left == 1 ? "" : "s", ms);
  }
  running_ = false;
}

void DataAgent::shutdown() {
  // Every frame still in progress ends FAILED(shutdown), also those still in
  // a ring and those of a client attached at the last moment.
  outbound_.startShutdown();
  drainCommands();
  // Handing over: the producers' rings stay as they are (pauseProducers),
  // the consumers' releases are taken and answered before the links end.
  clients_.drainRings([this](AgentClient& c, const fl_submit_desc& d) { onDescriptor(c, d); });
  if (hand_over_) {
    inbound_.flushControl();
    flushLinkControl();
  }
  for (auto& [id, c] : clients_.all()) {
    if (c.session->role == FL_ROLE_PRODUCER) {
      outbound_.failAllInProgress(*c.session, FL_ERR_SHUTDOWN, "the daemon is shutting down");
    }
    // After the last completion: from here the client fails whatever it
    // still has in flight itself -- unless the next daemon takes it over.
    if (!hand_over_) {
      __atomic_store_n(&c.session->segments->header()->daemon_state, uint32_t{FL_DAEMON_DETACHED},
                       __ATOMIC_RELEASE);
    }
  }
  clients_.wakeReaders();
  for (auto& [id, l] : links_) {
    v1::PeerMessage fin;
    fin.mutable_fin()->set_code(v1::ERROR_CODE_SHUTDOWN);
    fin.mutable_fin()->set_reason("daemon shutting down");
    if (l.session.writer) l.session.writer->send(std::move(fin));
    if (l.transport) l.transport->shutdown();
  }
}

}  // namespace framelink
