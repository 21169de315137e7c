// The listener's side of a Session, on the daemon's session queue
// (session_call.h): no thread holds a session, from its Hello to its end.  The steps: the token, the Hello
// (admitHello), the peer's instance, the HelloAck; then the data channel,
// which the transport's listener hands over (PendingChannels) or which does
// not come within the transport's handshake timeout (SessionTimers); then
// the link (SessionReactor) until the call ends.

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "agent/data_agent.h"
#include "common/log_fields.h"
#include "link/peer_identity.h"
#include "link/peer_links_impl.h"
#include "link/session_reactor.h"
#include "metrics/metrics.h"

namespace framelink {

class PeerLinksImpl::AcceptedSession final : public ServerSessionReactor {
 public:
  // Waits for the next Session a peer opens.
  static void awaitNext(PeerLinksImpl& links) {
    auto* next = new AcceptedSession(links);
    next->await(links, links.session_queue_->cq());
  }

  void onStart(bool ok) override {
    if (!ok) {  // the server shuts down
      delete this;
      return;
    }
    awaitNext(links_);  // the next one meanwhile
    from_ = ctx_.peer();
    if (!links_.identity_.tokenAccepted(ctx_)) {
      links_.metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
      links_.log_auth_.warn(
          "peer at {} refused: wrong or missing token (FL_ERR_AUTH); configure the same token on both "
          "daemons",
          from_);
      finish({::grpc::StatusCode::UNAUTHENTICATED,
              "wrong or missing token: configure the same token on both daemons"});
      return;
    }
    {
      MutexLock lock(links_.mutex_);
      if (links_.stopping_) {
        finish({::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"});
        return;
      }
      links_.server_contexts_.emplace(&ctx_, CallPeer{});
      registered_ = true;
    }
    startRead(&first_);
  }

  void onDone() override {
    if (timeout_ != 0) links_.timers_.cancel(timeout_);
    if (registered_) {
      MutexLock lock(links_.mutex_);
      links_.server_contexts_.erase(&ctx_);
    }
    delete this;
  }

  ~AcceptedSession() override {
    MutexLock lock(links_.mutex_);
    if (--links_.accepted_sessions_ == 0) links_.stop_cv_.notify_all();
  }

  // Only the wait for the data channel has no read or write out that the
  // cancellation fails: it ends here.
  // (The call's end is onCancel too, once it was cancelled.)
  void onCancel() override { failWait({::grpc::StatusCode::CANCELLED, "the session was cancelled"}); }

 private:
  // The Hello.
  void handshakeRead(bool ok) override {
    if (!ok) {
      finish({::grpc::StatusCode::CANCELLED, "no Hello"});
      return;
    }
    if (::grpc::Status refused = links_.admitHello(ctx_, from_, first_, choice_); !refused.ok()) {
      finish(refused);
      return;
    }
    const v1::Hello& hello = first_.hello();
    // Counted from here, before the HelloAck: links being set up take their place too.
    if (::grpc::Status refused = links_.instances_.admit(
            hello.daemon_id(), hello.instance(), links_.identity_.provenAlone(hello.daemon_id()), from_, up_);
        !refused.ok()) {
      finish(refused);
      return;
    }
    {
      MutexLock lock(links_.mutex_);
      // A reload that revokes its credentials (its token, its certificate) ends it.
      links_.server_contexts_[&ctx_] =
          CallPeer{hello.daemon_id(), peerCertificate(ctx_.auth_context().get())};
    }
    // The listener's thread and the deadline's may reach the call until the wait settles (advance()).
    hold();
    const bool waiting = links_.pending_.add(hello.session_id(), choice_.transport,
                                             links_.live_.get()->peerToken(hello.daemon_id()),
                                             [this](std::shared_ptr<transport::Transport> t) { arrived(t); });
    if (!waiting) {
      unhold();  // nothing outside this thread reaches the call
      finish(links_.stopping_
                 ? ::grpc::Status{::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"}
                 : ::grpc::Status{::grpc::StatusCode::ALREADY_EXISTS, "session id already in use"});
      return;
    }
    const auto timeout = choice_.transport->handshakeTimeout(links_.config_);
    timeout_ = links_.timers_.at(Clock::now() + timeout, [this, timeout] {
      links_.log_data_timeout_.warn("peer {} at {}: the {} data channel did not come up within {} ms",
                                    first_.hello().daemon_id(), from_, choice_.transport->name(),
                                    timeout.count());
      failWait({::grpc::StatusCode::DEADLINE_EXCEEDED, "the data channel did not come up in time"});
    });
    reply_ = links_.helloAck(hello, choice_);
    startWrite(&reply_);
  }

  // The HelloAck.
  void handshakeWritten(bool ok) override {
    {
      MutexLock lock(mutex_);
      ack_written_ = true;
      if (!ok && failure_.ok()) failure_ = {::grpc::StatusCode::CANCELLED, "peer went away"};
    }
    advance();
  }

  // From the transport's listener, or null when the daemon stops.
  void arrived(std::shared_ptr<transport::Transport> t) {
    {
      MutexLock lock(mutex_);
      arrived_ = true;
      channel_ = std::move(t);
      if (!channel_ && failure_.ok()) failure_ = {::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"};
    }
    advance();
  }

  // The wait ends without a channel (unless one came first).
  void failWait(::grpc::Status why) {
    {
      MutexLock lock(mutex_);
      if (arrived_ || begun_ || !failure_.ok()) return;
      failure_ = std::move(why);
    }
    advance();
  }

  // Once the HelloAck is written: the link begins when its channel came, or
  // the call finishes when the wait failed and no channel is on its way.
  void advance() {
    std::shared_ptr<transport::Transport> channel;
    // A channel that came too late closes, once mutex_ is released: its
    // shutdown waits for its call to end on the session queue, whose thread
    // may be waiting for mutex_.
    std::shared_ptr<transport::Transport> too_late;
    ::grpc::Status failure;
    {
      MutexLock lock(mutex_);
      if (!ack_written_ || begun_ || done_) return;
      if (!failure_.ok() && !arrived_ && !removed_) {
        removed_ = links_.pending_.remove(first_.hello().session_id());
        if (!removed_) return;  // it is being handed over: arrived() comes next
      }
      if (failure_.ok() && !arrived_) return;
      if (failure_.ok()) {
        begun_ = true;
        channel = std::move(channel_);
      } else {
        done_ = true;
        failure = failure_;
        too_late = std::move(channel_);
      }
    }
    if (timeout_ != 0) links_.timers_.cancel(timeout_);  // not under mutex_: its callback takes it
    if (!channel) {
      finish(failure);
    } else {
      begin(std::move(channel));
    }
    unhold();
  }

  void begin(std::shared_ptr<transport::Transport> t) {
    const v1::Hello& hello = first_.hello();
    const LogScope scope(LogFields{.peer = hello.daemon_id()});
    const auto& [chosen, reason] = choice_;
    if (reply_.hello_ack().frame_batches()) t->enableFrameBatches();
    const uint64_t link_id = links_.next_link_id_++;
    links_.log_accepted_.info("peer {} at {} connected (session {:016x}, protocol {}, transport {}{})",
                              hello.daemon_id(), from_, hello.session_id(),
                              reply_.hello_ack().protocol_version(), chosen->name(),
                              reason.empty() ? "" : "; " + reason);
    LinkSessionInfo info{link_id,
                         {hello.daemon_id(), from_.substr(from_.find(':') + 1), hello.instance(),
                          std::string(chosen->name()), reason}};
    beginLink(links_.agent_, links_.config_, links_.timers_, info, std::move(t));
  }

  explicit AcceptedSession(PeerLinksImpl& links) : links_(links) {
    MutexLock lock(links_.mutex_);
    ++links_.accepted_sessions_;
  }

  void cancelCall() override { ctx_.TryCancel(); }
  void linkEnded() override { finish(::grpc::Status::OK); }

  PeerLinksImpl& links_;
  std::string from_;
  v1::PeerMessage first_;  // the Hello
  v1::PeerMessage reply_;  // the HelloAck
  TransportRegistry::Choice choice_;
  std::unique_ptr<PeerInstances::Up> up_;  // the peer's instance counts as linked while the call lasts
  bool registered_ = false;                // in links_.server_contexts_
  SessionTimers::Id timeout_ = 0;          // the data channel's deadline; set before the HelloAck goes
  Mutex mutex_;
  bool ack_written_ FL_GUARDED_BY(mutex_) = false;
  bool arrived_ FL_GUARDED_BY(mutex_) = false;  // PendingChannels called arrived()
  bool removed_ FL_GUARDED_BY(mutex_) = false;  // taken off PendingChannels: arrived() never comes
  bool begun_ FL_GUARDED_BY(mutex_) = false;
  bool done_ FL_GUARDED_BY(mutex_) = false;  // finished without a link
  ::grpc::Status failure_ FL_GUARDED_BY(mutex_);
  std::shared_ptr<transport::Transport> channel_ FL_GUARDED_BY(mutex_);
};

void PeerLinksImpl::awaitSessions() { AcceptedSession::awaitNext(*this); }

}  // namespace framelink
