// The dialer's side of a Session, on the daemon's session queue (session_call.h).  The dialer's
// thread runs the handshake (the Hello, the HelloAck, the data channel) and
// hands the link over (launch): from then on no thread holds it, and its end
// starts the peer's next dialer (PeerLinksImpl::redial).  A call that ended
// before the hand-over stays the dialer's, whose thread goes on.  Internal
// to peer_dialer.cpp.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <optional>
#include <string>

#include "common/thread_annotations.h"
#include "framelink/v1/link.grpc.pb.h"
#include "link/peer_links_impl.h"
#include "link/session_reactor.h"

namespace framelink {

class PeerLinksImpl::DialedSession final : public ClientSessionReactor {
 public:
  // Registered with the calls stop() and a reload cancel; empty when the dialer is to end.
  static std::unique_ptr<DialedSession> open(PeerLinksImpl& links, const PeerConfig& peer,
                                             const DialState& state, std::shared_ptr<::grpc::Channel> channel,
                                             const std::string& token);
  ~DialedSession() override;

  ::grpc::ClientContext& context() { return ctx_; }
  // Writes `hello` and reads the answer.  False: the call ended; `status` says how.
  bool exchange(const v1::PeerMessage& hello, v1::PeerMessage& reply, ::grpc::Status& status);
  // Ends a call that got no further than its handshake, and waits for its end.
  void abandon();
  // The link runs from here, and moves back to `preferred` at `move_back_at`
  // (null: stays).  True: handed over with `state`; false: the call has
  // ended already, and the caller keeps `state` and deletes the session.
  bool launch(DialState& state, const PeerConfig& peer, const LinkSessionInfo& info,
              std::shared_ptr<transport::Transport> t, const TransportEntry* preferred,
              Clock::time_point move_back_at, std::unique_ptr<PeerInstances::Up> up);
  // A launch() that returned false: what the link's end leaves to the next dial.
  void settle(DialState& state);

  void onStarted(bool ok) override;
  void onDone(const ::grpc::Status& status) override;

 private:
  DialedSession(PeerLinksImpl& links, std::shared_ptr<::grpc::Channel> channel);

  void handshakeRead(bool ok) override;
  void handshakeWritten(bool ok) override;
  void cancelCall() override { ctx_.TryCancel(); }
  void linkEnded() override { finishWhenIdle(); }

  PeerLinksImpl& links_;
  std::shared_ptr<::grpc::Channel> channel_;
  std::unique_ptr<v1::Link::Stub> stub_;
  v1::PeerMessage hello_, reply_;
  // The link's, once launched.
  std::optional<PeerConfig> peer_;
  std::unique_ptr<PeerInstances::Up> up_;
  const TransportEntry* preferred_ = nullptr;
  SessionTimers::Id move_back_ = 0;
  std::atomic<bool> moved_back_{false};
  Mutex mutex_;
  std::condition_variable cv_;
  bool started_ FL_GUARDED_BY(mutex_) = false;
  bool start_ok_ FL_GUARDED_BY(mutex_) = false;
  bool hello_written_ FL_GUARDED_BY(mutex_) = false;
  bool ack_read_ FL_GUARDED_BY(mutex_) = false;
  bool ack_ok_ FL_GUARDED_BY(mutex_) = false;
  bool done_ FL_GUARDED_BY(mutex_) = false;
  bool handed_over_ FL_GUARDED_BY(mutex_) = false;
  ::grpc::Status status_ FL_GUARDED_BY(mutex_);
  std::optional<DialState> state_ FL_GUARDED_BY(mutex_);  // once handed over
};

}  // namespace framelink
