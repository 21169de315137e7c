// The bookkeeping of a byte-stream transport that moves its bytes on threads
// of its own (grpc's reader and writer): the bounded send queue, the credit
// table, the event queue with its eventfd, and the "link failed exactly
// once" rule, shared between those threads and the calling thread under
// mutexes.  Such a transport owns one TransportCore and adds only the code
// that moves bytes.  tcp does not use it: it does its I/O on the calling
// thread and keeps the same bookkeeping without locks (tcp_transport.h);
// validateSendRequest() and kDefaultSendQueueDepth serve every transport.
//
// Threads:
//   * data agent (one thread): exposeCredit, retractCredit, post, postControl, poll, eventFd
//   * sender thread (one):     nextSend, completeSend
//   * receiver thread (one):   beginReceive, endReceive, frameArrived, controlArrived
//   * any thread:              fail, connected
//
// Ordering guarantees the daemon relies on (every transport keeps them, with
// or without this class):
//   * Every request accepted by post() yields exactly one SendComplete.
//   * A SendComplete with FL_OK is never reported after the LinkError: once
//     the link failed, requests still queued or being written complete with
//     FL_ERR_LINK_LOST (the payload may or may not have left the host, the
//     ACK on the control link decides).
//   * A SendComplete is reported only once the transport no longer reads the
//     request's payload.
//   * LinkError is reported once per transport, whatever the cause
//     (peer closed, I/O error, protocol violation, local shutdown).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/transport.h"

namespace framelink::transport {

// Default depth of the send queue: post() reports kBackpressure beyond it.
inline constexpr size_t kDefaultSendQueueDepth = 256;

// Checks a SendRequest the way every transport must before queueing it.
// Returns an empty string when the request is well formed, else why not.
const char* validateSendRequest(const SendRequest& request) noexcept;

class TransportCore {
 public:
  static Result<std::unique_ptr<TransportCore>> create(size_t send_queue_depth = kDefaultSendQueueDepth);

  TransportCore(const TransportCore&) = delete;
  TransportCore& operator=(const TransportCore&) = delete;
  ~TransportCore();

  // ---- data agent ----
  Result<RemoteCredit> exposeCredit(LocalCredit credit);
  void retractCredit(uint64_t credit_id);
  PostResult post(const SendRequest& request) noexcept;
  PostResult postControl(std::string record) noexcept;
  size_t poll(TransportEvent* out, size_t max) noexcept;
  int eventFd() const noexcept { return event_fd_.get(); }
  bool connected() const noexcept;

  // ---- sender thread ----
  // What the sender writes next: the control records queued so far (written
  // first, they are small and someone waits for them), then at most one frame.
  struct Outgoing {
    std::vector<std::string> control;
    bool has_frame = false;
    SendRequest frame;
  };
  // Blocks until a control record or a request is queued (true) or the link
  // failed (false).  A frame stays "in flight" until completeSend().
  bool nextSend(Outgoing* out) noexcept;
  // Makes nextSend() return false from now on without failing the link:
  // the transport stops writing (its stream is gone) and fails the link
  // afterwards, once it knows why.  Queued requests stay queued until fail().
  void stopSending() noexcept;
  // The in-flight request was written (FL_OK), or failed with `status`; its
  // payload is not read any more.  Reports FL_ERR_LINK_LOST instead of FL_OK
  // if the link failed meanwhile.  Must be called for every nextSend() that
  // returned true, also when the write failed.
  void completeSend(uint64_t cookie, int status, uint64_t bytes) noexcept;

  // ---- receiver thread ----
  // Takes the credit out of the table (it is consumed by this frame).
  std::optional<LocalCredit> beginReceive(uint64_t credit_id) noexcept;
  // True if the credit taken by beginReceive was not retracted meanwhile.
  bool endReceive() noexcept;
  void frameArrived(const FrameHeader& header, int status, std::string message = {}) noexcept;
  void controlArrived(std::string record) noexcept;

  // ---- any thread ----
  // Marks the link failed.  The first call reports LinkError(status, message)
  // and completes every queued request with FL_ERR_LINK_LOST; it returns
  // true.  Later calls do nothing and return false.
  bool fail(int status, std::string message) noexcept;
  bool failed() const noexcept;

  // Counters for stats and benchmarks (approximate, relaxed).
  struct Counters {
    uint64_t frames_sent = 0;
    uint64_t bytes_sent = 0;
    uint64_t frames_received = 0;
    uint64_t bytes_received = 0;
    uint64_t unknown_credit_frames = 0;
    uint64_t backpressure = 0;
    uint64_t control_sent = 0;      // records
    uint64_t control_received = 0;  // records
  };
  Counters counters() const noexcept;
  void countReceived(uint64_t bytes) noexcept;

 private:
  TransportCore(UniqueFd event_fd, size_t send_queue_depth);
  void pushEventLocked(TransportEvent event) noexcept FL_REQUIRES(events_mu_);
  void signal() noexcept;

  UniqueFd event_fd_;

  // Send queue: a fixed ring so post() never allocates.
  mutable Mutex send_mu_;
  std::condition_variable send_cv_;
  std::vector<SendRequest> ring_ FL_GUARDED_BY(send_mu_);
  size_t head_ FL_GUARDED_BY(send_mu_) = 0;
  size_t count_ FL_GUARDED_BY(send_mu_) = 0;
  bool in_flight_ FL_GUARDED_BY(send_mu_) = false;
  uint64_t in_flight_cookie_ FL_GUARDED_BY(send_mu_) = 0;
  std::vector<std::string> control_ FL_GUARDED_BY(send_mu_);
  size_t control_bytes_ FL_GUARDED_BY(send_mu_) = 0;
  bool failed_ FL_GUARDED_BY(send_mu_) = false;
  bool stopped_ FL_GUARDED_BY(send_mu_) = false;

  // Lock order: send_mu_ before events_mu_ and counters_mu_.
  mutable Mutex events_mu_ FL_ACQUIRED_AFTER(send_mu_);
  std::deque<TransportEvent> events_ FL_GUARDED_BY(events_mu_);

  mutable Mutex credits_mu_;
  std::unordered_map<uint64_t, LocalCredit> credits_ FL_GUARDED_BY(credits_mu_);
  std::optional<uint64_t> receiving_ FL_GUARDED_BY(credits_mu_);
  bool receiving_retracted_ FL_GUARDED_BY(credits_mu_) = false;

  mutable Mutex counters_mu_ FL_ACQUIRED_AFTER(send_mu_);
  Counters counters_ FL_GUARDED_BY(counters_mu_);
};

}  // namespace framelink::transport
