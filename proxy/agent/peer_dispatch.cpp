// DataAgent's dispatch of what peers send: each link's events in turns of
// a bounded size, the per-frame messages of a control record and every
// decoded peer message, to the part that owns it (inbound or outbound
// streams) or to the link itself (Fin, violations).
#include <deque>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "agent/data_agent.h"
#include "agent/peer_messages.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"

namespace framelink {

size_t DataAgent::pollLinks() {
  size_t work = 0;
  // By id: handling an event may close a link (and erase it from links_).
  link_ids_.clear();
  for (auto& [id, l] : links_) link_ids_.push_back(id);
  for (uint64_t id : link_ids_) {
    AgentLink* l = links_.find(id);
    if (l == nullptr || !l->transport) continue;
    const uint64_t began = clock_.nowNs();
    if (began < l->next_turn_ns) continue;  // its share of the agent's time is used
    // The name outlives the scope: only onLinkDown erases a link, and
    // commands bring that, not the link's events.
    const LogScope scope(LogFields{.peer = l->peer_name});
    // A throttled link's turn is not work that keeps the agent spinning for
    // more: between its turns the agent sleeps, unless the others bring work.
    const bool throttled = l->next_turn_ns != 0;
    turn_control_ = 0;
    const size_t done = pollLink(id);
    if (!throttled) work += done;
    if ((l = links_.find(id)) == nullptr) continue;
    const uint64_t ended = clock_.nowNs();
    checkBusy(*l, ended);
    // Control records are what no credit bounds: a link whose turns they
    // have filled for kThrottleAfterNs, leaving more each time, waits
    // (kBusyTurnGap); an honest burst (grants, ACKs of many streams) is over
    // before that.  Frames are bounded by the credits this end granted, and
    // a link busy with them is not held.
    const bool control_backlog =
        l->busy && turn_control_ >= kMessagesPerLinkRound / 2 && ended - l->busy_since_ns >= kThrottleAfterNs;
    if (control_backlog && !throttled) {
      metrics_.counters.links_throttled.fetch_add(1, std::memory_order_relaxed);
    }
    l->next_turn_ns = control_backlog ? ended + kBusyTurnGap * (ended - began) : 0;
  }
  return work;
}

uint64_t DataAgent::nextBusyTurnNs() const {
  uint64_t next = 0;
  for (const auto& [id, l] : links_) {
    // Only a link still polled and still busy: one closed or cut since keeps
    // the mark of its last turn, but waits for nothing.
    if (l.transport && l.busy && l.next_turn_ns != 0 && (next == 0 || l.next_turn_ns < next)) {
      next = l.next_turn_ns;
    }
  }
  return next;
}

size_t DataAgent::pollLink(uint64_t id) {
  turn_left_ = kMessagesPerLinkRound;
  AgentLink* l = links_.find(id);
  size_t work = 0;
  // First what the link left in earlier rounds, in the order it came.
  if (l->record_rest) {
    continueRecord(*l);
    ++work;
  }
  if (!l->events_waiting.empty()) {
    std::deque<transport::TransportEvent> waiting = std::move(l->events_waiting);
    l->events_waiting.clear();
    work += waiting.size();
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      if ((l = links_.find(id)) == nullptr) return work;
      if (turn_left_ == 0 || l->record_rest) {
        std::move(it, waiting.end(), std::back_inserter(l->events_waiting));
        return work + 1;
      }
      --turn_left_;
      onTransportEvent(*l, *it);
    }
    if ((l = links_.find(id)) == nullptr) return work;
  }
  if (turn_left_ == 0 || l->record_rest) return work + 1;  // new events wait until the rest is handled
  transport::TransportEvent* events = events_.get();
  const size_t n = l->transport->poll(events, kMaxEventsPerRound);
  handleEvents(id, events, n);
  l = links_.find(id);
  const bool left = l != nullptr && (l->record_rest || !l->events_waiting.empty());
  return work + n + (left ? 1 : 0);
}

void DataAgent::handleEvents(uint64_t id, transport::TransportEvent* events, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    AgentLink* l = links_.find(id);
    if (l == nullptr) return;
    if (turn_left_ == 0 || l->record_rest) {
      // The link's turn is over: the rest waits for its next one.
      for (; i < n; ++i) l->events_waiting.push_back(std::move(events[i]));
      return;
    }
    --turn_left_;
    onTransportEvent(*l, events[i]);
  }
}

void DataAgent::checkBusy(AgentLink& l, uint64_t now_ns) {
  if (!l.record_rest && l.events_waiting.empty()) {
    l.busy = false;
    return;
  }
  if (!l.busy) {
    l.busy = true;
    l.busy_since_ns = now_ns;
    return;
  }
  const uint64_t limit_ns = uint64_t{config_.link_timeout_ms} * 1'000'000;
  if (limit_ns == 0 || l.violated || now_ns - l.busy_since_ns < limit_ns) return;
  metrics_.counters.links_cut_busy.fetch_add(1, std::memory_order_relaxed);
  protocolError(l, "its control records kept the data agent busy: every round for " +
                       std::to_string((now_ns - l.busy_since_ns) / 1'000'000) +
                       " ms (link_timeout_ms) left some for the next, beyond the " +
                       std::to_string(kMessagesPerLinkRound) + " messages a link has in a round");
  l.record_rest.reset();
  l.events_waiting.clear();
}

void DataAgent::onControlRecord(AgentLink& l, const std::string& record) {
  if (l.violated) return;
  metrics_.counters.control_records_received.fetch_add(1, std::memory_order_relaxed);
  auto batch = std::make_shared<v1::ControlBatch>();
  if (!batch->ParseFromString(record)) {
    protocolError(l, "a control record of " + std::to_string(record.size()) + " bytes is not a ControlBatch");
    return;
  }
  if (std::string why = peer::checkRecord(*batch); !why.empty()) {
    protocolError(l, why);
    return;
  }
  l.record_rest = std::move(batch);
  l.record_next = 0;
  continueRecord(l);
}

void DataAgent::continueRecord(AgentLink& l) {
  const v1::ControlBatch& batch = *l.record_rest;
  while (l.record_next < batch.messages_size() && !l.violated) {
    if (turn_left_ == 0) return;  // the rest in the link's next turn
    --turn_left_;
    ++turn_control_;
    const v1::PeerMessage& m = batch.messages(l.record_next++);
    if (!isPerFrameMessage(m)) {
      protocolError(l, "a control record carries a message of kind " + std::to_string(m.body_case()) +
                           "; only credit grants, revokes and lows, ACKs, NACKs and offers travel there");
      break;
    }
    // A closing link takes no new credits or streams, but the answers about
    // frames it carried still settle them: a peer that shuts down cleanly
    // sends its last ACKs just before its Fin, and the Session may overtake
    // them.
    if (l.closing && !m.has_ack() && !m.has_nack()) continue;
    metrics_.counters.peer_messages_received.fetch_add(1, std::memory_order_relaxed);
    onPeerMessage(l, m);
  }
  l.record_rest.reset();
  l.record_next = 0;
}

void DataAgent::onPeerMessage(AgentLink& l, const v1::PeerMessage& message) {
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, peer::Violation>) {
          protocolError(l, m.why);
        } else if constexpr (std::is_same_v<T, peer::StreamOpen>) {
          if (std::string why = inbound_.onStreamOpen(l, m); !why.empty()) protocolError(l, why);
        } else if constexpr (std::is_same_v<T, peer::StreamClose>) {
          inbound_.onStreamClose(l, m.stream_id);
        } else if constexpr (std::is_same_v<T, peer::CreditGrant>) {
          if (std::string why = outbound_.onCreditGrant(l, m); !why.empty()) protocolError(l, why);
        } else if constexpr (std::is_same_v<T, peer::CreditRevoke>) {
          if (m.returned) {
            inbound_.onCreditsReturned(l, m);
          } else {
            outbound_.onCreditRevoke(l, m);
          }
        } else if constexpr (std::is_same_v<T, peer::CreditLow>) {
          inbound_.onCreditLow(l, m);
        } else if constexpr (std::is_same_v<T, peer::Ack>) {
          for (uint64_t sequence : m.sequences) {
            outbound_.onAck(l.peer, m.stream_id, sequence, FL_OK, {}, m.readers, m.readers - m.skipped);
          }
        } else if constexpr (std::is_same_v<T, peer::Nack>) {
          outbound_.onAck(l.peer, m.stream_id, m.sequence, m.code,
                          "peer " + l.peer_name + " refused it: " + m.message, m.readers, m.released, l.id);
        } else if constexpr (std::is_same_v<T, peer::Offer>) {
          if (std::string why = inbound_.onOffer(l, m); !why.empty()) protocolError(l, why);
        } else if constexpr (std::is_same_v<T, peer::Fin>) {
          log_link_closing_.info("link {}: peer {} closes the link: {} ({})", l.id, l.peer_name, m.reason,
                                 v1::ErrorCode_IsValid(m.code)
                                     ? v1::ErrorCode_Name(static_cast<v1::ErrorCode>(m.code))
                                     : "code " + std::to_string(m.code));
          l.closing = true;
          if (l.session.cancel) l.session.cancel();
        } else {
          static_assert(std::is_same_v<T, peer::Keepalive>);
        }
      },
      peer::decode(message));
}

}  // namespace framelink
