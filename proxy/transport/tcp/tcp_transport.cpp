#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <span>

namespace framelink::transport::tcp {

namespace {

// A write unit holds two iovecs per control record, read request and read
// response, and two for its frame; sendmsg takes at most IOV_MAX of them.
constexpr size_t kMaxRecordsPerWrite = (IOV_MAX - 2) / 2;
// The frames of one write unit: at most this many, and beyond the first only while the unit stays
// within kMaxWriteBytes -- a round of small frames is one sendmsg, a large frame goes alone.
constexpr size_t kMaxFramesPerWrite = 64;
constexpr uint64_t kMaxWriteBytes = uint64_t{256} * 1024;
// Notified ranges held past a gap (TCP notifies in order: none, in practice).
constexpr size_t kMaxZerocopyEarly = 64;

std::string errnoText(int err) { return std::strerror(err); }

}  // namespace

Result<std::unique_ptr<TcpTransport>> TcpTransport::make(UniqueFd fd, std::string peer_name,
                                                         TcpTransportOptions options) {
  if (!fd.valid()) return makeError(FL_EINVAL, "TcpTransport::create: invalid socket");
  if (options.send_queue_depth == 0) {
    return makeError(FL_EINVAL, "tcp transport: send queue depth must be at least 1");
  }
  if (options.read_budget_bytes == 0) {
    return makeError(FL_EINVAL, "tcp transport: read budget must be at least 1 byte");
  }
  int one = 1;
  // Frames are written whole; Nagle would only delay the tail of each one.
  if (::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return makeError(FL_ERR_TRANSPORT,
                     std::string("TCP_NODELAY on data socket to ") + peer_name + ": " + errnoText(errno));
  }
  if (options.zerocopy_min_bytes > 0 &&
      ::setsockopt(fd.get(), SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) {
    options.zerocopy_min_bytes = 0;  // a kernel before 4.14: every send copies, as before
  }
  UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  UniqueFd event_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_fd.valid() || !event_fd.valid()) {
    return makeError(FL_ERR_RESOURCES, "tcp transport to " + peer_name + ": epoll/eventfd failed: " +
                                           errnoText(errno) + " (raise the fd limit?)");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = event_fd.get();
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, event_fd.get(), &ev) != 0) {
    return makeError(FL_ERR_RESOURCES, "tcp transport to " + peer_name + ": epoll_ctl: " + errnoText(errno));
  }
  ev.events = EPOLLIN;
  ev.data.fd = fd.get();
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
    return makeError(FL_ERR_RESOURCES, "tcp transport to " + peer_name + ": epoll_ctl: " + errnoText(errno));
  }
  try {
    return std::unique_ptr<TcpTransport>(new TcpTransport(
        std::move(fd), std::move(epoll_fd), std::move(event_fd), std::move(peer_name), options));
  } catch (const std::bad_alloc&) {
    return makeError(FL_ERR_RESOURCES, "tcp transport: out of memory for the send queue");
  }
}

Result<std::unique_ptr<Transport>> TcpTransport::create(UniqueFd fd, std::string peer_name,
                                                        TcpTransportOptions options) {
  auto t = make(std::move(fd), std::move(peer_name), options);
  if (!t) return std::move(t).error();
  return std::unique_ptr<Transport>(std::move(t).value());
}

TcpTransport::TcpTransport(UniqueFd fd, UniqueFd epoll_fd, UniqueFd event_fd, std::string peer_name,
                           TcpTransportOptions options)
    : fd_(std::move(fd)),
      epoll_fd_(std::move(epoll_fd)),
      event_fd_(std::move(event_fd)),
      peer_name_(std::move(peer_name)),
      options_(options),
      book_(options.send_queue_depth),
      zc_on_(options.zerocopy_min_bytes > 0) {
  // The largest write unit's iovecs and frames: startWrite() then never allocates for them.
  tx_iov_.reserve(IOV_MAX);
  tx_pulls_.reserve(kMaxRecordsPerWrite);
  tx_frame_headers_.reserve(kMaxFramesPerWrite);
  tx_cookies_.reserve(kMaxFramesPerWrite);
  // A write's frames and those waiting for the kernel's pages (startWrite bounds them by the queue).
  fail_cookies_.reserve(kMaxFramesPerWrite + options.send_queue_depth);
  zc_early_.reserve(kMaxZerocopyEarly);
}

TcpTransport::~TcpTransport() { shutdown(); }

void TcpTransport::shutdown() noexcept {
  failLink(FL_ERR_SHUTDOWN, "tcp transport to " + peer_name_ + " shut down locally");
  syncSignal();
}

void TcpTransport::failLink(int status, const std::string& message) noexcept {
  // Nothing is being written now (every write happens on this thread), so
  // the frames of the write in progress complete here with the queued ones,
  // and their payloads are never read again.
  // So do the frames whose pages the kernel still holds (the connection is
  // reset first: it drops them).
  fail_cookies_.clear();
  if (tx_active_) fail_cookies_.assign(tx_cookies_.begin(), tx_cookies_.end());
  abortZerocopy(fail_cookies_);
  if (!book_.fail(status, message, fail_cookies_)) return;
  warnLinkFailed(status, message);
  tx_active_ = false;
  clearFrames();
  tx_records_.clear();
  tx_pulls_.clear();
  pull_queue_.clear();
  responses_queued_ = 0;
  tx_iov_.clear();
  // A frame landing now stays unreported: the link is gone.  Its credit's
  // keepalive is released here, the buffer is not written any more.
  rx_buffer_ = nullptr;
  rx_body_ = Body::kNone;
  book_.credits().clear();
  // The socket leaves the epoll set (a hung-up socket would keep eventFd()
  // readable for ever); the peer sees the connection end now.  The
  // descriptor itself is closed by the destructor.
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd_.get(), nullptr);
  watch_out_ = false;
  ::shutdown(fd_.get(), SHUT_RDWR);
}

void TcpTransport::syncSignal() noexcept {
  // Events to take, or bytes read ahead that the next poll() turns into events
  // (the socket they came from may be empty by now).
  const bool want = !book_.events().empty() || stage_pos_ < stage_len_;
  if (want == signalled_) return;
  uint64_t value = 1;
  if (want) {
    // EAGAIN only when the counter would overflow: it is readable then anyway.
    [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &value, sizeof value);
  } else {
    [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &value, sizeof value);
  }
  signalled_ = want;
}

// ---------------------------------------------------------------- credits

Result<RemoteCredit> TcpTransport::exposeCredit(LocalCredit credit) {
  return book_.exposeCredit(std::move(credit));
}

// A frame landing in the buffer right now: the rest of it is read into the
// scratch buffer, and the frame is reported as for an unknown credit.
void TcpTransport::retractCredit(uint64_t credit_id) { book_.retractCredit(credit_id); }

// ---------------------------------------------------------------- pull

Result<RemoteSource> TcpTransport::exposeSource(LocalSource source) {
  return book_.exposeSource(std::move(source));
}

PostResult TcpTransport::postRead(const ReadRequest& request) noexcept {
  uint64_t tag = 0;
  const PostResult admitted = book_.postRead(request, &tag);
  if (admitted != PostResult::kOk) return admitted;
  PullWrite w;
  w.header.magic = kTcpReadRequestMagic;
  w.header.credit_id = request.source.source_id;
  w.header.frame_id = tag;
  w.header.length = request.source.length;
  if (!queuePull(std::move(w))) {
    book_.reads().take(tag);
    return PostResult::kBackpressure;
  }
  return sendQueued(PostResult::kOk);
}

bool TcpTransport::queuePull(PullWrite write) noexcept {
  try {
    pull_queue_.push_back(std::move(write));
  } catch (...) {
    return false;
  }
  return true;
}

void TcpTransport::answerRead() noexcept {
  const TcpFrameHeader& asked = rx_header_;
  if (responses_queued_ >= kMaxReadsOutstanding) {
    failLink(FL_ERR_PROTOCOL, "tcp data link from " + peer_name_ + ": peer has more than " +
                                  std::to_string(kMaxReadsOutstanding) + " reads unanswered");
    return;
  }
  PullWrite w;
  w.header.magic = kTcpReadResponseMagic;
  w.header.credit_id = asked.credit_id;
  w.header.frame_id = asked.frame_id;
  const LocalSource* source = book_.sources().lookup(asked.credit_id);
  if (source != nullptr && source->length == asked.length) {
    w.header.length = source->length;
    w.payload = source->payload;
    w.keepalive = source->keepalive;
  } else {
    w.header.flags = kTcpReadNoSource;
  }
  if (!queuePull(std::move(w))) {
    failLink(FL_ERR_RESOURCES, "tcp data link to " + peer_name_ + ": out of memory for a read response");
    return;
  }
  book_.countReadServed(source != nullptr && source->length == asked.length);
  ++responses_queued_;
}

// ---------------------------------------------------------------- sending

// Queued only: flush() -- the agent's, after each round of posts -- or the next poll() writes the
// round's frames together, as many as one write unit holds (kMaxFramesPerWrite, kMaxWriteBytes).
PostResult TcpTransport::post(const SendRequest& request) noexcept { return book_.post(request); }

void TcpTransport::flush() noexcept {
  if (book_.failed() || tx_active_) return;  // a waiting write goes on in poll()
  drainSends();
  syncSignal();
}

PostResult TcpTransport::postControl(std::string record) noexcept {
  return sendQueued(book_.postControl(std::move(record)));
}

PostResult TcpTransport::sendQueued(PostResult queued) noexcept {
  if (queued != PostResult::kOk) return queued;
  // Something queued ahead is continued by poll() when the socket has room.
  if (!tx_active_) drainSends();
  syncSignal();
  return queued;
}

bool TcpTransport::startWrite() noexcept {
  ControlQueue& control = book_.control();
  SendRing& ring = book_.ring();
  if (control.empty() && ring.empty() && pull_queue_.empty()) return false;
  const size_t records = std::min(control.size(), kMaxRecordsPerWrite);
  try {
    tx_records_.clear();
    tx_iov_.clear();
    // Sized before any address is taken: the iovecs point into it.
    tx_headers_.resize(records);
    for (size_t i = 0; i < records; ++i) tx_records_.push_back(control.pop());
  } catch (...) {
    // Out of memory for the bookkeeping of a write: the link cannot go on
    // in order.
    failLink(FL_ERR_RESOURCES, "tcp data link to " + peer_name_ + ": out of memory for a write");
    return false;
  }
  for (size_t i = 0; i < records; ++i) {
    tx_headers_[i] = TcpFrameHeader{};
    tx_headers_[i].magic = kTcpControlMagic;
    tx_headers_[i].length = tx_records_[i].size();
    tx_iov_.push_back({&tx_headers_[i], sizeof(TcpFrameHeader)});
    tx_iov_.push_back({tx_records_[i].data(), tx_records_[i].size()});
  }
  book_.countControlSent(records);
  // Then reads and their answers, once no record waits.
  tx_pulls_.clear();
  if (control.empty()) {
    const size_t pulls = std::min(pull_queue_.size(), kMaxRecordsPerWrite - records);
    for (size_t i = 0; i < pulls; ++i) {
      tx_pulls_.push_back(std::move(pull_queue_.front()));  // reserved: does not allocate
      pull_queue_.pop_front();
    }
    for (PullWrite& w : tx_pulls_) {
      tx_iov_.push_back({&w.header, sizeof w.header});
      if (w.payload != nullptr && w.header.length > 0) {
        tx_iov_.push_back({const_cast<uint8_t*>(w.payload),  // NOLINT: sendmsg only reads it
                           static_cast<size_t>(w.header.length)});
      }
    }
  }
  clearFrames();
  tx_zc_iov_ = kNoZerocopy;
  tx_zc_used_ = false;
  // Control first: frames join the write only once no record and no read waits.  Then as many
  // frames as the write holds: the first whatever its size, the others while the write stays
  // within kMaxWriteBytes (small frames go together, a large one goes alone as before).  A
  // zero-copy frame goes alone, while no more than a queue's worth wait for their pages.
  if (control.empty() && pull_queue_.empty()) {
    uint64_t bytes = 0;
    while (!ring.empty() && tx_cookies_.size() < kMaxFramesPerWrite && tx_iov_.size() + 2 <= IOV_MAX) {
      const SendRequest& r = ring.front();
      const uint64_t size = sizeof(TcpFrameHeader) + r.header.length;
      const bool zero_copy = zc_on_ && r.header.length >= options_.zerocopy_min_bytes &&
                             zc_waiting_.size() < options_.send_queue_depth;
      if (!tx_cookies_.empty() && (zero_copy || bytes + size > kMaxWriteBytes)) break;
      bytes += size;
      tx_frame_headers_.push_back(toWire(r.header));  // reserved: does not move
      tx_iov_.push_back({&tx_frame_headers_.back(), sizeof(TcpFrameHeader)});
      // sendmsg does not write through iov_base; the cast only satisfies its type.
      if (r.header.length > 0) {
        if (zero_copy) tx_zc_iov_ = tx_iov_.size();
        tx_iov_.push_back({const_cast<uint8_t*>(r.payload),  // NOLINT
                           static_cast<size_t>(r.header.length)});
      }
      tx_cookies_.push_back(r.cookie);
      ring.pop();
      if (zero_copy) break;
    }
  }
  tx_next_ = 0;
  tx_active_ = true;
  return true;
}

void TcpTransport::finishWrite() noexcept {
  tx_active_ = false;
  tx_records_.clear();
  for (const PullWrite& w : tx_pulls_) {
    if (w.header.magic == kTcpReadResponseMagic) --responses_queued_;
  }
  tx_pulls_.clear();  // a response's source may go now
  completeWritten();
  socket_counters_.frames_written += tx_cookies_.size();
  clearFrames();
}

void TcpTransport::clearFrames() noexcept {
  tx_frame_headers_.clear();
  tx_cookies_.clear();
}

void TcpTransport::drainSends() noexcept {
  while (!book_.failed()) {
    if (!tx_active_ && !startWrite()) break;
    msghdr msg{};
    msg.msg_iov = tx_iov_.data() + tx_next_;
    msg.msg_iovlen = tx_iov_.size() - tx_next_;
    int flags = MSG_DONTWAIT | MSG_NOSIGNAL;
    bool zero_copy = false;
    if (tx_zc_iov_ != kNoZerocopy) {
      if (tx_next_ < tx_zc_iov_) {
        // What goes before a zero-copy payload goes with copies, in a call of its own.
        msg.msg_iovlen = tx_zc_iov_ - tx_next_;
        flags |= MSG_MORE;
      } else {
        zero_copy = zc_on_;
      }
    }
    const size_t end = tx_next_ + msg.msg_iovlen;
    ssize_t n = ::sendmsg(fd_.get(), &msg, flags | (zero_copy ? MSG_ZEROCOPY : 0));
    if (n < 0 && zero_copy && errno == ENOBUFS) {
      zero_copy = false;  // past optmem_max of pinned pages: this call copies
      n = ::sendmsg(fd_.get(), &msg, flags);
    }
    if (n > 0 && zero_copy) {
      tx_zc_last_ = zc_next_id_++;  // the kernel's id of this call
      tx_zc_used_ = true;
      ++zc_calls_;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        ++socket_counters_.send_blocked;
        watchWritable(true);
        return;
      }
      failLink(FL_ERR_LINK_LOST, "tcp data link to " + peer_name_ + ": send failed: " + errnoText(errno));
      return;
    }
    ++socket_counters_.writes;
    auto left = static_cast<size_t>(n);
    while (tx_next_ < end && left >= tx_iov_[tx_next_].iov_len) {
      left -= tx_iov_[tx_next_].iov_len;
      ++tx_next_;
    }
    if (tx_next_ < end) {
      // The socket is full: the rest waits for EPOLLOUT (or the next poll).
      tx_iov_[tx_next_].iov_base = static_cast<uint8_t*>(tx_iov_[tx_next_].iov_base) + left;
      tx_iov_[tx_next_].iov_len -= left;
      ++socket_counters_.send_blocked;
      watchWritable(true);
      return;
    }
    if (tx_next_ == tx_iov_.size()) finishWrite();  // else: a zero-copy payload's call is next
  }
  watchWritable(false);
}

void TcpTransport::watchWritable(bool on) noexcept {
  if (on == watch_out_ || book_.failed()) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  ev.data.fd = fd_.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, fd_.get(), &ev) == 0) watch_out_ = on;
}

// ---------------------------------------------------------------- receiving

size_t TcpTransport::poll(TransportEvent* out, size_t max) noexcept {
  // A write the socket did not take whole goes on, and frames posted without a flush() go.
  if (!book_.failed()) drainSends();
  if (!book_.failed() && (zc_done_ != zc_next_id_ || !zc_waiting_.empty())) takeZerocopyNotes();
  if (!book_.failed()) receive(max);
  // Answers to the reads just received go out now.
  if (!book_.failed() && !tx_active_ && !pull_queue_.empty()) drainSends();
  const size_t taken = book_.events().take(out, max);
  syncSignal();
  return taken;
}

}  // namespace framelink::transport::tcp
