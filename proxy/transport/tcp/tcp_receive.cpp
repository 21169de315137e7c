// TcpTransport's receiving side: what poll() reads from the socket --
// staged small frames, large payloads straight into their buffers, control
// records, pull read requests and responses -- and how a frame ends.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "transport/tcp/tcp_transport.h"

namespace framelink::transport::tcp {

namespace {

// The discard buffer of a frame for an unknown credit read past the staging buffer.
constexpr size_t kScratchBytes = size_t{256} * 1024;

std::string receiveErrnoText(int err) { return std::strerror(err); }

}  // namespace

void TcpTransport::receive(size_t max_events) noexcept {
  size_t budget = options_.read_budget_bytes;
  while (!book_.failed() && book_.events().size() < max_events) {
    if (stage_pos_ < stage_len_) {
      consumeStaged(max_events);
      if (stage_pos_ == stage_len_ && stage_short_) return;
      continue;
    }
    if (budget == 0) {
      ++socket_counters_.read_budget_hits;
      return;
    }
    size_t got = 0;
    if (!(directBody() ? readDirect(budget, got) : readStaged(budget, got))) return;
    budget -= got;
  }
}

bool TcpTransport::directBody() const noexcept {
  if (options_.stage_bytes == 0) return true;  // no staging: every read as below
  if (rx_body_ == Body::kNone || rx_body_length_ - rx_body_got_ < options_.stage_bytes) return false;
  return (rx_body_ == Body::kFrame && book_.credits().landingValid()) || rx_body_ == Body::kRead;
}

bool TcpTransport::readStaged(size_t budget, size_t& got) noexcept {
  if (stage_.size() != options_.stage_bytes) {
    try {
      stage_.resize(options_.stage_bytes);
    } catch (...) {
      failLink(FL_ERR_RESOURCES,
               "tcp data link from " + peer_name_ + ": out of memory for the staging buffer");
      return false;
    }
  }
  const size_t want = std::min(stage_.size(), budget);
  const ssize_t n = ::recv(fd_.get(), stage_.data(), want, MSG_DONTWAIT);
  if (n < 0) return readFailed();
  if (n == 0) return peerClosed();
  stage_short_ = static_cast<size_t>(n) < want;
  ++socket_counters_.reads;
  ++socket_counters_.staged_reads;
  stage_pos_ = 0;
  stage_len_ = static_cast<size_t>(n);
  got = stage_len_;
  return true;
}

void TcpTransport::consumeStaged(size_t max_events) noexcept {
  while (stage_pos_ < stage_len_ && !book_.failed() && book_.events().size() < max_events) {
    const uint8_t* data = stage_.data() + stage_pos_;
    const size_t avail = stage_len_ - stage_pos_;
    if (rx_body_ == Body::kNone) {
      const size_t take = std::min(avail, sizeof rx_header_ - rx_header_got_);
      std::memcpy(reinterpret_cast<uint8_t*>(&rx_header_) + rx_header_got_, data, take);
      rx_header_got_ += take;
      stage_pos_ += take;
      if (rx_header_got_ == sizeof rx_header_) beginBody();
      continue;
    }
    const auto take = static_cast<size_t>(std::min<uint64_t>(avail, rx_body_length_ - rx_body_got_));
    if ((rx_body_ == Body::kFrame && book_.credits().landingValid()) || rx_body_ == Body::kRead) {
      std::memcpy(rx_buffer_ + rx_body_got_, data, take);
    } else if (rx_body_ == Body::kControl) {
      std::memcpy(rx_record_.data() + rx_body_got_, data, take);
    }  // else an unknown credit's frame, or the rest of a retracted one: dropped
    rx_body_got_ += take;
    stage_pos_ += take;
    if (rx_body_got_ == rx_body_length_) endBody();
  }
  if (stage_pos_ == stage_len_) stage_pos_ = stage_len_ = 0;
}

bool TcpTransport::readFailed() noexcept {
  if (errno == EINTR) return true;
  if (errno != EAGAIN && errno != EWOULDBLOCK) {
    failLink(FL_ERR_LINK_LOST,
             "tcp data link from " + peer_name_ + ": recv failed: " + receiveErrnoText(errno));
  }
  return false;
}

bool TcpTransport::peerClosed() noexcept {
  const bool between = rx_body_ == Body::kNone && rx_header_got_ == 0;
  failLink(FL_ERR_LINK_LOST,
           "tcp data link from " + peer_name_ + ": " +
               (between                      ? "peer closed the connection"
                : rx_body_ == Body::kControl ? "peer closed the connection in the middle of a control record"
                : rx_body_ == Body::kRead    ? "peer closed the connection in the middle of a read response"
                                             : "peer closed the connection in the middle of a frame"));
  return false;
}

bool TcpTransport::readDirect(size_t budget, size_t& got_out) noexcept {
  // The body being read (if any), then the next header: one call usually
  // finishes a frame and starts the next.
  iovec iov[2];
  size_t iovcnt = 0;
  if (rx_body_ != Body::kNone) {
    const uint64_t rest = rx_body_length_ - rx_body_got_;
    if ((rx_body_ == Body::kFrame && book_.credits().landingValid()) || rx_body_ == Body::kRead) {
      iov[iovcnt++] = {rx_buffer_ + rx_body_got_, static_cast<size_t>(rest)};
    } else if (rx_body_ == Body::kControl) {
      iov[iovcnt++] = {rx_record_.data() + rx_body_got_, static_cast<size_t>(rest)};
    } else {
      // An unknown credit's frame, or the rest of a retracted one: read and dropped.
      try {
        if (scratch_.empty()) scratch_.resize(kScratchBytes);
      } catch (...) {
        failLink(FL_ERR_RESOURCES,
                 "tcp data link from " + peer_name_ + ": out of memory for the discard buffer");
        return false;
      }
      iov[iovcnt++] = {scratch_.data(), static_cast<size_t>(std::min<uint64_t>(rest, scratch_.size()))};
    }
  }
  // The next header only behind the body's last byte: a scratch buffer
  // smaller than the rest of a discarded body must not let the read run on
  // into the header with bytes that are still the body's.
  if (iovcnt == 0 || iov[0].iov_len == rx_body_length_ - rx_body_got_) {
    iov[iovcnt++] = {reinterpret_cast<uint8_t*>(&rx_header_) + rx_header_got_,
                     sizeof rx_header_ - rx_header_got_};
  }
  // Never more than the budget: the rest stays in the socket for the next poll().
  size_t room = budget;
  for (size_t i = 0; i < iovcnt; ++i) {
    iov[i].iov_len = std::min(iov[i].iov_len, room);
    room -= iov[i].iov_len;
  }
  if (iov[iovcnt - 1].iov_len == 0) --iovcnt;
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = iovcnt;
  const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
  if (n < 0) return readFailed();
  if (n == 0) return peerClosed();
  ++socket_counters_.reads;
  auto got = static_cast<size_t>(n);
  got_out = got;
  if (rx_body_ != Body::kNone) {
    const size_t body = std::min<uint64_t>(got, rx_body_length_ - rx_body_got_);
    rx_body_got_ += body;
    got -= body;
    if (rx_body_got_ == rx_body_length_) endBody();
  }
  rx_header_got_ += got;
  if (rx_header_got_ == sizeof rx_header_) beginBody();
  return true;
}

void TcpTransport::beginBody() noexcept {
  rx_header_got_ = 0;
  // Built only when something went wrong: this runs once per frame.
  auto where = [this] { return "tcp data link from " + peer_name_ + ": "; };
  const TcpFrameHeader& wire = rx_header_;
  rx_body_got_ = 0;
  rx_body_length_ = wire.length;
  if (wire.magic == kTcpControlMagic) {
    if (wire.length == 0 || wire.length > kMaxControlBytes) {
      failLink(FL_ERR_PROTOCOL, where() + "control record of " + std::to_string(wire.length) +
                                    " bytes (allowed: 1.." + std::to_string(kMaxControlBytes) + ")");
      return;
    }
    try {
      rx_record_.assign(static_cast<size_t>(wire.length), '\0');
    } catch (...) {
      failLink(FL_ERR_RESOURCES, where() + "out of memory for a control record");
      return;
    }
    rx_body_ = Body::kControl;
    return;
  }
  if (wire.magic == kTcpReadRequestMagic) {
    rx_body_length_ = 0;
    answerRead();
    return;
  }
  if (wire.magic == kTcpReadResponseMagic) {
    beginReadResponse();
    return;
  }
  if (wire.magic != kTcpFrameMagic) {
    failLink(FL_ERR_PROTOCOL,
             where() + "bad frame magic (not a framelink peer, or the stream is out of sync)");
    return;
  }
  if (wire.attr_length > FL_MAX_ATTR_BYTES) {
    failLink(FL_ERR_PROTOCOL, where() + "attr_length " + std::to_string(wire.attr_length) + " > " +
                                  std::to_string(FL_MAX_ATTR_BYTES));
    return;
  }
  rx_frame_ = fromWire(wire);
  // The credit is consumed by this frame.
  const LocalCredit* credit = book_.credits().beginLanding(rx_frame_.credit_id);
  if (credit == nullptr) {
    if (rx_frame_.length > options_.max_frame_bytes) {
      failLink(FL_ERR_PROTOCOL, where() + "frame of " + std::to_string(rx_frame_.length) +
                                    " bytes for unknown credit " + std::to_string(rx_frame_.credit_id) +
                                    " exceeds max_frame_bytes");
      return;
    }
    rx_body_ = Body::kDiscard;
  } else {
    if (rx_frame_.length > credit->capacity) {
      failLink(FL_ERR_PROTOCOL, where() + "frame of " + std::to_string(rx_frame_.length) +
                                    " bytes exceeds credit " + std::to_string(rx_frame_.credit_id) + " of " +
                                    std::to_string(credit->capacity) + " bytes");
      return;
    }
    rx_buffer_ = credit->buffer;
    rx_body_ = Body::kFrame;
  }
  if (rx_body_length_ == 0) endBody();
}

void TcpTransport::beginReadResponse() noexcept {
  const TcpFrameHeader& wire = rx_header_;
  auto where = [this] { return "tcp data link from " + peer_name_ + ": "; };
  const ReadRequest* read = book_.reads().lookup(wire.frame_id);
  if (read == nullptr) {
    failLink(FL_ERR_PROTOCOL, where() + "read response for read " + std::to_string(wire.frame_id) +
                                  ", which is not outstanding");
    return;
  }
  if (wire.flags == kTcpReadNoSource && wire.length == 0) {
    book_.readDone(wire.frame_id, FL_ERR_UNKNOWN_CREDIT, 0,
                   "the peer has no source " + std::to_string(read->source.source_id) + " of " +
                       std::to_string(read->source.length) +
                       " bytes (retracted, never offered, or offered with another length)");
    return;
  }
  if (wire.flags != 0 || wire.length != read->source.length || wire.credit_id != read->source.source_id) {
    failLink(FL_ERR_PROTOCOL, where() + "read response for read " + std::to_string(wire.frame_id) +
                                  " does not match its request (source " + std::to_string(wire.credit_id) +
                                  ", " + std::to_string(wire.length) + " bytes, flags " +
                                  std::to_string(wire.flags) + ")");
    return;
  }
  rx_read_tag_ = wire.frame_id;
  rx_buffer_ = read->buffer;
  rx_body_length_ = wire.length;
  rx_body_ = Body::kRead;
  if (rx_body_length_ == 0) endBody();
}

void TcpTransport::endBody() noexcept {
  const Body body = rx_body_;
  rx_body_ = Body::kNone;
  if (body == Body::kRead) {
    rx_buffer_ = nullptr;
    book_.readDone(rx_read_tag_, FL_OK, rx_body_length_);
    return;
  }
  if (body == Body::kControl) {
    book_.controlArrived(rx_record_);
    return;
  }
  rx_buffer_ = nullptr;
  if (body == Body::kFrame && book_.credits().endLanding()) {
    book_.frameArrived(rx_frame_, FL_OK);
  } else if (body == Body::kFrame) {
    book_.frameArrived(
        rx_frame_, FL_ERR_UNKNOWN_CREDIT,
        "credit " + std::to_string(rx_frame_.credit_id) + " was retracted while the frame landed");
  } else {
    book_.frameArrived(rx_frame_, FL_ERR_UNKNOWN_CREDIT,
                       "frame for unknown or retracted credit " + std::to_string(rx_frame_.credit_id));
  }
}

}  // namespace framelink::transport::tcp
