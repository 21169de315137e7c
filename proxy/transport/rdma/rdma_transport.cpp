#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace framelink::transport::rdma {
void RdmaTransport::signalEventFd(int fd) noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

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

void RdmaTransport::established(std::string peer_name) noexcept {
  peer_name_ = std::move(peer_name);
  if (!book_.failed() && !torn_down_) connected_.store(true, std::memory_order_release);
}

RdmaTransport::~RdmaTransport() { shutdown(); }

// Credits and their memory windows: rdma_windows.cpp.

// ---------------------------------------------------------------- sending

// Queues only: the agent flushes after its round (and poll() posts what
// waits), so a round's records leave in one chain with its frames.
PostResult RdmaTransport::postControl(std::string record) noexcept {
  if (!connected_.load(std::memory_order_relaxed)) return PostResult::kNotConnected;
  return book_.postControl(std::move(record));
}

// The common path takes no lock and looks nothing up: the payload's lkey
// comes with the request, from the registration made when its producer
// attached.
PostResult RdmaTransport::post(const SendRequest& r) noexcept {
  if (!connected_.load(std::memory_order_relaxed)) return PostResult::kNotConnected;
  const char* no_key =
      r.header.length > 0 && !r.local_key
          ? "the payload carries no local memory key (rdma sends only from memory registered "
            "with its device: the producer's data segment, registered when it attached)"
          : nullptr;
  if (const PostResult admitted = book_.admitFrame(r, sendQueueUsed(), options_.send_queue_depth, no_key);
      admitted != PostResult::kOk) {
    return admitted;
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
  sge[1].lkey = r.local_key.value_or(0);  // unused when the frame is empty (one SGE)
  ibv_send_wr& wr = send_wrs_[slot];
  wr = {};
  wr.wr_id = seq;
  wr.sg_list = sge;
  wr.num_sge = r.header.length > 0 ? 2 : 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(static_cast<uint32_t>(r.credit.credit_id));
  wr.wr.rdma.remote_addr = r.credit.remote_addr;
  wr.wr.rdma.rkey = r.credit.rkey;
  sends_[slot] = PendingSend{r.cookie, r.header.length, 0};
  ++next_seq_;
  if (next_seq_ - posted_seq_ >= options_.max_batch) flushChain();
  return PostResult::kOk;
}

// An RDMA_READ from the offer's window straight into the reader's buffer,
// on the send queue with the frames (completions come in order, so the
// selective signalling covers it like a frame).  Nothing is read for an
// empty source: it completes at once.
PostResult RdmaTransport::postRead(const ReadRequest& r) noexcept {
  if (!connected_.load(std::memory_order_relaxed)) return PostResult::kNotConnected;
  // Without a key, the receive registration that holds the buffer (a
  // consumer's slots are registered one by one, each with its own key).
  std::optional<uint32_t> lkey = r.local_key;
  if (!lkey && r.source.length > 0 && r.buffer != nullptr) {
    if (const ibv_mr* mr = device_->windowRegion(r.buffer, r.source.length)) lkey = mr->lkey;
  }
  const char* why = read_depth_ == 0 ? "this rdma link cannot read (the device offers no RDMA READ)"
                    : r.source.length > 0 && !lkey
                        ? "the read's buffer carries no local memory key and lies in no receive registration "
                          "(rdma reads only into memory registered with its device: a consumer's slots)"
                    : r.source.length > UINT32_MAX ? "a read of more than 4 GiB"
                                                   : nullptr;
  const uint64_t length = r.source.length;
  const uint64_t max_pieces = std::min<uint64_t>(kMaxReadPieces, options_.send_queue_depth);
  const uint64_t piece_bytes =
      std::max<uint64_t>({options_.read_piece_bytes, 1, (length + max_pieces - 1) / max_pieces});
  const uint64_t pieces = std::max<uint64_t>(1, (length + piece_bytes - 1) / piece_bytes);
  uint64_t tag = 0;
  if (const PostResult admitted =
          book_.postRead(r, &tag, why, sendQueueUsed() + pieces > options_.send_queue_depth);
      admitted != PostResult::kOk) {
    return admitted;
  }
  if (length == 0) {
    book_.readDone(tag, FL_OK, 0);
    signalEventFd(event_fd_.get());
    return PostResult::kOk;
  }
  for (uint64_t offset = 0; offset < length; offset += piece_bytes) {
    const uint64_t n = std::min(piece_bytes, length - offset);
    const bool last = offset + n == length;
    const uint64_t seq = next_seq_;
    const size_t slot = seq % options_.send_queue_depth;
    ibv_sge* sge = &send_sges_[2 * slot];
    sge[0].addr = reinterpret_cast<uint64_t>(r.buffer) + offset;
    sge[0].length = static_cast<uint32_t>(n);
    sge[0].lkey = *lkey;
    ibv_send_wr& wr = send_wrs_[slot];
    wr = {};
    wr.wr_id = seq;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = r.source.remote_addr + offset;
    wr.wr.rdma.rkey = r.source.rkey;
    sends_[slot] = PendingSend{0, last ? length : n, tag, !last};
    ++next_seq_;
  }
  if (next_seq_ - posted_seq_ >= options_.max_batch) flushChain();
  return PostResult::kOk;
}

void RdmaTransport::flush() noexcept { flushChain(); }

uint32_t RdmaTransport::buildControlWrs(uint32_t room) noexcept {
  const uint32_t chunks = options_.control_send_chunks;
  const size_t chunk_bytes = options_.control_chunk_bytes;
  uint32_t built = 0;
  ControlQueue& backlog = book_.control();
  while (built < room && !backlog.empty() && ctl_posted_seq_ + built - ctl_done_seq_ < chunks) {
    const uint64_t cseq = ctl_posted_seq_ + built;
    const size_t slot = cseq % chunks;
    const std::string& record = backlog.front();
    const size_t n = std::min(chunk_bytes, record.size() - ctl_backlog_offset_);
    uint8_t* dst = ctl_send_buf_.get() + slot * chunk_bytes;
    record.copy(reinterpret_cast<char*>(dst), n, ctl_backlog_offset_);
    ctl_backlog_offset_ += n;
    backlog.consumed(n);
    const bool last = ctl_backlog_offset_ == record.size();
    ibv_sge& sge = ctl_sges_[slot];
    sge.addr = reinterpret_cast<uint64_t>(dst);
    sge.length = static_cast<uint32_t>(n);
    sge.lkey = ctl_send_mr_->lkey;
    ibv_send_wr& wr = ctl_wrs_[slot];
    wr = {};
    wr.wr_id = kControlTag | cseq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(last ? kControlImmLast : kControlImmMore);
    if (n <= max_inline_) {
      wr.send_flags = IBV_SEND_INLINE;
      ++verbs_counters_.control_inline_wrs;
    }
    if (built > 0) ctl_wrs_[(cseq - 1) % chunks].next = &wr;
    // Frames in this chain follow every control WR: posted_seq_ frames came
    // before this one on the queue.
    ctl_frames_before_[slot] = posted_seq_;
    ++built;
    if (last) {
      backlog.dropFront();
      ctl_backlog_offset_ = 0;
      book_.countControlSent(1);
    }
  }
  return built;
}

void RdmaTransport::flushChain() noexcept {
  if (book_.failed()) return;
  if (posted_seq_ == next_seq_ && book_.control().empty() && window_backlog_.empty()) return;
  const uint32_t depth = options_.send_queue_depth;
  const uint32_t chunks = options_.control_send_chunks;
  const uint32_t wdepth = options_.window_queue_depth;
  // Window WRs first: a bind goes before the grant that carries its key.
  const uint32_t nwin = window_backlog_.empty() ? 0 : buildWindowWrs();
  // Then control: what is queued fits in the send queue entries frames
  // have not claimed.
  const uint64_t used = sendQueueUsed();
  const uint32_t room = used < depth ? static_cast<uint32_t>(depth - used) : 0;
  const uint32_t nctl = book_.control().empty() ? 0 : buildControlWrs(room);
  if (nwin == 0 && nctl == 0 && posted_seq_ == next_seq_) return;
  ibv_send_wr* frames_first = posted_seq_ == next_seq_ ? nullptr : &send_wrs_[posted_seq_ % depth];
  ibv_send_wr* ctl_first = nctl > 0 ? &ctl_wrs_[ctl_posted_seq_ % chunks] : frames_first;
  ibv_send_wr* first = nwin > 0 ? &window_ring_[window_posted_seq_ % wdepth].wr : ctl_first;
  ibv_send_wr* last_wr = nullptr;
  if (nwin > 0) {
    last_wr = &window_ring_[(window_posted_seq_ + nwin - 1) % wdepth].wr;
    last_wr->next = ctl_first;
  }
  // Every signal_interval-th WR of the chain is signalled, control or frame.
  auto signalEvery = [this](ibv_send_wr& wr) {
    wr.send_flags &= ~unsigned{IBV_SEND_SIGNALED};  // keeps IBV_SEND_INLINE
    if (++since_signal_ >= options_.signal_interval) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      since_signal_ = 0;
      ++verbs_counters_.signalled_wrs;
    }
  };
  for (uint32_t i = 0; i < nctl; ++i) {
    ibv_send_wr& wr = ctl_wrs_[(ctl_posted_seq_ + i) % chunks];
    signalEvery(wr);
    last_wr = &wr;
  }
  if (nctl > 0) last_wr->next = frames_first;
  for (uint64_t seq = posted_seq_; seq < next_seq_; ++seq) {
    ibv_send_wr& wr = send_wrs_[seq % depth];
    wr.next = seq + 1 == next_seq_ ? nullptr : &send_wrs_[(seq + 1) % depth];
    signalEvery(wr);
    last_wr = &wr;
  }
  // The chain's last WR is always signalled: nothing waits for a later one.
  if (!(last_wr->send_flags & IBV_SEND_SIGNALED)) {
    last_wr->send_flags |= IBV_SEND_SIGNALED;
    since_signal_ = 0;
    ++verbs_counters_.signalled_wrs;
  }
  if (nwin > 0) ++verbs_counters_.signalled_wrs;  // the windows' last
  ibv_send_wr* bad = nullptr;
  ++verbs_counters_.post_send_calls;
  int rc = api_.postSend(qp_, first, &bad);
  settlePosted(rc, bad, nwin, nctl);
}

// WRs before `bad` are on the queue; the rest never got there: frames
// complete as lost once the queue has flushed, control records are lost
// with the link, windows stay bound (and their memory held) until
// tearDown().
void RdmaTransport::settlePosted(int rc, const ibv_send_wr* bad, uint32_t nwin, uint32_t nctl) noexcept {
  const uint32_t wdepth = options_.window_queue_depth;
  uint64_t win_accepted = window_posted_seq_ + nwin;
  uint64_t ctl_accepted = ctl_posted_seq_ + nctl;
  uint64_t accepted = next_seq_;
  if (rc != 0) {
    if (bad == nullptr) {
      win_accepted = window_posted_seq_;
      ctl_accepted = ctl_posted_seq_;
      accepted = posted_seq_;
    } else if (bad->wr_id & kControlTag) {
      ctl_accepted = bad->wr_id & ~kControlTag;
      accepted = posted_seq_;
    } else if (bad->wr_id & kWindowTag) {
      win_accepted = bad->wr_id & ~kWindowTag;
      ctl_accepted = ctl_posted_seq_;
      accepted = posted_seq_;
    } else {
      accepted = bad->wr_id;
    }
  }
  for (uint64_t w = window_posted_seq_; w < win_accepted; ++w) {
    window_ring_[w % wdepth].windows->posted(window_ring_[w % wdepth].wr);
  }
  verbs_counters_.window_wrs += win_accepted - window_posted_seq_;
  verbs_counters_.send_wrs +=
      (win_accepted - window_posted_seq_) + (ctl_accepted - ctl_posted_seq_) + (accepted - posted_seq_);
  verbs_counters_.control_wrs += ctl_accepted - ctl_posted_seq_;
  window_posted_seq_ = win_accepted;
  ctl_posted_seq_ = ctl_accepted;
  posted_seq_ = accepted;
  if (rc != 0) {
    fail(FL_ERR_LINK_LOST, "rdma link to " + peer_name_ + ": ibv_post_send failed: " + std::strerror(rc));
  }
}

// ---------------------------------------------------------------- failure

void RdmaTransport::fail(int status, const std::string& message) noexcept {
  if (!book_.failed()) {
    // The sources' windows stay bound until tearDown() deallocates them (the
    // QP in error reads nothing): so does the memory under them, which a
    // registration with a window bound cannot be let go of.
    try {
      for (auto& memory : book_.sources().takeMemory()) {
        unended_windows_.push_back(WindowHold{std::move(memory), 0});
      }
    } catch (...) {
      // Out of memory: the sources' memory goes with them.
    }
  }
  if (!book_.fail(status, message)) return;
  connected_.store(false, std::memory_order_release);
  warnLinkFailed(status, message);
  if (!torn_down_) {
    // The QP to ERR flushes every WR still on it (each comes back as a
    // flush error and completes as FL_ERR_LINK_LOST); rdma_disconnect tells
    // the peer now rather than after its retries run out.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api_.modifyQp(qp_, &attr, IBV_QP_STATE);
    api_.disconnect(cm_.id());
  }
  completeUnpostedIfDrained();
}

// ---------------------------------------------------------------- teardown

void RdmaTransport::shutdown() noexcept {
  fail(FL_ERR_SHUTDOWN, "rdma link to " + peer_name_ + " shut down locally");
  tearDown();
  if (!book_.events().empty()) signalEventFd(event_fd_.get());
}

void RdmaTransport::tearDown() noexcept {
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
    // A bound type-2 window holds its QP (rxe keeps a reference and
    // destroying the QP waits for it): the windows go first.
    windows_.clear();
    source_windows_.clear();
    api_.destroyQp(cm_.id());
    qp_ = nullptr;
  }
  // No window is bound any more: the memory they held can go.
  windows_.clear();
  source_windows_.clear();
  window_backlog_.clear();
  for (PendingWindowWr& entry : window_ring_) entry.hold = WindowHold{};
  window_done_seq_ = window_posted_seq_;
  unended_windows_.clear();
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
  for (ibv_mr** mr : {&headers_mr_, &ctl_send_mr_, &recv_mr_}) {
    if (*mr != nullptr) api_.deregMr(*mr);
    *mr = nullptr;
  }
  book_.control().clear();
  ctl_rx_.clear();
  if (cm_.channel() != nullptr) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, cm_.channel()->fd, nullptr);
    rdma_cm_event* event = nullptr;
    while (api_.getCmEvent(cm_.channel(), &event) == 0) api_.ackCmEvent(event);
  }
  cm_.reset();
  // Credits keep their buffers mapped only while a write can land.
  book_.credits().clear();
}

}  // namespace framelink::transport::rdma
