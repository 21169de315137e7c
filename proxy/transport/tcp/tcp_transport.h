// The `tcp` data transport over one connected, handshaken TCP socket (see
// tcp_wire.h for the bytes, tcp_connect.h for how the socket is obtained).
//
// No threads of its own: every byte moves on the calling thread (the data
// agent), so a frame costs no hand-off and no wake-up beyond the agent's own.
//   * post() queues a frame; flush() (the agent's, after each round of posts)
//     or the next poll() writes what is queued with one non-blocking
//     sendmsg() per write unit: the control records queued so far, then the
//     frames' headers and payloads from the callers' memory -- up to 64
//     frames, beyond the first only within 256 KiB, so a round of small
//     frames is one system call and a large frame goes alone.
//     postControl() writes at once when nothing is queued ahead.  Frames the
//     socket takes whole complete at once: their SendCompletes are queued
//     and eventFd() is readable.  What the socket does not take waits in
//     order (the rest of the write in progress, then queued control records,
//     then queued frames); poll() continues it, and while it waits eventFd()
//     also watches the socket for writability.  One write unit is finished
//     before the next starts.
//   * poll() reads with non-blocking recvmsg().  Between frames, and in a
//     body with less than stage_bytes left, it reads up to stage_bytes into a
//     staging buffer and copies from there -- headers, small payloads into
//     their credited buffers, control records, the first bytes of a large
//     payload -- so a burst of small frames costs one call, not one each.
//     The rest of a large payload is read straight into the credited buffer
//     (the next header in the same call); a frame for an unknown credit is
//     read and dropped.  Each call reads at most
//     read_budget_bytes and stops once `max` events wait, so one busy link
//     cannot starve the agent's other links; eventFd() stays readable while
//     the socket holds more.
//   * Reads (pull): postRead() queues a request (written like a control
//     record, ahead of frames); the peer's poll() answers it from the
//     exposed source's memory, written like a frame's payload (no copy),
//     and this side's poll() lands the response straight in the read's
//     buffer.  Requests and responses join a write unit after its control
//     records and before its frame.
//   * Zero-copy send (zerocopy_min_bytes; tcp_zerocopy.cpp): a frame at least
//     that large goes alone in its write unit, its header and the records
//     before it as usual, its payload with MSG_ZEROCOPY: the kernel sends
//     from the caller's pages, and the frame's SendComplete waits for the
//     kernel's notification that it let them go (on the socket's error
//     queue), as an rdma write's waits for its completion.  A link whose
//     first notifications all say the kernel copied anyway (loopback, veth:
//     a packet delivered to a local socket is copied) sends with copies from
//     then on.  A link that fails with such pages out resets the connection,
//     so the kernel drops them before their frames complete.
//   * eventFd() is an epoll descriptor over the socket (readable; writable
//     while a write waits) and an eventfd that is set while events wait
//     (or staged bytes that the next poll() turns into events).
// No user-space copy of a large payload on either side (a small one is
// copied once, from the staging buffer: a copy of a few KiB costs less than
// the system call it saves).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "transport/link_bookkeeping.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace framelink::transport::tcp {

struct TcpTransportOptions {
  // Frames queued behind the write in progress before post() reports
  // kBackpressure.
  size_t send_queue_depth = kDefaultSendQueueDepth;
  // Largest frame the receiver reads (and discards) for an unknown credit;
  // a larger announced length is a protocol violation (closes the link), so
  // a broken peer cannot make the receiver read forever.  Frames for a known
  // credit are bounded by that credit's capacity instead.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
  // Bytes one poll() reads at most before it returns (the agent polls every
  // link each round; the rest is read in the next).  At least 1.
  size_t read_budget_bytes = size_t{2} << 20;
  // The staging buffer's size: a read between frames takes up to this much
  // (several small frames at once); a payload with more than this left is
  // read straight into its buffer.  0: no staging (a call per frame).
  size_t stage_bytes = size_t{32} << 10;
  // A frame payload of at least this many bytes is sent with MSG_ZEROCOPY
  // (see above).  0: never.
  uint64_t zerocopy_min_bytes = 0;
};

class TcpTransport final : public Transport {
 public:
  // Takes a connected socket on which the handshake is done (dialData() or
  // a TcpDataListener callback).  `peer_name` is used in log messages.
  static Result<std::unique_ptr<TcpTransport>> make(UniqueFd fd, std::string peer_name,
                                                    TcpTransportOptions options = {});
  // The same, as the interface the daemon holds.
  static Result<std::unique_ptr<Transport>> create(UniqueFd fd, std::string peer_name,
                                                   TcpTransportOptions options = {});

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;
  ~TcpTransport() override;

  const char* name() const noexcept override { return "tcp"; }
  bool connected() const noexcept override { return !book_.failed(); }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override;
  void retractCredit(uint64_t credit_id) override;
  bool readable() const noexcept override { return true; }
  Result<RemoteSource> exposeSource(LocalSource source) override;
  void retractSource(uint64_t source_id) override { book_.retractSource(source_id); }
  PostResult postRead(const ReadRequest& request) noexcept override;
  PostResult post(const SendRequest& request) noexcept override;
  std::string_view lastRefusal() const noexcept override { return book_.lastRefusal(); }
  PostResult postControl(std::string record) noexcept override;
  void flush() noexcept override;
  size_t poll(TransportEvent* out, size_t max) noexcept override;
  int eventFd() const noexcept override { return epoll_fd_.get(); }
  void shutdown() noexcept override;

  TransportCounters counters() const noexcept override;

  // What only a byte stream on the calling thread counts (calling thread
  // only; for benchmarks and tests).
  struct SocketCounters {
    uint64_t send_blocked = 0;  // times the socket took less than offered (a write then waits)
    uint64_t writes = 0;        // sendmsg() calls that wrote something
    uint64_t frames_written =
        0;  // frames in write units written whole (frames_written / writes: the batching)
    uint64_t read_budget_hits = 0;  // poll() calls that returned with the budget spent
    uint64_t reads = 0;             // recvmsg() calls that read something
    uint64_t staged_reads = 0;      // of those, into the staging buffer
    uint64_t zerocopy_notes = 0;    // notifications taken off the error queue
  };
  // Whether frames from zerocopy_min_bytes up still go with MSG_ZEROCOPY
  // (false: never asked, the kernel refused SO_ZEROCOPY, or it only copied).
  bool zerocopyOn() const noexcept { return zc_on_; }
  const SocketCounters& socketCounters() const noexcept { return socket_counters_; }

 private:
  TcpTransport(UniqueFd fd, UniqueFd epoll_fd, UniqueFd event_fd, std::string peer_name,
               TcpTransportOptions options);

  // ---- sending ----
  // After post() or postControl() queued something: writes it now unless a
  // write waits for the socket.
  PostResult sendQueued(PostResult queued) noexcept;
  // Writes until nothing is left or the socket is full (then asks for
  // EPOLLOUT); fails the link on an error.
  void drainSends() noexcept;
  // Takes the queued control records and the next queued frame into the
  // write in progress; false when nothing is queued.
  bool startWrite() noexcept;
  void finishWrite() noexcept;
  // Empties the write unit's frames (tx_frame_headers_, tx_cookies_).
  void clearFrames() noexcept;
  void watchWritable(bool on) noexcept;

  // A read request or response waiting to be written (`payload`: a
  // response's bytes, kept mapped by `keepalive` until written).
  struct PullWrite {
    TcpFrameHeader header{};
    const uint8_t* payload = nullptr;
    std::shared_ptr<void> keepalive;
  };
  bool queuePull(PullWrite write) noexcept;
  // A peer's read request is in rx_header_: queues its response.
  void answerRead() noexcept;
  // A response to one of this side's reads is in rx_header_: checks it and
  // lands its body in the read's buffer.
  void beginReadResponse() noexcept;

  // ---- receiving ----
  void receive(size_t max_events) noexcept;
  // One read into the staging buffer (at most `budget` bytes; `got` says how
  // many).  False: nothing to read now, or the link failed.
  bool readStaged(size_t budget, size_t& got) noexcept;
  // One read of the body's rest straight into its buffer, and the next
  // header behind it (at most `budget` bytes); false as readStaged.
  bool readDirect(size_t budget, size_t& got) noexcept;
  // A read that failed (errno): true to try again (EINTR), else false, the
  // link failed unless it would only have blocked.
  bool readFailed() noexcept;
  // The peer closed the connection: the link fails, saying where in the
  // stream it was.  Returns false.
  bool peerClosed() noexcept;
  // Feeds staged bytes through the receive state (headers, bodies) until
  // they are used up or `max_events` events wait.
  void consumeStaged(size_t max_events) noexcept;
  // Whether the body being read goes straight into its buffer (a large rest
  // of a frame or read response whose buffer is valid).
  bool directBody() const noexcept;
  // The header in rx_header_ is complete: checks it and sets up its body.
  void beginBody() noexcept;
  // The body is complete: reports it.
  void endBody() noexcept;

  // ---- zero-copy send (tcp_zerocopy.cpp) ----
  // Takes the kernel's notifications off the error queue and completes the
  // frames whose pages it let go.
  void takeZerocopyNotes() noexcept;
  void noteZerocopy(uint32_t first, uint32_t last, bool copied) noexcept;
  // Whether every zero-copy call up to `id` was notified.
  bool zerocopyDone(uint32_t id) const noexcept { return static_cast<int32_t>(zc_done_ - id) > 0; }
  // The frames of the write just finished: complete now, or when the kernel let their pages go.
  void completeWritten() noexcept;
  // failLink: with pages still the kernel's, the connection is reset (its
  // queue dropped); the cookies of the frames waiting for them.
  void abortZerocopy(std::vector<uint64_t>& waiting) noexcept;

  void failLink(int status, const std::string& message) noexcept;
  // eventfd set exactly while events wait (the epoll fd then is readable).
  void syncSignal() noexcept;

  // Member order is teardown order in reverse: the socket outlives nothing
  // that refers to it.
  UniqueFd fd_;
  UniqueFd epoll_fd_;
  UniqueFd event_fd_;
  const std::string peer_name_;
  const TcpTransportOptions options_;
  // Everything below belongs to the calling thread; nothing takes a lock.
  // The credits, the send ring, the control queue, the events and the
  // counters; a frame landing holds its credit there.
  LinkBookkeeping book_;
  SocketCounters socket_counters_;
  bool signalled_ = false;  // event_fd_ is set
  bool watch_out_ = false;  // EPOLLOUT is in epoll_fd_'s interest
  // The write in progress: control records, reads and frames, as iovecs into
  // tx_records_, tx_headers_, tx_pulls_, tx_frame_headers_ and the callers'
  // payloads.  Its frames (cookie i, header i) complete when it is written
  // whole (capacity reserved: the headers never move while iovecs point at them).
  bool tx_active_ = false;
  std::vector<TcpFrameHeader> tx_frame_headers_;
  std::vector<uint64_t> tx_cookies_;
  std::vector<std::string> tx_records_;
  std::vector<TcpFrameHeader> tx_headers_;
  std::deque<PullWrite> pull_queue_;  // requests and responses not yet in a write
  size_t responses_queued_ = 0;       // of pull_queue_ and tx_pulls_ (bounded: kMaxReadsOutstanding)
  std::vector<PullWrite> tx_pulls_;   // in the write in progress
  std::vector<iovec> tx_iov_;
  size_t tx_next_ = 0;  // first iovec not yet written whole

  // Zero-copy send.  The kernel numbers each sendmsg() with MSG_ZEROCOPY that
  // sent something, from 0 (ids wrap: compared by difference).
  static constexpr size_t kNoZerocopy = SIZE_MAX;
  // The first notifications of a link: all copied, and it stops.
  static constexpr uint64_t kZerocopyProbeCalls = 64;
  struct ZerocopyFrame {
    uint32_t last_id = 0;  // its payload's last zero-copy call
    uint64_t cookie = 0;
    uint64_t length = 0;
  };
  bool zc_on_ = false;
  size_t tx_zc_iov_ = kNoZerocopy;  // the write's payload iovec that goes with MSG_ZEROCOPY
  bool tx_zc_used_ = false;         // a call of the write in progress went zero-copy
  uint32_t tx_zc_last_ = 0;         // ... the last of them
  uint32_t zc_next_id_ = 0;         // the id of the next zero-copy call
  uint32_t zc_done_ = 0;            // every call before it was notified
  std::vector<std::pair<uint32_t, uint32_t>> zc_early_;  // notified ranges past a gap
  std::deque<ZerocopyFrame> zc_waiting_;                 // written whole, pages still the kernel's
  std::vector<uint64_t> fail_cookies_;                   // failLink's, reserved: it allocates nothing
  uint64_t zc_calls_ = 0;                                // zero-copy calls made
  uint64_t zc_copied_ = 0;                               // of those notified, the calls the kernel copied
  uint64_t zc_notified_ = 0;                             // calls notified

  // Receive state: a header (rx_header_got_ bytes of it so far), then a body
  // of rx_body_length_ bytes.
  enum class Body { kNone, kFrame, kControl, kDiscard, kRead };
  Body rx_body_ = Body::kNone;
  TcpFrameHeader rx_header_{};
  size_t rx_header_got_ = 0;
  FrameHeader rx_frame_;
  uint64_t rx_body_length_ = 0;
  uint64_t rx_body_got_ = 0;
  uint8_t* rx_buffer_ = nullptr;  // kFrame: the landing credit's buffer (book_.credits()); kRead: the read's
  uint64_t rx_read_tag_ = 0;      // kRead: the read (book_.reads())
  std::string rx_record_;         // kControl
  std::vector<uint8_t> scratch_;  // kDiscard, and a retracted frame's rest
  // Bytes read ahead (stage_bytes at most): [stage_pos_, stage_len_) not yet consumed.
  std::vector<uint8_t> stage_;
  size_t stage_pos_ = 0;
  size_t stage_len_ = 0;
  // The last staged read got less than it asked for: the socket was empty
  // then, and receive() stops once those bytes are consumed rather than
  // spend a call on EAGAIN (the socket's EPOLLIN is level-triggered: what
  // came meanwhile wakes the caller, or its next poll() reads it).
  bool stage_short_ = false;
};

}  // namespace framelink::transport::tcp
