// The frame header on the `grpc` data transport: framelink.v1.FrameHeader
// (proto/framelink/v1/link.proto), carried by the first DataMessage of each
// frame.  These are the grpc wire's only converters to and from the daemon's
// FrameHeader.
//
// The namespace is framelink::transport (not ...::grpc, which would shadow
// ::grpc inside it).
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
