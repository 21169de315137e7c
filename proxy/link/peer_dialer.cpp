// A dial's handshake on a connected channel (peer_connect.cpp connects it):
// the Hello, the transport's dial, the link handed to its DialedSession,
// which holds no thread; its end starts the next connect.

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <type_traits>

#include "agent/data_agent.h"
#include "common/log_fields.h"
#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "framelink/shm_layout.h"
#include "framelink/v1/link.grpc.pb.h"
#include "link/dialed_session.h"
#include "link/peer_grpc_options.h"
#include "link/peer_identity.h"
#include "link/peer_links_impl.h"
#include "link/pending_channels.h"
#include "link/session_reader.h"
#include "metrics/metrics.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/link_bookkeeping.h"
#include "transport/tcp/tcp_connect.h"

namespace framelink {

using transport::kTokenMetadataKey;

namespace {

using Clock = PeerLinksImpl::Clock;

// From the kernel's CSPRNG: a session id crosses the network in clear, and
// one id must tell nothing of the next (a generator seeded once would, from
// a few of its outputs).
uint64_t randomSessionId() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof id, 0) != static_cast<ssize_t>(sizeof id)) {
      std::random_device device;  // getrandom(2) failing at all: the same source by another way
      id = (uint64_t{device()} << 32) | device();
    }
  }
  return id;
}

}  // namespace

std::unique_ptr<PeerLinksImpl::DialedSession> PeerLinksImpl::DialedSession::open(
    PeerLinksImpl& links, const PeerConfig& peer, const DialState& state,
    std::shared_ptr<::grpc::Channel> channel, const std::string& token) {
  std::unique_ptr<DialedSession> session(new DialedSession(links, std::move(channel)));
  if (!token.empty()) session->ctx_.AddMetadata(kTokenMetadataKey, token);
  MutexLock lock(links.mutex_);
  if (links.ending(state)) return nullptr;
  links.client_contexts_.emplace(&session->ctx_, CallPeer{peer.name, {}});
  return session;
}

PeerLinksImpl::DialedSession::DialedSession(PeerLinksImpl& links, std::shared_ptr<::grpc::Channel> channel)
    : links_(links), channel_(std::move(channel)), stub_(v1::Link::NewStub(channel_)) {}

PeerLinksImpl::DialedSession::~DialedSession() {
  bool handed_over = false;
  {
    MutexLock lock(mutex_);
    handed_over = handed_over_;
  }
  MutexLock lock(links_.mutex_);
  links_.client_contexts_.erase(&ctx_);
  if (handed_over && --links_.dialed_sessions_ == 0) links_.stop_cv_.notify_all();
}

bool PeerLinksImpl::DialedSession::exchange(const v1::PeerMessage& hello, v1::PeerMessage& reply,
                                            ::grpc::Status& status) {
  hello_ = hello;
  startCallOn(*stub_, links_.session_queue_->cq());
  {
    MutexLock lock(mutex_);
    lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return started_; });
    if (!start_ok_) {
      lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return done_; });
      status = status_;
      return false;
    }
  }
  startWrite(&hello_);
  startRead(&reply_);
  MutexLock lock(mutex_);
  // Both complete, whether they worked or the call ended.
  lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return hello_written_ && ack_read_; });
  if (ack_ok_) {
    reply = reply_;
    return true;
  }
  lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return done_; });
  status = status_;
  return false;
}

void PeerLinksImpl::DialedSession::abandon() {
  ctx_.TryCancel();
  finishWhenIdle();
  MutexLock lock(mutex_);
  lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return done_; });
}

void PeerLinksImpl::DialedSession::onStarted(bool ok) {
  MutexLock lock(mutex_);
  started_ = true;
  start_ok_ = ok;
  cv_.notify_all();
}

void PeerLinksImpl::DialedSession::handshakeRead(bool ok) {
  MutexLock lock(mutex_);
  ack_read_ = true;
  ack_ok_ = ok;
  cv_.notify_all();
}

void PeerLinksImpl::DialedSession::handshakeWritten(bool /*ok*/) {
  MutexLock lock(mutex_);
  hello_written_ = true;  // a failed write: the call is over, and the read fails too
  cv_.notify_all();
}

bool PeerLinksImpl::DialedSession::launch(DialState& state, const PeerConfig& peer,
                                          const LinkSessionInfo& info,
                                          std::shared_ptr<transport::Transport> t,
                                          const TransportEntry* preferred, Clock::time_point move_back_at,
                                          std::unique_ptr<PeerInstances::Up> up) {
  peer_ = peer;
  up_ = std::move(up);
  preferred_ = preferred;
  if (preferred != nullptr) {
    // A link that fell back from a transport it prefers moves back: the
    // session ends at the deadline, and the next dial offers that one first.
    move_back_ = links_.timers_.at(move_back_at, [this, to = std::string(preferred->name())] {
      spdlog::info("peer {}: trying {} again; the link moves back to it if it works", peer_->name, to);
      moved_back_.store(true);
      ctx_.TryCancel();
    });
  }
  {
    // Counted before the link can end: stop() waits for every handed-over session.
    MutexLock lock(links_.mutex_);
    ++links_.dialed_sessions_;
  }
  beginLink(links_.agent_, links_.config_, links_.timers_, info, std::move(t));
  MutexLock lock(mutex_);
  if (done_) {
    MutexLock links(links_.mutex_);
    --links_.dialed_sessions_;
    return false;
  }
  state_.emplace(std::move(state));
  handed_over_ = true;
  return true;
}

void PeerLinksImpl::DialedSession::settle(DialState& state) {
  if (move_back_ != 0) links_.timers_.cancel(move_back_);
  if (moved_back_.load()) state.fallbacks.erase(preferred_);
  up_.reset();
}

void PeerLinksImpl::DialedSession::onDone(const ::grpc::Status& status) {
  std::optional<DialState> state;
  {
    MutexLock lock(mutex_);
    done_ = true;
    status_ = status;
    if (!handed_over_) {
      cv_.notify_all();  // the dialer's thread deletes the session once it sees done_
      return;
    }
    state = std::move(state_);
  }
  const LogScope scope(LogFields{.peer = peer_->name});
  settle(*state);
  links_.redial(*peer_, std::move(*state), channel_);
  delete this;
}

PeerLinksImpl::Dialed PeerLinksImpl::dialOnce(const PeerConfig& peer, DialState& state,
                                              std::shared_ptr<::grpc::Channel> channel) {
  auto host_port = transport::tcp::parseHostPort(peer.address);
  if (!host_port) return Dialed::kFailed;  // connectNow said why, and dials no such address
  const std::string token = live_.get()->peerToken(peer.name);  // a reload may have rotated it
  std::unique_ptr<DialedSession> session = DialedSession::open(*this, peer, state, channel, token);
  if (!session) return Dialed::kFailed;
  ::grpc::ClientContext& ctx = session->context();
  uint64_t session_id = randomSessionId();
  // What this side leaves out, and why, is part of the link's reason.
  const auto offer = TransportRegistry::offer(configured_, [&state](const TransportEntry& t) -> std::string {
    auto it = state.fallbacks.find(&t);
    if (it == state.fallbacks.end() || Clock::now() >= it->second.until) return {};
    auto left = std::chrono::duration_cast<std::chrono::seconds>(it->second.until - Clock::now());
    return it->second.failure + " (tried again in " + std::to_string(left.count() + 1) + " s)";
  });
  v1::PeerMessage reply;
  if (!exchangeHello(peer, offer, session_id, *session, reply)) return Dialed::kFailed;
  {
    MutexLock lock(mutex_);
    client_contexts_[&ctx].cert_pem = peerCertificate(ctx.auth_context().get());
  }
  const v1::HelloAck& ack = reply.hello_ack();
  if (ack.daemon_id() != peer.name) {
    if (peer.discovered) {
      // A registry entry is a claim: the daemon at its address must be the one it names.
      metrics_.counters.discovery_entries_refused.fetch_add(1, std::memory_order_relaxed);
      const std::string why = "the registry's entry for '" + peer.name + "' points at " + peer.address +
                              ", where daemon '" + ack.daemon_id().substr(0, 64) + "' answers: not linked";
      metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kRefused, why);
      if (!state.unreachable_logged) spdlog::warn("discovery: {}", why);
      state.unreachable_logged = true;  // once per streak, as an unreachable peer
      session->abandon();
      return Dialed::kFailed;
    }
    spdlog::info("peer {} at {} calls itself '{}'", peer.name, peer.address, ack.daemon_id());
  }
  auto chosen_it = std::find_if(offer.transports.begin(), offer.transports.end(),
                                [&ack](const TransportEntry* t) { return t->name() == ack.transport(); });
  TransportEntry* chosen = chosen_it != offer.transports.end() ? *chosen_it : nullptr;
  Result<std::shared_ptr<transport::Transport>> made =
      chosen != nullptr
          ? chosen->dial(DialContext{config_, peer.name, host_port->first, ack, session_id, channel,
                                     stop_fd_.get(), token, session_queue_->cq(), &data_calls_})
          : makeError(FL_ERR_PROTOCOL,
                      "peer chose transport '" + ack.transport() + "' that this daemon did not offer");
  if (!made) {
    dialFailed(peer, chosen, ack, made.error().message, state);
    session->abandon();
    return Dialed::kFailed;
  }
  state.fallbacks.erase(chosen);
  if (ack.frame_batches()) made.value()->enableFrameBatches();
  std::string reason = offer.reason;
  if (!ack.transport_reason().empty()) {
    reason += (reason.empty() ? "" : "; ") + ack.transport_reason().substr(0, 512);
  }
  spdlog::info("connected to peer {} at {} (session {:016x}, protocol {}, transport {}{})", peer.name,
               peer.address, session_id, ack.protocol_version(), ack.transport(),
               reason.empty() ? "" : "; " + reason);
  return launchLink(peer, chosen, ack, reason, std::move(made).value(), std::move(session), state);
}

bool PeerLinksImpl::exchangeHello(const PeerConfig& peer, const TransportRegistry::Offer& offer,
                                  uint64_t session_id, DialedSession& session, v1::PeerMessage& reply) {
  ::grpc::ClientContext& ctx = session.context();
  v1::PeerMessage hello_msg;
  auto* hello = hello_msg.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_min_protocol_version(kMinProtocolVersion);
  hello->set_frame_batches(true);
  hello->set_daemon_id(config_.id);
  for (const TransportEntry* t : offer.transports) hello->add_transports(std::string(t->name()));
  hello->set_token(live_.get()->peerToken(peer.name));
  for (const auto& t : transports_.entries()) t->announce(*hello);
  hello->set_session_id(session_id);
  hello->set_instance(instance_);
  if (::grpc::Status status; !session.exchange(hello_msg, reply, status)) {
    if (const std::optional<VersionRange> theirs = refusedVersions(ctx)) {
      metrics_.counters.peer_version_mismatches.fetch_add(1, std::memory_order_relaxed);
      const std::string why = mismatchText(kSpokenVersions, *theirs);
      spdlog::error("peer {} at {} refused the session: {}", peer.name, peer.address, why);
      metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kVersion, why);
      return false;
    }
    if (status.error_code() == ::grpc::StatusCode::UNAUTHENTICATED) {
      metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    }
    spdlog::error("peer {} at {} refused the session: {} (gRPC {}); fix the configuration of one side",
                  peer.name, peer.address, status.error_message(), static_cast<int>(status.error_code()));
    // The peer refuses a token and a certificate alike (UNAUTHENTICATED):
    // with TLS on, either may be the one.
    const PeerProblems::Cause cause = status.error_code() != ::grpc::StatusCode::UNAUTHENTICATED
                                          ? PeerProblems::Cause::kRefused
                                      : config_.tlsEnabled() ? PeerProblems::Cause::kCredentials
                                                             : PeerProblems::Cause::kToken;
    metrics_.peer_problems.record(peer.name, cause,
                                  "refused the session: " + status.error_message() + " (gRPC " +
                                      std::to_string(static_cast<int>(status.error_code())) + ")");
    return false;
  }
  const uint32_t agreed = reply.hello_ack().protocol_version();
  if (reply.has_hello_ack() && !agreedVersion(kSpokenVersions, {agreed, agreed})) {
    const std::string why =
        "answered with protocol version " + std::to_string(agreed) +
        ", which this daemon does not speak: " + mismatchText(kSpokenVersions, {agreed, agreed});
    spdlog::error("peer {} at {} {}", peer.name, peer.address, why);
    metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kVersion, why);
  } else if (!reply.has_hello_ack() || reply.hello_ack().session_id() != session_id) {
    spdlog::error("peer {} at {}: bad HelloAck (FL_ERR_PROTOCOL)", peer.name, peer.address);
    metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kProtocol,
                                  "bad HelloAck (FL_ERR_PROTOCOL)");
  } else if (const std::string why = revokedPeer(*live_.get(), ctx.auth_context().get()); !why.empty()) {
    metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("peer {} at {}: not linked: {} (link.tls_crl_file)", peer.name, peer.address, why);
    metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kCredentials, why + " (link.tls_crl_file)");
  } else {
    return true;
  }
  session.abandon();
  return false;
}

// Logs a data channel that did not open; a transport with a fallback interval
// is not offered for that long.
void PeerLinksImpl::dialFailed(const PeerConfig& peer, const TransportEntry* chosen, const v1::HelloAck& ack,
                               const std::string& error, DialState& state) {
  if (chosen != nullptr && chosen->fallbackFor(config_).count() > 0) {
    // Offer the next transport at once; this one again after its interval.
    state.fallbacks[chosen] = DialState::Fallback{Clock::now() + chosen->fallbackFor(config_), error};
    spdlog::warn(
        "peer {}: {} connection failed ({}); falling back to the next transport, {} is tried again in {} "
        "ms",
        peer.name, chosen->name(), error, chosen->name(), chosen->fallbackFor(config_).count());
  }
  spdlog::error("peer {} at {}: cannot open the {} data channel: {}", peer.name, peer.address,
                ack.transport(), error);
  metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kDataChannel,
                                "cannot open the " + ack.transport() + " data channel: " + error);
}

// Hands the link over to its session; a link that fell back from a transport it prefers, while both
// sides have that one, moves back: at a deadline the session is ended, and the next dial offers that
// transport first again.  Frames in flight are replayed by the data agent.
PeerLinksImpl::Dialed PeerLinksImpl::launchLink(const PeerConfig& peer, const TransportEntry* chosen,
                                                const v1::HelloAck& ack, const std::string& reason,
                                                std::shared_ptr<transport::Transport> data,
                                                std::unique_ptr<DialedSession> session, DialState& state) {
  const TransportEntry* preferred = nullptr;
  Clock::time_point move_back_at = Clock::time_point::max();
  for (const TransportEntry* t : configured_) {
    if (t == chosen) break;
    const auto interval = t->fallbackFor(config_);
    if (interval.count() == 0 || !t->usable(0, nullptr) || !t->peerListens(ack)) continue;
    auto at = Clock::now() + interval;
    if (auto it = state.fallbacks.find(t); it != state.fallbacks.end()) at = std::max(at, it->second.until);
    if (at < move_back_at) {
      move_back_at = at;
      preferred = t;
    }
  }
  LinkSessionInfo info{next_link_id_++, {peer.name, peer.address, ack.instance(), ack.transport(), reason}};
  std::unique_ptr<PeerInstances::Up> up(
      new PeerInstances::Up(instances_.up(peer.name, ack.instance(), peer.address)));
  if (session->launch(state, peer, info, std::move(data), preferred, move_back_at, std::move(up))) {
    [[maybe_unused]] DialedSession* owned_by_its_call = session.release();  // deleted in its onDone
    return Dialed::kHandedOver;
  }
  session->settle(state);
  return Dialed::kEnded;
}

}  // namespace framelink
