// The Session call as a reactor (session_call.h: gRPC's asynchronous API,
// one completion-queue thread for every call): no thread holds it.  A
// reaction runs as a read or a write completes; a read hands the peer's
// message to the agent and starts the next, a write done lets the session's
// writer start the next (SessionWriter::makeAsync), and keepalives and the
// silence check run on the daemon's SessionTimers.  The handshake before
// the link is up (Hello, HelloAck, the data channel) is the side's own: the
// listener's in peer_accept.cpp, the dialer's in peer_dialer.cpp.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <utility>

#include "agent/session_timers.h"
#include "agent/session_writer.h"
#include "common/thread_annotations.h"
#include "config/config.h"
#include "framelink/v1/link.pb.h"
#include "link/session_call.h"
#include "link/session_reader.h"

namespace framelink {

// `Base`: ServerSessionCall or ClientSessionCall.
template <typename Base>
class SessionReactor : public Base {
 public:
  void onReadDone(bool ok) override {
    if (!inbox_) {
      handshakeRead(ok);
      return;
    }
    if (!ok || !inbox_->take(message_)) {
      endLink();
      return;
    }
    Base::startRead(message_.get());
  }

  void onWriteDone(bool ok) override {
    if (!writer_) {
      handshakeWritten(ok);
      return;
    }
    bool finish = false;
    {
      MutexLock lock(gate_->mutex);
      gate_->writing = false;
      finish = gate_->ended && !finished_;
      finished_ = finished_ || finish;
    }
    writer_->writeDone(ok);
    if (finish) linkEnded();
  }

 protected:
  // The handshake's read and write completions, before beginLink().  Every
  // handshake write is done before beginLink() is called.
  virtual void handshakeRead(bool ok) = 0;
  virtual void handshakeWritten(bool ok) = 0;
  // Ends the call from this side (the context's TryCancel).
  virtual void cancelCall() = 0;
  // The link is down and no write is out: the call may be finished.
  virtual void linkEnded() = 0;

  // The data channel is up: the agent gets the link, and the peer's messages from now on.
  void beginLink(DataAgent& agent, const Config& config, SessionTimers& timers, const LinkSessionInfo& info,
                 std::shared_ptr<transport::Transport> t) {
    // The agent may ask to cancel at any time, also after this call ended:
    // the guard turns such late calls into no-ops.  So may the writer, when
    // the peer stops reading.
    auto guard = std::make_shared<CancelGuard>([this] { cancelCall(); });
    writer_ = SessionWriter::makeAsync(
        [gate = gate_, this](const v1::PeerMessage& m, bool more) { return gate->start(this, m, more); },
        std::chrono::milliseconds(config.keepalive_ms), std::chrono::milliseconds(config.link_timeout_ms),
        [guard] { guard->fire(); }, timers);
    message_ = std::make_shared<v1::PeerMessage>();
    inbox_ = std::make_unique<SessionInbox>(agent, config, info, std::move(t), writer_, std::move(guard));
    Base::startRead(message_.get());
  }

 private:
  // What the writer's StartFn reaches: the writer, held by the agent, may
  // outlive the call, and a write it began to start as the link ended must
  // not reach a reactor that is gone.
  struct WriteGate {
    Mutex mutex;
    std::condition_variable cv;
    bool writing FL_GUARDED_BY(mutex) = false;  // a write of the writer's is out
    bool ended FL_GUARDED_BY(mutex) = false;    // no write starts any more
    int starting FL_GUARDED_BY(mutex) = 0;      // startWrite calls under way

    bool start(SessionReactor* reactor, const v1::PeerMessage& m, bool more) {
      {
        MutexLock lock(mutex);
        if (ended) return false;
        writing = true;
        ++starting;
      }
      ::grpc::WriteOptions options;
      if (more) options.set_buffer_hint();
      reactor->Base::startWrite(&m, options);
      MutexLock lock(mutex);
      if (--starting == 0) cv.notify_all();
      return true;
    }
  };

  // No read is out: the last one failed, or the peer floods the Session.
  void endLink() {
    inbox_->down();
    bool finish = false;
    {
      MutexLock lock(gate_->mutex);
      gate_->ended = true;
      lock.wait(gate_->cv, [this]() FL_REQUIRES(gate_->mutex) { return gate_->starting == 0; });
      finish = !gate_->writing && !finished_;
      finished_ = finished_ || finish;
    }
    if (finish) linkEnded();
  }

  std::shared_ptr<SessionWriter> writer_;
  std::unique_ptr<SessionInbox> inbox_;
  std::shared_ptr<v1::PeerMessage> message_;
  const std::shared_ptr<WriteGate> gate_ = std::make_shared<WriteGate>();
  bool finished_ FL_GUARDED_BY(gate_->mutex) = false;  // linkEnded() was called
};

using ServerSessionReactor = SessionReactor<ServerSessionCall>;
using ClientSessionReactor = SessionReactor<ClientSessionCall>;

}  // namespace framelink
