#include "transport/grpc/grpc_wire.h"

#include <cstring>

namespace framelink::transport {

void toProto(const FrameHeader& h, framelink::v1::FrameHeader* p) {
  p->set_stream_id(h.stream_id);
  p->set_sequence(h.sequence);
  p->set_credit_id(h.credit_id);
  p->set_frame_id(h.frame_id);
  p->set_wafer_id(h.wafer_id);
  p->set_timestamp_ns(h.timestamp_ns);
  p->set_length(h.length);
  p->set_has_crc32c(h.has_crc32c != 0);
  p->set_maybe_redelivered(h.maybe_redelivered != 0);
  p->set_crc32c(h.crc32c);
  p->set_attributes(reinterpret_cast<const char*>(h.attrs),
                    h.attr_length <= FL_MAX_ATTR_BYTES ? h.attr_length : FL_MAX_ATTR_BYTES);
}

bool fromProto(const framelink::v1::FrameHeader& p, FrameHeader* h) noexcept {
  if (p.attributes().size() > FL_MAX_ATTR_BYTES) return false;
  *h = FrameHeader{};
  h->stream_id = p.stream_id();
  h->sequence = p.sequence();
  h->credit_id = p.credit_id();
  h->frame_id = p.frame_id();
  h->wafer_id = p.wafer_id();
  h->timestamp_ns = p.timestamp_ns();
  h->length = p.length();
  h->crc32c = p.crc32c();
  h->has_crc32c = p.has_crc32c() ? 1 : 0;
  h->maybe_redelivered = p.maybe_redelivered() ? 1 : 0;
  h->attr_length = static_cast<uint32_t>(p.attributes().size());
  std::memcpy(h->attrs, p.attributes().data(), h->attr_length);
  return true;
}

}  // namespace framelink::transport
