// The bookkeeping of a byte-stream transport that moves its bytes on
// another thread than the data agent's (grpc's: the completions of its call,
// on the daemon's call queue): one LinkBookkeeping (the bounded send queue,
// the credit table, the sources and reads of pull, the event queue, the
// admission rules and the "link failed exactly once" rule,
// link_bookkeeping.h) shared between that thread and the calling thread
// under one mutex, plus the eventfd and the hand-over to the writer (frames,
// control records, read requests and the answers to the peer's).  Such a
// transport owns one LockedLinkBookkeeping and adds only the code that moves
// bytes.  tcp, rdma and loopback do their I/O on the calling thread and use
// LinkBookkeeping without a lock.
//
// Nothing here blocks the transport's thread: the sender takes what is
// queued (takeSend) and, when nothing is, is woken (the wake given to
// setWake) once something is; the reader asks roomForEvents() before its
// next read and is woken once poll() made room.
//
// Threads:
//   * data agent (one thread): exposeCredit, retractCredit, post, postControl, exposeSource,
//                              retractSource, postRead, poll, eventFd, counters, lastRefusal
//   * sender (one at a time):  takeSend, completeSend
//   * receiver (one at a time): beginReceive, copyIntoLanding, endReceive, frameArrived,
//                              controlArrived, roomForEvents, answerRead, findRead,
//                              copyIntoRead, readDone
//   * any thread:              fail, connected, setWake (before the first post)
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

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/link_bookkeeping.h"
#include "transport/transport.h"

namespace framelink::transport {

// Frames and control records the reader queues for the caller of poll()
// before it stops reading (roomForEvents), until poll() takes some; the
// peer's writes wait in flow control meanwhile.  A peer that sends faster
// than the data agent handles it costs this many events here, and those of
// the one message being read (a batch: kMaxBatchFrames), not its whole send
// rate.  tcp stops reading at the `max` of poll() the same way.
inline constexpr size_t kMaxQueuedEvents = 64;

// A read on the wire: the source the reader asks for, the id its answer
// echoes (the tag LinkBookkeeping::postRead gave the read) and the bytes
// asked for.
struct ReadAsk {
  uint64_t source_id = 0;
  uint64_t read_id = 0;
  uint64_t length = 0;
};

// This side's answer to a peer's ReadAsk: the source's `asked.length` bytes
// at `payload`, kept mapped by `keepalive` for as long as the writer needs
// them (past retractSource), or none when this side exposes no such source
// of that length (`known` false).
struct ReadAnswer {
  ReadAsk asked;
  bool known = false;
  const uint8_t* payload = nullptr;
  std::shared_ptr<void> keepalive;
};

// Which queued frames one unit of LockedLinkBookkeeping::takeSend() may take
// together: while the first frame and each next one have at most
// max_frame_bytes of payload, up to max_frames frames and max_bytes of
// payload in all.  The default takes one frame a unit.
struct SendBatching {
  size_t max_frames = 1;
  uint64_t max_frame_bytes = 0;
  uint64_t max_bytes = 0;
};

class LockedLinkBookkeeping {
 public:
  static Result<std::unique_ptr<LockedLinkBookkeeping>> create(
      size_t send_queue_depth = kDefaultSendQueueDepth);
  // Without its eventfd until openEventFd(): a listener's call not yet
  // admitted (a stranger's, or the one a daemon waits for) holds no
  // descriptor.  Nothing is signalled meanwhile.
  static Result<std::unique_ptr<LockedLinkBookkeeping>> createWithoutEventFd(
      size_t send_queue_depth = kDefaultSendQueueDepth);
  // Before the transport is handed to anyone (eventFd() is read unlocked).
  Status openEventFd();

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
  Result<RemoteSource> exposeSource(LocalSource source);
  void retractSource(uint64_t source_id) noexcept;
  // Admits the read (LinkBookkeeping::postRead) and queues its request for
  // the sender.
  PostResult postRead(const ReadRequest& request) noexcept;
  // Why the last post(), postControl() or postRead() returned kInvalid; valid until the next one.
  std::string_view lastRefusal() const noexcept;
  size_t poll(TransportEvent* out, size_t max) noexcept;
  int eventFd() const noexcept { return event_fd_.get(); }
  bool connected() const noexcept;
  TransportCounters counters() const noexcept;

  // What wakes the transport's sender (takeSend found nothing) once something
  // is queued or the link failed, and its reader (roomForEvents said no) once
  // poll() made room.  Called with no lock held, from the thread that queued,
  // polled or failed; it must not block.  Set before the first post().
  void setWake(std::function<void()> wake);

  // ---- sender ----
  // What the sender writes next: the control records and read requests
  // queued so far (written first, they are small and someone waits for
  // them), then one unit: the answer to a peer's read, or else frames: one,
  // or several small ones queued one after the other, to be written as one
  // batch (Batching).  A unit is written whole before the next one starts.
  struct Outgoing {
    std::deque<std::string> control;
    std::vector<ReadAsk> asks;
    bool has_answer = false;
    ReadAnswer answer;
    std::vector<SendRequest> frames;  // in the order they were posted
  };
  // kTaken: `out` holds what goes next.  kNothing: nothing is queued; the
  // wake comes once something is.  kStopped: the link failed or stopSending()
  // was called.  A frame stays "in flight" until its completeSend(); an
  // answer no longer counts against the peer's bound once it is handed out
  // (see answerRead).
  enum class Take { kTaken, kNothing, kStopped };
  Take takeSend(Outgoing* out, const SendBatching& batching = {}) noexcept;
  // Makes takeSend() return kStopped from now on without failing the link:
  // the transport stops writing (its stream is gone) and fails the link
  // afterwards, once it knows why.  Queued requests stay queued until fail().
  void stopSending() noexcept;
  // An in-flight frame was written (FL_OK), or failed with `status`; its
  // payload is not read any more.  Reports FL_ERR_LINK_LOST instead of FL_OK
  // if the link failed meanwhile.  Must be called for every frame takeSend()
  // handed out, also when the write failed.
  void completeSend(uint64_t cookie, int status, uint64_t bytes) noexcept;

  // ---- receiver ----
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
  // Whether the reader may read on: fewer than kMaxQueuedEvents events wait
  // for poll(), or the link failed.  When not, the wake comes once poll()
  // took some.
  bool roomForEvents() noexcept;

  // Pull, this side the owner: the peer asks for a source.  Queues the
  // answer for the sender (the source's bytes, or "no source"), counted as
  // served.  FL_ERR_PROTOCOL when kMaxReadsOutstanding answers wait already:
  // an answer waits only while its read is outstanding on the peer, so the
  // peer asked for more than it may (the bound keeps the queue finite);
  // FL_ERR_RESOURCES when out of memory.  The caller fails the link then.
  // Nothing is queued once the link failed.
  int answerRead(const ReadAsk& asked) noexcept;
  // Pull, this side the reader: the read posted under `tag`, while it is
  // outstanding (the reader's own copy: it writes into the buffer without
  // mu_, copyIntoRead).
  std::optional<ReadRequest> findRead(uint64_t tag) const noexcept;
  // Runs `copy`, which writes one chunk of an answer into the buffer of the
  // read `tag`, unless the read completed meanwhile (the link failed: its
  // buffer may be the caller's again).  fail() waits for a copy in progress.
  template <typename Copy>
  void copyIntoRead(uint64_t tag, Copy&& copy) noexcept FL_EXCLUDES(copy_mu_, mu_) {
    MutexLock copying(copy_mu_);
    if (readOutstanding(tag)) copy();
  }
  // The read `tag` ended (LinkBookkeeping::readDone); false when it was not
  // outstanding any more.
  bool readDone(uint64_t tag, int status, uint64_t bytes, std::string message = {}) noexcept;

  // ---- any thread ----
  // Marks the link failed.  The first call reports LinkError(status, message)
  // and completes every queued request and every outstanding read with
  // FL_ERR_LINK_LOST (after a chunk being copied into a read's buffer landed:
  // none lands after), drops the queued read requests and answers, and
  // returns true.  Later calls do nothing and return false.  The request being
  // written (if any) is not reported here: its payload may still be read
  // until the write returns, and the implementation unblocks that write
  // (socket shutdown, call cancel) right after this.  Its completeSend()
  // then reports FL_ERR_LINK_LOST.
  bool fail(int status, std::string message) noexcept FL_EXCLUDES(copy_mu_, mu_);
  bool failed() const noexcept;

 private:
  LockedLinkBookkeeping(UniqueFd event_fd, size_t send_queue_depth);
  void signal() noexcept;
  // The wake, if the sender or the reader waits for it (the flags are cleared).
  void wakeIfWaited(bool sender_waits, bool reader_waits) noexcept;
  // takeSend()'s frames: the ring's first, and the ones after it `batching` lets share its unit.
  void takeFrames(Outgoing* out, const SendBatching& batching) noexcept FL_REQUIRES(mu_);
  bool landingValid() const noexcept FL_EXCLUDES(mu_);
  bool readOutstanding(uint64_t tag) const noexcept FL_EXCLUDES(mu_);

  UniqueFd event_fd_;
  // signal() wrote event_fd_ and poll() has not read it since (poll's read).
  std::atomic<bool> signalled_{false};

  // Held by the receiver while it copies a chunk, and by retractCredit and
  // fail: a retraction never overlaps a copy into the buffer it takes back,
  // nor a read's completion one into the read's buffer.
  Mutex copy_mu_ FL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  std::function<void()> wake_;  // set before the first post, then only read
  LinkBookkeeping book_ FL_GUARDED_BY(mu_);
  bool stopped_ FL_GUARDED_BY(mu_) = false;
  bool sender_waits_ FL_GUARDED_BY(mu_) = false;  // takeSend() found nothing since the last wake
  bool reader_waits_ FL_GUARDED_BY(mu_) = false;  // roomForEvents() said no since the last wake
  // Frames handed out by takeSend() whose completeSend() has not come yet.
  std::vector<uint64_t> in_flight_ FL_GUARDED_BY(mu_);
  std::vector<ReadAsk> asks_ FL_GUARDED_BY(mu_);       // read requests not yet handed out
  std::deque<ReadAnswer> answers_ FL_GUARDED_BY(mu_);  // answers not yet handed out
};

}  // namespace framelink::transport
