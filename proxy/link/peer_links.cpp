#include "link/peer_links.h"

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
#include "config/tls_crl.h"
#include "framelink/shm_layout.h"
#include "framelink/v1/link.grpc.pb.h"
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

Result<std::unique_ptr<PeerLinks>> PeerLinks::start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                    uint64_t instance, RdmaSupport rdma) {
  return start(config, agent, metrics, instance, makeDaemonTransports(std::move(rdma)));
}

Result<std::unique_ptr<PeerLinks>> PeerLinks::start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                    uint64_t instance, TransportRegistry transports) {
  auto links = std::make_unique<PeerLinksImpl>(config, agent, metrics, instance, std::move(transports));
  Status s = links->init();
  if (!s) return std::move(s).error();
  return std::unique_ptr<PeerLinks>(std::move(links));
}

Status PeerLinksImpl::init() {
  auto configured = transports_.select(config_.transports);
  if (!configured) return std::move(configured).error().context("transports");
  configured_ = std::move(configured.value());
  // Each configured transport's listener, before the gRPC listener binds
  // (the tcp one keeps clear of --listen's port).
  for (TransportEntry* t : configured_) {
    Status s = t->listen(ListenContext{config_, metrics_, instance_, pending_.hooks(t)});
    if (!s) return s;
  }

  ::grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, peerServerCredentials(config_), &grpc_port_);
  builder.RegisterService(this);
  configurePeerServer(builder, config_);
  std::unique_ptr<::grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (!server_ || grpc_port_ == 0) {
    cq->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
    }
    return makeError(FL_ERR_RESOURCES,
                     "cannot listen for peers on " + config_.listen +
                         " (address in use? choose another --listen" +
                         (config_.tlsEnabled() ? "; or the TLS certificate and key do not match)" : ")"));
  }
  session_queue_ = std::make_unique<SessionQueue>(std::move(cq));
  awaitSessions();
  if (Status s = awaitDataCalls(); !s) return s;
  MutexLock lock(dialers_mutex_);
  for (const auto& peer : config_.peers) startDialer(peer);
  return {};
}

void PeerLinksImpl::startDialer(const PeerConfig& peer) {
  if (peer.address.empty()) return;  // it only dials in
  DialState state;
  Dialer& d = dialers_[peer.name];
  d.address = peer.address;
  d.quit = state.quit;
  d.ended = state.ended;
  connectNow(peer, std::move(state));  // no thread until it connected
}

void PeerLinksImpl::reconfigure(std::shared_ptr<const Config> next) {
  const std::shared_ptr<const Config> running = live_.get();
  live_.set(next);
  MutexLock dialers(dialers_mutex_);
  // Those an earlier reload ended and that returned since: however many
  // reloads come, the threads kept are those still winding down.
  std::erase_if(retired_, [](Dialer& d) {
    if (!d.ended->load()) return false;
    d.thread.join();
    return true;
  });
  std::set<std::string> undialed;  // their dialed links end
  std::set<std::string> revoked;   // their links end, whoever dialed
  for (auto it = dialers_.begin(); it != dialers_.end();) {
    const PeerConfig* now = next->peer(it->first);
    if (now != nullptr && now->address == it->second.address) {
      ++it;
      continue;
    }
    it->second.quit->store(true);
    undialed.insert(it->first);
    retired_.push_back(std::move(it->second));
    it = dialers_.erase(it);
  }
  // A removed peer's accepted sessions end only when it proved its id with
  // a token of its own, the one credential its removal takes away: one that
  // holds link.token or a certificate naming it would only dial in again.
  for (const auto& old : running->peers) {
    if (!old.token.empty() && next->peer(old.name) == nullptr) revoked.insert(old.name);
  }
  {
    MutexLock lock(mutex_);
    if (stopping_) return;
    const std::set<const void*> revoked_certs = revokedCalls(*running, *next);
    for (auto& [ctx, call] : client_contexts_) {
      if (undialed.count(call.id) != 0 || revoked.count(call.id) != 0 || revoked_certs.count(ctx) != 0) {
        ctx->TryCancel();
      }
    }
    for (auto& [ctx, call] : server_contexts_) {
      if (revoked.count(call.id) != 0 || revoked_certs.count(ctx) != 0) ctx->TryCancel();
    }
  }
  stop_cv_.notify_all();
  for (const auto& peer : next->peers) {
    if (dialers_.count(peer.name) == 0) startDialer(peer);
  }
}

std::set<const void*> PeerLinksImpl::revokedCalls(const Config& running, const Config& next) {
  std::set<const void*> out;
  if (next.tls_crl_pem.empty() || next.tls_crl_pem == running.tls_crl_pem) return out;
  auto check = [&](const void* ctx, const CallPeer& call) {
    if (call.cert_pem.empty()) return;
    const std::string why = revocation(next.tls_crl_pem, call.cert_pem);
    if (why.empty()) return;
    out.insert(ctx);
    metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
    metrics_.peer_problems.record(call.id, PeerProblems::Cause::kCredentials,
                                  "link cut at a reload: " + why + " (link.tls_crl_file)");
    spdlog::warn("peer {}: link cut: {} (link.tls_crl_file, read again by a reload)", call.id, why);
  };
  for (const auto& [ctx, call] : client_contexts_) check(ctx, call);
  for (const auto& [ctx, call] : server_contexts_) check(ctx, call);
  return out;
}

void PeerLinksImpl::stop() {
  {
    MutexLock lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (auto& [ctx, peer] : client_contexts_) ctx->TryCancel();
    for (auto& [ctx, peer] : server_contexts_) ctx->TryCancel();
  }
  pending_.stop();
  if (stop_fd_.valid()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
  }
  stop_cv_.notify_all();
  {
    MutexLock dialers(dialers_mutex_);
    for (auto& [name, d] : dialers_) {
      if (d.thread.joinable()) d.thread.join();
    }
    for (auto& d : retired_) {
      if (d.thread.joinable()) d.thread.join();
    }
  }
  {
    // The links dialers handed over end as their cancelled calls do.
    MutexLock lock(mutex_);
    // And the connects in progress end at their next change or wait's end (half a second at most).
    lock.wait(stop_cv_,
              [this]() FL_REQUIRES(mutex_) { return dialed_sessions_ == 0 && connect_watches_ == 0; });
  }
  for (TransportEntry* t : configured_) t->stop();
  // Every handler has returned by now (their contexts are cancelled, pending
  // data channels failed); what is left are calls whose peer has not closed
  // its side -- a stranger that stalls must not hold the shutdown, so they are
  // cancelled after a short grace (the Fins already went out).
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
  if (session_queue_) {
    {
      // The Sessions peers opened end as the server cancels them, and the one awaited fails.
      MutexLock lock(mutex_);
      lock.wait(stop_cv_, [this]() FL_REQUIRES(mutex_) { return accepted_sessions_ == 0; });
    }
    // The Data calls still running (a transport nobody shut down: a channel
    // that came as its session gave up, one dialed as the daemon stopped).
    data_calls_.endAll();
    session_queue_->shutdown();
  }
}

v1::PeerMessage PeerLinksImpl::helloAck(const v1::Hello& hello,
                                        const TransportRegistry::Choice& choice) const {
  const auto& [chosen, reason] = choice;
  v1::PeerMessage reply;
  auto* ack = reply.mutable_hello_ack();
  ack->set_protocol_version(
      agreedVersion(kSpokenVersions, helloRange(hello.protocol_version(), hello.min_protocol_version()))
          .value_or(kProtocolVersion));
  ack->set_daemon_id(config_.id);
  ack->set_transport(std::string(chosen->name()));
  ack->set_session_id(hello.session_id());
  ack->set_instance(instance_);
  for (const auto& t : transports_.entries()) t->announce(*ack, t.get() == chosen);
  ack->set_transport_reason(reason);
  ack->set_frame_batches(hello.frame_batches());  // this daemon reads them too
  return reply;
}

::grpc::Status PeerLinksImpl::admitHello(::grpc::ServerContextBase& ctx, const std::string& from,
                                         const v1::PeerMessage& first, TransportRegistry::Choice& choice) {
  if (!first.has_hello()) {
    log_protocol_.warn("peer at {}: first message is not Hello (FL_ERR_PROTOCOL)", from);
    return {::grpc::StatusCode::INVALID_ARGUMENT, "the first message of a Session must be Hello"};
  }
  const v1::Hello& hello = first.hello();
  const VersionRange theirs = helloRange(hello.protocol_version(), hello.min_protocol_version());
  if (!agreedVersion(kSpokenVersions, theirs)) {
    metrics_.counters.peer_version_mismatches.fetch_add(1, std::memory_order_relaxed);
    log_protocol_.warn("peer at {}: {}", from, mismatchText(kSpokenVersions, theirs));
    ctx.AddTrailingMetadata(std::string(kVersionsKey), describe(kSpokenVersions));
    return {::grpc::StatusCode::FAILED_PRECONDITION, mismatchText(theirs, kSpokenVersions)};
  }
  // A daemon id names the peer in routes and [[peer]] tables: the stream-name rule.
  if (!fl_stream_name_valid(hello.daemon_id().data(), hello.daemon_id().size())) {
    return {
        ::grpc::StatusCode::INVALID_ARGUMENT,
        "daemon id must be 1-" + std::to_string(FL_STREAM_NAME_LEN_MAX) + " characters of [A-Za-z0-9._-]"};
  }
  if (::grpc::Status refused = identity_.prove(ctx, hello, from); !refused.ok()) return refused;
  std::vector<std::string> offered(hello.transports().begin(), hello.transports().end());
  choice = transports_.choose(offered, config_.transports, config_.id, hello.instance());
  choice.reason.resize(std::min<size_t>(choice.reason.size(), 512));  // a peer may offer many names
  if (choice.transport == nullptr) {
    log_protocol_.warn("peer {} at {}: no common transport (it offers {}, this daemon allows {}{}{})",
                       hello.daemon_id(), from, joinedNames(offered), joinedNames(config_.transports),
                       choice.reason.empty() ? "" : "; ", choice.reason);
    return {::grpc::StatusCode::FAILED_PRECONDITION,
            "no common transport: you offer " + joinedNames(offered) + ", this daemon allows " +
                joinedNames(config_.transports) + (choice.reason.empty() ? "" : " (" + choice.reason + ")")};
  }
  return ::grpc::Status::OK;
}

Status PeerLinksImpl::awaitDataCalls() {
  TransportEntry* serving = nullptr;
  for (const auto& t : transports_.entries()) {
    if (t->servesDataCalls()) serving = t.get();
  }
  auto hooks = std::make_shared<transport::DataCallHooks>();
  hooks->first = [this, serving](::grpc::ServerContext& ctx) -> ::grpc::Status {
    if (!identity_.tokenAccepted(ctx)) {
      metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
      log_auth_.warn("grpc data channel from {} refused: wrong or missing token", ctx.peer());
      return {::grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token"};
    }
    if (serving == nullptr) {
      return {::grpc::StatusCode::UNIMPLEMENTED, "no transport of this daemon uses the Data call"};
    }
    return ::grpc::Status::OK;
  };
  hooks->admit = [serving](::grpc::ServerContext& ctx, uint64_t session_id) {
    return serving->admitDataCall(ctx, session_id);
  };
  hooks->accepted = [serving](uint64_t session_id, std::shared_ptr<transport::GrpcTransport> t) {
    serving->dataCallAccepted(session_id, std::move(t));
  };
  hooks->options.chunk_bytes = config_.grpc_chunk_bytes;
  // A stranger's call that never says which session it is for ends as its handshake would.
  hooks->first_message_timeout = std::chrono::milliseconds(config_.connect_timeout_ms);
  return transport::GrpcTransport::awaitDataCall(*this, session_queue_->cq(), &data_calls_, std::move(hooks));
}

}  // namespace framelink
