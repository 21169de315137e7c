// What the rdma transport puts on the wire.
//
// 1. The frame header: the first SGE of every RDMA_WRITE_WITH_IMM.  It lands
//    in the 256 bytes right before the credited payload, which in the
//    daemon's segment layout is the slot's fl_slot_header; so the wire header
//    *is* an fl_slot_header (RdmaWireHeader is that type, not a copy of its
//    layout), written with the slot header's own converter, and what lands is
//    already a valid slot header.  Two fields fl_slot_header keeps reserved
//    carry what a slot header has no place for:
//      reserved0  has_crc32c (0 or 1; flags has FL_SLOT_HAS_CRC32C too, but a
//                 receiver reads this one)
//      reserved1  stream_id (8 bytes)
//    The credit id is not carried: the immediate data names the receiver's
//    credit slot, and the receiver knows its credit id.
// 2. Control records (Transport::postControl): each record goes as one or
//    more SEND_WITH_IMM fragments of 1 to kControlChunkBytes bytes, sent
//    back to back on the queue pair (never interleaved with another
//    record's), each landing in one receive WR's buffer.  The immediate data
//    says whether more fragments of the record follow (kControlImmMore) or
//    this is the last one (kControlImmLast); the receiver appends fragments
//    in arrival order and fails the link with FL_ERR_PROTOCOL when a record
//    grows beyond kMaxControlBytes, or on any other immediate value.  Frames
//    (RDMA_WRITE_WITH_IMM) consume receive WRs too, without touching their
//    buffers, and may sit between two fragments of a record.
// 3. RdmaConnectData / RdmaRejectData: rdma_cm private data of the connect
//    request and of a reject.  Version 2 added control records.
//
// Both peers are little-endian x86-64/aarch64 hosts; integers go as they lie
// in memory, except the immediate data, which verbs defines as big-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "framelink/shm_layout.h"
#include "transport/frame_header.h"
#include "transport/token_digest.h"

namespace framelink::transport::rdma {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the rdma wire format is little-endian; add byte swapping for this host");

using RdmaWireHeader = fl_slot_header;
static_assert(sizeof(fl_slot_header::reserved0) == sizeof(FrameHeader::has_crc32c));
static_assert(sizeof(fl_slot_header::reserved1) == sizeof(FrameHeader::stream_id));

inline constexpr size_t kWireHeaderBytes = sizeof(RdmaWireHeader);  // 256

// The immediate data names the credit a frame consumed, not the slot its
// write landed in, and the receiver reads the header from the named credit's
// slot.  A slot header left by an earlier frame would pass for a header the
// peer never wrote there (a write into credit A's window naming credit B
// would deliver B's old frame again), so the transport poisons the header's
// length when it exposes a credit: a frame must bring its own header, and
// one that finds the poison was written somewhere else.
inline constexpr uint64_t kPoisonedLength = ~uint64_t{0};

inline void poisonHeader(uint8_t* landing) noexcept {
  std::memcpy(landing + offsetof(RdmaWireHeader, length), &kPoisonedLength, sizeof kPoisonedLength);
}

inline void toWire(const FrameHeader& h, RdmaWireHeader* w) noexcept {
  toSlotHeader(h, w);
  // The send-header buffers are reused across the link's streams: the bytes
  // past attr_length would carry an earlier frame's attributes (of another
  // stream, perhaps) into this consumer's slot.
  const uint32_t n = h.attr_length <= FL_MAX_ATTR_BYTES ? h.attr_length : FL_MAX_ATTR_BYTES;
  std::memset(w->attrs + n, 0, FL_MAX_ATTR_BYTES - n);
  w->reserved0 = h.has_crc32c;
  std::memcpy(w->reserved1, &h.stream_id, sizeof w->reserved1);
}

// `w` is a copy the caller took out of the landing region; credit_id comes
// from the receiver's own table.  An attr_length above FL_MAX_ATTR_BYTES
// becomes 0 (the transport fails the link on it, reading w.attr_length).
inline void fromWire(const RdmaWireHeader& w, uint64_t credit_id, FrameHeader* h) noexcept {
  fromSlotHeader(w, h);
  h->has_crc32c = w.reserved0;
  std::memcpy(&h->stream_id, w.reserved1, sizeof h->stream_id);
  h->credit_id = credit_id;
}

// Control fragments: the payload of a SEND_WITH_IMM, and the size of the
// buffer every receive WR carries.
inline constexpr uint32_t kControlChunkBytes = 4096;
inline constexpr uint32_t kControlImmMore = 0x464C4301;  // "FLC" 1: more fragments follow
inline constexpr uint32_t kControlImmLast = 0x464C4302;  // "FLC" 2: the record ends here

inline constexpr uint32_t kRdmaConnectMagic = 0x4D44524C;  // "LRDM"
inline constexpr uint16_t kRdmaProtocolVersion = 3;        // 3: the token proof in RdmaConnectData

// Private data of rdma_connect (at most 56 bytes for RC).  `token` proves
// the token the Session of `session_id` proved (transport/token_digest.h),
// so that knowing a session id -- it crosses the network in clear -- is not
// enough to take that Session's data channel.
struct RdmaConnectData {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint64_t session_id;
  uint8_t token[kTokenDigestBytes];
};
static_assert(sizeof(RdmaConnectData) == 48);
// What every version has: enough to say which version a request speaks.
inline constexpr size_t kRdmaConnectPrefixBytes = 16;

// Private data of rdma_reject, so the dialer can say why.
struct RdmaRejectData {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int32_t status;  // fl_status: FL_ERR_AUTH (unknown session), FL_ERR_PEER_VERSION, ...
  uint32_t reserved2;
};
static_assert(sizeof(RdmaRejectData) == 16);

}  // namespace framelink::transport::rdma
