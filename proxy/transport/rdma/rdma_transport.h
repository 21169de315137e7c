// The `rdma` data transport over one RC queue pair set up with rdma_cm (see
// rdma_connect.h for how the connection is made).
//
// Send: post() builds one RDMA_WRITE_WITH_IMM per frame — SGE 0 the 256-byte
// RdmaWireHeader (in a small MR this transport owns, one header per
// send-queue entry), SGE 1 the payload straight from the producer's slot
// under the request's local_key (the lkey of the segment's registration,
// made at attach: post() looks nothing up and takes no lock) —
// into the credited consumer slot (remote_addr/rkey of the credit, which
// point at the slot header).  The immediate data is the low 32 bits of the
// credit id: the receiving daemon assigns credit ids, and this transport
// refuses to expose two credits whose low 32 bits collide.  WRs accumulate
// and go to the adapter as one chain in flush() (or when max_batch wait);
// every signal_interval-th WR and the last WR of each chain are signalled,
// and a signalled completion completes every earlier WR, so there is still
// exactly one SendComplete per accepted post, in posting order.
//
// Control records (postControl: credit grants, ACKs, NACKs) travel on the
// same queue pair as SEND_WITH_IMM work requests (rdma_wire.h, part 2).
// postControl only queues the record (bounded by kMaxControlBacklogBytes);
// flush() and poll() copy queued records, split into fragments of at most
// control_chunk_bytes, into a ring of control_send_chunks registered chunks
// this transport owns and put one WR per fragment at the head of the chain,
// ahead of the frames waiting in the same flush: the peer waits for credits
// and ACKs, and they are small.  Control WRs share the send queue and the
// selective signalling with frames; their completions free their chunks and
// report nothing.  A record that finds no free chunk or send-queue entry
// waits (fragments already posted stay posted: the peer reassembles them in
// order) until completions free some.
//
// Receive: every receive WR carries one SGE, a control_chunk_bytes chunk of
// a registered receive buffer (one chunk per WR, recv_queue_depth in all;
// the receive queue consumes them in posting order, so the chunks are used
// as a ring).  An RDMA_WRITE_WITH_IMM consumes one without touching its
// chunk and completes it with the immediate data and the byte count, which
// poll() checks against the header that landed in the credit's slot header
// before reporting FrameArrived.  A SEND_WITH_IMM lands in the chunk:
// poll() appends it to the record being reassembled (failing the link with
// FL_ERR_PROTOCOL beyond kMaxControlBytes) and reports one Control event
// per record.  Receive WRs are replenished from poll(), one ibv_post_recv
// chain at a time.
//
// Reads (pull, rdma_windows.cpp and post side here): exposeSource binds a
// type-2 window, remote read only, over exactly the offered payload in the
// producer's segment, with the next flush, ahead of the offer that carries
// its key; retractSource invalidates it.  postRead puts one RDMA_READ from
// the offer's window into the reader's buffer on the send queue with the
// frames, so it shares their order, their selective signalling and their
// completion path (PendingSend::read_tag).  The queue pair is set up with
// readDepth() reads in flight each way (responder_resources and
// initiator_depth); reads beyond it wait on the send queue.
//
// Events (rdma_completions.cpp): poll() drains the CQ (completion channel
// events acked, then the CQ re-armed and polled once more to close the race),
// the connection's own rdma_cm event channel (DISCONNECTED) and the errors
// the device's event thread reported.  eventFd() is an epoll fd over all of
// those plus an eventfd that stays readable while reported events wait in
// the queue.
//
// Threads, as transport.h says: the connecting thread calls create, cmId,
// cmChannel and established (rdma_connect.cpp) before the transport is handed
// over; from then on one thread (the data agent) calls every Transport
// method, counters() and the destructor's shutdown, and those members take
// no lock (postControl neither).  The one other thread is the device's event
// thread, which reports asynchronous errors through async_mu_ and link_fd_.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/link_bookkeeping.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_windows.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/transport.h"

namespace framelink::transport::rdma {

struct RdmaTransportOptions {
  uint32_t send_queue_depth = 256;  // WRs on the send queue; post() reports kBackpressure beyond
  uint32_t recv_queue_depth = 512;  // receive WRs kept posted (RNR retry covers a burst beyond)
  uint32_t signal_interval = 16;    // at least every this many WRs is one signalled
  uint32_t max_batch = 32;          // post() flushes itself once this many WRs wait
  // Control records go in fragments of at most this many bytes; each receive
  // WR carries a buffer of this size (both peers must use the same).
  uint32_t control_chunk_bytes = kControlChunkBytes;
  // Registered chunks control fragments are sent from (in flight at once).
  uint32_t control_send_chunks = 64;
  // A control fragment of at most this many bytes goes inline
  // (IBV_SEND_INLINE): the adapter takes its bytes with the WR instead of
  // reading the chunk by DMA, which saves a PCIe round trip per credit/ACK
  // record.  The queue pair is asked for this much inline room; a device that
  // refuses it gets a queue pair without (0: never inline).
  uint32_t control_inline_bytes = 256;
  // Retracted credits whose buffers are kept mapped until their window's
  // invalidation has executed, so that a frame that still lands in one is
  // reported with its header; the oldest beyond this are forgotten sooner
  // (such a frame is then reported with credit_id = its low 32 bits and an
  // empty header).
  uint32_t max_retracted_credits = 4096;
  // Send-queue entries kept for memory-window work requests (one bind per
  // credit exposed, one invalidation per credit consumed or retracted),
  // beyond send_queue_depth.  exposeCredit refuses (FL_ERR_RESOURCES, the
  // grant is tried again later) while all are in use or waiting for one.
  uint32_t window_queue_depth = 512;
  // A read longer than this goes out as several RDMA_READ WRs of at most
  // this many bytes each, on consecutive send-queue entries, and completes
  // with the last of them (at most kMaxReadPieces pieces: a longer read gets
  // longer pieces).  rxe answers a single 4 MiB read at a third of the rate
  // of four 1 MiB reads, and stalls with several in flight; UCX caps its gets
  // the same way (max_get_zcopy).
  uint32_t read_piece_bytes = 1u << 20;
  // The send queue's watchdog: work requests posted and none of them completed for this long
  // fails the link (0: never).  A peer that stops replenishing its receive queue holds our next
  // SEND on RNR for ever (rnr_retry 7), and every WR behind it -- the invalidations of the
  // windows of its credits too, which then stay writable for it.  The daemon gives it its
  // link_timeout_ms.
  uint32_t send_stall_ms = 0;
};

// The most RDMA_READ WRs one read is split into (read_piece_bytes).
inline constexpr uint32_t kMaxReadPieces = 16;

// An rdma_cm id with its own event channel: destroys both (id first).
class CmId {
 public:
  CmId() = default;
  CmId(std::shared_ptr<VerbsApi> api, rdma_event_channel* channel, rdma_cm_id* id) noexcept
      : api_(std::move(api)), channel_(channel), id_(id) {}
  CmId(CmId&& o) noexcept : api_(std::move(o.api_)), channel_(o.channel_), id_(o.id_) {
    o.channel_ = nullptr;
    o.id_ = nullptr;
  }
  CmId& operator=(CmId&& o) noexcept;
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;
  ~CmId() { reset(); }

  rdma_cm_id* id() const noexcept { return id_; }
  rdma_event_channel* channel() const noexcept { return channel_; }
  // Acks whatever events are still queued, destroys the QP if the id has
  // one, the id, and the channel.
  void reset() noexcept;

 private:
  std::shared_ptr<VerbsApi> api_;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
};

class RdmaTransport final : public Transport {
 public:
  // Creates the completion channel, CQ and QP on `id` (whose address is
  // resolved, or which came with a connect request), registers the header
  // ring and posts the receive WRs.  The transport is not connected until
  // established() — the caller runs rdma_connect / rdma_accept meanwhile.
  static Result<std::unique_ptr<RdmaTransport>> create(std::shared_ptr<RdmaDevice> device, CmId id,
                                                       RdmaTransportOptions options = {});
  ~RdmaTransport() override;

  // For the connecting thread, before the hand-over.
  rdma_cm_id* cmId() const noexcept { return cm_.id(); }
  rdma_event_channel* cmChannel() const noexcept { return cm_.channel(); }
  // The rdma_cm ESTABLISHED event was seen: posts are accepted from now on.
  void established(std::string peer_name) noexcept;

  const char* name() const noexcept override { return "rdma"; }
  bool connected() const noexcept override { return connected_.load(std::memory_order_acquire); }
  // The credit's window is bound by the next flush() (or poll()), on the
  // send queue ahead of what is posted after this call: the grant that
  // carries its key.  A peer that had the key sooner finds it refused.
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override;
  // Its window's invalidation is posted before this returns; it executes after everything posted
  // before it on the send queue (windowOpen is true until then).
  void retractCredit(uint64_t credit_id) override;
  bool windowOpen(uint64_t credit_id) const noexcept override;
  // True once every window bind queued so far has executed.
  bool creditsWritable() const noexcept override;
  PostResult post(const SendRequest& request) noexcept override;
  PostResult postControl(std::string record) noexcept override;
  bool readable() const noexcept override { return read_depth_ > 0; }
  // The read's window is bound by the next flush() (or poll()), like a credit's.
  Result<RemoteSource> exposeSource(LocalSource source) override;
  // Its window's invalidation is posted before this returns (and executes in the queue's order).
  void retractSource(uint64_t source_id) override;
  PostResult postRead(const ReadRequest& request) noexcept override;
  // RDMA READs in flight at once, each way: what the connection asks for
  // (rdma_conn_param's responder_resources and initiator_depth), the
  // device's max_qp_rd_atom and max_qp_init_rd_atom, at most 16; 0 when the
  // device has none (then the link cannot be read).
  uint8_t readDepth() const noexcept { return read_depth_; }
  static uint8_t deviceReadDepth(const ibv_device_attr& attr) noexcept;
  std::string_view lastRefusal() const noexcept override { return book_.lastRefusal(); }
  // Hands every WR post() accumulated, and the window binds and
  // invalidations waiting, to the adapter as one chain.
  void flush() noexcept override;
  size_t poll(TransportEvent* out, size_t max) noexcept override;
  int eventFd() const noexcept override { return epoll_fd_.get(); }
  void shutdown() noexcept override;

  // control_sent: records whose last fragment was posted.
  TransportCounters counters() const noexcept override { return book_.counters(); }

  // What the verbs calls did (for benchmarks and tests).
  struct VerbsCounters {
    uint64_t post_send_calls = 0;  // ibv_post_send calls (one per flushed chain)
    uint64_t send_wrs = 0;         // WRs handed to ibv_post_send
    uint64_t signalled_wrs = 0;
    uint64_t recv_wrs = 0;            // receive WRs posted
    uint64_t control_wrs = 0;         // control fragments handed to ibv_post_send
    uint64_t control_inline_wrs = 0;  // of those, sent inline
    uint64_t window_wrs = 0;          // memory-window binds and invalidations posted
  };
  const VerbsCounters& verbsCounters() const noexcept { return verbs_counters_; }

 private:
  RdmaTransport(std::shared_ptr<RdmaDevice> device, CmId id, RdmaTransportOptions options);
  // Completions are polled this many at a time.
  static constexpr int kPollBatch = 32;
  // wr_id tags: receive WRs carry kRecvTag | chunk index; control send WRs
  // kControlTag | their control sequence; frame WRs their frame sequence,
  // which never reaches either bit.  Error completions have no valid opcode,
  // so wr_id is what tells them apart.
  static constexpr uint64_t kRecvTag = uint64_t{1} << 63;
  static constexpr uint64_t kControlTag = uint64_t{1} << 62;
  static constexpr uint64_t kWindowTag = uint64_t{1} << 61;  // BIND_MW and LOCAL_INV
  static void signalEventFd(int fd) noexcept;

  // The verbs resources, fds and buffers, in the steps below (in this order;
  // rdma_setup.cpp, with create()).
  Status setUp();
  // Neither queue deeper than the device's max_qp_wr.
  Status checkQueueDepths() const;
  // event_fd_, link_fd_ and epoll_fd_.
  Status openEventFds();
  // The completion channel and one CQ for both queues (at most max_cqe).
  Status createCq();
  // The RC QP on the rdma_cm id; without inline room if the device refuses it.
  Status createQp();
  // The header ring (one RdmaWireHeader per send-queue entry) and its MR.
  Status registerHeaderRing();
  // The control send chunks and the receive chunks, one MR each.
  Status registerControlChunks();
  // The send, control and receive WR/SGE arrays, built once.
  void sizeWorkRequests();
  // Both event channels non-blocking, and every fd eventFd() covers in its epoll set.
  Status watchChannels();
  // Posts every receive WR, arms the CQ and asks the device for this QP's errors.
  Status startReceiving();
  void flushChain() noexcept;
  // After ibv_post_send of a chain of `nwin` window, `nctl` control and the
  // unposted frame WRs: advances the posted counters past what the queue
  // took (all when rc is 0, else the WRs before `bad`), fails the link if rc.
  void settlePosted(int rc, const ibv_send_wr* bad, uint32_t nwin, uint32_t nctl) noexcept;
  // Copies queued control records into free send chunks (at most `room`
  // WRs) and links their WRs in posting order; returns how many it built.
  uint32_t buildControlWrs(uint32_t room) noexcept;
  // Send-queue entries in use: frames accepted (flushed or not) and
  // control fragments on the queue.
  uint64_t sendQueueUsed() const noexcept {
    return (next_seq_ - done_seq_) + (ctl_posted_seq_ - ctl_done_seq_);
  }
  void fail(int status, const std::string& message) noexcept;
  // fail() for a work completion in error.  A flush error is never the
  // cause (the queue pair was already in error): it waits in
  // flush_failure_ until the end of the poll, so that a completion error,
  // an asynchronous event or a disconnect found in the same poll names
  // the cause instead.
  void failOnWc(const ibv_wc& wc, int status, const std::string& message) noexcept;
  void tearDown() noexcept;
  // rdma_completions.cpp: completions and events become TransportEvents.
  // Which of the fds eventFd() covers are readable, by one epoll_wait(0):
  // poll() reads only those, not each of the four every round.
  struct ReadyChannels {
    bool completions = false;  // comp_channel_: the armed CQ had a completion
    bool cm = false;           // an rdma_cm event
    bool events = false;       // event_fd_
    bool link = false;         // link_fd_: the device's event thread reported
  };
  ReadyChannels readyChannels() noexcept;
  void drainCmEvents() noexcept;
  void drainAsyncError() noexcept;
  // Takes the completion channel's events first when `channel_ready`.
  void drainCq(bool channel_ready = true) noexcept;
  void handleWc(const ibv_wc& wc) noexcept;
  void handleSendWc(const ibv_wc& wc) noexcept;
  void handleRecvWc(const ibv_wc& wc) noexcept;
  void completeSendsThrough(uint64_t seq, int status) noexcept;
  // Frame `frame_seq` completed, so did every control fragment posted
  // before it: their chunks are free again.
  void releaseControlBeforeFrame(uint64_t frame_seq) noexcept;
  void handleControlSendWc(const ibv_wc& wc) noexcept;
  void controlArrived(const ibv_wc& wc) noexcept;
  void completeUnpostedIfDrained() noexcept;
  void watchSendQueue() noexcept;
  void replenishRecvs() noexcept;
  // What a window WR holds until it has executed: the memory of the
  // credit whose window an invalidation ends (a write the peer posted may
  // land until then, and the memory's registration cannot be deregistered
  // while a window is bound to it), and the retracted credit to forget then.
  struct WindowHold {
    std::shared_ptr<void> memory;
    uint64_t retracted_credit = 0;  // 0: none (a bind, or a consumed credit)
    // The invalidation of a credit's window: counted in ending_windows_ until it executed.
    bool ending_credit = false;
    uint32_t ending_key = 0;
  };
  // The window of credit key `key` ends (consumed or retracted): its
  // LOCAL_INV joins the window backlog, for the next flushChain().
  void endWindow(CreditWindows& windows, uint32_t key, WindowHold hold) noexcept;
  // Binds window `key` of `windows` over [addr, addr + length) of `mr` and
  // queues the bind for the next flushChain(); its rkey, or why not (every
  // window work request in use, the key bound already, no window left).
  // `what` and `id` name the caller in the error ("exposeCredit", 7).
  Result<uint32_t> bindWindow(CreditWindows& windows, uint32_t key, ibv_mr* mr, const uint8_t* addr,
                              uint64_t length, const char* what, uint64_t id);
  // Undoes the bindWindow() just before (its bind is the backlog's last).
  void unbindWindow(CreditWindows& windows, uint32_t key) noexcept;
  // A window WR completed, or none will (the QP is gone): what it held goes.
  void releaseHold(WindowHold& hold) noexcept;
  // Moves backlog entries onto the window ring, as many as it has room
  // for, linked in order with the last one signalled; returns how many.
  uint32_t buildWindowWrs() noexcept;
  void handleWindowWc(const ibv_wc& wc) noexcept;

  // A frame, or a read when read_tag is not 0 (book_.reads()).  A read in
  // several pieces has one entry per piece, all with its tag; only the last
  // (piece false) reports it done, and a piece that fails reports it failed
  // (the pieces after it complete in error too, and find the tag gone).
  struct PendingSend {
    uint64_t cookie = 0;
    uint64_t bytes = 0;
    uint64_t read_tag = 0;
    bool piece = false;
  };

  const std::shared_ptr<RdmaDevice> device_;
  VerbsApi& api_;
  const RdmaTransportOptions options_;

  // Everything below up to connected_ belongs to the calling thread (see
  // the top of this file): no lock.
  std::string peer_name_ = "peer";
  // Verbs resources; torn down in shutdown() in this order: QP (with the
  // id), CQ, completion channel, header MR, id, event channel.
  CmId cm_;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::unique_ptr<RdmaWireHeader[]> headers_;
  ibv_mr* headers_mr_ = nullptr;
  // Control send chunks (control_send_chunks x control_chunk_bytes) and the
  // receive chunks (recv_queue_depth x control_chunk_bytes), one MR each.
  std::unique_ptr<uint8_t[]> ctl_send_buf_;
  ibv_mr* ctl_send_mr_ = nullptr;
  std::unique_ptr<uint8_t[]> recv_buf_;
  ibv_mr* recv_mr_ = nullptr;
  // Memory windows of this queue pair: one bound per live credit
  // (rdma_windows.h); deallocated just before the QP in tearDown().
  CreditWindows windows_;
  // Read windows, one bound per exposed source (pull), the same way.
  CreditWindows source_windows_;
  uint8_t read_depth_ = 0;
  // Window WRs (binds and invalidations) wait in the backlog, in the order
  // they were made, for the next flushChain(), which puts them on the send
  // queue ahead of its control records and frames: a bind before the grant
  // that carries its key, one chain and one ibv_post_send for all.  Posted,
  // window sequence w sits in window_ring_[w % window_queue_depth] until it
  // has executed; [window_done_seq_, window_posted_seq_) are on the queue.
  // Only the last WR of a chain is signalled: its completion is every
  // earlier one's too (one send queue, executed in order).
  struct PendingWindowWr {
    ibv_send_wr wr{};
    WindowHold hold;
    CreditWindows* windows = nullptr;  // the set the window belongs to
  };
  std::deque<PendingWindowWr> window_backlog_;
  std::vector<PendingWindowWr> window_ring_;
  uint64_t window_posted_seq_ = 0;
  uint64_t window_done_seq_ = 0;
  // Windows of a failed link that were never invalidated: bound until
  // tearDown() deallocates them, and their memory with them.
  std::vector<WindowHold> unended_windows_;
  // Credit keys whose window's invalidation is queued or posted and has not executed (windowOpen),
  // with how many such invalidations each has.
  std::unordered_map<uint32_t, uint32_t> ending_windows_;
  uint64_t watch_id_ = 0;
  bool torn_down_ = false;
  bool cq_armed_ = false;
  unsigned int unacked_cq_events_ = 0;

  // Send ring, indexed by sequence % send_queue_depth.  Sequences
  // [done_seq_, posted_seq_) are on the send queue, [posted_seq_, next_seq_)
  // wait for flush().
  std::vector<PendingSend> sends_;
  std::vector<ibv_send_wr> send_wrs_;
  std::vector<ibv_sge> send_sges_;  // two per entry
  uint64_t next_seq_ = 0;
  uint64_t posted_seq_ = 0;
  uint64_t done_seq_ = 0;
  uint32_t since_signal_ = 0;
  uint64_t sq_progress_ = 0;          // the completions counted when the watchdog last saw one
  uint64_t sq_waiting_since_ns_ = 0;  // since then, with WRs on the send queue (0: none)
  uint32_t max_inline_ = 0;           // inline room the queue pair got

  // Control fragments: control sequence c uses send chunk c % chunks.
  // [ctl_done_seq_, ctl_posted_seq_) are on the send queue; each remembers
  // how many frames had been posted before it (its place in the queue's
  // completion order).  book_.control() holds records not yet fully copied
  // into chunks; ctl_backlog_offset_ bytes of its front one already are.
  std::vector<ibv_send_wr> ctl_wrs_;
  std::vector<ibv_sge> ctl_sges_;
  std::vector<uint64_t> ctl_frames_before_;
  uint64_t ctl_posted_seq_ = 0;
  uint64_t ctl_done_seq_ = 0;
  size_t ctl_backlog_offset_ = 0;

  // Receive WRs use the receive chunks as a ring: the next one posted takes
  // chunk recv_next_ % recv_queue_depth (the queue consumes in order).
  std::vector<ibv_recv_wr> recv_wrs_;
  std::vector<ibv_sge> recv_sges_;
  uint64_t recv_next_ = 0;
  uint32_t recvs_posted_ = 0;  // receive WRs on the receive queue
  std::string ctl_rx_;         // the record being reassembled

  // The credits (by the low 32 bits of the credit id, retracted ones kept
  // max_retracted_credits long), the control backlog, the events, the
  // admission rules, failing once and the counters.  Its send ring is
  // unused: frames wait in sends_ above, on the send queue's terms.
  LinkBookkeeping book_;
  VerbsCounters verbs_counters_;
  // Set by the connecting thread (established), cleared by the calling
  // thread; atomic so that connected() is a plain read for either.
  std::atomic<bool> connected_{false};

  // Written by the device's event thread, read by poll(): the one state
  // shared between threads.
  Mutex async_mu_;
  std::optional<std::pair<int, std::string>> async_error_ FL_GUARDED_BY(async_mu_);

  std::optional<std::pair<int, std::string>> flush_failure_;  // see failOnWc()

  UniqueFd event_fd_;  // eventfd: readable while events_ is not empty
  UniqueFd link_fd_;   // eventfd: the device's event thread reported an error
  UniqueFd epoll_fd_;  // what eventFd() returns
};

}  // namespace framelink::transport::rdma
