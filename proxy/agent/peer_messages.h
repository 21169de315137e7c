// The peer protocol as the data agent reads it: every control message a peer
// daemon sends after the handshake, bounded and validated here, in one
// place, and turned into a plain struct.  Whatever gets past decode() is
// within the protocol's bounds; what depends on the agent's state (a grant
// for a stream it knows, the streams a link has open) is checked where that
// state lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "framelink/framelink.h"
#include "framelink/v1/link.pb.h"
#include "transport/transport.h"

namespace framelink::peer {

constexpr size_t kMaxCreditsPerStream = 65536;  // bound on what a peer may grant us on one stream
constexpr size_t kMaxAcksPerMessage = 4096;     // frames one ACK may name
constexpr size_t kMaxStreamsPerLink = 4096;     // streams a peer may have open on one link
constexpr size_t kMaxTextBytes = 256;           // what a NACK message or Fin reason keeps
// Frames the ACKs of one control record may name in all, a run counting
// each of its frames: a run names 4096 frames in a few bytes, and each
// frame named costs the receiver a lookup.  A frame for each credit a
// stream may hold; a sender cuts its records to stay within it
// (AgentLink::send).
constexpr size_t kMaxAckFramesPerRecord = kMaxCreditsPerStream;

// A NACK the sender answers by sending the frame again (it was damaged on
// the way, or landed in a credit withdrawn meanwhile), not by failing it.
constexpr bool resendable(int nack_code) {
  return nack_code == FL_ERR_CRC_MISMATCH || nack_code == FL_ERR_UNKNOWN_CREDIT;
}

// Slot credits: region_id << 52 | slot << 32 | generation.  The generation
// is the low 32 bits, which the rdma transport sends as immediate data, so
// it alone tells the live credits of a link apart; it is never 0, and a
// credit id below 2^32 (region 0) is one sent as a whole Credit.
constexpr uint32_t kMaxRegionId = (1u << 12) - 1;  // region ids a link may have announced at once
constexpr uint32_t kMaxRegionSlots = 1u << 20;     // slots of one region
constexpr uint64_t slotCreditId(uint32_t region_id, uint32_t slot, uint32_t generation) {
  return uint64_t{region_id} << 52 | uint64_t{slot} << 32 | generation;
}
constexpr uint32_t slotCreditRegion(uint64_t credit_id) { return static_cast<uint32_t>(credit_id >> 52); }
constexpr uint32_t slotCreditSlot(uint64_t credit_id) {
  return static_cast<uint32_t>(credit_id >> 32) & (kMaxRegionSlots - 1);
}

struct StreamOpen {
  uint64_t stream_id = 0;
  std::string name;
};
struct StreamClose {
  uint64_t stream_id = 0;
};
// A consumer's receive slots as one region (link.proto SlotRegion): the
// first grant that names one of them announces it on the link, and from then
// on a credit for one of its slots is a slot credit, an id alone.
struct SlotRegion {
  uint32_t region_id = 0;  // 1..kMaxRegionId
  uint64_t base_addr = 0;
  uint32_t rkey = 0;
  uint64_t slot_stride = 0;
  uint64_t slot_bytes = 0;  // non-zero
  uint32_t slot_count = 0;  // 1..kMaxRegionSlots
};
struct CreditGrant {
  uint64_t stream_id = 0;
  std::vector<transport::RemoteCredit> credits;  // each of a non-zero length
  uint64_t largest_slot = 0;                     // of the stream's consumers; 0: not said
  std::vector<SlotRegion> regions;               // announced by this grant
  std::vector<uint64_t> slot_credits;            // each of a region (slotCreditRegion != 0)
  bool pull = false;                             // offer frames into these credits, do not write them
};
struct CreditRevoke {
  uint64_t stream_id = 0;
  std::vector<uint64_t> credit_ids;       // at most kMaxCreditsPerStream
  bool returned = false;                  // the sender gives back credits it did not use
  std::vector<uint32_t> retired_regions;  // from the receiver: these regions are gone
};
// The sender's credits on the stream fell to a quarter of what it held.
struct CreditLow {
  uint64_t stream_id = 0;
};
struct Ack {
  uint64_t stream_id = 0;
  std::vector<uint64_t> sequences;  // at most kMaxAcksPerMessage
  uint32_t readers = 1;             // each of them was meant for on the receiving host
  uint32_t skipped = 0;             // of those, skipped (a drop stream); the others released it
};
struct Nack {
  uint64_t stream_id = 0;
  uint64_t sequence = 0;
  int code = 0;           // never FL_OK: a NACK without a code is FL_ERR_PEER_REJECTED
  std::string message;    // at most kMaxTextBytes
  uint32_t readers = 0;   // on the receiving host that it reached
  uint32_t released = 0;  // of those, that released it
};
// Pull: a frame the sender offers into one of the credits it holds; the
// receiver reads `source` into that credit's slot.
struct Offer {
  transport::FrameHeader header;   // attributes within FL_MAX_ATTR_BYTES
  transport::RemoteSource source;  // source.length == header.length
};
struct Fin {
  int code = 0;        // a v1::ErrorCode, as the peer sent it
  std::string reason;  // at most kMaxTextBytes
};
struct Keepalive {};
// Out of the protocol's bounds: the link it came on is closed with a
// Fin(PROTOCOL) saying why.
struct Violation {
  std::string why;
};

using Message = std::variant<StreamOpen, StreamClose, CreditGrant, CreditRevoke, CreditLow, Ack, Nack, Offer,
                             Fin, Keepalive, Violation>;

Message decode(const v1::PeerMessage& message);

// The frames an ACK names: its single sequences and the counts of its runs
// (as sent, not validated: decode() does that), saturating.
uint64_t ackFrames(const v1::Ack& ack);
// Empty, or why a control record as a whole breaks the protocol: its ACKs
// name more than kMaxAckFramesPerRecord frames together.  Checked before
// any of its messages is decoded and acted on.
std::string checkRecord(const v1::ControlBatch& record);

// Fills `out` (stream_id aside) with these sequences, at most
// kMaxAcksPerMessage: each run of consecutive ones as a (first, count) pair,
// the others one by one.  decode() gives back the same sequences in the
// same order.
void encodeAck(const uint64_t* sequences, size_t count, v1::Ack* out);

// The regions a peer announced on one link, which its slot credits name:
// what turns a slot credit back into the RemoteCredit a frame is posted to.
class SlotRegions {
 public:
  // Empty, or why the announcement breaks the protocol (the id is
  // announced already: a region is retired before its id is used again).
  std::string add(const SlotRegion& region);
  void retire(uint32_t region_id) { regions_.erase(region_id); }
  // The credit a slot credit names; empty, or why it names nothing (its
  // region was never announced, or retired; its slot lies past the region).
  std::string resolve(uint64_t credit_id, transport::RemoteCredit* out) const;

 private:
  std::unordered_map<uint32_t, SlotRegion> regions_;
};

// A stream name a peer may open: 1..FL_STREAM_NAME_MAX-1 of [A-Za-z0-9._-].
bool validStreamName(const std::string& name);

}  // namespace framelink::peer
