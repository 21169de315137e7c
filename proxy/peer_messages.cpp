#include "peer_messages.h"

#include "framelink/framelink.h"
#include "framelink/shm_layout.h"

namespace framelink::peer {

bool validStreamName(const std::string& name) { return fl_stream_name_valid(name.data(), name.size()) != 0; }

Message decode(const v1::PeerMessage& msg) {
  switch (msg.body_case()) {
    case v1::PeerMessage::kStreamOpen: {
      const auto& so = msg.stream_open();
      if (!validStreamName(so.name())) return Violation{"StreamOpen with an invalid stream name"};
      return StreamOpen{so.stream_id(), so.name()};
    }
    case v1::PeerMessage::kStreamClose:
      return StreamClose{msg.stream_close().stream_id()};
    case v1::PeerMessage::kCreditGrant: {
      const auto& g = msg.credit_grant();
      if (static_cast<size_t>(g.credits_size()) > kMaxCreditsPerStream) {
        return Violation{"peer granted more than " + std::to_string(kMaxCreditsPerStream) + " credits"};
      }
      CreditGrant out;
      out.stream_id = g.stream_id();
      out.largest_slot = g.largest_slot();
      out.credits.reserve(static_cast<size_t>(g.credits_size()));
      for (const auto& cr : g.credits()) {
        if (cr.length() == 0) return Violation{"credit of zero length"};
        transport::RemoteCredit rc;
        rc.credit_id = cr.credit_id();
        rc.length = cr.length();
        rc.remote_addr = cr.remote_addr();
        rc.rkey = cr.rkey();
        out.credits.push_back(rc);
      }
      return out;
    }
    case v1::PeerMessage::kCreditRevoke: {
      const auto& r = msg.credit_revoke();
      return CreditRevoke{r.stream_id(), {r.credit_ids().begin(), r.credit_ids().end()}, r.returned()};
    }
    case v1::PeerMessage::kCreditLow:
      return CreditLow{msg.credit_low().stream_id(), msg.credit_low().credits_left()};
    case v1::PeerMessage::kAck: {
      const auto& a = msg.ack();
      auto too_many = [] {
        return Violation{"ACK of more than " + std::to_string(kMaxAcksPerMessage) + " frames"};
      };
      if (static_cast<size_t>(a.sequences_size()) > kMaxAcksPerMessage) return too_many();
      if (a.runs_size() % 2 != 0) return Violation{"ACK with a run that has no count"};
      Ack out{a.stream_id(), {a.sequences().begin(), a.sequences().end()}};
      for (int i = 0; i < a.runs_size(); i += 2) {
        const uint64_t first = a.runs(i);
        const uint64_t count = a.runs(i + 1);
        if (count < 2 || first == 0 || count - 1 > UINT64_MAX - first) {
          return Violation{"ACK run of " + std::to_string(count) + " frames from " + std::to_string(first)};
        }
        if (count > kMaxAcksPerMessage - out.sequences.size()) return too_many();
        for (uint64_t k = 0; k < count; ++k) out.sequences.push_back(first + k);
      }
      return out;
    }
    case v1::PeerMessage::kNack: {
      const auto& n = msg.nack();
      int code = static_cast<int>(n.code());
      if (code == FL_OK) code = FL_ERR_PEER_REJECTED;
      return Nack{n.stream_id(), n.sequence(), code, n.message().substr(0, kMaxTextBytes)};
    }
    case v1::PeerMessage::kFin:
      return Fin{msg.fin().reason().substr(0, kMaxTextBytes)};
    case v1::PeerMessage::kKeepalive:
      return Keepalive{};
    default:
      return Violation{"unexpected message (field " + std::to_string(msg.body_case()) +
                       ") after the handshake"};
  }
}

void encodeAck(const uint64_t* sequences, size_t count, v1::Ack* out) {
  size_t i = 0;
  while (i < count) {
    size_t run = 1;
    while (i + run < count && sequences[i + run] == sequences[i] + run) ++run;
    if (run == 1) {
      out->add_sequences(sequences[i]);
    } else {
      out->add_runs(sequences[i]);
      out->add_runs(run);
    }
    i += run;
  }
}

}  // namespace framelink::peer
