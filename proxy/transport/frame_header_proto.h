// FrameHeader to and from framelink.v1.FrameHeader (proto/framelink/v1/link.proto).
//
// The protobuf header is the grpc transport's wire form of a header
// (grpc/grpc_wire.h) and also what peer messages carry (an Offer's header,
// which the data agent builds and decodes), so the two converters belong to
// the transport interface; they are defined in grpc/grpc_wire.cpp, next to
// the rest of that wire (frame_header.h: every wire converts in one place).
#pragma once

#include "framelink/v1/link.pb.h"
#include "transport/frame_header.h"

namespace framelink::transport {

// Sends the first attr_length attribute bytes (at most FL_MAX_ATTR_BYTES).
void toProto(const FrameHeader& h, framelink::v1::FrameHeader* p);

// Refuses (false, `h` untouched) a header whose attributes exceed
// FL_MAX_ATTR_BYTES: the receiver fails the link on it.  Otherwise fills
// every field of `h`; the attribute bytes past attr_length are zero.
bool fromProto(const framelink::v1::FrameHeader& p, FrameHeader* h) noexcept;

}  // namespace framelink::transport
