// What the data agent holds of one live peer session: a non-blocking way to
// send control messages and a way to end the session.  On the daemon's
// Session calls (link/session_reactor.h) the writer starts each write and the
// call reports it done (writeDone); keepalives and the silence check run on
// the daemon's SessionTimers: no thread of the session's own.  On a blocking
// call the writer has a thread of its own (session_writer.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "agent/session_timers.h"
#include "common/thread_annotations.h"
#include "framelink/v1/link.pb.h"

namespace framelink {

// Serialises writes to one gRPC stream, so the data agent never blocks on
// the network: started one at a time on an asynchronous call (makeAsync),
// or on a thread of its own.  Sends a Keepalive a period after the
// last message it wrote that was not an echo of the peer's.
class SessionWriter {
 public:
  // `more`: further messages follow at once, so the stream may hold this one
  // back and coalesce (grpc::WriteOptions::set_buffer_hint).
  using WriteFn = std::function<bool(const v1::PeerMessage&, bool more)>;

  // Bytes of messages that may wait for a write (which blocks while the
  // peer's flow-control window is full).  A peer that reads its Session
  // never comes near it: its messages are a stream open or close, a Fin or a
  // keepalive.  Past it the peer has stopped reading; the writer gives up
  // (failed(), failure()) and calls `cut`, which ends the call.
  static constexpr size_t kMaxQueuedBytes = size_t{4} * 1024 * 1024;

  SessionWriter(WriteFn write, std::chrono::milliseconds keepalive, std::function<void()> cut = {});
  // ... and gives the link up (failure(), `cut`) once nothing was heard()
  // from the peer for `silence`: a path that carries only our direction
  // leaves the call open and our writes succeeding.  0: never.
  SessionWriter(WriteFn write, std::chrono::milliseconds keepalive, std::chrono::milliseconds silence,
                std::function<void()> cut);
  // Writes on the caller's thread as send() is called: no thread and no
  // keepalive of its own.  For a caller that is one deterministic thread (the
  // protocol simulator drives two agents and their sessions this way).
  struct Inline {};
  SessionWriter(WriteFn write, Inline);
  // Starts a write on the call and returns at once, the message kept alive
  // until the call reports it done through writeDone(); false: the call
  // ended, nothing was started.  At most one write is out at a time.
  using StartFn = std::function<bool(const v1::PeerMessage&, bool more)>;
  static std::shared_ptr<SessionWriter> makeAsync(StartFn start, std::chrono::milliseconds keepalive,
                                                  std::chrono::milliseconds silence,
                                                  std::function<void()> cut, SessionTimers& timers);
  ~SessionWriter();
  SessionWriter(const SessionWriter&) = delete;
  SessionWriter& operator=(const SessionWriter&) = delete;

  // A keepalive that echoes the peer's (echo_ns set) replaces one still
  // waiting: the peer measures its round trip from the newest, and one that
  // floods keepalives and reads nothing queues a single echo.
  void send(v1::PeerMessage message);
  // Sends `message` after what is queued, then ends the call (`cut`): a
  // Fin that says why the link closes reaches the peer before the call
  // ends, when the peer reads.  A peer that does not read is cut by the
  // agent's deadline instead (DataAgent, kFinGraceNs).  False when this
  // writer cannot end the call (inline, or made without `cut`): the message
  // was written or queued, and the caller ends the call itself.  Either way
  // it is the last message: send() drops whatever comes after it (a later
  // echo would otherwise overtake the Fin, a later message follow it).
  bool sendLast(v1::PeerMessage message);
  // Stops the thread after what is queued was written (or writing failed).
  void close();
  // The write started last (StartFn) is done; `ok` false: the call broke.
  void writeDone(bool ok);
  // Something (a message, a keepalive) arrived from the peer.
  void heard() noexcept;
  // What the keepalives say this end took off the link's data transport
  // (Keepalive.data_received); the data agent sets it as it takes them.
  void setDataReceived(uint64_t units) noexcept { data_received_.store(units, std::memory_order_relaxed); }
  bool failed() const;
  // Why writing stopped; empty while it has not.
  std::string failure() const;
  size_t queuedBytes() const;

 private:
  struct Queued {
    v1::PeerMessage message;
    size_t bytes = 0;
  };
  struct AsyncTag {};

 public:
  SessionWriter(AsyncTag, StartFn start, std::chrono::milliseconds keepalive,
                std::chrono::milliseconds silence, std::function<void()> cut, SessionTimers& timers);

 private:
  void run();
  // Async: starts the next write unless one is out; cuts once the last is written.
  void pump();
  // Async: the keepalive and silence check, on the timers' thread; arms the next.
  void tick(const std::weak_ptr<SessionWriter>& self);
  void arm(const std::weak_ptr<SessionWriter>& self, std::chrono::steady_clock::time_point now)
      FL_REQUIRES(mutex_);
  // Takes the next message to write off the queue (the echo first).
  v1::PeerMessage takeNext() FL_REQUIRES(mutex_);
  v1::PeerMessage keepaliveMessage() const;
  // The peer said nothing for longer than silence_: why, or "".
  std::string silenceFailure() const;
  // Stops writing for good: what waits is dropped.
  void fail(std::string why) FL_REQUIRES(mutex_);

  WriteFn write_;
  std::chrono::milliseconds keepalive_;
  std::chrono::milliseconds silence_{0};
  std::function<void()> cut_;
  std::atomic<int64_t> heard_ns_{0};  // steady clock
  std::atomic<uint64_t> data_received_{0};
  mutable Mutex mutex_;
  std::condition_variable cv_;
  std::deque<Queued> queue_ FL_GUARDED_BY(mutex_);
  size_t queued_bytes_ FL_GUARDED_BY(mutex_) = 0;
  uint64_t echo_ns_ FL_GUARDED_BY(mutex_) = 0;  // the echo waiting to go; 0: none
  bool closing_ FL_GUARDED_BY(mutex_) = false;
  bool cut_when_written_ FL_GUARDED_BY(mutex_) = false;  // sendLast: cut once the queue is written
  bool last_queued_ FL_GUARDED_BY(mutex_) = false;       // sendLast was called: nothing more is taken
  bool failed_ FL_GUARDED_BY(mutex_) = false;
  std::string failure_ FL_GUARDED_BY(mutex_);
  bool inline_ = false;  // set once, at construction
  std::thread thread_;
  // Async mode (set once, at construction): no thread_.
  StartFn start_;
  SessionTimers* timers_ = nullptr;
  v1::PeerMessage in_flight_ FL_GUARDED_BY(mutex_);  // what the call writes now
  bool writing_ FL_GUARDED_BY(mutex_) = false;
  bool cut_done_ FL_GUARDED_BY(mutex_) = false;
  SessionTimers::Id timer_ FL_GUARDED_BY(mutex_) = 0;
  std::chrono::steady_clock::time_point next_keepalive_ FL_GUARDED_BY(mutex_);
};

// The agent's handle on a session.
struct PeerSession {
  std::shared_ptr<SessionWriter> writer;
  std::function<void()> cancel;  // ends the gRPC call; the session thread then reports LinkDown
};

}  // namespace framelink
