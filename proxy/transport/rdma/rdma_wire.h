// What the rdma transport puts on the wire.
//
// 1. RdmaWireHeader: the first SGE of every RDMA_WRITE_WITH_IMM.  It lands
//    in the 256 bytes right before the credited payload, which in the
//    daemon's segment layout is the slot's fl_slot_header; so the field
//    offsets are those of fl_slot_header, and what lands is already a valid
//    slot header.  Fields fl_slot_header keeps reserved carry what a slot
//    header has no place for: has_crc32c (reserved0) and stream_id
//    (reserved1).  The credit id is not carried: the immediate data names the
//    receiver's credit slot, and the receiver knows its credit id.
// 2. RdmaConnectData / RdmaRejectData: rdma_cm private data of the connect
//    request and of a reject.
//
// Both peers are little-endian x86-64/aarch64 hosts; integers go as they lie
// in memory, except the immediate data, which verbs defines as big-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "framelink/shm_layout.h"
#include "transport/transport.h"

namespace framelink::transport::rdma {

struct RdmaWireHeader {
  uint64_t frame_id;
  uint64_t wafer_id;
  uint64_t timestamp_ns;
  uint64_t length;  // payload bytes that follow in the same write
  uint64_t sequence;
  uint32_t crc32c;
  uint32_t flags;  // FL_SLOT_HAS_CRC32C when has_crc32c, FL_SLOT_MAYBE_REDELIVERED
  uint32_t attr_length;
  uint32_t has_crc32c;  // fl_slot_header.reserved0
  uint64_t stream_id;   // fl_slot_header.reserved1
  uint8_t attrs[FL_MAX_ATTR_BYTES];
};

static_assert(sizeof(RdmaWireHeader) == sizeof(fl_slot_header), "wire header is a slot header");
static_assert(offsetof(RdmaWireHeader, frame_id) == offsetof(fl_slot_header, frame_id));
static_assert(offsetof(RdmaWireHeader, wafer_id) == offsetof(fl_slot_header, wafer_id));
static_assert(offsetof(RdmaWireHeader, timestamp_ns) == offsetof(fl_slot_header, timestamp_ns));
static_assert(offsetof(RdmaWireHeader, length) == offsetof(fl_slot_header, length));
static_assert(offsetof(RdmaWireHeader, sequence) == offsetof(fl_slot_header, sequence));
static_assert(offsetof(RdmaWireHeader, crc32c) == offsetof(fl_slot_header, crc32c));
static_assert(offsetof(RdmaWireHeader, flags) == offsetof(fl_slot_header, flags));
static_assert(offsetof(RdmaWireHeader, attr_length) == offsetof(fl_slot_header, attr_length));
static_assert(offsetof(RdmaWireHeader, has_crc32c) == offsetof(fl_slot_header, reserved0));
static_assert(offsetof(RdmaWireHeader, stream_id) == offsetof(fl_slot_header, reserved1));
static_assert(offsetof(RdmaWireHeader, attrs) == offsetof(fl_slot_header, attrs));

inline constexpr size_t kWireHeaderBytes = sizeof(RdmaWireHeader);  // 256

inline void toWire(const FrameHeader& h, RdmaWireHeader* w) noexcept {
  w->frame_id = h.frame_id;
  w->wafer_id = h.wafer_id;
  w->timestamp_ns = h.timestamp_ns;
  w->length = h.length;
  w->sequence = h.sequence;
  w->crc32c = h.crc32c;
  w->flags = (h.has_crc32c ? static_cast<uint32_t>(FL_SLOT_HAS_CRC32C) : 0u) |
             (h.maybe_redelivered ? static_cast<uint32_t>(FL_SLOT_MAYBE_REDELIVERED) : 0u);
  w->attr_length = h.attr_length;
  w->has_crc32c = h.has_crc32c;
  w->stream_id = h.stream_id;
  std::memcpy(w->attrs, h.attrs, h.attr_length <= FL_MAX_ATTR_BYTES ? h.attr_length : FL_MAX_ATTR_BYTES);
}

// `w` is a copy the caller took out of the landing region; credit_id comes
// from the receiver's own table.
inline void fromWire(const RdmaWireHeader& w, uint64_t credit_id, FrameHeader* h) noexcept {
  h->stream_id = w.stream_id;
  h->sequence = w.sequence;
  h->credit_id = credit_id;
  h->frame_id = w.frame_id;
  h->wafer_id = w.wafer_id;
  h->timestamp_ns = w.timestamp_ns;
  h->length = w.length;
  h->crc32c = w.crc32c;
  h->has_crc32c = w.has_crc32c;
  h->maybe_redelivered = (w.flags & FL_SLOT_MAYBE_REDELIVERED) ? 1 : 0;
  h->attr_length = w.attr_length <= FL_MAX_ATTR_BYTES ? w.attr_length : 0;
  std::memcpy(h->attrs, w.attrs, h->attr_length);
}

inline constexpr uint32_t kRdmaConnectMagic = 0x4D44524C;  // "LRDM"
inline constexpr uint16_t kRdmaProtocolVersion = 1;

// Private data of rdma_connect (at most 56 bytes for RC).
struct RdmaConnectData {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint64_t session_id;
};
static_assert(sizeof(RdmaConnectData) == 16);

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
