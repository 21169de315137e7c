// The bookkeeping of a byte-stream transport that moves its bytes on threads
// of its own (grpc's reader and writer): one LinkBookkeeping (the bounded
// send queue, the credit table, the event queue, the admission rules and
// the "link failed exactly once" rule, link_bookkeeping.h) shared between
// those threads and the calling thread under one mutex, plus the eventfd
// and the hand-over to the writer.  Such a transport owns one
// LockedLinkBookkeeping and adds only the code that moves bytes.  tcp, rdma
// and loopback do their I/O on the calling thread and use LinkBookkeeping
// without a lock.
//
// Threads:
//   * data agent (one thread): exposeCredit, retractCredit, post, postControl, poll, eventFd,
//                              counters, lastRefusal
//   * sender thread (one):     nextSend, completeSend
//   * receiver thread (one):   beginReceive, copyIntoLanding, endReceive, frameArrived,
//                              controlArrived
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
#include <string_view>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/link_bookkeeping.h"
#include "transport/transport.h"

namespace framelink::transport {

class LockedLinkBookkeeping {
 public:
  static Result<std::unique_ptr<LockedLinkBookkeeping>> create(
      size_t send_queue_depth = kDefaultSendQueueDepth);

  LockedLinkBookkeeping(const LockedLinkBookkeeping&) = delete;
  LockedLinkBookkeeping& operator=(const LockedLinkBookkeeping&) = delete;
  ~LockedLinkBookkeeping();

  // ---- data agent ----
  Result<RemoteCredit> exposeCredit(LocalCredit credit);
  // Waits for a chunk being copied into the credit's buffer right now: once
  // it returns, nothing more of a frame lands there, and the daemon may give
  // the buffer to another frame at once.
  void retractCredit(uint64_t credit_id) FL_EXCLUDES(copy_mu_, mu_);
  PostResult post(const SendRequest& request) noexcept;
  PostResult postControl(std::string record) noexcept;
  // Why the last post() or postControl() returned kInvalid; valid until the next one.
  std::string_view lastRefusal() const noexcept;
  size_t poll(TransportEvent* out, size_t max) noexcept;
  int eventFd() const noexcept { return event_fd_.get(); }
  bool connected() const noexcept;
  TransportCounters counters() const noexcept;

  // ---- sender thread ----
  // What the sender writes next: the control records queued so far (written
  // first, they are small and someone waits for them), then at most one frame.
  struct Outgoing {
    std::deque<std::string> control;
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
  // Runs `copy`, which writes one chunk into the buffer of the credit taken
  // by beginReceive, unless that credit was retracted meanwhile (then the
  // chunk is dropped).  The copy runs outside mu_, so that posts and polls
  // on the data agent do not wait for it; only retractCredit does.
  template <typename Copy>
  void copyIntoLanding(Copy&& copy) noexcept FL_EXCLUDES(copy_mu_, mu_) {
    MutexLock copying(copy_mu_);
    if (landingValid()) copy();
  }
  // True if the credit taken by beginReceive was not retracted meanwhile.
  bool endReceive() noexcept;
  // A frame arrived: counted as received when `status` is FL_OK.
  void frameArrived(const FrameHeader& header, int status, std::string message = {}) noexcept;
  void controlArrived(std::string record) noexcept;

  // ---- any thread ----
  // Marks the link failed.  The first call reports LinkError(status, message)
  // and completes every queued request with FL_ERR_LINK_LOST; it returns
  // true.  Later calls do nothing and return false.  The request being
  // written (if any) is not reported here: its payload may still be read
  // until the write returns, and the implementation unblocks that write
  // (socket shutdown, call cancel) right after this.  Its completeSend()
  // then reports FL_ERR_LINK_LOST.
  bool fail(int status, std::string message) noexcept;
  bool failed() const noexcept;

 private:
  LockedLinkBookkeeping(UniqueFd event_fd, size_t send_queue_depth);
  void signal() noexcept;
  bool landingValid() const noexcept FL_EXCLUDES(mu_);

  UniqueFd event_fd_;

  // Held by the receiver while it copies a chunk, and by retractCredit:
  // a retraction never overlaps a copy into the buffer it takes back.
  Mutex copy_mu_ FL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  std::condition_variable send_cv_;  // nextSend() waits on it
  LinkBookkeeping book_ FL_GUARDED_BY(mu_);
  bool stopped_ FL_GUARDED_BY(mu_) = false;
  bool in_flight_ FL_GUARDED_BY(mu_) = false;
  uint64_t in_flight_cookie_ FL_GUARDED_BY(mu_) = 0;
};

}  // namespace framelink::transport
