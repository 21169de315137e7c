// A dial's connect and its waits, with no thread of its own: gRPC reports each
// change of the channel's state to the session queue (ConnectWatch), the
// back-off between tries is a timer, and a thread runs only the handshake
// on a channel that connected (peer_dialer.cpp).  A configured peer that
// does not answer costs no thread while it is retried.

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/log_fields.h"
#include "link/peer_grpc_options.h"
#include "link/peer_links_impl.h"
#include "metrics/metrics.h"
#include "transport/tcp/tcp_connect.h"

namespace framelink {

namespace {

using Clock = PeerLinksImpl::Clock;

// How long one wait of a watch lasts at most: a daemon that stops waits no
// longer than this for a connect in progress.
constexpr auto kWatchSlice = std::chrono::milliseconds(500);

}  // namespace

// One channel being connected.  Its completions come one at a time on the
// session queue's thread, which must not block: what follows a connect (the
// handshake's thread, the next try) is handed to the timers' thread.
class PeerLinksImpl::ConnectWatch final : public SessionTag {
 public:
  ConnectWatch(PeerLinksImpl& links, PeerConfig peer, std::string host, DialState state,
               std::shared_ptr<::grpc::Channel> channel)
      : links_(links),
        peer_(std::move(peer)),
        host_(std::move(host)),
        state_(std::move(state)),
        channel_(std::move(channel)),
        deadline_(std::chrono::system_clock::now() +
                  std::chrono::milliseconds(links.config_.connect_timeout_ms)) {}

  void start() { complete(true); }

  void complete(bool /*ok: false when a wait ran out with no change*/) override {
    const grpc_connectivity_state now_in = channel_->GetState(true);  // an idle channel tries again
    const auto now = std::chrono::system_clock::now();
    if (now_in != GRPC_CHANNEL_READY && !links_.ending(state_) && now < deadline_) {
      channel_->NotifyOnStateChange(now_in, std::min(deadline_, now + kWatchSlice),
                                    links_.session_queue_->cq(), this);
      return;
    }
    finish(now_in == GRPC_CHANNEL_READY);
  }

 private:
  void finish(bool connected) {
    PeerLinksImpl& links = links_;
    if (links.ending(state_)) {
      links.dialerEnded(peer_, state_);
    } else if (connected) {
      state_.unreachable_logged = false;
      auto next = std::make_shared<DialState>(std::move(state_));
      links.timers_.at(Clock::now(), [&links, peer = peer_, next, channel = channel_] {
        links.startHandshake(peer, next, channel);
      });
    } else {
      const LogScope scope(LogFields{.peer = peer_.name});
      links.connectFailed(peer_, host_, state_);
      links.retry(peer_, std::move(state_), Dialed::kFailed);
    }
    delete this;
    MutexLock lock(links.mutex_);
    if (--links.connect_watches_ == 0) links.stop_cv_.notify_all();
  }

  PeerLinksImpl& links_;
  const PeerConfig peer_;
  const std::string host_;
  DialState state_;
  std::shared_ptr<::grpc::Channel> channel_;
  const std::chrono::system_clock::time_point deadline_;
};

void PeerLinksImpl::connectNow(const PeerConfig& peer, DialState state) {
  auto host_port = transport::tcp::parseHostPort(peer.address);
  if (!host_port) {
    spdlog::error("peer {}: bad address '{}': {}", peer.name, peer.address, host_port.error().message);
    metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kBadAddress,
                                  "bad address '" + peer.address + "': " + host_port.error().message);
    return retry(peer, std::move(state), Dialed::kFailed);  // a reload may mend it
  }
  // A daemon found in the registry proves its id with its certificate: the name checked is the id.
  ::grpc::ChannelArguments args = peerChannelArguments(config_);
  if (peer.discovered && config_.tlsEnabled()) args.SetSslTargetNameOverride(peer.name);
  auto channel = ::grpc::CreateCustomChannel(peer.address, peerChannelCredentials(config_), args);
  bool ended = false;
  {
    // Counted before it can complete; none once stop() began (it waits for those counted).
    MutexLock lock(mutex_);
    ended = ending(state);
    if (!ended) ++connect_watches_;
  }
  if (ended) {
    dialerEnded(peer, state);
    return;
  }
  (new ConnectWatch(*this, peer, host_port->first, std::move(state), std::move(channel)))->start();
}

void PeerLinksImpl::connectLater(const PeerConfig& peer, DialState state, std::chrono::milliseconds after,
                                 std::shared_ptr<::grpc::Channel> let_go) {
  auto next = std::make_shared<DialState>(std::move(state));
  timers_.at(Clock::now() + after, [this, peer, next, let_go = std::move(let_go)] {
    if (ending(*next)) return dialerEnded(peer, *next);
    connectNow(peer, std::move(*next));
  });
}

void PeerLinksImpl::startHandshake(const PeerConfig& peer, std::shared_ptr<DialState> next,
                                   std::shared_ptr<::grpc::Channel> channel) {
  MutexLock dialers(dialers_mutex_);
  auto it = dialers_.find(peer.name);
  if (ending(*next) || it == dialers_.end() || it->second.quit != next->quit) return dialerEnded(peer, *next);
  // The thread of the handshake before has returned, or is about to.
  if (it->second.thread.joinable()) it->second.thread.join();
  it->second.thread = std::thread(
      [this, peer, next, channel]() mutable { handshake(peer, std::move(*next), std::move(channel)); });
}

void PeerLinksImpl::handshake(const PeerConfig& peer, DialState state,
                              std::shared_ptr<::grpc::Channel> channel) {
  const LogScope scope(LogFields{.peer = peer.name});
  const Dialed dialed = dialOnce(peer, state, std::move(channel));
  if (dialed == Dialed::kHandedOver) return;  // the link's end connects again (redial)
  retry(peer, std::move(state), dialed);
}

void PeerLinksImpl::retry(const PeerConfig& peer, DialState state, Dialed dialed) {
  if (ending(state)) return dialerEnded(peer, state);
  // Doubling after each failure, from reconnect_min_ms; after a link that ended, from the start.
  state.backoff_ms = dialed == Dialed::kEnded || state.backoff_ms == 0
                         ? config_.reconnect_min_ms
                         : std::min(state.backoff_ms * 2, config_.reconnect_max_ms);
  const std::chrono::milliseconds after(state.backoff_ms);
  connectLater(peer, std::move(state), after);
}

void PeerLinksImpl::dialerEnded(const PeerConfig& peer, DialState& state) {
  if (!stopping_) {
    spdlog::info("peer {} at {}: no longer dialed (the configuration was reloaded)", peer.name, peer.address);
  }
  state.ended->store(true);
}

void PeerLinksImpl::connectFailed(const PeerConfig& peer, const std::string& host, DialState& state) {
  metrics_.peer_problems.record(
      peer.name,
      config_.tlsEnabled() ? PeerProblems::Cause::kUnreachableOrTls : PeerProblems::Cause::kUnreachable,
      "no connection within " + std::to_string(config_.connect_timeout_ms) + " ms" +
          (config_.tlsEnabled() ? " (peer down, a firewall, or a TLS handshake that failed)"
                                : " (peer down, wrong address or port, or a firewall)"));
  if (state.unreachable_logged) return;  // once an outage: it retries with back-off, and says when it links
  state.unreachable_logged = true;
  if (config_.tlsEnabled()) {
    // A refused handshake looks like an unreachable peer from here.
    spdlog::warn(
        "peer {} at {}: no TLS connection yet (peer down, or a TLS handshake that failed: its "
        "certificate must be signed by tls_ca_file and name '{}'; with tls_client_auth on its side, "
        "ours must be signed by its CA); retrying",
        peer.name, peer.address, config_.tls_server_name.empty() ? host : config_.tls_server_name);
  } else {
    spdlog::warn(
        "peer {} at {}: no connection within {} ms (the peer's framelinkd is down, or the address, "
        "port or a firewall between the hosts keeps it out); retrying",
        peer.name, peer.address, config_.connect_timeout_ms);
  }
}

void PeerLinksImpl::redial(const PeerConfig& peer, DialState state,
                           std::shared_ptr<::grpc::Channel> channel) {
  state.backoff_ms = 0;
  connectLater(peer, std::move(state), std::chrono::milliseconds(config_.reconnect_min_ms),
               std::move(channel));
}

}  // namespace framelink
