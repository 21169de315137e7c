// The peer links' implementation, shared by peer_links.cpp (the listener:
// sessions peers open, init, stop, reload) and peer_dialer.cpp (the dialers:
// sessions this daemon opens).  Internal to link/.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/eventfd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/session_timers.h"
#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "framelink/v1/link.grpc.pb.h"
#include "link/peer_identity.h"
#include "link/peer_links.h"
#include "link/pending_channels.h"
#include "link/session_call.h"
#include "transport/grpc/grpc_transport.h"

namespace framelink {

class PeerLinksImpl final : public PeerLinks, public SessionService {
 public:
  using Clock = std::chrono::steady_clock;

  PeerLinksImpl(const Config& config, DataAgent& agent, Metrics& metrics, uint64_t instance,
                TransportRegistry transports)
      : config_(config),
        agent_(agent),
        metrics_(metrics),
        instance_(instance),
        transports_(std::move(transports)),
        live_(config),
        identity_(live_, metrics),
        instances_(metrics),
        pending_(config.token) {}
  ~PeerLinksImpl() override { stop(); }

  Status init();
  uint16_t grpcPort() const noexcept override { return static_cast<uint16_t>(grpc_port_); }
  uint16_t listenPort(std::string_view transport) const noexcept override {
    const TransportEntry* t = transports_.find(transport);
    return t != nullptr ? t->port() : 0;
  }
  void stop() override;
  void reconfigure(std::shared_ptr<const Config> next) override;

  // peer_accept.cpp: waits for the Sessions peers open, on the session queue (no thread of their own).
  void awaitSessions();
  // Waits for the Data calls of grpc-transport links, on the session queue too.
  Status awaitDataCalls();
  // peer_describe.cpp: this daemon's id, instance and streams, to a daemon with the token.
  ::grpc::Status Describe(::grpc::ServerContext* ctx, const v1::DescribeRequest* request,
                          v1::DescribeReply* reply) override;
  void onDescribed(Heard heard) override;

 private:
  class AcceptedSession;
  class DialedSession;
  class ConnectWatch;
  // How a dial ended: no link, a link that ended before it was handed over,
  // or a link handed over to its session (whose end starts the next dialer).
  enum class Dialed { kFailed, kEnded, kHandedOver };
  // Per configured peer, kept by its dialer across sessions.
  struct DialState {
    // Transports whose dial failed: not offered before `until` (while
    // another can run), and why they failed.
    struct Fallback {
      Clock::time_point until{};
      std::string failure;
    };
    std::map<const TransportEntry*, Fallback> fallbacks;
    bool unreachable_logged = false;  // the warning for this streak of failed connects is out
    uint32_t backoff_ms = 0;          // before the next connect after a failed one (0: none failed yet)
    // Set when a reload removed or moved the peer: the dialer ends.
    std::shared_ptr<std::atomic<bool>> quit = std::make_shared<std::atomic<bool>>(false);
    // Set by the dialer as it returns: its thread may be joined without waiting.
    std::shared_ptr<std::atomic<bool>> ended = std::make_shared<std::atomic<bool>>(false);
  };
  // One per configured peer with an address.
  struct Dialer {
    std::string address;
    std::shared_ptr<std::atomic<bool>> quit, ended;
    std::thread thread;
  };

  // Who is at the other end of a call: the peer's id ("" until a server
  // call's Hello is admitted), and its verified certificate (PEM; "" without
  // TLS), which a reload checks against new CRLs.
  struct CallPeer {
    std::string id;
    std::string cert_pem;
  };

  // The listener's answer to `hello` on the transport `choice` picked.
  v1::PeerMessage helloAck(const v1::Hello& hello, const TransportRegistry::Choice& choice) const;
  // Checks the Hello (and that the call's credentials prove the id it claims) and picks the first
  // transport it offers that this daemon allows and can run.
  ::grpc::Status admitHello(::grpc::ServerContextBase& ctx, const std::string& from,
                            const v1::PeerMessage& first, TransportRegistry::Choice& choice);

  // Whether the dialer of `state` is to end (the daemon stops, or a reload took its peer).
  bool ending(const DialState& state) const { return stopping_ || state.quit->load(); }
  void startDialer(const PeerConfig& peer) FL_REQUIRES(dialers_mutex_);
  // The calls of peers whose certificate a CRL of `next` lists (logged); empty
  // when `next` brings no new CRLs.
  std::set<const void*> revokedCalls(const Config& running, const Config& next) FL_REQUIRES(mutex_);
  // A dial holds no thread while it connects or waits to try again: its channel's
  // connection is watched from the session queue (ConnectWatch), the wait is a timer,
  // and a thread runs only the handshake on a connected channel.
  void connectNow(const PeerConfig& peer, DialState state);
  // `let_go`, a channel to release there (on the timers' thread, not in a completion).
  void connectLater(const PeerConfig& peer, DialState state, std::chrono::milliseconds after,
                    std::shared_ptr<::grpc::Channel> let_go = nullptr);
  // On the timers' thread: the handshake's thread, unless the dialer is to end.
  void startHandshake(const PeerConfig& peer, std::shared_ptr<DialState> next,
                      std::shared_ptr<::grpc::Channel> channel);
  void handshake(const PeerConfig& peer, DialState state, std::shared_ptr<::grpc::Channel> channel);
  Dialed dialOnce(const PeerConfig& peer, DialState& state, std::shared_ptr<::grpc::Channel> channel);
  // No connection within connect_timeout_ms: counted, and said once a streak.
  void connectFailed(const PeerConfig& peer, const std::string& host, DialState& state);
  // The next connect after a back-off (from reconnect_min_ms, doubling while dials fail), or the end.
  void retry(const PeerConfig& peer, DialState state, Dialed dialed);
  // A reload took the peer, or the daemon stops: said (the former), and the dialer may be joined.
  void dialerEnded(const PeerConfig& peer, DialState& state);
  // After a handed-over link ended: the peer's next dialer, a reconnect_min_ms
  // later.  `channel`, the ended call's, is let go there.
  void redial(const PeerConfig& peer, DialState state, std::shared_ptr<::grpc::Channel> channel);
  // Sends the Hello, reads the HelloAck; false (logged, the call ended): refused or a bad answer.
  bool exchangeHello(const PeerConfig& peer, const TransportRegistry::Offer& offer, uint64_t session_id,
                     DialedSession& session, v1::PeerMessage& reply);
  void dialFailed(const PeerConfig& peer, const TransportEntry* chosen, const v1::HelloAck& ack,
                  const std::string& error, DialState& state);
  Dialed launchLink(const PeerConfig& peer, const TransportEntry* chosen, const v1::HelloAck& ack,
                    const std::string& reason, std::shared_ptr<transport::Transport> data,
                    std::unique_ptr<DialedSession> session, DialState& state);

  const Config& config_;
  DataAgent& agent_;
  Metrics& metrics_;
  uint64_t instance_;
  TransportRegistry transports_;
  // What a reload changes (peers, tokens, certificate names); config_ keeps the rest.
  LiveConfig live_;
  PeerIdentity identity_;
  PeerInstances instances_;
  PendingChannels pending_;
  std::vector<TransportEntry*> configured_;  // config_.transports, in its order; set by init()
  // The grpc transport's Data calls not yet ended: stop() ends them before the queue.
  transport::DataCalls data_calls_;
  // Every Session call's and Data call's completions; before server_, which goes first.
  std::unique_ptr<SessionQueue> session_queue_;
  std::unique_ptr<::grpc::Server> server_;
  int grpc_port_ = 0;
  std::atomic<uint64_t> next_link_id_{1};
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  // Readable once stop() began: wakes dials and handshakes blocked in poll().
  UniqueFd stop_fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};

  Mutex mutex_;
  std::condition_variable stop_cv_;
  // The calls stop() cancels, and a reload those of a peer it removes: by
  // peer id (a server call's is "" until its Hello is admitted).
  std::map<::grpc::ServerContext*, CallPeer> server_contexts_ FL_GUARDED_BY(mutex_);
  std::map<::grpc::ClientContext*, CallPeer> client_contexts_ FL_GUARDED_BY(mutex_);
  size_t dialed_sessions_ FL_GUARDED_BY(mutex_) = 0;    // handed over and not yet ended (stop() waits)
  size_t accepted_sessions_ FL_GUARDED_BY(mutex_) = 0;  // accepted or awaited, not yet deleted (stop() waits)
  size_t connect_watches_ FL_GUARDED_BY(mutex_) = 0;    // channels being connected (stop() waits)
  // Taken by init, reconfigure and stop only: the dialers by peer name, and
  // those a reload ended (joined by stop()).
  Mutex dialers_mutex_;
  std::map<std::string, Dialer> dialers_ FL_GUARDED_BY(dialers_mutex_);
  std::vector<Dialer> retired_ FL_GUARDED_BY(dialers_mutex_);
  // What strangers on the network can make this daemon log, per cause; and
  // a holder of the token, by opening links as fast as handshakes finish.
  LogLimiter log_auth_, log_protocol_, log_data_timeout_;
  Mutex heard_mutex_;
  Heard heard_ FL_GUARDED_BY(heard_mutex_);
  LogLimiter log_accepted_{std::chrono::seconds(1), transport::kLoggedLinkEventsPerSecond};
  // Keepalives, silence checks, data-channel deadlines and redials of every
  // session.  Last: it goes first, after stop() ended every session, while
  // what its callbacks reach is still there.
  SessionTimers timers_;
};

}  // namespace framelink
