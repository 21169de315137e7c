// The daemon's one in-memory frame header, and its mapping to the
// shared-memory slot header (fl_slot_header, include/framelink/shm_layout.h).
//
// Every wire converts to and from this type in exactly one place, next to the
// wire's format:
//   shared memory   fl_slot_header          toSlotHeader / fromSlotHeader (here)
//   tcp             tcp::TcpFrameHeader     tcp::toWire / tcp::fromWire (tcp/tcp_wire.h)
//   rdma            fl_slot_header itself   rdma::toWire / rdma::fromWire (rdma/rdma_wire.h)
//   grpc            framelink.v1.FrameHeader  toProto / fromProto (frame_header_proto.h,
//                                             in grpc/grpc_wire.cpp; peer messages use them too)
// The loopback transport hands the struct itself to the other end.
#pragma once

#include <cstdint>
#include <cstring>

#include "framelink/shm_layout.h"

namespace framelink::transport {

struct FrameHeader {
  uint64_t stream_id = 0;
  uint64_t sequence = 0;
  uint64_t credit_id = 0;
  uint64_t frame_id = 0;
  uint64_t group_id = 0;
  uint64_t timestamp_ns = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;
  uint32_t has_crc32c = 0;
  uint32_t attr_length = 0;  // <= FL_MAX_ATTR_BYTES
  // Sent again to a new instance of the receiving daemon: the instance before
  // it may have delivered the frame (FL_SLOT_MAYBE_REDELIVERED for the consumer).
  uint32_t maybe_redelivered = 0;
  // For the subscribers on the receiving host only: a member of the stream's
  // queue group on another host has it (FL_SLOT_GROUP_ELSEWHERE).
  uint32_t subscribers_only = 0;
  uint8_t attrs[FL_MAX_ATTR_BYTES] = {};
};

// Writes what a slot header holds of a frame: ids, timestamp, length,
// sequence, CRC32C, flags (FL_SLOT_HAS_CRC32C, FL_SLOT_MAYBE_REDELIVERED, FL_SLOT_GROUP_ELSEWHERE),
// attr_length and the first attr_length attribute bytes (never more than
// FL_MAX_ATTR_BYTES).  The reserved fields and the attribute bytes past
// attr_length are left as they are: the rdma wire carries data in the
// former, and the bytes of a slot header that an RDMA write landed must not
// change under it.  stream_id and credit_id have no place in a slot header.
inline void toSlotHeader(const FrameHeader& h, fl_slot_header* s) noexcept {
  s->frame_id = h.frame_id;
  s->group_id = h.group_id;
  s->timestamp_ns = h.timestamp_ns;
  s->length = h.length;
  s->sequence = h.sequence;
  s->crc32c = h.crc32c;
  s->flags = (h.has_crc32c ? uint32_t{FL_SLOT_HAS_CRC32C} : 0u) |
             (h.maybe_redelivered ? uint32_t{FL_SLOT_MAYBE_REDELIVERED} : 0u) |
             (h.subscribers_only ? uint32_t{FL_SLOT_GROUP_ELSEWHERE} : 0u);
  s->attr_length = h.attr_length;
  std::memcpy(s->attrs, h.attrs, h.attr_length <= FL_MAX_ATTR_BYTES ? h.attr_length : FL_MAX_ATTR_BYTES);
}

// Reads `s`, a private copy the caller took (shared memory can change under
// a reader), into the fields a slot header carries; stream_id, credit_id and
// the attribute bytes past attr_length are left as they are.  An
// attr_length above FL_MAX_ATTR_BYTES becomes 0 with no attributes: a caller
// that must refuse such a header checks s.attr_length itself and says why.
inline void fromSlotHeader(const fl_slot_header& s, FrameHeader* h) noexcept {
  h->frame_id = s.frame_id;
  h->group_id = s.group_id;
  h->timestamp_ns = s.timestamp_ns;
  h->length = s.length;
  h->sequence = s.sequence;
  h->crc32c = s.crc32c;
  h->has_crc32c = (s.flags & FL_SLOT_HAS_CRC32C) ? 1 : 0;
  h->maybe_redelivered = (s.flags & FL_SLOT_MAYBE_REDELIVERED) ? 1 : 0;
  h->subscribers_only = (s.flags & FL_SLOT_GROUP_ELSEWHERE) ? 1 : 0;
  h->attr_length = s.attr_length <= FL_MAX_ATTR_BYTES ? s.attr_length : 0;
  std::memcpy(h->attrs, s.attrs, h->attr_length);
}

}  // namespace framelink::transport
