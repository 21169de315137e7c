// The grpc transport's receiving side, either end: each message a read
// completes is parsed and reassembled into the credited buffer (a frame) or
// the read's (a read response); a read request is queued for the sender.
// One copy: from gRPC's receive slices straight into that buffer.
#include <string>

#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/grpc_wire.h"

namespace framelink::transport {

void GrpcTransport::abandonFrame() noexcept {
  if (credit_) {
    core_->endReceive();
    credit_.reset();
  }
  in_frame_ = false;
  in_response_ = false;
  response_buffer_ = nullptr;
}

bool GrpcTransport::violation(const std::string& what) noexcept {
  abandonFrame();
  failLink(FL_ERR_PROTOCOL, "grpc data link with " + peer_name_ + ": " + what);
  return false;
}

bool GrpcTransport::handleBuffer(grpc::ByteBuffer* buffer) noexcept {
  std::string malformed;
  try {
    malformed = parseDataMessage(buffer, &received_);
  } catch (...) {  // bad_alloc
    malformed = "out of memory while parsing a message";
  }
  if (malformed.empty()) {
    const bool ok = handleMessage(received_);
    received_.slices.clear();  // gRPC's receive buffers go back now, not with the next message
    return ok;
  }
  abandonFrame();
  failLink(FL_ERR_PROTOCOL, "grpc data link with " + peer_name_ + ": malformed DataMessage: " + malformed);
  return false;
}

bool GrpcTransport::handleMessage(const ReceivedDataMessage& m) noexcept {
  if (m.frame_count > 0) return handleBatch(m);
  const bool chunk_data =
      m.has_header || m.has_read_response || m.payload_bytes != 0 || m.offset != 0 || m.last;
  if (!m.control.empty()) {
    if (chunk_data || m.has_read_request) {
      return violation("a control record shares its message with frame data");
    }
    if (m.control.size() > kMaxControlBytes) {
      return violation("control record of " + std::to_string(m.control.size()) + " bytes exceeds " +
                       std::to_string(kMaxControlBytes));
    }
    core_->controlArrived(m.control);
    return true;
  }
  if (m.has_read_request) {
    if (chunk_data) return violation("a read request shares its message with frame data");
    return handleReadRequest(m.read_request);
  }
  if (in_response_ || (!in_frame_ && m.has_read_response)) return handleResponseChunk(m);
  if (!in_frame_) {
    if (!m.has_header) return violation("chunk without a frame header");
    if (!beginFrame(m.header)) return false;
  } else if (m.has_header) {
    return violation("frame header in the middle of frame " + std::to_string(frame_.sequence));
  } else if (m.has_read_response) {
    return violation("read response in the middle of frame " + std::to_string(frame_.sequence));
  }
  return landChunk(m, SIZE_MAX, m.offset, m.payload_bytes, m.last);
}

bool GrpcTransport::handleBatch(const ReceivedDataMessage& m) noexcept {
  if (m.has_header || m.has_read_response || m.payload_bytes != 0 || m.offset != 0 || m.last ||
      !m.control.empty() || m.has_read_request) {
    return violation("batched frames share their message with other fields");
  }
  if (in_frame_ || in_response_) {
    return violation("batched frames in the middle of " +
                     (in_frame_ ? "frame " + std::to_string(frame_.sequence)
                                : "the response to read " + std::to_string(response_read_)));
  }
  for (size_t i = 0; i < m.frame_count; ++i) {
    if (!beginFrame(m.frames[i].header)) return false;
    if (!landChunk(m, i, 0, m.frames[i].payload_bytes, true)) return false;
  }
  return true;
}

bool GrpcTransport::landChunk(const ReceivedDataMessage& m, size_t frame, uint64_t offset, uint64_t bytes,
                              bool last) noexcept {
  if (offset != offset_) {
    return violation("chunk at offset " + std::to_string(offset) + ", expected " + std::to_string(offset_));
  }
  if (bytes > frame_.length - offset_) {
    return violation("chunk runs past the frame length " + std::to_string(frame_.length));
  }
  // The one copy on this side: from gRPC's receive slices into the slot.
  // A credit retracted in the middle of the frame may already stand for
  // another frame in that slot: the rest of this one is read and dropped,
  // and endReceive reports it as for a retracted credit.
  if (credit_ && bytes > 0) {
    uint8_t* dst = credit_->buffer + offset_;
    if (frame == SIZE_MAX) {
      core_->copyIntoLanding([&m, dst] { m.copyPayload(dst); });
    } else {
      core_->copyIntoLanding([&m, frame, dst] { m.copyFramePayload(frame, dst); });
    }
  }
  offset_ += bytes;
  if (!last) return true;
  if (offset_ != frame_.length) {
    return violation("last chunk at " + std::to_string(offset_) + " of " + std::to_string(frame_.length) +
                     " bytes");
  }
  in_frame_ = false;
  if (!credit_) {
    core_->frameArrived(frame_, FL_ERR_UNKNOWN_CREDIT,
                        "frame for unknown or retracted credit " + std::to_string(frame_.credit_id));
    return true;
  }
  credit_.reset();
  if (core_->endReceive()) {
    core_->frameArrived(frame_, FL_OK);
  } else {
    core_->frameArrived(
        frame_, FL_ERR_UNKNOWN_CREDIT,
        "credit " + std::to_string(frame_.credit_id) + " was retracted while the frame landed");
  }
  return true;
}

bool GrpcTransport::handleReadRequest(const framelink::v1::ReadRequest& q) noexcept {
  const int status = core_->answerRead(ReadAsk{q.source_id(), q.read_id(), q.length()});
  if (status == FL_ERR_PROTOCOL) {
    return violation("peer has more than " + std::to_string(kMaxReadsOutstanding) + " reads unanswered");
  }
  if (status != FL_OK) {
    abandonFrame();
    failLink(status, "grpc data link with " + peer_name_ + ": out of memory for a read response");
    return false;
  }
  return true;
}

bool GrpcTransport::beginFrame(const framelink::v1::FrameHeader& p) noexcept {
  if (!fromProto(p, &frame_)) {
    return violation("attributes of " + std::to_string(p.attributes().size()) + " bytes exceed " +
                     std::to_string(FL_MAX_ATTR_BYTES));
  }
  offset_ = 0;
  in_frame_ = true;
  credit_ = core_->beginReceive(frame_.credit_id);
  if (credit_ && frame_.length > credit_->capacity) {
    return violation("frame of " + std::to_string(frame_.length) + " bytes exceeds credit " +
                     std::to_string(frame_.credit_id) + " of " + std::to_string(credit_->capacity) +
                     " bytes");
  }
  if (!credit_ && frame_.length > options_.max_frame_bytes) {
    return violation("frame of " + std::to_string(frame_.length) + " bytes for unknown credit " +
                     std::to_string(frame_.credit_id) + " exceeds max_frame_bytes");
  }
  return true;
}

bool GrpcTransport::handleResponseChunk(const ReceivedDataMessage& m) noexcept {
  if (!in_response_) {
    const framelink::v1::ReadResponse& r = m.read_response;
    if (m.has_header) return violation("a read response shares its message with a frame header");
    const std::optional<ReadRequest> read = core_->findRead(r.read_id());
    if (!read) {
      return violation("read response for read " + std::to_string(r.read_id()) +
                       ", which is not outstanding");
    }
    if (r.no_source() && r.length() == 0 && m.payload_bytes == 0 && m.offset == 0 && m.last) {
      core_->readDone(r.read_id(), FL_ERR_UNKNOWN_CREDIT, 0,
                      "the peer has no source " + std::to_string(read->source.source_id) + " of " +
                          std::to_string(read->source.length) +
                          " bytes (retracted, never offered, or offered with another length)");
      return true;
    }
    // Checked before a byte lands: the buffer holds exactly the asked length.
    if (r.no_source() || r.length() != read->source.length || r.source_id() != read->source.source_id) {
      return violation("read response for read " + std::to_string(r.read_id()) +
                       " does not match its request (source " + std::to_string(r.source_id()) + ", " +
                       std::to_string(r.length()) + " bytes" + (r.no_source() ? ", no source" : "") + ")");
    }
    in_response_ = true;
    response_read_ = r.read_id();
    response_length_ = r.length();
    response_buffer_ = read->buffer;
    offset_ = 0;
  } else if (m.has_header || m.has_read_response) {
    return violation(std::string(m.has_header ? "frame header" : "read response") +
                     " in the middle of the response to read " + std::to_string(response_read_));
  }
  if (m.offset != offset_) {
    return violation("read response chunk at offset " + std::to_string(m.offset) + ", expected " +
                     std::to_string(offset_));
  }
  if (m.payload_bytes > response_length_ - offset_) {
    return violation("read response chunk runs past the length " + std::to_string(response_length_));
  }
  // The one copy on this side, as for a frame: gRPC's receive slices into
  // the read's buffer, unless the link failed meanwhile and gave it back.
  if (m.payload_bytes > 0) {
    uint8_t* dst = response_buffer_ + offset_;
    core_->copyIntoRead(response_read_, [&m, dst] { m.copyPayload(dst); });
  }
  offset_ += m.payload_bytes;
  if (!m.last) return true;
  if (offset_ != response_length_) {
    return violation("last read response chunk at " + std::to_string(offset_) + " of " +
                     std::to_string(response_length_) + " bytes");
  }
  in_response_ = false;
  response_buffer_ = nullptr;
  core_->readDone(response_read_, FL_OK, response_length_);
  return true;
}

}  // namespace framelink::transport
