// TcpTransport's zero-copy send: the kernel's notifications (MSG_ZEROCOPY,
// Documentation/networking/msg_zerocopy.rst) that it let a frame's pages go,
// and the frames that wait for them.  See tcp_transport.h.
#include <time.h>  // before linux/errqueue.h, which uses struct timespec without declaring it

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "transport/tcp/tcp_transport.h"

namespace framelink::transport::tcp {

TransportCounters TcpTransport::counters() const noexcept {
  TransportCounters c = book_.counters();
  c.zerocopy_sends = zc_calls_;
  c.zerocopy_copied = zc_copied_;
  return c;
}

void TcpTransport::completeWritten() noexcept {
  if (!tx_zc_used_) {
    for (size_t i = 0; i < tx_cookies_.size(); ++i) {
      book_.sendDone(tx_cookies_[i], FL_OK, tx_frame_headers_[i].length);
    }
    return;
  }
  // A zero-copy write holds one frame (startWrite); its pages are the
  // kernel's until the notification of its last call.
  tx_zc_used_ = false;
  const uint64_t cookie = tx_cookies_.front();
  const uint64_t length = tx_frame_headers_.front().length;
  if (zerocopyDone(tx_zc_last_)) {
    book_.sendDone(cookie, FL_OK, length);
    return;
  }
  try {
    zc_waiting_.push_back(ZerocopyFrame{tx_zc_last_, cookie, length});
  } catch (...) {
    failLink(FL_ERR_RESOURCES, "tcp data link to " + peer_name_ + ": out of memory for a zero-copy send");
  }
}

void TcpTransport::takeZerocopyNotes() noexcept {
  while (zc_done_ != zc_next_id_ && !book_.failed()) {
    alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(sock_extended_err) + sizeof(sockaddr_in6))];
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (::recvmsg(fd_.get(), &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
      if (errno == EINTR) continue;
      break;  // EAGAIN: the rest come later (the socket's EPOLLERR says when)
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      const bool recverr = (cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
                           (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR);
      if (!recverr || cm->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) continue;
      sock_extended_err err{};
      std::memcpy(&err, CMSG_DATA(cm), sizeof err);
      if (err.ee_origin != SO_EE_ORIGIN_ZEROCOPY || err.ee_errno != 0) continue;
      ++socket_counters_.zerocopy_notes;
      noteZerocopy(err.ee_info, err.ee_data, (err.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0);
    }
  }
  while (!zc_waiting_.empty() && zerocopyDone(zc_waiting_.front().last_id)) {
    const ZerocopyFrame f = zc_waiting_.front();
    zc_waiting_.pop_front();
    book_.sendDone(f.cookie, FL_OK, f.length);
  }
}

void TcpTransport::noteZerocopy(uint32_t first, uint32_t last, bool copied) noexcept {
  const uint32_t calls = last - first + 1;
  zc_notified_ += calls;
  if (copied) zc_copied_ += calls;
  // [first, last] done: in order (TCP's way), or held until the gap before it is.
  if (static_cast<int32_t>(first - zc_done_) > 0) {
    if (zc_early_.size() == zc_early_.capacity()) {
      failLink(FL_ERR_PROTOCOL,
               "tcp data link to " + peer_name_ +
                   ": the kernel's zero-copy notifications came out of order past every bound");
      return;
    }
    zc_early_.emplace_back(first, last);  // reserved: does not allocate
    return;
  }
  if (static_cast<int32_t>(last + 1 - zc_done_) > 0) zc_done_ = last + 1;
  for (bool merged = true; merged;) {
    merged = false;
    for (auto it = zc_early_.begin(); it != zc_early_.end(); ++it) {
      if (static_cast<int32_t>(it->first - zc_done_) > 0) continue;
      if (static_cast<int32_t>(it->second + 1 - zc_done_) > 0) zc_done_ = it->second + 1;
      zc_early_.erase(it);
      merged = true;
      break;
    }
  }
  // A path on which the kernel copies all the same (a local socket's:
  // loopback, veth) pins pages for nothing: the link sends with copies.
  if (zc_on_ && zc_notified_ >= kZerocopyProbeCalls && zc_copied_ == zc_notified_) {
    zc_on_ = false;
    spdlog::info(
        "tcp data link to {}: the kernel copied its first {} zero-copy sends (a local path: loopback or "
        "veth); it sends with copies from now on",
        peer_name_, zc_notified_);
  }
}

void TcpTransport::abortZerocopy(std::vector<uint64_t>& waiting) noexcept {
  for (const ZerocopyFrame& f : zc_waiting_) waiting.push_back(f.cookie);  // reserved for them
  zc_waiting_.clear();
  if (zc_done_ == zc_next_id_ || book_.failed()) return;
  // Reset, not shut down: a shutdown would still send what is queued, from
  // pages whose frames complete now (and may hold the next frame soon).
  // connect(AF_UNSPEC) drops the socket's queues at once.
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  // Failing leaves the socket as it was: failLink shuts it down all the same.
  [[maybe_unused]] const int reset = ::connect(fd_.get(), &unspec, sizeof unspec);
  zc_done_ = zc_next_id_;
}

}  // namespace framelink::transport::tcp
