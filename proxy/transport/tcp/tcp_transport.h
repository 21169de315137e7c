// The `tcp` data transport over one connected, handshaken TCP socket (see
// tcp_wire.h for the bytes, tcp_connect.h for how the socket is obtained).
//
// No threads of its own: every byte moves on the calling thread (the data
// agent), so a frame costs no hand-off and no wake-up beyond the agent's own.
//   * post() and postControl() write straight to the socket with one
//     non-blocking sendmsg() (control records queued so far first, then the
//     frame's header and its payload from the caller's memory) when nothing
//     is queued ahead.  A frame the socket takes whole completes at once: its
//     SendComplete is queued and eventFd() is readable.  What the socket does
//     not take waits in order (the rest of the write in progress, then queued
//     control records, then queued frames); poll() continues it, and while
//     it waits eventFd() also watches the socket for writability.  Frames are
//     never interleaved: one write unit (records + at most one frame) is
//     finished before the next starts.
//   * poll() reads with non-blocking recvmsg(): a frame header, then the
//     payload straight into the credited buffer (the next header in the same
//     call), a control record into its event, or a frame for an unknown
//     credit into a scratch buffer.  Each call reads at most
//     read_budget_bytes and stops once `max` events wait, so one busy link
//     cannot starve the agent's other links; eventFd() stays readable while
//     the socket holds more.
//   * eventFd() is an epoll descriptor over the socket (readable; writable
//     while a write waits) and an eventfd that is set while events wait.
// No user-space copy of a payload on either side.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "common/unique_fd.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"
#include "transport/transport_core.h"  // validateSendRequest, kDefaultSendQueueDepth

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
  bool connected() const noexcept override { return !failed_; }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override;
  void retractCredit(uint64_t credit_id) override;
  PostResult post(const SendRequest& request) noexcept override;
  std::string_view lastRefusal() const noexcept override { return refusal_; }
  PostResult postControl(std::string record) noexcept override;
  size_t poll(TransportEvent* out, size_t max) noexcept override;
  int eventFd() const noexcept override { return epoll_fd_.get(); }
  void shutdown() noexcept override;

  // Counters for stats, benchmarks and tests (calling thread only).
  struct Counters {
    uint64_t frames_sent = 0;
    uint64_t bytes_sent = 0;  // payload bytes of frames sent
    uint64_t frames_received = 0;
    uint64_t bytes_received = 0;  // payload bytes of frames received
    uint64_t unknown_credit_frames = 0;
    uint64_t backpressure = 0;
    uint64_t control_sent = 0;      // records
    uint64_t control_received = 0;  // records
    uint64_t send_blocked = 0;      // times the socket took less than offered (a write then waits)
    uint64_t read_budget_hits = 0;  // poll() calls that returned with the budget spent
  };
  const Counters& counters() const noexcept { return counters_; }

 private:
  TcpTransport(UniqueFd fd, UniqueFd epoll_fd, UniqueFd event_fd, std::string peer_name,
               TcpTransportOptions options);

  // ---- sending ----
  // Writes until nothing is left or the socket is full (then asks for
  // EPOLLOUT); fails the link on an error.
  void drainSends() noexcept;
  // Takes the queued control records and the next queued frame into the
  // write in progress; false when nothing is queued.
  bool startWrite() noexcept;
  void finishWrite() noexcept;
  void watchWritable(bool on) noexcept;

  // ---- receiving ----
  void receive(size_t max_events) noexcept;
  // The header in rx_header_ is complete: checks it and sets up its body.
  void beginBody() noexcept;
  // The body is complete: reports it.
  void endBody() noexcept;

  void failLink(int status, const std::string& message) noexcept;
  void pushEvent(TransportEvent event) noexcept;
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
  bool failed_ = false;
  bool signalled_ = false;  // event_fd_ is set
  bool watch_out_ = false;  // EPOLLOUT is in epoll_fd_'s interest
  std::string_view refusal_ = "the request is malformed";
  // Events not yet polled, a ring that grows by doubling: a deque would
  // allocate for every event (one TransportEvent fills a deque block).
  std::vector<TransportEvent> events_;
  size_t events_head_ = 0;
  size_t events_count_ = 0;
  Counters counters_;

  std::unordered_map<uint64_t, LocalCredit> credits_;

  // Send queue: a fixed ring so post() never allocates.
  std::vector<SendRequest> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
  std::deque<std::string> control_;
  size_t control_bytes_ = 0;
  // The write in progress: control records and at most one frame, as iovecs
  // into tx_records_, tx_headers_, tx_frame_header_ and the caller's payload.
  bool tx_active_ = false;
  bool tx_has_frame_ = false;
  uint64_t tx_cookie_ = 0;
  uint64_t tx_length_ = 0;
  std::vector<std::string> tx_records_;
  std::vector<TcpFrameHeader> tx_headers_;
  TcpFrameHeader tx_frame_header_{};
  std::vector<iovec> tx_iov_;
  size_t tx_next_ = 0;  // first iovec not yet written whole

  // Receive state: a header (rx_header_got_ bytes of it so far), then a body
  // of rx_body_length_ bytes.
  enum class Body { kNone, kFrame, kControl, kDiscard };
  Body rx_body_ = Body::kNone;
  TcpFrameHeader rx_header_{};
  size_t rx_header_got_ = 0;
  FrameHeader rx_frame_;
  uint64_t rx_body_length_ = 0;
  uint64_t rx_body_got_ = 0;
  std::optional<LocalCredit> rx_credit_;  // kFrame: the credit the frame consumes
  bool rx_retracted_ = false;             // kFrame: retracted while landing (the rest is discarded)
  std::string rx_record_;                 // kControl
  std::vector<uint8_t> scratch_;          // kDiscard, and a retracted frame's rest
};

}  // namespace framelink::transport::tcp
