// RdmaTransport's event side: work completions, the connection's rdma_cm
// events and the device's asynchronous errors become TransportEvents (one
// SendComplete per accepted post, in posting order; FrameArrived once the
// landed header matches the byte count; one LinkError), and poll() hands
// them out.  Runs on the calling thread, like the rest of the transport
// (see rdma_transport.h); only async_error_ is shared with the device's
// event thread.
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "transport/rdma/rdma_status.h"
#include "transport/rdma/rdma_transport.h"

namespace framelink::transport::rdma {
namespace {

constexpr unsigned int kCqEventAckBatch = 64;
// Receives are reposted only while fewer events than this wait for the
// caller: the data agent takes at most 64 a poll.
constexpr size_t kRepostBelowEvents = 64;

void drainEventFd(int fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}

}  // namespace

// ---------------------------------------------------------------- sends

void RdmaTransport::releaseControlBeforeFrame(uint64_t frame_seq) noexcept {
  // The send queue completes in order: every control WR posted before frame
  // `frame_seq` is done with its chunk.
  const uint32_t chunks = options_.control_send_chunks;
  while (ctl_done_seq_ < ctl_posted_seq_ && ctl_frames_before_[ctl_done_seq_ % chunks] <= frame_seq) {
    ++ctl_done_seq_;
  }
}

void RdmaTransport::completeSendsThrough(uint64_t seq, int status) noexcept {
  // RC completes in order: an error at `seq` means every earlier WR
  // succeeded (or it would have completed in error first).
  if (seq < posted_seq_) releaseControlBeforeFrame(seq);
  for (; done_seq_ <= seq && done_seq_ < posted_seq_; ++done_seq_) {
    const PendingSend& p = sends_[done_seq_ % options_.send_queue_depth];
    const int done = done_seq_ == seq ? status : FL_OK;
    if (p.piece && done == FL_OK) continue;  // the read's last piece reports it
    if (p.read_tag != 0) {
      book_.readDone(p.read_tag, done, p.bytes,
                     done == FL_OK ? std::string()
                                   : "the read of an offered frame failed (the peer's window refused it, "
                                     "or the link went)");
    } else {
      book_.sendDone(p.cookie, done, p.bytes);
    }
  }
}

void RdmaTransport::completeUnpostedIfDrained() noexcept {
  // Once the queue has given back every WR, the ones that never reached it
  // are reported, after them (in posting order).
  if (!book_.failed() || done_seq_ < posted_seq_) return;
  posted_seq_ = next_seq_;
  if (next_seq_ > done_seq_) completeSendsThrough(next_seq_ - 1, FL_ERR_LINK_LOST);
}

// ---------------------------------------------------------------- events

void RdmaTransport::drainAsyncError() noexcept {
  drainEventFd(link_fd_.get());
  std::optional<std::pair<int, std::string>> e;
  {
    MutexLock l(async_mu_);
    e = async_error_;
  }
  if (e) fail(e->first, e->second + " (link to " + peer_name_ + ")");
}

void RdmaTransport::drainCmEvents() noexcept {
  rdma_cm_event* event = nullptr;
  while (api_.getCmEvent(cm_.channel(), &event) == 0) {
    const rdma_cm_event_type type = event->event;
    const int status = event->status;
    api_.ackCmEvent(event);
    switch (type) {
      case RDMA_CM_EVENT_DISCONNECTED:
        // A disconnect is often the consequence of a failed work request
        // (the peer's queue pair failed on our write): a completion saying
        // so names the cause, so it goes first.
        drainCq();
        fail(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": the peer disconnected");
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        fail(kStatusDevice, "rdma link to " + peer_name_ + ": device " + device_->name() + " was removed");
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

void RdmaTransport::drainCq(bool channel_ready) noexcept {
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (channel_ready && api_.getCqEvent(comp_channel_, &ev_cq, &ev_ctx) == 0) {
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
      fail(kStatusDevice, "rdma link to " + peer_name_ + ": ibv_poll_cq failed on " + device_->name());
      return;
    }
    for (int i = 0; i < n; ++i) handleWc(wcs[i]);
    if (n == kPollBatch) continue;
    if (cq_armed_) return;
    // Empty: arm, then poll once more — a completion that came between the
    // last poll and the arming raised no event.
    if (api_.reqNotifyCq(cq_, 0) != 0) {
      fail(kStatusDevice, "rdma link to " + peer_name_ + ": ibv_req_notify_cq failed on " + device_->name());
      return;
    }
    cq_armed_ = true;
  }
}

void RdmaTransport::failOnWc(const ibv_wc& wc, int status, const std::string& message) noexcept {
  if (wc.status != IBV_WC_WR_FLUSH_ERR) {
    fail(status, message);
  } else if (!flush_failure_) {
    flush_failure_.emplace(status, message);
  }
}

void RdmaTransport::handleWc(const ibv_wc& wc) noexcept {
  if (wc.wr_id & kRecvTag) {
    handleRecvWc(wc);
  } else if (wc.wr_id & kControlTag) {
    handleControlSendWc(wc);
  } else if (wc.wr_id & kWindowTag) {
    handleWindowWc(wc);
  } else {
    handleSendWc(wc);
  }
}

void RdmaTransport::handleControlSendWc(const ibv_wc& wc) noexcept {
  const uint64_t cseq = wc.wr_id & ~kControlTag;
  if (cseq < ctl_done_seq_ || cseq >= ctl_posted_seq_) return;  // not one of ours any more
  // This WR and every earlier one are done: the frames posted before it
  // completed (in order, and without error, or they would have completed in
  // error first), and the earlier control chunks are free.
  const uint64_t frames_before = ctl_frames_before_[cseq % options_.control_send_chunks];
  ctl_done_seq_ = cseq + 1;
  if (frames_before > done_seq_) completeSendsThrough(frames_before - 1, FL_OK);
  if (wc.status == IBV_WC_SUCCESS) return;
  if (book_.failed()) {  // flushed after the link went down: expected
    completeUnpostedIfDrained();
    return;
  }
  const WcClassification c = classifyWcStatus(wc.status);
  failOnWc(wc, c.link_status,
           "rdma link to " + peer_name_ + ": control send completed with " + ibv_wc_status_str(wc.status) +
               " (vendor error " + std::to_string(wc.vendor_err) + "; " + scopeName(c.scope) + " error)");
}

void RdmaTransport::handleSendWc(const ibv_wc& wc) noexcept {
  const uint64_t seq = wc.wr_id;
  if (seq < done_seq_ || seq >= posted_seq_) {
    // Not one of ours any more; an error still means the queue pair failed.
    if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR && !book_.failed()) {
      fail(classifyWcStatus(wc.status).link_status,
           "rdma link to " + peer_name_ + ": a work request completed with " + ibv_wc_status_str(wc.status));
    }
    return;
  }
  if (wc.status == IBV_WC_SUCCESS) {
    completeSendsThrough(seq, FL_OK);
    return;
  }
  const WcClassification c = classifyWcStatus(wc.status);
  if (book_.failed()) {  // flushed after the link went down: expected
    completeSendsThrough(seq, FL_ERR_LINK_LOST);
    completeUnpostedIfDrained();
    return;
  }
  const bool read = sends_[seq % options_.send_queue_depth].read_tag != 0;
  completeSendsThrough(seq, c.frame_status);
  failOnWc(wc, c.link_status,
           "rdma link to " + peer_name_ + (read ? ": a read of an offered frame" : ": send") +
               " completed with " + ibv_wc_status_str(wc.status) + " (vendor error " +
               std::to_string(wc.vendor_err) + "; " + scopeName(c.scope) + " error)");
}

void RdmaTransport::handleRecvWc(const ibv_wc& wc) noexcept {
  if (recvs_posted_ > 0) --recvs_posted_;
  if (wc.status != IBV_WC_SUCCESS) {
    if (!book_.failed()) {
      const WcClassification c = classifyWcStatus(wc.status);
      failOnWc(wc, c.link_status,
               "rdma link to " + peer_name_ + ": receive completed with " + ibv_wc_status_str(wc.status) +
                   " (" + scopeName(c.scope) + " error)");
    }
    return;
  }
  if (wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM)) {
    controlArrived(wc);
    return;
  }
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ +
                              ": the peer sent something other than "
                              "RDMA_WRITE_WITH_IMM or SEND_WITH_IMM (opcode " +
                              std::to_string(wc.opcode) + ", flags " + std::to_string(wc.wc_flags) + ")");
    return;
  }
  const uint32_t index = ntohl(wc.imm_data);
  FrameHeader header;
  // The credit is consumed by this frame (a retracted one too).
  const LocalCredit* credit = book_.credits().beginLanding(index);
  // Its window ends before the slot can be granted again; the slot's memory
  // stays until then.
  endWindow(windows_, index, WindowHold{credit != nullptr ? credit->keepalive : nullptr, 0});
  if (credit == nullptr) {
    header.credit_id = index;
    book_.frameArrived(header, FL_ERR_UNKNOWN_CREDIT,
                       "frame for an unknown credit (immediate data " + std::to_string(index) + ")");
    return;
  }
  const uint64_t credit_id = credit->credit_id;
  const uint64_t capacity = credit->capacity;
  RdmaWireHeader wire{};
  std::memcpy(&wire, credit->buffer - kWireHeaderBytes, sizeof wire);
  fromWire(wire, credit_id, &header);
  if (!book_.credits().endLanding()) {
    book_.frameArrived(header, FL_ERR_UNKNOWN_CREDIT,
                       "frame for retracted credit " + std::to_string(credit_id));
    return;
  }
  if (wire.length == kPoisonedLength) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ + ": a frame named credit " +
                              std::to_string(credit_id) +
                              " but wrote no header into its slot (the write landed in another window)");
    return;
  }
  if (wire.attr_length > FL_MAX_ATTR_BYTES || wire.length > capacity ||
      wc.byte_len != kWireHeaderBytes + wire.length) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ + ": frame for credit " + std::to_string(credit_id) +
                              " wrote " + std::to_string(wc.byte_len) + " bytes for a header announcing " +
                              std::to_string(wire.length) + " (capacity " + std::to_string(capacity) +
                              ", attr_length " + std::to_string(wire.attr_length) + ")");
    return;
  }
  book_.frameArrived(header, FL_OK);
}

void RdmaTransport::controlArrived(const ibv_wc& wc) noexcept {
  const uint32_t imm = ntohl(wc.imm_data);
  const uint64_t chunk = wc.wr_id & ~kRecvTag;
  if ((imm != kControlImmMore && imm != kControlImmLast) || chunk >= options_.recv_queue_depth ||
      wc.byte_len > options_.control_chunk_bytes) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ + ": a SEND_WITH_IMM that is no control fragment " +
                              "(immediate data " + std::to_string(imm) + ", " + std::to_string(wc.byte_len) +
                              " bytes; peers of different framelink versions?)");
    return;
  }
  if (ctl_rx_.size() + wc.byte_len > kMaxControlBytes) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ + ": the peer sent a control record of more than " +
                              std::to_string(kMaxControlBytes) + " bytes (kMaxControlBytes; " +
                              std::to_string(ctl_rx_.size() + wc.byte_len) + " so far)");
    return;
  }
  const uint8_t* data = recv_buf_.get() + chunk * options_.control_chunk_bytes;
  try {
    ctl_rx_.append(reinterpret_cast<const char*>(data), wc.byte_len);
  } catch (...) {
    fail(FL_ERR_RESOURCES, "rdma link to " + peer_name_ + ": out of memory for a control record");
    return;
  }
  if (imm == kControlImmMore) return;
  if (ctl_rx_.empty()) {
    fail(FL_ERR_PROTOCOL, "rdma link to " + peer_name_ + ": the peer sent an empty control record");
    return;
  }
  book_.controlArrived(ctl_rx_);
}

void RdmaTransport::replenishRecvs() noexcept {
  if (book_.failed()) return;
  const uint32_t depth = options_.recv_queue_depth;
  const uint32_t want = depth - recvs_posted_;
  if (want == 0) return;
  // The receive queue consumes WRs in posting order, so the chunks of the
  // `want` WRs it gave back are the ones after those still posted.
  for (uint32_t i = 0; i < want; ++i) {
    const uint64_t chunk = (recv_next_ + i) % depth;
    ibv_sge& sge = recv_sges_[i];
    sge.addr = reinterpret_cast<uint64_t>(recv_buf_.get() + chunk * options_.control_chunk_bytes);
    sge.length = options_.control_chunk_bytes;
    sge.lkey = recv_mr_->lkey;
    ibv_recv_wr& wr = recv_wrs_[i];
    wr = {};
    wr.wr_id = kRecvTag | chunk;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.next = i + 1 < want ? &recv_wrs_[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  int rc = api_.postRecv(qp_, recv_wrs_.data(), &bad);
  uint32_t posted = want;
  if (rc != 0) posted = bad != nullptr ? static_cast<uint32_t>(bad - recv_wrs_.data()) : 0;
  recvs_posted_ += posted;
  recv_next_ += posted;
  verbs_counters_.recv_wrs += posted;
  if (rc != 0) {
    fail(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": ibv_post_recv failed: " + std::strerror(rc));
  }
}

RdmaTransport::ReadyChannels RdmaTransport::readyChannels() noexcept {
  epoll_event evs[4];
  const int n = ::epoll_wait(epoll_fd_.get(), evs, 4, 0);
  if (n < 0) return {true, true, true, true};  // cannot tell: read each
  ReadyChannels r;
  for (int i = 0; i < n; ++i) {
    const int fd = evs[i].data.fd;
    r.completions |= comp_channel_ != nullptr && fd == comp_channel_->fd;
    r.cm |= cm_.channel() != nullptr && fd == cm_.channel()->fd;
    r.events |= fd == event_fd_.get();
    r.link |= fd == link_fd_.get();
  }
  return r;
}

void RdmaTransport::watchSendQueue() noexcept {
  if (options_.send_stall_ms == 0 || book_.failed()) return;
  const uint64_t posted = sendQueueUsed() + (window_posted_seq_ - window_done_seq_);
  if (posted == 0) {
    sq_waiting_since_ns_ = 0;
    return;
  }
  const uint64_t progress = done_seq_ + ctl_done_seq_ + window_done_seq_;
  const auto now_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now().time_since_epoch())
                                                .count());
  if (sq_waiting_since_ns_ == 0 || progress != sq_progress_) {
    sq_progress_ = progress;
    sq_waiting_since_ns_ = now_ns;
    return;
  }
  if (now_ns - sq_waiting_since_ns_ < uint64_t{options_.send_stall_ms} * 1'000'000) return;
  fail(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": none of the " + std::to_string(posted) +
                             " work requests on the send queue completed in " +
                             std::to_string((now_ns - sq_waiting_since_ns_) / 1'000'000) +
                             " ms (link_timeout_ms): the peer takes none of this end's sends (its receive "
                             "queue runs dry); the link ends, and with it every window its credits had");
}

size_t RdmaTransport::poll(TransportEvent* out, size_t max) noexcept {
  // A channel that turns readable after this look is read by the next poll
  // (the CQ itself is polled every time).
  const ReadyChannels ready = readyChannels();
  if (!torn_down_) {
    if (ready.link) drainAsyncError();
    drainCq(ready.completions);  // before rdma_cm: see RDMA_CM_EVENT_DISCONNECTED
    if (ready.cm) drainCmEvents();
    if (flush_failure_) {  // nothing named a cause: the flush is all there is
      fail(flush_failure_->first, flush_failure_->second);
      flush_failure_.reset();
    }
    completeUnpostedIfDrained();
    flushChain();  // WRs a caller forgot to flush
    watchSendQueue();
  }
  const size_t taken = book_.events().take(out, max);
  // Receives the peer used up go back only while few events wait for the
  // caller: a peer that sends faster than the data agent takes its records
  // waits (receiver not ready, retried for ever: rnr_retry 7) instead of
  // filling the event queue a whole receive queue per poll.
  if (!torn_down_ && recvs_posted_ < options_.recv_queue_depth / 2 + 1 &&
      book_.events().size() < kRepostBelowEvents) {
    replenishRecvs();
  }
  if (book_.events().empty()) {
    // Signalled during this poll, it stays readable until the next: one
    // spurious wake-up at most.
    if (ready.events) drainEventFd(event_fd_.get());
  } else {
    signalEventFd(event_fd_.get());  // level-triggered for the caller
  }
  return taken;
}

}  // namespace framelink::transport::rdma
