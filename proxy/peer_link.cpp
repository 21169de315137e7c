#include "peer_link.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "data_agent.h"
#include "framelink/shm_layout.h"
#include "framelink/v1/link.grpc.pb.h"
#include "metrics.h"
#include "peer_session.h"
#include "transport/faulty/faulty_transport.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"
#ifdef FRAMELINK_HAVE_RDMA
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#endif

namespace framelink {

using transport::kTokenMetadataKey;

namespace {

using Clock = std::chrono::steady_clock;
using ServerStream = ::grpc::ServerReaderWriter<v1::PeerMessage, v1::PeerMessage>;
using ClientStream = ::grpc::ClientReaderWriter<v1::PeerMessage, v1::PeerMessage>;

bool listed(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out.empty() ? "(none)" : out;
}

// Calls `cancel` until disarmed, never after.
class CancelGuard {
 public:
  explicit CancelGuard(std::function<void()> cancel) : cancel_(std::move(cancel)) {}
  void fire() {
    MutexLock lock(mutex_);
    if (cancel_) cancel_();
  }
  void disarm() {
    MutexLock lock(mutex_);
    cancel_ = nullptr;
  }

 private:
  Mutex mutex_;
  std::function<void()> cancel_ FL_GUARDED_BY(mutex_);
};

// rdma_cm retransmits a lost connection request only after seconds (the CM
// response timeout), and right after a link comes back the first one is
// often lost: an rdma handshake gets this many connect timeouts.
constexpr int kRdmaHandshakeFactor = 3;

uint64_t randomSessionId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

}  // namespace

class PeerLinksImpl final : public PeerLinks, public v1::Link::Service {
 public:
  PeerLinksImpl(const Config& config, DataAgent& agent, Metrics& metrics, uint64_t instance, RdmaSupport rdma)
      : config_(config), agent_(agent), metrics_(metrics), instance_(instance), rdma_(std::move(rdma)) {}
  ~PeerLinksImpl() override { stop(); }

  Status init();
  uint16_t grpcPort() const noexcept override { return static_cast<uint16_t>(grpc_port_); }
  uint16_t dataPort() const noexcept override { return data_listener_ ? data_listener_->port() : 0; }
  uint16_t rdmaPort() const noexcept override {
#ifdef FRAMELINK_HAVE_RDMA
    MutexLock lock(rdma_mu_);
    return rdma_listener_ ? rdma_listener_->port() : 0;
#else
    return 0;
#endif
  }
  void stop() override;

  ::grpc::Status Session(::grpc::ServerContext* ctx, ServerStream* stream) override;
  ::grpc::Status Data(::grpc::ServerContext* ctx,
                      ::grpc::ServerReaderWriter<v1::DataMessage, v1::DataMessage>* stream) override;

 private:
  struct Pending {
    std::string transport;
    std::promise<std::shared_ptr<transport::Transport>> promise;
    bool fulfilled = false;
  };

  // Per configured peer, kept by its dialer across sessions.
  struct DialState {
    Clock::time_point rdma_retry_at{};  // rdma is not offered before this
    std::string rdma_failure;           // why the last rdma connection failed
    bool unreachable_logged = false;    // the warning for this streak of failed connects is out
  };

  // Whether this daemon can run `transport` now; else why not.
  bool usable(const std::string& transport, std::string* why) const;
  std::shared_ptr<Pending> registerPending(uint64_t session_id, const std::string& transport);
  void unregisterPending(uint64_t session_id);
  void fulfil(uint64_t session_id, const std::string& transport, std::shared_ptr<transport::Transport> t);
  void onTcpConnection(uint64_t session_id, UniqueFd fd);
  bool tokenOk(const ::grpc::ServerContext* ctx) const;

  template <typename Stream>
  void runSession(uint64_t link_id, const std::string& peer, const std::string& address,
                  uint64_t peer_instance, const std::string& transport_name,
                  const std::string& transport_reason, std::shared_ptr<transport::Transport> t,
                  Stream* stream, std::function<void()> cancel);
  void dialLoop(const PeerConfig& peer);
  bool dialOnce(const PeerConfig& peer, DialState& state);
  ::grpc::ChannelArguments channelArguments() const;
  std::shared_ptr<::grpc::ServerCredentials> serverCredentials() const;
  std::shared_ptr<::grpc::ChannelCredentials> channelCredentials() const;

  const Config& config_;
  DataAgent& agent_;
  Metrics& metrics_;
  uint64_t instance_;
  std::unique_ptr<::grpc::Server> server_;
  int grpc_port_ = 0;
  std::unique_ptr<transport::tcp::TcpDataListener> data_listener_;
  RdmaSupport rdma_;
#ifdef FRAMELINK_HAVE_RDMA
  mutable Mutex rdma_mu_;  // never held together with mutex_
  std::unique_ptr<transport::rdma::RdmaListener> rdma_listener_ FL_GUARDED_BY(rdma_mu_);
  void startRdmaListener(uint16_t port);
#endif
  std::atomic<uint64_t> next_link_id_{1};
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  // Readable once stop() began: wakes dials and handshakes blocked in poll().
  UniqueFd stop_fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};

  Mutex mutex_;
  std::condition_variable stop_cv_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_ FL_GUARDED_BY(mutex_);
  std::set<::grpc::ServerContext*> server_contexts_ FL_GUARDED_BY(mutex_);
  std::set<::grpc::ClientContext*> client_contexts_ FL_GUARDED_BY(mutex_);
  std::vector<std::thread> dialers_;
  // What strangers on the network can make this daemon log, per cause.
  LogLimiter log_auth_, log_protocol_, log_session_;
};

Result<std::unique_ptr<PeerLinks>> PeerLinks::start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                    uint64_t instance, RdmaSupport rdma) {
  auto links = std::make_unique<PeerLinksImpl>(config, agent, metrics, instance, std::move(rdma));
  Status s = links->init();
  if (!s) return std::move(s).error();
  return std::unique_ptr<PeerLinks>(std::move(links));
}

::grpc::ChannelArguments PeerLinksImpl::channelArguments() const {
  ::grpc::ChannelArguments args = transport::channelArguments(config_.grpc_chunk_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(config_.reconnect_min_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(config_.reconnect_max_ms));
  // One channel per dial attempt: never share a subchannel with an earlier one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (config_.tlsEnabled() && !config_.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(config_.tls_server_name);
  }
  return args;
}

std::shared_ptr<::grpc::ServerCredentials> PeerLinksImpl::serverCredentials() const {
  if (!config_.tlsEnabled()) return ::grpc::InsecureServerCredentials();
  ::grpc::SslServerCredentialsOptions options(config_.tls_client_auth
                                                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = config_.tls_ca_pem;
  options.pem_key_cert_pairs.push_back({config_.tls_key_pem, config_.tls_cert_pem});
  return ::grpc::SslServerCredentials(options);
}

std::shared_ptr<::grpc::ChannelCredentials> PeerLinksImpl::channelCredentials() const {
  if (!config_.tlsEnabled()) return ::grpc::InsecureChannelCredentials();
  ::grpc::SslCredentialsOptions options;
  options.pem_root_certs = config_.tls_ca_pem;  // empty: the system's CA store
  options.pem_private_key = config_.tls_key_pem;
  options.pem_cert_chain = config_.tls_cert_pem;
  return ::grpc::SslCredentials(options);
}

Status PeerLinksImpl::init() {
  bool wants_tcp =
      std::find(config_.transports.begin(), config_.transports.end(), "tcp") != config_.transports.end();
  if (wants_tcp) {
    // The gRPC listener binds after this one.  An ephemeral data port can be
    // the very port --listen names (a daemon restarted on its old port is
    // handed it when that port is free for a moment): keep such a listener
    // open while binding another, so that the kernel picks a different port.
    auto grpc_host_port = transport::tcp::parseHostPort(config_.listen);
    const uint16_t grpc_port = grpc_host_port ? grpc_host_port->second : 0;
    std::vector<std::unique_ptr<transport::tcp::TcpDataListener>> collided;
    while (!data_listener_) {
      auto listener = transport::tcp::TcpDataListener::listen(
          config_.data_listen, config_.token,
          [this](uint64_t session_id, UniqueFd fd) { onTcpConnection(session_id, std::move(fd)); },
          // Shorter than the dialer's whole dial: a stalled stranger goes
          // before a genuine peer would give up.
          std::chrono::milliseconds(std::max<uint32_t>(config_.connect_timeout_ms / 2, 100)), {},
          transport::tcp::TcpListenerCounters{&metrics_.counters.handshakes_timed_out_tcp,
                                              &metrics_.counters.handshakes_refused_tcp,
                                              &metrics_.counters.auth_failures});
      if (!listener) {
        Error e = std::move(listener).error();
        return e.context("tcp data listener on " + config_.data_listen);
      }
      if (grpc_port != 0 && listener.value()->port() == grpc_port && collided.size() < 8) {
        collided.push_back(std::move(listener.value()));
        continue;
      }
      data_listener_ = std::move(listener.value());
    }
    for (auto& l : collided) l->stop();
  }
#ifdef FRAMELINK_HAVE_RDMA
  if (listed(config_.transports, "rdma") && rdma_.device) {
    startRdmaListener(static_cast<uint16_t>(config_.rdma_port));
  }
#endif

  ::grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, serverCredentials(), &grpc_port_);
  builder.RegisterService(this);
  transport::configureServerBuilder(builder, config_.grpc_chunk_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // What a stranger's connection may hold: one that does not finish its
  // (TLS and HTTP/2) handshake within the dialer's connect timeout is closed
  // (the default was two minutes), one without calls after a minute, and
  // a peer needs two concurrent calls (Session, Data) per connection.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(config_.connect_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 8);
  server_ = builder.BuildAndStart();
  if (!server_ || grpc_port_ == 0) {
    return makeError(FL_ERR_RESOURCES,
                     "cannot listen for peers on " + config_.listen +
                         " (address in use? choose another --listen" +
                         (config_.tlsEnabled() ? "; or the TLS certificate and key do not match)" : ")"));
  }
  for (const auto& peer : config_.peers) {
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
    // A Session waiting for its data channel ends now, not at its timeout.
    for (auto& [id, p] : pending_) {
      if (!p->fulfilled) {
        p->fulfilled = true;
        p->promise.set_value(nullptr);
      }
    }
    pending_.clear();
  }
  if (stop_fd_.valid()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
  }
  stop_cv_.notify_all();
  for (auto& t : dialers_) {
    if (t.joinable()) t.join();
  }
#ifdef FRAMELINK_HAVE_RDMA
  std::unique_ptr<transport::rdma::RdmaListener> listener;
  {
    MutexLock lock(rdma_mu_);
    listener = std::move(rdma_listener_);
  }
  listener.reset();
#endif
  if (data_listener_) data_listener_->stop();
  // Every handler has returned by now (their contexts are cancelled, pending
  // data channels failed); what is left are calls whose peer has not closed
  // its side -- a stranger that stalls must not hold the shutdown, so they are
  // cancelled after a short grace (the Fins already went out).
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(250));
}

#ifdef FRAMELINK_HAVE_RDMA
void PeerLinksImpl::startRdmaListener(uint16_t port) {
  auto host_port = transport::tcp::parseHostPort(config_.listen);
  std::string host = host_port ? host_port->first : std::string("0.0.0.0");
  auto listener = transport::rdma::RdmaListener::listen(
      rdma_.device, host, port,
      [this](uint64_t session_id) {
        MutexLock lock(mutex_);
        auto it = pending_.find(session_id);
        return it != pending_.end() && it->second->transport == "rdma" && !it->second->fulfilled;
      },
      [this](uint64_t session_id, std::unique_ptr<transport::Transport> t) {
        fulfil(session_id, "rdma", std::shared_ptr<transport::Transport>(std::move(t)));
      },
      // Shorter than the dialer's whole dial (kRdmaHandshakeFactor connect
      // timeouts), long enough for one lost REP to be sent again: a stalled
      // stranger goes before a genuine peer would give up.
      {}, std::chrono::milliseconds(config_.connect_timeout_ms) * (kRdmaHandshakeFactor - 1),
      transport::rdma::RdmaListenerCounters{&metrics_.counters.handshakes_timed_out_rdma,
                                            &metrics_.counters.handshakes_refused_rdma,
                                            &metrics_.counters.auth_failures});
  if (!listener) {
    rdma_.unavailable = "cannot listen for rdma connections on " + host + ": " + listener.error().message;
    spdlog::warn("rdma is not usable: {}; links use the next transport of {}", rdma_.unavailable,
                 joined(config_.transports));
    return;
  }
  spdlog::info("rdma: listening on {}:{} (device {})", host, listener.value()->port(), rdma_.device->name());
  MutexLock lock(rdma_mu_);
  rdma_listener_ = std::move(listener.value());
}

#endif

bool PeerLinksImpl::usable(const std::string& transport, std::string* why) const {
  if (transport == "tcp" || transport == "grpc") return true;
  if (transport == "rdma") {
    if (rdmaPort() != 0) return true;
    if (why != nullptr) {
      *why = rdma_.unavailable.empty() ? "this daemon has no usable RDMA device" : rdma_.unavailable;
    }
    return false;
  }
  if (why != nullptr) *why = "unknown transport";
  return false;
}

std::shared_ptr<PeerLinksImpl::Pending> PeerLinksImpl::registerPending(uint64_t session_id,
                                                                       const std::string& transport) {
  MutexLock lock(mutex_);
  if (pending_.count(session_id) != 0) return nullptr;
  auto p = std::make_shared<Pending>();
  p->transport = transport;
  pending_[session_id] = p;
  return p;
}

void PeerLinksImpl::unregisterPending(uint64_t session_id) {
  MutexLock lock(mutex_);
  pending_.erase(session_id);
}

void PeerLinksImpl::fulfil(uint64_t session_id, const std::string& transport,
                           std::shared_ptr<transport::Transport> t) {
  std::shared_ptr<Pending> p;
  {
    MutexLock lock(mutex_);
    auto it = pending_.find(session_id);
    if (it == pending_.end() || it->second->transport != transport || it->second->fulfilled) {
      log_session_.warn("a {} data channel for unknown session {:016x} was refused", transport, session_id);
      return;
    }
    p = it->second;
    p->fulfilled = true;
    pending_.erase(it);
  }
  p->promise.set_value(std::move(t));
}

void PeerLinksImpl::onTcpConnection(uint64_t session_id, UniqueFd fd) {
  auto t = transport::tcp::TcpTransport::create(std::move(fd), "session " + std::to_string(session_id));
  if (!t) {
    log_session_.warn("tcp data channel for session {:016x}: {}", session_id, t.error().message);
    return;
  }
  fulfil(session_id, "tcp", std::shared_ptr<transport::Transport>(std::move(t.value())));
}

bool PeerLinksImpl::tokenOk(const ::grpc::ServerContext* ctx) const {
  if (config_.token.empty()) return true;
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenMetadataKey);
  return it != md.end() && std::string(it->second.data(), it->second.size()) == config_.token;
}

template <typename Stream>
void PeerLinksImpl::runSession(uint64_t link_id, const std::string& peer, const std::string& address,
                               uint64_t peer_instance, const std::string& transport_name,
                               const std::string& transport_reason, std::shared_ptr<transport::Transport> t,
                               Stream* stream, std::function<void()> cancel) {
  auto writer = std::make_shared<SessionWriter>(
      [stream](const v1::PeerMessage& m, bool more) {
        ::grpc::WriteOptions options;
        if (more) options.set_buffer_hint();
        return stream->Write(m, options);
      },
      std::chrono::milliseconds(config_.keepalive_ms));
  CmdLinkUp up;
  up.link_id = link_id;
  up.peer = peer;
  up.peer_instance = peer_instance;
  up.transport_name = transport_name;
  up.transport_reason = transport_reason;
  up.address = address;
  if (!config_.fault_inject.empty()) {
    // Validated at start-up (parseConfig).
    auto spec = transport::parseFaultSpec(config_.fault_inject);
    auto faulty = transport::FaultyTransport::wrap(t, spec.value(), link_id);
    if (faulty) {
      spdlog::warn("link {} to peer {}: injecting faults ({})", link_id, peer,
                   transport::describe(spec.value()));
      t = std::move(faulty).value();
    } else {
      spdlog::error("link {} to peer {}: cannot inject faults: {}", link_id, peer, faulty.error().message);
    }
  }
  up.transport = std::move(t);
  // The agent may ask to cancel at any time, also after this call ended and
  // its context is gone: the guard turns such late calls into no-ops.
  auto guard = std::make_shared<CancelGuard>(std::move(cancel));
  up.session = PeerSession{writer, [guard] { guard->fire(); }};
  agent_.post(std::move(up));
  auto msg = std::make_shared<v1::PeerMessage>();
  while (stream->Read(msg.get())) {
    if (msg->has_keepalive()) {
      // The round trip, for framelink links: each side sends its keepalive
      // time back once (echo_ns), and measures when its own comes back.
      // Older daemons ignore the field; their links show no RTT.
      const auto& keepalive = msg->keepalive();
      if (keepalive.echo_ns() != 0) {
        timespec ts{};
        ::clock_gettime(CLOCK_REALTIME, &ts);
        const uint64_t now = uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
        if (now > keepalive.echo_ns()) agent_.post(CmdLinkRtt{link_id, now - keepalive.echo_ns()});
      } else if (keepalive.timestamp_ns() != 0) {
        v1::PeerMessage echo;
        echo.mutable_keepalive()->set_echo_ns(keepalive.timestamp_ns());
        writer->send(std::move(echo));
      }
      continue;
    }
    agent_.post(CmdPeerMessage{link_id, std::move(msg)});
    msg = std::make_shared<v1::PeerMessage>();
  }
  guard->fire();  // a Write blocked on flow control fails now
  writer->close();
  guard->disarm();
  agent_.post(CmdLinkDown{link_id, writer->failed() ? "writing to the peer failed" : "the session ended"});
}

::grpc::Status PeerLinksImpl::Session(::grpc::ServerContext* ctx, ServerStream* stream) {
  const std::string from = ctx->peer();
  if (!tokenOk(ctx)) {
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
  struct Unregister {
    PeerLinksImpl* self;
    ::grpc::ServerContext* ctx;
    ~Unregister() {
      MutexLock lock(self->mutex_);
      self->server_contexts_.erase(ctx);
    }
  } unregister{this, ctx};

  v1::PeerMessage first;
  if (!stream->Read(&first)) return {::grpc::StatusCode::CANCELLED, "no Hello"};
  if (!first.has_hello()) {
    log_protocol_.warn("peer at {}: first message is not Hello (FL_ERR_PROTOCOL)", from);
    return {::grpc::StatusCode::INVALID_ARGUMENT, "the first message of a Session must be Hello"};
  }
  const v1::Hello& hello = first.hello();
  if (hello.protocol_version() != kProtocolVersion) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_protocol_.warn("peer at {} speaks protocol version {}, this daemon speaks {} (FL_ERR_PEER_VERSION)",
                       from, hello.protocol_version(), kProtocolVersion);
    return {::grpc::StatusCode::FAILED_PRECONDITION,
            "protocol version " + std::to_string(hello.protocol_version()) +
                " is not supported; this daemon speaks " + std::to_string(kProtocolVersion) +
                ": upgrade the older daemon"};
  }
  if (!config_.token.empty() && hello.token() != config_.token) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_auth_.warn("peer at {} refused: wrong token in Hello (FL_ERR_AUTH)", from);
    return {::grpc::StatusCode::UNAUTHENTICATED, "wrong token: configure the same token on both daemons"};
  }
  // A daemon id names the peer in routes and [[peer]] tables: the stream-name rule.
  if (!fl_stream_name_valid(hello.daemon_id().data(), hello.daemon_id().size())) {
    return {
        ::grpc::StatusCode::INVALID_ARGUMENT,
        "daemon id must be 1-" + std::to_string(FL_STREAM_NAME_LEN_MAX) + " characters of [A-Za-z0-9._-]"};
  }
  std::string chosen;
  std::string reason;  // why not the transports the dialer preferred
  std::vector<std::string> offered(hello.transports().begin(), hello.transports().end());
  for (const auto& t : offered) {
    std::string why;
    if (!listed(config_.transports, t)) {
      why = "peer " + config_.id + " does not allow it (transports " + joined(config_.transports) + ")";
    } else if (usable(t, &why)) {
      chosen = t;
      break;
    }
    reason += (reason.empty() ? "" : "; ") + std::string("not ") + t + ": " + why;
  }
  if (chosen.empty()) {
    log_protocol_.warn("peer {} at {}: no common transport (it offers {}, this daemon allows {})",
                       hello.daemon_id(), from, joined(offered), joined(config_.transports));
    return {::grpc::StatusCode::FAILED_PRECONDITION, "no common transport: you offer " + joined(offered) +
                                                         ", this daemon allows " +
                                                         joined(config_.transports)};
  }
  auto pending = registerPending(hello.session_id(), chosen);
  if (!pending) return {::grpc::StatusCode::ALREADY_EXISTS, "session id already in use"};
  auto future = pending->promise.get_future();

  v1::PeerMessage reply;
  auto* ack = reply.mutable_hello_ack();
  ack->set_protocol_version(kProtocolVersion);
  ack->set_daemon_id(config_.id);
  ack->set_transport(chosen);
  ack->set_tcp_data_port(chosen == "tcp" ? dataPort() : 0);
  ack->set_session_id(hello.session_id());
  ack->set_instance(instance_);
  ack->set_max_frame_bytes(config_.max_slot_size);
  ack->set_rdma_port(rdmaPort());
  ack->set_transport_reason(reason);
  if (!stream->Write(reply)) {
    unregisterPending(hello.session_id());
    return {::grpc::StatusCode::CANCELLED, "peer went away"};
  }
  auto data_timeout =
      std::chrono::milliseconds(config_.connect_timeout_ms) * (chosen == "rdma" ? kRdmaHandshakeFactor : 1);
  // In slices: stop() fulfils the promise with nothing, and a dialer that gave
  // up cancels its call; neither waits out the timeout.
  const auto data_deadline = Clock::now() + data_timeout;
  bool ready = false;
  while (!ready && Clock::now() < data_deadline && !ctx->IsCancelled()) {
    ready = future.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready;
  }
  if (!ready) {
    unregisterPending(hello.session_id());
    if (ctx->IsCancelled()) return {::grpc::StatusCode::CANCELLED, "the session was cancelled"};
    spdlog::warn("peer {} at {}: the {} data channel did not come up within {} ms", hello.daemon_id(), from,
                 chosen, data_timeout.count());
    return {::grpc::StatusCode::DEADLINE_EXCEEDED, "the data channel did not come up in time"};
  }
  std::shared_ptr<transport::Transport> t = future.get();
  if (!t) return {::grpc::StatusCode::UNAVAILABLE, "daemon shutting down"};
  uint64_t link_id = next_link_id_++;
  spdlog::info("peer {} at {} connected (session {:016x}, transport {}{})", hello.daemon_id(), from,
               hello.session_id(), chosen, reason.empty() ? "" : "; " + reason);
  runSession(link_id, hello.daemon_id(), from.substr(from.find(':') + 1), hello.instance(), chosen, reason,
             std::move(t), stream, [ctx] { ctx->TryCancel(); });
  return ::grpc::Status::OK;
}

::grpc::Status PeerLinksImpl::Data(::grpc::ServerContext* ctx,
                                   ::grpc::ServerReaderWriter<v1::DataMessage, v1::DataMessage>* stream) {
  if (!tokenOk(ctx)) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_auth_.warn("grpc data channel from {} refused: wrong or missing token", ctx->peer());
    return {::grpc::StatusCode::UNAUTHENTICATED, "wrong or missing token"};
  }
  v1::DataMessage first;
  if (!stream->Read(&first)) return {::grpc::StatusCode::CANCELLED, "no first message"};
  uint64_t session_id = first.session_id();
  {
    MutexLock lock(mutex_);
    auto it = pending_.find(session_id);
    if (it == pending_.end() || it->second->transport != "grpc") {
      log_session_.warn("grpc data channel from {} for unknown session {:016x} refused", ctx->peer(),
                        session_id);
      return {::grpc::StatusCode::NOT_FOUND, "unknown session"};
    }
  }
  auto t = transport::GrpcTransport::adoptServerStream(ctx, stream, config_.grpc_chunk_bytes);
  if (!t) return {::grpc::StatusCode::RESOURCE_EXHAUSTED, t.error().message};
  std::shared_ptr<transport::GrpcServerTransport> server_transport = t.value();
  fulfil(session_id, "grpc", server_transport);
  return server_transport->runUntilClosed();
}

bool PeerLinksImpl::dialOnce(const PeerConfig& peer, DialState& state) {
  auto host_port = transport::tcp::parseHostPort(peer.address);
  if (!host_port) {
    spdlog::error("peer {}: bad address '{}': {}", peer.name, peer.address, host_port.error().message);
    return false;
  }
  auto channel = ::grpc::CreateCustomChannel(peer.address, channelCredentials(), channelArguments());
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
  if (stopping_) return false;
  if (!connected) {
    if (config_.tlsEnabled() && !state.unreachable_logged) {
      // A refused handshake looks like an unreachable peer from here.
      spdlog::warn(
          "peer {} at {}: no TLS connection yet (peer down, or a TLS handshake that failed: its "
          "certificate must be signed by tls_ca_file and name '{}'; with tls_client_auth on its side, "
          "ours must be signed by its CA); retrying",
          peer.name, peer.address,
          config_.tls_server_name.empty() ? host_port->first : config_.tls_server_name);
      state.unreachable_logged = true;
    } else {
      spdlog::debug("peer {} at {} is not reachable yet", peer.name, peer.address);
    }
    return false;
  }
  state.unreachable_logged = false;
  ::grpc::ClientContext ctx;
  if (!config_.token.empty()) ctx.AddMetadata(kTokenMetadataKey, config_.token);
  {
    MutexLock lock(mutex_);
    if (stopping_) return false;
    client_contexts_.insert(&ctx);
  }
  struct Unregister {
    PeerLinksImpl* self;
    ::grpc::ClientContext* ctx;
    ~Unregister() {
      MutexLock lock(self->mutex_);
      self->client_contexts_.erase(ctx);
    }
  } unregister{this, &ctx};

  auto stub = v1::Link::NewStub(channel);
  std::unique_ptr<ClientStream> stream = stub->Session(&ctx);
  uint64_t session_id = randomSessionId();
  v1::PeerMessage hello_msg;
  auto* hello = hello_msg.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_daemon_id(config_.id);
  // What this side leaves out, and why: part of the link's reason.
  std::string local_reason;
  // rdma waits out its retry interval only when something else can run.
  bool alternative = std::any_of(config_.transports.begin(), config_.transports.end(),
                                 [this](const std::string& t) { return t != "rdma" && usable(t, nullptr); });
  for (const auto& t : config_.transports) {
    std::string why;
    if (!usable(t, &why)) {
      local_reason += (local_reason.empty() ? "" : "; ") + std::string("not ") + t + ": " + why;
      continue;
    }
    if (t == "rdma" && alternative && Clock::now() < state.rdma_retry_at) {
      auto left = std::chrono::duration_cast<std::chrono::seconds>(state.rdma_retry_at - Clock::now());
      local_reason += (local_reason.empty() ? "" : "; ") + std::string("not rdma: ") + state.rdma_failure +
                      " (tried again in " + std::to_string(left.count() + 1) + " s)";
      continue;
    }
    hello->add_transports(t);
  }
  hello->set_token(config_.token);
  hello->set_max_frame_bytes(config_.max_slot_size);
  hello->set_tcp_data_port(dataPort());
  hello->set_session_id(session_id);
  hello->set_instance(instance_);
  v1::PeerMessage reply;
  if (!stream->Write(hello_msg) || !stream->Read(&reply)) {
    ::grpc::Status status = stream->Finish();
    if (status.error_code() == ::grpc::StatusCode::UNAUTHENTICATED) {
      metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    }
    spdlog::error("peer {} at {} refused the session: {} (gRPC {}); fix the configuration of one side",
                  peer.name, peer.address, status.error_message(), static_cast<int>(status.error_code()));
    return false;
  }
  if (!reply.has_hello_ack() || reply.hello_ack().session_id() != session_id ||
      reply.hello_ack().protocol_version() != kProtocolVersion) {
    spdlog::error("peer {} at {}: bad HelloAck (FL_ERR_PROTOCOL)", peer.name, peer.address);
    ctx.TryCancel();
    stream->Finish();
    return false;
  }
  const v1::HelloAck& ack = reply.hello_ack();
  if (ack.daemon_id() != peer.name) {
    spdlog::info("peer {} at {} calls itself '{}'", peer.name, peer.address, ack.daemon_id());
  }
  std::shared_ptr<transport::Transport> t;
  std::string error;
  if (ack.transport() == "rdma") {
#ifdef FRAMELINK_HAVE_RDMA
    if (rdma_.device && ack.rdma_port() != 0) {
      auto made = transport::rdma::dialRdma(
          rdma_.device, host_port->first, static_cast<uint16_t>(ack.rdma_port()), session_id,
          std::chrono::milliseconds(config_.connect_timeout_ms) * kRdmaHandshakeFactor, {}, stop_fd_.get());
      if (made) {
        t = std::move(made.value());
        state.rdma_failure.clear();
      } else {
        error = made.error().message;
      }
    } else {
      error = "the peer chose rdma but announced no rdma port";
    }
    if (!t) {
      // Offer the next transport at once; rdma again after rdma_retry_ms.
      state.rdma_failure = error;
      state.rdma_retry_at = Clock::now() + std::chrono::milliseconds(config_.rdma_retry_ms);
      spdlog::warn(
          "peer {}: rdma connection failed ({}); falling back to the next transport, rdma is tried "
          "again in {} ms",
          peer.name, error, config_.rdma_retry_ms);
    }
#else
    error = "this framelinkd was built without rdma";
#endif
  } else if (ack.transport() == "tcp") {
    auto fd = transport::tcp::dialData(
        host_port->first, static_cast<uint16_t>(ack.tcp_data_port()), session_id, config_.token,
        std::chrono::milliseconds(config_.connect_timeout_ms), {}, stop_fd_.get());
    if (fd) {
      auto made = transport::tcp::TcpTransport::create(std::move(fd.value()), peer.name);
      if (made) {
        t = std::move(made.value());
      } else {
        error = made.error().message;
      }
    } else {
      error = fd.error().message;
    }
  } else if (ack.transport() == "grpc") {
    auto made =
        transport::GrpcTransport::connect(channel, session_id, config_.token, config_.grpc_chunk_bytes);
    if (made) {
      t = std::move(made.value());
    } else {
      error = made.error().message;
    }
  } else {
    error = "peer chose transport '" + ack.transport() + "' that this daemon did not offer";
  }
  if (!t) {
    spdlog::error("peer {} at {}: cannot open the {} data channel: {}", peer.name, peer.address,
                  ack.transport(), error);
    ctx.TryCancel();
    stream->Finish();
    return false;
  }
  std::string reason = local_reason;
  if (!ack.transport_reason().empty()) {
    reason += (reason.empty() ? "" : "; ") + ack.transport_reason().substr(0, 512);
  }
  spdlog::info("connected to peer {} at {} (session {:016x}, transport {}{})", peer.name, peer.address,
               session_id, ack.transport(), reason.empty() ? "" : "; " + reason);

  // A link that fell back from rdma while both sides have it moves back:
  // after rdma_retry_ms the session is ended and the next dial offers rdma
  // first again.  Frames in flight are replayed by the data agent.
  Mutex upgrade_mu;
  std::condition_variable upgrade_cv;
  bool session_over = false;
  std::thread upgrader;
  auto rdma_pos = std::find(config_.transports.begin(), config_.transports.end(), "rdma");
  auto chosen_pos = std::find(config_.transports.begin(), config_.transports.end(), ack.transport());
  if (ack.transport() != "rdma" && rdma_pos < chosen_pos && usable("rdma", nullptr) && ack.rdma_port() != 0) {
    auto wait =
        std::max(std::chrono::milliseconds(config_.rdma_retry_ms),
                 std::chrono::duration_cast<std::chrono::milliseconds>(state.rdma_retry_at - Clock::now()));
    upgrader = std::thread([&, wait] {
      MutexLock lock(upgrade_mu);
      if (lock.waitFor(upgrade_cv, wait, [&] { return session_over || stopping_.load(); })) return;
      spdlog::info("peer {}: trying rdma again; the link moves back to it if it works", peer.name);
      state.rdma_retry_at = Clock::time_point{};
      ctx.TryCancel();
    });
  }
  runSession(next_link_id_++, peer.name, peer.address, ack.instance(), ack.transport(), reason, std::move(t),
             stream.get(), [&ctx] { ctx.TryCancel(); });
  {
    MutexLock lock(upgrade_mu);
    session_over = true;
  }
  upgrade_cv.notify_all();
  if (upgrader.joinable()) upgrader.join();
  stream->Finish();
  return true;
}

void PeerLinksImpl::dialLoop(const PeerConfig& peer) {
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
