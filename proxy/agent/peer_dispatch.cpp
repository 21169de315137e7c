// DataAgent's dispatch of what peers send: the per-frame messages of a
// control record and every decoded peer message, to the part that owns it
// (inbound or outbound streams) or to the link itself (Fin, violations).
#include <string>
#include <type_traits>
#include <variant>

#include "agent/data_agent.h"
#include "agent/peer_messages.h"
#include "framelink/framelink.h"

namespace framelink {

void DataAgent::onControlRecord(AgentLink& l, const std::string& record) {
  if (l.violated) return;
  metrics_.counters.control_records_received.fetch_add(1, std::memory_order_relaxed);
  v1::ControlBatch batch;
  if (!batch.ParseFromString(record)) {
    protocolError(l, "a control record of " + std::to_string(record.size()) + " bytes is not a ControlBatch");
    return;
  }
  if (std::string why = peer::checkRecord(batch); !why.empty()) {
    protocolError(l, why);
    return;
  }
  for (const v1::PeerMessage& m : batch.messages()) {
    if (!isPerFrameMessage(m)) {
      protocolError(l, "a control record carries a message of kind " + std::to_string(m.body_case()) +
                           "; only credit grants, revokes and lows, ACKs, NACKs and offers travel there");
      return;
    }
    // A closing link takes no new credits or streams, but the answers about
    // frames it carried still settle them: a peer that shuts down cleanly
    // sends its last ACKs just before its Fin, and the Session may overtake
    // them.
    if (l.closing && !m.has_ack() && !m.has_nack()) continue;
    onPeerMessage(l, m);
    if (l.violated) return;
  }
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
