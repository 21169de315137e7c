#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "transport/rdma/rdma_status.h"
#include "transport/transport_core.h"

namespace framelink::transport::rdma {
namespace {

// Receive WRs carry this bit in wr_id; send WRs carry their sequence, which
// never gets there.  Error completions have no valid opcode, so wr_id is
// what tells a send from a receive.
constexpr uint64_t kRecvTag = uint64_t{1} << 63;
constexpr int kPollBatch = 32;
constexpr unsigned int kCqEventAckBatch = 64;

bool setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void drainEventFd(int fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}

void signalEventFd(int fd) {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

}  // namespace

// ---------------------------------------------------------------- CmId

CmId& CmId::operator=(CmId&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::move(o.api_);
    channel_ = std::exchange(o.channel_, nullptr);
    id_ = std::exchange(o.id_, nullptr);
  }
  return *this;
}

void CmId::reset() noexcept {
  if (id_ != nullptr) {
    // rdma_destroy_qp before rdma_destroy_id; every event we took off the
    // channel is acked where it was taken, so destroy_id does not wait.
    if (id_->qp != nullptr) api_->destroyQp(id_);
    api_->destroyId(id_);
    id_ = nullptr;
  }
  if (channel_ != nullptr) {
    api_->destroyEventChannel(channel_);
    channel_ = nullptr;
  }
}

// ---------------------------------------------------------------- setup

Result<std::unique_ptr<RdmaTransport>> RdmaTransport::create(std::shared_ptr<RdmaDevice> device, CmId id,
                                                             RdmaTransportOptions options) {
  if (!device || id.id() == nullptr || id.channel() == nullptr) {
    return makeError(FL_EINVAL, "rdma transport: needs a device and an rdma_cm id with its own channel");
  }
  if (options.send_queue_depth == 0 || options.recv_queue_depth == 0 || options.signal_interval == 0 ||
      options.max_batch == 0) {
    return makeError(FL_EINVAL, "rdma transport: queue depths, signal interval and batch must be >= 1");
  }
  if (id.id()->verbs != device->context()) {
    const char* other = id.id()->verbs ? device->api().deviceName(id.id()->verbs) : "no device";
    return makeError(FL_ERR_TRANSPORT, std::string("rdma transport: the connection runs over ") +
                                           (other ? other : "?") + ", but this daemon uses " +
                                           device->name() +
                                           " (the route to the peer leaves through another interface)");
  }
  // A signalled WR at least every send_queue_depth WRs, or the send queue
  // could fill with WRs that never complete.
  options.signal_interval = std::min(options.signal_interval, options.send_queue_depth);
  options.max_batch = std::min(options.max_batch, options.send_queue_depth);
  std::unique_ptr<RdmaTransport> t(new RdmaTransport(std::move(device), std::move(id), options));
  Status s = t->setUp();
  if (!s) return std::move(s).error().context("rdma transport");
  return t;
}

RdmaTransport::RdmaTransport(std::shared_ptr<RdmaDevice> device, CmId id, RdmaTransportOptions options)
    : device_(std::move(device)), api_(device_->api()), options_(options), cm_(std::move(id)) {}

Status RdmaTransport::setUp() {
  // Nothing else holds the transport yet; the lock is for the analysis (the
  // members below are guarded) and costs nothing.
  MutexLock lock(mu_);
  const uint32_t sq = options_.send_queue_depth;
  const uint32_t rq = options_.recv_queue_depth;
  const auto& attr = device_->attributes();
  if (attr.max_qp_wr > 0 &&
      (sq > static_cast<uint32_t>(attr.max_qp_wr) || rq > static_cast<uint32_t>(attr.max_qp_wr))) {
    return makeError(FL_EINVAL, "queue depth " + std::to_string(std::max(sq, rq)) +
                                    " exceeds the device's max_qp_wr " + std::to_string(attr.max_qp_wr));
  }
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int lfd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int pfd = ::epoll_create1(EPOLL_CLOEXEC);
  event_fd_.reset(efd);
  link_fd_.reset(lfd);
  epoll_fd_.reset(pfd);
  if (efd < 0 || lfd < 0 || pfd < 0) {
    return makeError(FL_ERR_RESOURCES, std::string("eventfd/epoll: ") + std::strerror(errno));
  }

  comp_channel_ = api_.createCompChannel(device_->context());
  if (comp_channel_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_create_comp_channel: ") + std::strerror(errno));
  }
  int cqe = static_cast<int>(sq + rq);
  if (attr.max_cqe > 0) cqe = std::min(cqe, attr.max_cqe);
  cq_ = api_.createCq(device_->context(), cqe, this, comp_channel_, 0);
  if (cq_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, "ibv_create_cq(" + std::to_string(cqe) + "): " + std::strerror(errno));
  }

  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling
  qa.cap.max_send_wr = sq;
  qa.cap.max_recv_wr = rq;
  qa.cap.max_send_sge = 2;  // header + payload
  qa.cap.max_recv_sge = 1;  // receives carry no SGE; some providers want at least 1 here
  qa.cap.max_inline_data = 0;
  if (api_.createQp(cm_.id(), device_->pd(), &qa) != 0) {
    return makeError(FL_ERR_RESOURCES, "rdma_create_qp (send " + std::to_string(sq) + ", recv " +
                                           std::to_string(rq) + " WRs): " + std::strerror(errno));
  }
  qp_ = cm_.id()->qp;

  headers_.reset(new (std::nothrow) RdmaWireHeader[sq]);
  if (!headers_) return makeError(FL_ERR_RESOURCES, "out of memory for the header ring");
  std::memset(headers_.get(), 0, sizeof(RdmaWireHeader) * sq);
  // Only the adapter reads the headers (SGE 0 of sends): no access flags.
  headers_mr_ = api_.regMr(device_->pd(), headers_.get(), sizeof(RdmaWireHeader) * sq, 0);
  if (headers_mr_ == nullptr) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_reg_mr of the header ring: ") + std::strerror(errno));
  }

  sends_.resize(sq);
  send_wrs_.resize(sq);
  send_sges_.resize(size_t{2} * sq);
  recv_wrs_.resize(rq);

  if (!setNonBlocking(comp_channel_->fd) || !setNonBlocking(cm_.channel()->fd)) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("O_NONBLOCK on the event channels: ") + std::strerror(errno));
  }
  for (int fd : {comp_channel_->fd, cm_.channel()->fd, event_fd_.get(), link_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return makeError(FL_ERR_RESOURCES, std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }

  // Receives before the connection is accepted: the peer may write at once.
  replenishRecvsLocked();
  if (recvs_posted_ != rq) return makeError(FL_ERR_RESOURCES, "ibv_post_recv failed while setting up");
  if (api_.reqNotifyCq(cq_, 0) != 0) {
    return makeError(FL_ERR_RESOURCES, std::string("ibv_req_notify_cq: ") + std::strerror(errno));
  }
  cq_armed_ = true;
  watch_id_ = device_->watch(qp_, cq_, [this](int status, const std::string& message) {
    {
      MutexLock l(async_mu_);
      if (!async_error_) async_error_.emplace(status, message);
    }
    signalEventFd(link_fd_.get());
  });
  return {};
}

void RdmaTransport::established(std::string peer_name) noexcept {
  MutexLock lock(mu_);
  peer_name_ = std::move(peer_name);
  if (!failed_ && !torn_down_) connected_.store(true, std::memory_order_release);
}

RdmaTransport::~RdmaTransport() {
  shutdown();
  MutexLock lock(mu_);
  tearDownLocked();
}

// ---------------------------------------------------------------- credits

Result<RemoteCredit> RdmaTransport::exposeCredit(LocalCredit credit) {
  if (credit.buffer == nullptr) return makeError(FL_EINVAL, "exposeCredit: null buffer");
  MutexLock lock(mu_);
  if (failed_ || torn_down_) return makeError(FL_ERR_LINK_LOST, "exposeCredit: the link is down");
  uint8_t* landing = credit.buffer - kWireHeaderBytes;
  const uint64_t landing_length = kWireHeaderBytes + credit.capacity;
  uint32_t rkey = 0;
  if (!device_->lookupRemote(landing, landing_length, &rkey)) {
    return makeError(FL_EINVAL, "exposeCredit(" + std::to_string(credit.credit_id) +
                                    "): the buffer and the 256-byte slot header before it are not inside "
                                    "one remote-write registration on " +
                                    device_->name());
  }
  const auto index = static_cast<uint32_t>(credit.credit_id);
  auto it = credits_.find(index);
  if (it != credits_.end() && !it->second.retracted) {
    if (it->second.credit_id == credit.credit_id) {
      return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(credit.credit_id) +
                                      " is already exposed (credit ids must be unique per link)");
    }
    return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(credit.credit_id) +
                                    " has the same low 32 bits as exposed credit " +
                                    std::to_string(it->second.credit_id) + " (the rdma immediate data)");
  }
  RemoteCredit remote{credit.credit_id, credit.capacity, reinterpret_cast<uint64_t>(landing), rkey};
  Credit c{credit.credit_id, credit.buffer, credit.capacity, std::move(credit.keepalive), false};
  if (it != credits_.end()) {
    it->second = std::move(c);  // replaces a retracted one (its FIFO entry goes stale)
  } else {
    credits_.emplace(index, std::move(c));
  }
  return remote;
}

void RdmaTransport::retractCredit(uint64_t credit_id) {
  MutexLock lock(mu_);
  auto it = credits_.find(static_cast<uint32_t>(credit_id));
  if (it == credits_.end() || it->second.credit_id != credit_id || it->second.retracted) return;
  // The peer may have posted its write already, and nothing stops an RDMA
  // write: the buffer stays mapped (keepalive) so that such a frame is
  // reported with its header, as FL_ERR_UNKNOWN_CREDIT.
  it->second.retracted = true;
  retracted_.push_back(it->first);
  while (retracted_.size() > options_.max_retracted_credits) {
    auto old = credits_.find(retracted_.front());
    if (old != credits_.end() && old->second.retracted) credits_.erase(old);
    retracted_.pop_front();
  }
}

// ---------------------------------------------------------------- sending

PostResult RdmaTransport::post(const SendRequest& r) noexcept {
  if (*validateSendRequest(r) != '\0') return PostResult::kInvalid;
  MutexLock lock(mu_);
  if (failed_ || torn_down_ || !connected_.load(std::memory_order_relaxed)) return PostResult::kNotConnected;
  uint32_t lkey = 0;
  if (r.header.length > 0 && !device_->lookupLocal(r.payload, r.header.length, &lkey)) {
    return PostResult::kInvalid;  // payload not registered on this device
  }
  if (next_seq_ - done_seq_ >= options_.send_queue_depth) {
    ++counters_.backpressure;
    return PostResult::kBackpressure;
  }
  const uint64_t seq = next_seq_;
  const size_t slot = seq % options_.send_queue_depth;
  RdmaWireHeader* h = &headers_[slot];
  toWire(r.header, h);
  ibv_sge* sge = &send_sges_[2 * slot];
  sge[0].addr = reinterpret_cast<uint64_t>(h);
  sge[0].length = kWireHeaderBytes;
  sge[0].lkey = headers_mr_->lkey;
  sge[1].addr = reinterpret_cast<uint64_t>(r.payload);
  sge[1].length = static_cast<uint32_t>(r.header.length);
  sge[1].lkey = lkey;
  ibv_send_wr& wr = send_wrs_[slot];
  wr = {};
  wr.wr_id = seq;
  wr.sg_list = sge;
  wr.num_sge = r.header.length > 0 ? 2 : 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(static_cast<uint32_t>(r.credit.credit_id));
  wr.wr.rdma.remote_addr = r.credit.remote_addr;
  wr.wr.rdma.rkey = r.credit.rkey;
  sends_[slot] = PendingSend{r.cookie, r.header.length};
  ++next_seq_;
  if (next_seq_ - posted_seq_ >= options_.max_batch) flushLocked();
  return PostResult::kOk;
}

void RdmaTransport::flush() noexcept {
  MutexLock lock(mu_);
  flushLocked();
}

void RdmaTransport::flushLocked() noexcept {
  if (posted_seq_ == next_seq_ || failed_ || torn_down_) return;
  const uint32_t depth = options_.send_queue_depth;
  ibv_send_wr* first = &send_wrs_[posted_seq_ % depth];
  for (uint64_t seq = posted_seq_; seq < next_seq_; ++seq) {
    ibv_send_wr& wr = send_wrs_[seq % depth];
    const bool last = seq + 1 == next_seq_;
    wr.next = last ? nullptr : &send_wrs_[(seq + 1) % depth];
    if (last || ++since_signal_ >= options_.signal_interval) {
      wr.send_flags = IBV_SEND_SIGNALED;
      since_signal_ = 0;
      ++counters_.signalled_wrs;
    } else {
      wr.send_flags = 0;
    }
  }
  ibv_send_wr* bad = nullptr;
  ++counters_.post_send_calls;
  int rc = api_.postSend(qp_, first, &bad);
  if (rc == 0) {
    counters_.send_wrs += next_seq_ - posted_seq_;
    posted_seq_ = next_seq_;
    return;
  }
  // WRs before `bad` are on the queue; the rest never got there and
  // complete as lost once the queue has flushed.
  uint64_t accepted = bad != nullptr ? bad->wr_id : posted_seq_;
  counters_.send_wrs += accepted - posted_seq_;
  posted_seq_ = accepted;
  failLocked(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": ibv_post_send failed: " + std::strerror(rc));
}

// ---------------------------------------------------------------- failure

void RdmaTransport::failLocked(int status, const std::string& message) noexcept {
  if (failed_) return;
  failed_ = true;
  connected_.store(false, std::memory_order_release);
  if (status != FL_ERR_SHUTDOWN) spdlog::warn("{}", message);
  TransportEvent ev;
  ev.kind = TransportEvent::Kind::kLinkError;
  ev.status = status;
  ev.message = message;
  pushEvent(std::move(ev));
  if (!torn_down_) {
    // The QP to ERR flushes every WR still on it (each comes back as a
    // flush error and completes as FL_ERR_LINK_LOST); rdma_disconnect tells
    // the peer now rather than after its retries run out.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api_.modifyQp(qp_, &attr, IBV_QP_STATE);
    api_.disconnect(cm_.id());
  }
  completeUnpostedIfDrainedLocked();
}

void RdmaTransport::completeSendsThrough(uint64_t seq, int status) noexcept {
  // RC completes in order: an error at `seq` means every earlier WR
  // succeeded (or it would have completed in error first).
  for (; done_seq_ <= seq && done_seq_ < posted_seq_; ++done_seq_) {
    const PendingSend& p = sends_[done_seq_ % options_.send_queue_depth];
    int s = done_seq_ == seq ? status : FL_OK;
    if (failed_ && s == FL_OK) s = FL_ERR_LINK_LOST;
    if (s == FL_OK) {
      ++counters_.frames_sent;
      counters_.bytes_sent += p.bytes;
    }
    TransportEvent ev;
    ev.kind = TransportEvent::Kind::kSendComplete;
    ev.cookie = p.cookie;
    ev.status = s;
    pushEvent(std::move(ev));
  }
}

void RdmaTransport::completeUnpostedIfDrainedLocked() noexcept {
  // Once the queue has given back every WR, the ones that never reached it
  // are reported, after them (in posting order).
  if (!failed_ || done_seq_ < posted_seq_) return;
  posted_seq_ = next_seq_;
  if (next_seq_ > done_seq_) completeSendsThrough(next_seq_ - 1, FL_ERR_LINK_LOST);
}

// ---------------------------------------------------------------- events

void RdmaTransport::pushEvent(TransportEvent event) noexcept {
  try {
    events_.push_back(std::move(event));
  } catch (...) {
    // Out of memory while reporting: the control link's ACK timeout
    // recovers the frame.
  }
}

void RdmaTransport::frameArrived(const FrameHeader& header, int status, std::string message) noexcept {
  if (status == FL_ERR_UNKNOWN_CREDIT) ++counters_.unknown_credit_frames;
  TransportEvent ev;
  ev.kind = TransportEvent::Kind::kFrameArrived;
  ev.status = status;
  ev.header = header;
  ev.message = std::move(message);
  pushEvent(std::move(ev));
}

void RdmaTransport::drainAsyncErrorLocked() noexcept {
  drainEventFd(link_fd_.get());
  std::optional<std::pair<int, std::string>> e;
  {
    MutexLock l(async_mu_);
    e = async_error_;
  }
  if (e) failLocked(e->first, e->second + " (link to " + peer_name_ + ")");
}

void RdmaTransport::drainCmEventsLocked() noexcept {
  rdma_cm_event* event = nullptr;
  while (api_.getCmEvent(cm_.channel(), &event) == 0) {
    const rdma_cm_event_type type = event->event;
    const int status = event->status;
    api_.ackCmEvent(event);
    switch (type) {
      case RDMA_CM_EVENT_DISCONNECTED:
        failLocked(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": the peer disconnected");
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        failLocked(kStatusDevice,
                   "rdma link to " + peer_name_ + ": device " + device_->name() + " was removed");
        break;
      case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      case RDMA_CM_EVENT_ESTABLISHED:
        break;
      default:
        spdlog::info("rdma link to {}: rdma_cm event {} (status {})", peer_name_, rdma_event_str(type),
                     status);
        break;
    }
  }
}

void RdmaTransport::drainCqLocked() noexcept {
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (api_.getCqEvent(comp_channel_, &ev_cq, &ev_ctx) == 0) {
    cq_armed_ = false;
    if (++unacked_cq_events_ >= kCqEventAckBatch) {
      api_.ackCqEvents(cq_, unacked_cq_events_);
      unacked_cq_events_ = 0;
    }
  }
  ibv_wc wcs[kPollBatch];
  for (;;) {
    int n = api_.pollCq(cq_, kPollBatch, wcs);
    if (n < 0) {
      failLocked(kStatusDevice, "rdma link to " + peer_name_ + ": ibv_poll_cq failed on " + device_->name());
      return;
    }
    for (int i = 0; i < n; ++i) handleWc(wcs[i]);
    if (n == kPollBatch) continue;
    if (cq_armed_) return;
    // Empty: arm, then poll once more — a completion that came between the
    // last poll and the arming raised no event.
    if (api_.reqNotifyCq(cq_, 0) != 0) {
      failLocked(kStatusDevice,
                 "rdma link to " + peer_name_ + ": ibv_req_notify_cq failed on " + device_->name());
      return;
    }
    cq_armed_ = true;
  }
}

void RdmaTransport::handleWc(const ibv_wc& wc) noexcept {
  if (wc.wr_id & kRecvTag) {
    handleRecvWc(wc);
  } else {
    handleSendWc(wc);
  }
}

void RdmaTransport::handleSendWc(const ibv_wc& wc) noexcept {
  const uint64_t seq = wc.wr_id;
  if (seq < done_seq_ || seq >= posted_seq_) return;  // not one of ours any more
  if (wc.status == IBV_WC_SUCCESS) {
    completeSendsThrough(seq, FL_OK);
    return;
  }
  const WcClassification c = classifyWcStatus(wc.status);
  if (failed_) {  // flushed after the link went down: expected
    completeSendsThrough(seq, FL_ERR_LINK_LOST);
    completeUnpostedIfDrainedLocked();
    return;
  }
  completeSendsThrough(seq, c.frame_status);
  failLocked(c.link_status, "rdma link to " + peer_name_ + ": send completed with " +
                                ibv_wc_status_str(wc.status) + " (vendor error " +
                                std::to_string(wc.vendor_err) + "; " + scopeName(c.scope) + " error)");
}

void RdmaTransport::handleRecvWc(const ibv_wc& wc) noexcept {
  if (recvs_posted_ > 0) --recvs_posted_;
  if (wc.status != IBV_WC_SUCCESS) {
    if (!failed_) {
      const WcClassification c = classifyWcStatus(wc.status);
      failLocked(c.link_status, "rdma link to " + peer_name_ + ": receive completed with " +
                                    ibv_wc_status_str(wc.status) + " (" + scopeName(c.scope) + " error)");
    }
    return;
  }
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
    failLocked(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ +
                                    ": the peer sent something other than "
                                    "RDMA_WRITE_WITH_IMM (opcode " +
                                    std::to_string(wc.opcode) + ")");
    return;
  }
  const uint32_t index = ntohl(wc.imm_data);
  FrameHeader header;
  auto it = credits_.find(index);
  if (it == credits_.end()) {
    header.credit_id = index;
    frameArrived(header, FL_ERR_UNKNOWN_CREDIT,
                 "frame for an unknown credit (immediate data " + std::to_string(index) + ")");
    return;
  }
  Credit credit = std::move(it->second);
  credits_.erase(it);  // consumed by this frame
  RdmaWireHeader wire{};
  std::memcpy(&wire, credit.buffer - kWireHeaderBytes, sizeof wire);
  fromWire(wire, credit.credit_id, &header);
  if (credit.retracted) {
    frameArrived(header, FL_ERR_UNKNOWN_CREDIT,
                 "frame for retracted credit " + std::to_string(credit.credit_id));
    return;
  }
  if (wire.attr_length > FL_MAX_ATTR_BYTES || wire.length > credit.capacity ||
      wc.byte_len != kWireHeaderBytes + wire.length) {
    failLocked(FL_ERR_PROTOCOL,
               "rdma link to " + peer_name_ + ": frame for credit " + std::to_string(credit.credit_id) +
                   " wrote " + std::to_string(wc.byte_len) + " bytes for a header announcing " +
                   std::to_string(wire.length) + " (capacity " + std::to_string(credit.capacity) +
                   ", attr_length " + std::to_string(wire.attr_length) + ")");
    return;
  }
  ++counters_.frames_received;
  counters_.bytes_received += wire.length;
  frameArrived(header, FL_OK, {});
}

void RdmaTransport::replenishRecvsLocked() noexcept {
  if (failed_ || torn_down_) return;
  const uint32_t want = options_.recv_queue_depth - recvs_posted_;
  if (want == 0) return;
  for (uint32_t i = 0; i < want; ++i) {
    ibv_recv_wr& wr = recv_wrs_[i];
    wr = {};
    wr.wr_id = kRecvTag | i;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    wr.next = i + 1 < want ? &recv_wrs_[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  int rc = api_.postRecv(qp_, recv_wrs_.data(), &bad);
  uint32_t posted = want;
  if (rc != 0) posted = bad != nullptr ? static_cast<uint32_t>(bad - recv_wrs_.data()) : 0;
  recvs_posted_ += posted;
  counters_.recv_wrs += posted;
  if (rc != 0) {
    failLocked(FL_ERR_LINK_LOST,
               "rdma link to " + peer_name_ + ": ibv_post_recv failed: " + std::strerror(rc));
  }
}

size_t RdmaTransport::poll(TransportEvent* out, size_t max) noexcept {
  MutexLock lock(mu_);
  if (!torn_down_) {
    drainAsyncErrorLocked();
    drainCmEventsLocked();
    drainCqLocked();
    completeUnpostedIfDrainedLocked();
    // Receives the peer used up, and WRs a caller forgot to flush.
    if (recvs_posted_ < options_.recv_queue_depth / 2 + 1) replenishRecvsLocked();
    flushLocked();
  }
  size_t taken = 0;
  while (taken < max && !events_.empty()) {
    out[taken++] = std::move(events_.front());
    events_.pop_front();
  }
  if (events_.empty()) {
    drainEventFd(event_fd_.get());
  } else {
    signalEventFd(event_fd_.get());  // level-triggered for the caller
  }
  return taken;
}

// ---------------------------------------------------------------- teardown

void RdmaTransport::shutdown() noexcept {
  MutexLock lock(mu_);
  failLocked(FL_ERR_SHUTDOWN, "rdma link to " + peer_name_ + " shut down locally");
  tearDownLocked();
  if (!events_.empty()) signalEventFd(event_fd_.get());
}

void RdmaTransport::tearDownLocked() noexcept {
  if (torn_down_) return;
  torn_down_ = true;
  connected_.store(false, std::memory_order_release);
  if (watch_id_ != 0) device_->unwatch(watch_id_);
  watch_id_ = 0;
  if (qp_ != nullptr) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api_.modifyQp(qp_, &attr, IBV_QP_STATE);
    api_.disconnect(cm_.id());
    // Whatever the CQ already holds is reported as it is; after
    // rdma_destroy_qp the adapter touches no payload any more, so every
    // send still outstanding is lost, in posting order.
    ibv_wc wcs[kPollBatch];
    int n;
    while (cq_ != nullptr && (n = api_.pollCq(cq_, kPollBatch, wcs)) > 0) {
      for (int i = 0; i < n; ++i) handleWc(wcs[i]);
    }
    api_.destroyQp(cm_.id());
    qp_ = nullptr;
  }
  posted_seq_ = std::max(posted_seq_, done_seq_);
  if (next_seq_ > done_seq_) {
    posted_seq_ = next_seq_;
    completeSendsThrough(next_seq_ - 1, FL_ERR_LINK_LOST);
  }
  if (comp_channel_ != nullptr) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, comp_channel_->fd, nullptr);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    while (api_.getCqEvent(comp_channel_, &ev_cq, &ev_ctx) == 0) ++unacked_cq_events_;
  }
  if (cq_ != nullptr) {
    if (unacked_cq_events_ > 0) api_.ackCqEvents(cq_, unacked_cq_events_);
    unacked_cq_events_ = 0;
    api_.destroyCq(cq_);
    cq_ = nullptr;
  }
  if (comp_channel_ != nullptr) {
    api_.destroyCompChannel(comp_channel_);
    comp_channel_ = nullptr;
  }
  if (headers_mr_ != nullptr) {
    api_.deregMr(headers_mr_);
    headers_mr_ = nullptr;
  }
  if (cm_.channel() != nullptr) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, cm_.channel()->fd, nullptr);
    rdma_cm_event* event = nullptr;
    while (api_.getCmEvent(cm_.channel(), &event) == 0) api_.ackCmEvent(event);
  }
  cm_.reset();
  // Credits keep their buffers mapped only while a write can land.
  credits_.clear();
  retracted_.clear();
}

RdmaTransport::Counters RdmaTransport::counters() const noexcept {
  MutexLock lock(mu_);
  return counters_;
}

}  // namespace framelink::transport::rdma
