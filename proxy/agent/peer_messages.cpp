#include "agent/peer_messages.h"

#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "transport/frame_header_proto.h"

namespace framelink::peer {

bool validStreamName(const std::string& name) { return fl_stream_name_valid(name.data(), name.size()) != 0; }

namespace {

Message decodeGrant(const v1::CreditGrant& g) {
  const auto whole_credits = static_cast<size_t>(g.credits_size());
  if (whole_credits > kMaxCreditsPerStream ||
      static_cast<size_t>(g.slot_credits_size()) > kMaxCreditsPerStream - whole_credits) {
    return Violation{"peer granted more than " + std::to_string(kMaxCreditsPerStream) + " credits"};
  }
  if (static_cast<size_t>(g.regions_size()) > kMaxRegionId) {
    return Violation{"a grant announced more than " + std::to_string(kMaxRegionId) + " slot regions"};
  }
  CreditGrant out;
  out.stream_id = g.stream_id();
  out.largest_slot = g.largest_slot();
  out.pull = g.pull();
  out.regions.reserve(static_cast<size_t>(g.regions_size()));
  for (const auto& r : g.regions()) {
    if (r.region_id() == 0 || r.region_id() > kMaxRegionId) {
      return Violation{"slot region id " + std::to_string(r.region_id()) + " is outside 1.." +
                       std::to_string(kMaxRegionId)};
    }
    if (r.slot_bytes() == 0 || r.slot_count() == 0 || r.slot_count() > kMaxRegionSlots) {
      return Violation{"slot region " + std::to_string(r.region_id()) + " of " +
                       std::to_string(r.slot_count()) + " slots of " + std::to_string(r.slot_bytes()) +
                       " bytes (1.." + std::to_string(kMaxRegionSlots) + " slots of at least 1 byte)"};
    }
    out.regions.push_back(
        SlotRegion{r.region_id(), r.base_addr(), r.rkey(), r.slot_stride(), r.slot_bytes(), r.slot_count()});
  }
  out.slot_credits.assign(g.slot_credits().begin(), g.slot_credits().end());
  for (uint64_t id : out.slot_credits) {
    if (slotCreditRegion(id) == 0 || static_cast<uint32_t>(id) == 0) {
      return Violation{"slot credit " + std::to_string(id) + " names no region or has generation 0"};
    }
  }
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

// The codes a receiving daemon may refuse a frame with: a frame's own
// failures, the peer protocol's, and its transport's.  The rest (a call's
// outcome, a client's attachment, this host's device) would tell the producer
// something of its own host that a peer cannot know; they, an unknown value
// and 0 become PEER_REJECTED.
int frameFailureFromPeer(int code) {
  const bool frame = code >= FL_ERR_BAD_SLOT && code <= FL_ERR_NO_LINK;
  const bool protocol = code >= FL_ERR_PROTOCOL && code <= FL_ERR_UNKNOWN_CREDIT;
  return frame || protocol || code == FL_ERR_TRANSPORT ? code : FL_ERR_PEER_REJECTED;
}

Message decodeAck(const v1::Ack& a) {
  auto too_many = [] {
    return Violation{"ACK of more than " + std::to_string(kMaxAcksPerMessage) + " frames"};
  };
  if (static_cast<size_t>(a.sequences_size()) > kMaxAcksPerMessage) return too_many();
  if (a.runs_size() % 2 != 0) return Violation{"ACK with a run that has no count"};
  const uint32_t readers = a.readers() == 0 ? 1 : a.readers();
  // At least one reader released a frame its receiver ACKs: the one it landed in.
  if (a.skipped() >= readers) {
    return Violation{"ACK saying " + std::to_string(a.skipped()) + " of its " + std::to_string(readers) +
                     " readers were skipped"};
  }
  Ack out{a.stream_id(), {a.sequences().begin(), a.sequences().end()}, readers, a.skipped()};
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

}  // namespace

Message decode(const v1::PeerMessage& msg) {
  switch (msg.body_case()) {
    case v1::PeerMessage::kStreamOpen: {
      const auto& so = msg.stream_open();
      if (!validStreamName(so.name())) return Violation{"StreamOpen with an invalid stream name"};
      return StreamOpen{so.stream_id(), so.name()};
    }
    case v1::PeerMessage::kStreamClose:
      return StreamClose{msg.stream_close().stream_id()};
    case v1::PeerMessage::kCreditGrant:
      return decodeGrant(msg.credit_grant());
    case v1::PeerMessage::kCreditRevoke: {
      const auto& r = msg.credit_revoke();
      // No stream holds more credits, and each id named costs the receiver a
      // lookup: a longer list is work for nothing.
      if (static_cast<size_t>(r.credit_ids_size()) > kMaxCreditsPerStream) {
        return Violation{"revoke of more than " + std::to_string(kMaxCreditsPerStream) + " credits"};
      }
      if (static_cast<size_t>(r.retired_regions_size()) > kMaxRegionId) {
        return Violation{"a revoke retired more than " + std::to_string(kMaxRegionId) + " slot regions"};
      }
      return CreditRevoke{r.stream_id(),
                          {r.credit_ids().begin(), r.credit_ids().end()},
                          r.returned(),
                          {r.retired_regions().begin(), r.retired_regions().end()}};
    }
    case v1::PeerMessage::kCreditLow:
      return CreditLow{msg.credit_low().stream_id()};
    case v1::PeerMessage::kAck:
      return decodeAck(msg.ack());
    case v1::PeerMessage::kNack: {
      const auto& n = msg.nack();
      const int code = frameFailureFromPeer(static_cast<int>(n.code()));
      return Nack{n.stream_id(), n.sequence(),
                  code,          n.message().substr(0, kMaxTextBytes),
                  n.readers(),   std::min(n.released(), n.readers())};
    }
    case v1::PeerMessage::kOffer: {
      const auto& o = msg.offer();
      Offer out;
      if (!o.has_header() || !transport::fromProto(o.header(), &out.header)) {
        return Violation{"an offer without a frame header, or with more than " +
                         std::to_string(FL_MAX_ATTR_BYTES) + " attribute bytes"};
      }
      out.source = transport::RemoteSource{o.source_id(), out.header.length, o.remote_addr(), o.rkey()};
      return out;
    }
    case v1::PeerMessage::kFin:
      return Fin{static_cast<int>(msg.fin().code()), msg.fin().reason().substr(0, kMaxTextBytes)};
    case v1::PeerMessage::kKeepalive:
      return Keepalive{};
    default:
      return Violation{"unexpected message (field " + std::to_string(msg.body_case()) +
                       ") after the handshake"};
  }
}

uint64_t ackFrames(const v1::Ack& ack) {
  uint64_t frames = static_cast<uint64_t>(ack.sequences_size());
  for (int i = 1; i < ack.runs_size(); i += 2) {
    frames = ack.runs(i) > UINT64_MAX - frames ? UINT64_MAX : frames + ack.runs(i);
  }
  return frames;
}

std::string checkRecord(const v1::ControlBatch& record) {
  uint64_t frames = 0;
  for (const v1::PeerMessage& m : record.messages()) {
    if (!m.has_ack()) continue;
    const uint64_t acked = ackFrames(m.ack());
    if (acked > kMaxAckFramesPerRecord - frames) {
      return "a control record ACKs more than " + std::to_string(kMaxAckFramesPerRecord) + " frames";
    }
    frames += acked;
  }
  return {};
}

std::string SlotRegions::add(const SlotRegion& region) {
  if (!regions_.emplace(region.region_id, region).second) {
    return "slot region " + std::to_string(region.region_id) + " announced while it was announced already";
  }
  return {};
}

std::string SlotRegions::resolve(uint64_t credit_id, transport::RemoteCredit* out) const {
  auto it = regions_.find(slotCreditRegion(credit_id));
  if (it == regions_.end()) {
    return "slot credit " + std::to_string(credit_id) + " names region " +
           std::to_string(slotCreditRegion(credit_id)) + ", which was not announced";
  }
  const SlotRegion& r = it->second;
  const uint32_t slot = slotCreditSlot(credit_id);
  if (slot >= r.slot_count) {
    return "slot credit " + std::to_string(credit_id) + " names slot " + std::to_string(slot) +
           " of region " + std::to_string(r.region_id) + ", which has " + std::to_string(r.slot_count);
  }
  out->credit_id = credit_id;
  out->length = r.slot_bytes;
  out->remote_addr = r.base_addr + uint64_t{slot} * r.slot_stride;
  out->rkey = r.rkey;
  return {};
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
