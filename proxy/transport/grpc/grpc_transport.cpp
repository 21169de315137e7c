// Parts of the grpc transport shared by the dialing and the serving side:
// chunking on send, reassembly on receive.
#include "transport/grpc/grpc_transport.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "transport/grpc/grpc_wire.h"

namespace framelink::transport {

namespace {

GrpcTransportOptions clampOptions(GrpcTransportOptions o) {
  o.chunk_bytes = std::clamp<size_t>(o.chunk_bytes, 4096, kMaxGrpcChunkBytes);
  return o;
}

}  // namespace

GrpcTransport::GrpcTransport(std::string peer_name, const GrpcTransportOptions& options,
                             std::unique_ptr<TransportCore> core)
    : peer_name_(std::move(peer_name)), options_(clampOptions(options)), core_(std::move(core)) {}

GrpcTransport::~GrpcTransport() = default;

void GrpcTransport::failLink(int status, const std::string& message) noexcept {
  if (!core_->fail(status, message)) return;
  if (status != FL_ERR_SHUTDOWN) spdlog::warn("{}", message);
  cancelStream();
}

// ---------------------------------------------------------------- sending

void GrpcTransport::senderLoop() noexcept {
  framelink::v1::DataMessage msg;  // reused: keeps the payload string's capacity
  TransportCore::Outgoing out;
  while (core_->nextSend(&out)) {
    bool ok = true;
    try {
      for (size_t i = 0; ok && i < out.control.size(); ++i) {
        msg.Clear();
        msg.set_control(std::move(out.control[i]));
        // Held back while a frame or more control follows at once, so they share a write.
        ok = writeMessage(msg, out.has_frame || i + 1 < out.control.size());
      }
    } catch (...) {  // bad_alloc from protobuf
      ok = false;
    }
    if (!out.has_frame) {
      if (!ok) return;
      continue;
    }
    const SendRequest& r = out.frame;
    const uint64_t length = r.header.length;
    uint64_t offset = 0;
    try {
      while (ok) {
        msg.Clear();
        if (offset == 0) toProto(r.header, msg.mutable_header());
        size_t n = static_cast<size_t>(std::min<uint64_t>(options_.chunk_bytes, length - offset));
        msg.set_offset(offset);
        if (n > 0) msg.set_payload(r.payload + offset, n);
        offset += n;
        msg.set_last(offset == length);
        if (!writeMessage(msg, false)) {
          ok = false;
          break;
        }
        if (offset >= length) break;
      }
    } catch (...) {  // bad_alloc from protobuf
      ok = false;
    }
    core_->completeSend(r.cookie, ok ? FL_OK : FL_ERR_LINK_LOST, length);
    // A failed write means the call is over; the reader sees that too and
    // fails the link with the call's status.
    if (!ok) return;
  }
}

// ---------------------------------------------------------------- receiving

void GrpcTransport::abandonFrame() noexcept {
  if (credit_) {
    core_->endReceive();
    credit_.reset();
  }
  in_frame_ = false;
}

bool GrpcTransport::handleMessage(const framelink::v1::DataMessage& m) noexcept {
  auto violation = [&](const std::string& what) {
    abandonFrame();
    failLink(FL_ERR_PROTOCOL, "grpc data link with " + peer_name_ + ": " + what);
    return false;
  };
  if (!m.control().empty()) {
    if (m.has_header() || !m.payload().empty() || m.offset() != 0 || m.last()) {
      return violation("a control record shares its message with frame data");
    }
    if (m.control().size() > kMaxControlBytes) {
      return violation("control record of " + std::to_string(m.control().size()) + " bytes exceeds " +
                       std::to_string(kMaxControlBytes));
    }
    core_->controlArrived(m.control());
    return true;
  }
  if (!in_frame_) {
    if (!m.has_header()) return violation("chunk without a frame header");
    const auto& p = m.header();
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
  } else if (m.has_header()) {
    return violation("frame header in the middle of frame " + std::to_string(frame_.sequence));
  }
  if (m.offset() != offset_) {
    return violation("chunk at offset " + std::to_string(m.offset()) + ", expected " +
                     std::to_string(offset_));
  }
  const std::string& payload = m.payload();
  if (payload.size() > frame_.length - offset_) {
    return violation("chunk runs past the frame length " + std::to_string(frame_.length));
  }
  if (credit_ && !payload.empty()) std::memcpy(credit_->buffer + offset_, payload.data(), payload.size());
  offset_ += payload.size();
  if (!m.last()) return true;
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
    core_->countReceived(frame_.length);
    core_->frameArrived(frame_, FL_OK);
  } else {
    core_->frameArrived(
        frame_, FL_ERR_UNKNOWN_CREDIT,
        "credit " + std::to_string(frame_.credit_id) + " was retracted while the frame landed");
  }
  return true;
}

}  // namespace framelink::transport
