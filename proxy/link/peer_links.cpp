#include "link/peer_links.h"

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
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
#include "link/peer_grpc_options.h"
#include "link/peer_identity.h"
#include "link/pending_channels.h"
#include "link/session_reader.h"
#include "metrics/metrics.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/link_bookkeeping.h"
#include "transport/tcp/tcp_connect.h"

namespace framelink {

using transport::kTokenMetadataKey;

namespace {

using Clock = std::chrono::steady_clock;
using ServerStream = ::grpc::ServerReaderWriter<v1::PeerMessage, v1::PeerMessage>;
using ClientStream = ::grpc::ClientReaderWriter<v1::PeerMessage, v1::PeerMessage>;

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

// Waits for the data channel in slices: stop() fulfils the promise with nothing,
// and a dialer that gave up cancels its call; neither waits out the deadline.
bool dataChannelReady(std::future<std::shared_ptr<transport::Transport>>& future, Clock::time_point deadline,
                      const ::grpc::ServerContext& ctx) {
  bool ready = false;
  while (!ready && Clock::now() < deadline && !ctx.IsCancelled()) {
    ready = future.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready;
  }
  return ready;
}

}  // namespace

class PeerLinksImpl final : public PeerLinks, public transport::RawDataLinkService {
 public:
  PeerLinksImpl(const Config& config, DataAgent& agent, Metrics& metrics, uint64_t instance,
                TransportRegistry transports)
      : config_(config),
        agent_(agent),
        metrics_(metrics),
        instance_(instance),
        transports_(std::move(transports)),
        identity_(config, metrics),
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

  ::grpc::Status Session(::grpc::ServerContext* ctx, ServerStream* stream) override;
  ::grpc::Status serveRawData(::grpc::ServerContext* ctx, DataCall* stream) override;

 private:
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
  };

  // Takes a call's context off the list of those stop() cancels, when the call ends.
  template <typename Context>
  struct Unregister {
    PeerLinksImpl* self;
    Context* ctx;
    ~Unregister() {
      MutexLock lock(self->mutex_);
      if constexpr (std::is_same_v<Context, ::grpc::ServerContext>) {
        self->server_contexts_.erase(ctx);
      } else {
        self->client_contexts_.erase(ctx);
      }
    }
  };

  // Checks the Hello (and that the call's credentials prove the id it claims) and picks the first
  // transport it offers that this daemon allows and can run.
  ::grpc::Status admitHello(::grpc::ServerContext& ctx, const std::string& from, const v1::PeerMessage& first,
                            TransportRegistry::Choice& choice);

  void dialLoop(const PeerConfig& peer);
  bool dialOnce(const PeerConfig& peer, DialState& state);
  // A connected channel to `peer`; null when it was not reachable in time (logged) or the daemon stops.
  std::shared_ptr<::grpc::Channel> connectChannel(const PeerConfig& peer, const std::string& host,
                                                  DialState& state);
  // Sends the Hello, reads the HelloAck; false (logged, the call ended): refused or a bad answer.
  bool exchangeHello(const PeerConfig& peer, const TransportRegistry::Offer& offer, uint64_t session_id,
                     ::grpc::ClientContext& ctx, ClientStream& stream, v1::PeerMessage& reply);
  void dialFailed(const PeerConfig& peer, const TransportEntry* chosen, const v1::HelloAck& ack,
                  const std::string& error, DialState& state);
  void runDialedLink(const PeerConfig& peer, const TransportEntry* chosen, const v1::HelloAck& ack,
                     const std::string& reason, std::shared_ptr<transport::Transport> data,
                     ::grpc::ClientContext& ctx, ClientStream& stream, DialState& state);

  const Config& config_;
  DataAgent& agent_;
  Metrics& metrics_;
  uint64_t instance_;
  TransportRegistry transports_;
  PeerIdentity identity_;
  PeerInstances instances_;
  PendingChannels pending_;
  std::vector<TransportEntry*> configured_;  // config_.transports, in its order; set by init()
  std::unique_ptr<::grpc::Server> server_;
  int grpc_port_ = 0;
  std::atomic<uint64_t> next_link_id_{1};
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  // Readable once stop() began: wakes dials and handshakes blocked in poll().
  UniqueFd stop_fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};

  Mutex mutex_;
  std::condition_variable stop_cv_;
  std::set<::grpc::ServerContext*> server_contexts_ FL_GUARDED_BY(mutex_);
  std::set<::grpc::ClientContext*> client_contexts_ FL_GUARDED_BY(mutex_);
  std::vector<std::thread> dialers_;
  // What strangers on the network can make this daemon log, per cause; and
  // a holder of the token, by opening links as fast as handshakes finish.
  LogLimiter log_auth_, log_protocol_, log_data_timeout_;
  LogLimiter log_accepted_{std::chrono::seconds(1), transport::kLoggedLinkEventsPerSecond};
};

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
  server_ = builder.BuildAndStart();
  if (!server_ || grpc_port_ == 0) {
    return makeError(FL_ERR_RESOURCES,
                     "cannot listen for peers on " + config_.listen +
                         " (address in use? choose another --listen" +
                         (config_.tlsEnabled() ? "; or the TLS certificate and key do not match)" : ")"));
  }
  for (const auto& peer : config_.peers) {
    if (peer.address.empty()) continue;  // it only dials in
    dialers_.emplace_back([this, peer] { dialLoop(peer); });
  }
  return {};
}

void PeerLinksImpl::stop() {
  {
    MutexLock lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (auto* ctx : client_contexts_) ctx->TryCancel();
    for (auto* ctx : server_contexts_) ctx->TryCancel();
  }
  pending_.stop();
  if (stop_fd_.valid()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
  }
  stop_cv_.notify_all();
  for (auto& t : dialers_) {
    if (t.joinable()) t.join();
  }
  for (TransportEntry* t : configured_) t->stop();
  // Every handler has returned by now (their contexts are cancelled, pending
  // data channels failed); what is left are calls whose peer has not closed
  // its side -- a stranger that stalls must not hold the shutdown, so they are
  // cancelled after a short grace (the Fins already went out).
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
}

::grpc::Status PeerLinksImpl::Session(::grpc::ServerContext* ctx, ServerStream* stream) {
  const std::string from = ctx->peer();
  if (!identity_.tokenAccepted(*ctx)) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_auth_.warn(
        "peer at {} refused: wrong or missing token (FL_ERR_AUTH); configure the same token on both "
        "daemons",
        from);
    return {::grpc::StatusCode::UNAUTHENTICATED,
            "wrong or missing token: configure the same token on both daemons"};
  }
  {
    MutexLock lock(mutex_);
    if (stopping_) return {::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"};
    server_contexts_.insert(ctx);
  }
  Unregister<::grpc::ServerContext> unregister{this, ctx};

  v1::PeerMessage first;
  if (!stream->Read(&first)) return {::grpc::StatusCode::CANCELLED, "no Hello"};
  TransportRegistry::Choice choice;
  if (::grpc::Status refused = admitHello(*ctx, from, first, choice); !refused.ok()) return refused;
  const v1::Hello& hello = first.hello();
  // Counted from here, before the HelloAck: links being set up take their place too.
  std::unique_ptr<PeerInstances::Up> up;
  if (::grpc::Status refused = instances_.admit(hello.daemon_id(), hello.instance(),
                                                identity_.provenAlone(hello.daemon_id()), from, up);
      !refused.ok()) {
    return refused;
  }
  // Only now: a name the peer's credentials did not prove would file its
  // lines under a peer it is not.
  const LogScope scope(LogFields{.peer = hello.daemon_id()});
  const auto& [chosen, reason] = choice;
  auto future = pending_.add(hello.session_id(), chosen, config_.peerToken(hello.daemon_id()));
  if (!future) {
    if (stopping_) return {::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"};
    return {::grpc::StatusCode::ALREADY_EXISTS, "session id already in use"};
  }

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
  if (!stream->Write(reply)) {
    pending_.remove(hello.session_id());
    return {::grpc::StatusCode::CANCELLED, "peer went away"};
  }
  const auto data_timeout = chosen->handshakeTimeout(config_);
  if (!dataChannelReady(*future, Clock::now() + data_timeout, *ctx)) {
    pending_.remove(hello.session_id());
    if (ctx->IsCancelled()) return {::grpc::StatusCode::CANCELLED, "the session was cancelled"};
    log_data_timeout_.warn("peer {} at {}: the {} data channel did not come up within {} ms",
                           hello.daemon_id(), from, chosen->name(), data_timeout.count());
    return {::grpc::StatusCode::DEADLINE_EXCEEDED, "the data channel did not come up in time"};
  }
  std::shared_ptr<transport::Transport> t = future->get();
  if (!t) return {::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"};
  uint64_t link_id = next_link_id_++;
  log_accepted_.info("peer {} at {} connected (session {:016x}, protocol {}, transport {}{})",
                     hello.daemon_id(), from, hello.session_id(), reply.hello_ack().protocol_version(),
                     chosen->name(), reason.empty() ? "" : "; " + reason);
  LinkSessionInfo info{link_id,
                       {hello.daemon_id(), from.substr(from.find(':') + 1), hello.instance(),
                        std::string(chosen->name()), reason}};
  runLinkSession(agent_, config_, info, std::move(t), stream, [ctx] { ctx->TryCancel(); });
  return ::grpc::Status::OK;
}

::grpc::Status PeerLinksImpl::admitHello(::grpc::ServerContext& ctx, const std::string& from,
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

::grpc::Status PeerLinksImpl::serveRawData(::grpc::ServerContext* ctx, DataCall* stream) {
  if (!identity_.tokenAccepted(*ctx)) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_auth_.warn("grpc data channel from {} refused: wrong or missing token", ctx->peer());
    return {::grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token"};
  }
  for (const auto& t : transports_.entries()) {
    if (t->servesDataCalls()) return t->serveDataCall(ctx, stream);
  }
  return {::grpc::StatusCode::UNIMPLEMENTED, "no transport of this daemon uses the Data call"};
}

bool PeerLinksImpl::dialOnce(const PeerConfig& peer, DialState& state) {
  auto host_port = transport::tcp::parseHostPort(peer.address);
  if (!host_port) {
    spdlog::error("peer {}: bad address '{}': {}", peer.name, peer.address, host_port.error().message);
    metrics_.peer_problems.record(peer.name, PeerProblems::Cause::kBadAddress,
                                  "bad address '" + peer.address + "': " + host_port.error().message);
    return false;
  }
  auto channel = connectChannel(peer, host_port->first, state);
  if (!channel) return false;
  ::grpc::ClientContext ctx;
  const std::string& token = config_.peerToken(peer.name);
  if (!token.empty()) ctx.AddMetadata(kTokenMetadataKey, token);
  {
    MutexLock lock(mutex_);
    if (stopping_) return false;
    client_contexts_.insert(&ctx);
  }
  Unregister<::grpc::ClientContext> unregister{this, &ctx};

  auto stub = v1::Link::NewStub(channel);
  std::unique_ptr<ClientStream> stream = stub->Session(&ctx);
  uint64_t session_id = randomSessionId();
  // What this side leaves out, and why, is part of the link's reason.
  const auto offer = TransportRegistry::offer(configured_, [&state](const TransportEntry& t) -> std::string {
    auto it = state.fallbacks.find(&t);
    if (it == state.fallbacks.end() || Clock::now() >= it->second.until) return {};
    auto left = std::chrono::duration_cast<std::chrono::seconds>(it->second.until - Clock::now());
    return it->second.failure + " (tried again in " + std::to_string(left.count() + 1) + " s)";
  });
  v1::PeerMessage reply;
  if (!exchangeHello(peer, offer, session_id, ctx, *stream, reply)) return false;
  const v1::HelloAck& ack = reply.hello_ack();
  if (ack.daemon_id() != peer.name) {
    spdlog::info("peer {} at {} calls itself '{}'", peer.name, peer.address, ack.daemon_id());
  }
  auto chosen_it = std::find_if(offer.transports.begin(), offer.transports.end(),
                                [&ack](const TransportEntry* t) { return t->name() == ack.transport(); });
  TransportEntry* chosen = chosen_it != offer.transports.end() ? *chosen_it : nullptr;
  Result<std::shared_ptr<transport::Transport>> made =
      chosen != nullptr ? chosen->dial(DialContext{config_, peer.name, host_port->first, ack, session_id,
                                                   channel, stop_fd_.get(), token})
                        : makeError(FL_ERR_PROTOCOL, "peer chose transport '" + ack.transport() +
                                                         "' that this daemon did not offer");
  if (!made) {
    dialFailed(peer, chosen, ack, made.error().message, state);
    ctx.TryCancel();
    stream->Finish();
    return false;
  }
  state.fallbacks.erase(chosen);
  std::string reason = offer.reason;
  if (!ack.transport_reason().empty()) {
    reason += (reason.empty() ? "" : "; ") + ack.transport_reason().substr(0, 512);
  }
  spdlog::info("connected to peer {} at {} (session {:016x}, protocol {}, transport {}{})", peer.name,
               peer.address, session_id, ack.protocol_version(), ack.transport(),
               reason.empty() ? "" : "; " + reason);
  runDialedLink(peer, chosen, ack, reason, std::move(made).value(), ctx, *stream, state);
  return true;
}

std::shared_ptr<::grpc::Channel> PeerLinksImpl::connectChannel(const PeerConfig& peer,
                                                               const std::string& host, DialState& state) {
  auto channel = ::grpc::CreateCustomChannel(peer.address, peerChannelCredentials(config_),
                                             peerChannelArguments(config_));
  // In slices, so that a shutdown does not wait out the connect timeout (a
  // failing TLS handshake keeps gRPC retrying until the deadline).
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
  bool connected = false;
  while (!connected && !stopping_) {
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) break;
    connected = channel->WaitForConnected(std::min(deadline, now + std::chrono::milliseconds(200)));
  }
  if (stopping_) return nullptr;
  if (!connected) {
    metrics_.peer_problems.record(
        peer.name,
        config_.tlsEnabled() ? PeerProblems::Cause::kUnreachableOrTls : PeerProblems::Cause::kUnreachable,
        "no connection within " + std::to_string(config_.connect_timeout_ms) + " ms" +
            (config_.tlsEnabled() ? " (peer down, a firewall, or a TLS handshake that failed)"
                                  : " (peer down, wrong address or port, or a firewall)"));
    if (config_.tlsEnabled() && !state.unreachable_logged) {
      // A refused handshake looks like an unreachable peer from here.
      spdlog::warn(
          "peer {} at {}: no TLS connection yet (peer down, or a TLS handshake that failed: its "
          "certificate must be signed by tls_ca_file and name '{}'; with tls_client_auth on its side, "
          "ours must be signed by its CA); retrying",
          peer.name, peer.address, config_.tls_server_name.empty() ? host : config_.tls_server_name);
      state.unreachable_logged = true;
    } else if (!state.unreachable_logged) {
      // Once an outage: the dialler retries with back-off, and says when it links.
      spdlog::warn(
          "peer {} at {}: no connection within {} ms (the peer's framelinkd is down, or the address, "
          "port or a firewall between the hosts keeps it out); retrying",
          peer.name, peer.address, config_.connect_timeout_ms);
      state.unreachable_logged = true;
    }
    return nullptr;
  }
  state.unreachable_logged = false;
  return channel;
}

bool PeerLinksImpl::exchangeHello(const PeerConfig& peer, const TransportRegistry::Offer& offer,
                                  uint64_t session_id, ::grpc::ClientContext& ctx, ClientStream& stream,
                                  v1::PeerMessage& reply) {
  v1::PeerMessage hello_msg;
  auto* hello = hello_msg.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_min_protocol_version(kMinProtocolVersion);
  hello->set_daemon_id(config_.id);
  for (const TransportEntry* t : offer.transports) hello->add_transports(std::string(t->name()));
  hello->set_token(config_.peerToken(peer.name));
  for (const auto& t : transports_.entries()) t->announce(*hello);
  hello->set_session_id(session_id);
  hello->set_instance(instance_);
  if (!stream.Write(hello_msg) || !stream.Read(&reply)) {
    ::grpc::Status status = stream.Finish();
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
  } else {
    return true;
  }
  ctx.TryCancel();
  stream.Finish();
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

// Runs the link until the Session call ends, then finishes the call.  A link that fell back from a
// transport it prefers, while both sides have that one, moves back: at a deadline (an alarm on gRPC's
// timer, no thread) the session is ended, and the next dial offers that transport first again.
// Frames in flight are replayed by the data agent.
void PeerLinksImpl::runDialedLink(const PeerConfig& peer, const TransportEntry* chosen,
                                  const v1::HelloAck& ack, const std::string& reason,
                                  std::shared_ptr<transport::Transport> data, ::grpc::ClientContext& ctx,
                                  ClientStream& stream, DialState& state) {
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
  auto move_back = std::make_shared<CancelGuard>([&ctx] { ctx.TryCancel(); });
  auto moved_back = std::make_shared<std::atomic<bool>>(false);
  ::grpc::Alarm alarm;
  if (preferred != nullptr) {
    alarm.Set(std::chrono::system_clock::now() + (move_back_at - Clock::now()),
              [move_back, moved_back, name = peer.name, to = std::string(preferred->name())](bool fired) {
                if (!fired) return;  // cancelled: the session ended first
                spdlog::info("peer {}: trying {} again; the link moves back to it if it works", name, to);
                moved_back->store(true);
                move_back->fire();
              });
  }
  LinkSessionInfo info{next_link_id_++, {peer.name, peer.address, ack.instance(), ack.transport(), reason}};
  const auto up = instances_.up(peer.name, ack.instance(), peer.address);
  runLinkSession(agent_, config_, info, std::move(data), &stream, [&ctx] { ctx.TryCancel(); });
  alarm.Cancel();
  move_back->disarm();  // the alarm's callback may still run, but reaches ctx no more
  if (moved_back->load()) state.fallbacks.erase(preferred);
  stream.Finish();
}

void PeerLinksImpl::dialLoop(const PeerConfig& peer) {
  const LogScope scope(LogFields{.peer = peer.name});
  uint32_t backoff_ms = config_.reconnect_min_ms;
  DialState state;
  while (!stopping_) {
    bool was_up = dialOnce(peer, state);
    if (stopping_) break;
    backoff_ms = was_up ? config_.reconnect_min_ms : std::min(backoff_ms * 2, config_.reconnect_max_ms);
    MutexLock lock(mutex_);
    lock.waitFor(stop_cv_, std::chrono::milliseconds(backoff_ms), [this] { return stopping_.load(); });
  }
}

}  // namespace framelink
