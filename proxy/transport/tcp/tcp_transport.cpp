#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <system_error>

#include <spdlog/spdlog.h>

#include "transport/tcp/tcp_wire.h"

namespace framelink::transport::tcp {

Result<std::unique_ptr<Transport>> TcpTransport::create(UniqueFd fd, std::string peer_name,
                                                        TcpTransportOptions options) {
  if (!fd.valid()) return makeError(FL_EINVAL, "TcpTransport::create: invalid socket");
  int one = 1;
  // Frames are written whole; Nagle would only delay the tail of each one.
  if (::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return makeError(FL_ERR_TRANSPORT,
                     std::string("TCP_NODELAY on data socket to ") + peer_name + ": " + std::strerror(errno));
  }
  auto core = TransportCore::create(options.send_queue_depth);
  if (!core) return std::move(core).error().context("tcp transport to " + peer_name);
  std::unique_ptr<TcpTransport> t(
      new TcpTransport(std::move(fd), std::move(peer_name), options, std::move(core).value()));
  try {
    MutexLock lock(t->join_mu_);
    t->receiver_ = std::thread([p = t.get()] { p->receiverLoop(); });
    t->sender_ = std::thread([p = t.get()] { p->senderLoop(); });
  } catch (const std::system_error& e) {
    t->shutdown();
    return makeError(FL_ERR_RESOURCES, std::string("tcp transport: cannot start threads: ") + e.what());
  }
  return std::unique_ptr<Transport>(std::move(t));
}

TcpTransport::TcpTransport(UniqueFd fd, std::string peer_name, TcpTransportOptions options,
                           std::unique_ptr<TransportCore> core)
    : fd_(std::move(fd)), peer_name_(std::move(peer_name)), options_(options), core_(std::move(core)) {}

TcpTransport::~TcpTransport() { shutdown(); }

void TcpTransport::shutdown() noexcept {
  failLink(FL_ERR_SHUTDOWN, "tcp transport to " + peer_name_ + " shut down locally");
  MutexLock lock(join_mu_);
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
}

void TcpTransport::failLink(int status, const std::string& message) noexcept {
  if (!core_->fail(status, message)) return;
  if (status != FL_ERR_SHUTDOWN) spdlog::warn("{}", message);
  // Wakes both threads: a blocked recv() sees EOF, a blocked sendmsg() EPIPE.
  // The descriptor itself stays open until the destructor, after the joins,
  // so no thread can ever touch a reused fd number.
  ::shutdown(fd_.get(), SHUT_RDWR);
}

// ---------------------------------------------------------------- sender

void TcpTransport::senderLoop() noexcept {
  TransportCore::Outgoing out;
  std::vector<TcpFrameHeader> control_headers;
  std::vector<iovec> iov;
  while (core_->nextSend(&out)) {
    // Control records first, then the frame: one sendmsg for all of it.
    control_headers.assign(out.control.size(), TcpFrameHeader{});
    iov.clear();
    for (size_t i = 0; i < out.control.size(); ++i) {
      control_headers[i].magic = kTcpControlMagic;
      control_headers[i].length = out.control[i].size();
      iov.push_back({&control_headers[i], sizeof(TcpFrameHeader)});
      iov.push_back({out.control[i].data(), out.control[i].size()});
    }
    TcpFrameHeader wire{};
    if (out.has_frame) {
      wire = toWire(out.frame.header);
      iov.push_back({&wire, sizeof wire});
      // sendmsg does not write through iov_base; the cast only satisfies its type.
      if (out.frame.header.length > 0) {
        iov.push_back({const_cast<uint8_t*>(out.frame.payload),  // NOLINT
                       static_cast<size_t>(out.frame.header.length)});
      }
    }
    const bool ok = writeAll(iov.data(), iov.size());
    if (out.has_frame) {
      core_->completeSend(out.frame.cookie, ok ? FL_OK : FL_ERR_LINK_LOST, out.frame.header.length);
    }
    if (!ok) break;
  }
}

bool TcpTransport::writeAll(iovec* iov, size_t count) noexcept {
  msghdr msg{};
  msg.msg_iov = iov;
  while (count > 0) {
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      failLink(FL_ERR_LINK_LOST, "tcp data link to " + peer_name_ + ": send failed: " + std::strerror(errno));
      return false;
    }
    auto left = static_cast<size_t>(n);
    while (count > 0 && left >= msg.msg_iov[0].iov_len) {
      left -= msg.msg_iov[0].iov_len;
      ++msg.msg_iov;
      --count;
    }
    if (count > 0) {
      msg.msg_iov[0].iov_base = static_cast<uint8_t*>(msg.msg_iov[0].iov_base) + left;
      msg.msg_iov[0].iov_len -= left;
    }
  }
  return true;
}

// ---------------------------------------------------------------- receiver

int TcpTransport::readFull(void* buf, size_t n) noexcept {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd_.get(), p + got, n - got, MSG_WAITALL);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      if (got == 0) return 0;
      io_error_ = "peer closed the connection in the middle of a frame";
      return -1;
    } else if (errno != EINTR) {
      io_error_ = std::string("recv failed: ") + std::strerror(errno);
      return -1;
    }
  }
  return 1;
}

bool TcpTransport::discard(uint64_t n) noexcept {
  try {
    if (scratch_.empty()) scratch_.resize(size_t{256} * 1024);
  } catch (...) {
    io_error_ = "out of memory for the discard buffer";
    return false;
  }
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, scratch_.size()));
    if (readFull(scratch_.data(), chunk) != 1) {
      if (io_error_.empty()) io_error_ = "peer closed the connection in the middle of a frame";
      return false;
    }
    n -= chunk;
  }
  return true;
}

void TcpTransport::receiverLoop() noexcept {
  const std::string where = "tcp data link from " + peer_name_ + ": ";
  for (;;) {
    TcpFrameHeader wire{};
    int r = readFull(&wire, sizeof wire);
    if (r == 0) {
      failLink(FL_ERR_LINK_LOST, where + "peer closed the connection");
      return;
    }
    if (r < 0) {
      failLink(FL_ERR_LINK_LOST, where + io_error_);
      return;
    }
    if (wire.magic == kTcpControlMagic) {
      if (wire.length == 0 || wire.length > kMaxControlBytes) {
        failLink(FL_ERR_PROTOCOL, where + "control record of " + std::to_string(wire.length) +
                                      " bytes (allowed: 1.." + std::to_string(kMaxControlBytes) + ")");
        return;
      }
      std::string record;
      try {
        record.resize(static_cast<size_t>(wire.length));
      } catch (...) {
        failLink(FL_ERR_RESOURCES, where + "out of memory for a control record");
        return;
      }
      if (readFull(record.data(), record.size()) != 1) {
        if (io_error_.empty()) io_error_ = "peer closed the connection in the middle of a control record";
        failLink(FL_ERR_LINK_LOST, where + io_error_);
        return;
      }
      core_->controlArrived(std::move(record));
      continue;
    }
    if (wire.magic != kTcpFrameMagic) {
      failLink(FL_ERR_PROTOCOL,
               where + "bad frame magic (not a framelink peer, or the stream is out of sync)");
      return;
    }
    if (wire.attr_length > FL_MAX_ATTR_BYTES) {
      failLink(FL_ERR_PROTOCOL, where + "attr_length " + std::to_string(wire.attr_length) + " > " +
                                    std::to_string(FL_MAX_ATTR_BYTES));
      return;
    }
    FrameHeader header = fromWire(wire);
    std::optional<LocalCredit> credit = core_->beginReceive(header.credit_id);
    if (!credit) {
      if (header.length > options_.max_frame_bytes) {
        failLink(FL_ERR_PROTOCOL, where + "frame of " + std::to_string(header.length) +
                                      " bytes for unknown credit " + std::to_string(header.credit_id) +
                                      " exceeds max_frame_bytes");
        return;
      }
      if (!discard(header.length)) {
        failLink(FL_ERR_LINK_LOST, where + io_error_);
        return;
      }
      core_->frameArrived(header, FL_ERR_UNKNOWN_CREDIT,
                          "frame for unknown or retracted credit " + std::to_string(header.credit_id));
      continue;
    }
    if (header.length > credit->capacity) {
      core_->endReceive();
      failLink(FL_ERR_PROTOCOL, where + "frame of " + std::to_string(header.length) +
                                    " bytes exceeds credit " + std::to_string(header.credit_id) + " of " +
                                    std::to_string(credit->capacity) + " bytes");
      return;
    }
    if (header.length > 0 && readFull(credit->buffer, header.length) != 1) {
      core_->endReceive();
      if (io_error_.empty()) io_error_ = "peer closed the connection in the middle of a frame";
      failLink(FL_ERR_LINK_LOST, where + io_error_);
      return;
    }
    if (core_->endReceive()) {
      core_->countReceived(header.length);
      core_->frameArrived(header, FL_OK);
    } else {
      core_->frameArrived(
          header, FL_ERR_UNKNOWN_CREDIT,
          "credit " + std::to_string(header.credit_id) + " was retracted while the frame landed");
    }
  }
}

}  // namespace framelink::transport::tcp
