// What the data agent holds of one live peer session: a non-blocking way to
// send control messages and a way to end the session.  The session's writer
// is SessionWriter's own thread (session_writer.cpp); its reader is
// runLinkSession (link/session_reader.cpp), which starts the writer and runs
// on the thread that owns the gRPC call (a dialer's or a gRPC handler's,
// link/peer_links.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"
#include "framelink/v1/link.pb.h"

namespace framelink {

// Serialises writes to one gRPC stream on a thread of its own, so the data
// agent never blocks on the network.  Sends a Keepalive when idle.
class SessionWriter {
 public:
  // `more`: further messages follow at once, so the stream may hold this one
  // back and coalesce (grpc::WriteOptions::set_buffer_hint).
  using WriteFn = std::function<bool(const v1::PeerMessage&, bool more)>;

  SessionWriter(WriteFn write, std::chrono::milliseconds keepalive);
  // Writes on the caller's thread as send() is called: no thread and no
  // keepalive of its own.  For a caller that is one deterministic thread (the
  // protocol simulator drives two agents and their sessions this way).
  struct Inline {};
  SessionWriter(WriteFn write, Inline);
  ~SessionWriter();
  SessionWriter(const SessionWriter&) = delete;
  SessionWriter& operator=(const SessionWriter&) = delete;

  void send(v1::PeerMessage message);
  // Stops the thread after what is queued was written (or writing failed).
  void close();
  bool failed() const;

 private:
  void run();

  WriteFn write_;
  std::chrono::milliseconds keepalive_;
  mutable Mutex mutex_;
  std::condition_variable cv_;
  std::deque<v1::PeerMessage> queue_ FL_GUARDED_BY(mutex_);
  bool closing_ FL_GUARDED_BY(mutex_) = false;
  bool failed_ FL_GUARDED_BY(mutex_) = false;
  bool inline_ = false;  // set once, at construction
  std::thread thread_;
};

// The agent's handle on a session.
struct PeerSession {
  std::shared_ptr<SessionWriter> writer;
  std::function<void()> cancel;  // ends the gRPC call; the session thread then reports LinkDown
};

}  // namespace framelink
