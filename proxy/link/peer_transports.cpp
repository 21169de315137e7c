#include "link/peer_transports.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "config/config.h"
#include "config/transport_names.h"
#include "link/peer_identity.h"
#include "metrics/metrics.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/loopback/loopback_transport.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"
#ifdef FRAMELINK_HAVE_RDMA
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#endif

namespace framelink {

namespace {

using Made = Result<std::shared_ptr<transport::Transport>>;

transport::tcp::TcpTransportOptions tcpOptions(const Config& config) {
  transport::tcp::TcpTransportOptions options;
  options.zerocopy_min_bytes = config.tcp_zerocopy_bytes;
  return options;
}

template <typename T>
Made shared(Result<std::unique_ptr<T>> made) {
  if (!made) return std::move(made).error();
  return std::shared_ptr<transport::Transport>(std::move(made.value()));
}

// ---- tcp: its own data port; sendmsg/recv straight from and into slots ----
class TcpEntry final : public TransportEntry {
 public:
  static constexpr std::string_view kName = "tcp";
  std::string_view name() const noexcept override { return kName; }
  bool usable(uint64_t, std::string*) const override { return true; }
  uint16_t port() const noexcept override { return listener_ ? listener_->port() : 0; }
  void stop() noexcept override {
    if (listener_) listener_->stop();
  }
  void announce(v1::Hello& hello) const override { hello.set_tcp_data_port(port()); }
  void announce(v1::HelloAck& ack, bool chosen) const override { ack.set_tcp_data_port(chosen ? port() : 0); }

  Status listen(const ListenContext& ctx) override {
    const Config& config = ctx.config;
    // The gRPC listener binds after this one.  An ephemeral data port can be
    // the very port --listen names (a daemon restarted on its old port is
    // handed it when that port is free for a moment): keep such a listener
    // open while binding another, so that the kernel picks a different port.
    auto grpc_host_port = transport::tcp::parseHostPort(config.listen);
    const uint16_t grpc_port = grpc_host_port ? grpc_host_port->second : 0;
    std::vector<std::unique_ptr<transport::tcp::TcpDataListener>> collided;
    AcceptHooks hooks = ctx.hooks;
    const transport::tcp::TcpTransportOptions options = tcpOptions(config);
    while (!listener_) {
      auto listener = transport::tcp::TcpDataListener::listen(
          config.data_listen, hooks.token,
          [this, hooks, options](uint64_t session_id, UniqueFd fd) {
            auto t = transport::tcp::TcpTransport::create(std::move(fd),
                                                          "session " + std::to_string(session_id), options);
            if (!t) {
              log_session_.warn("tcp data channel for session {:016x}: {}", session_id, t.error().message);
              return;
            }
            hooks.accepted(session_id, std::shared_ptr<transport::Transport>(std::move(t.value())));
          },
          // Shorter than the dialer's whole dial: a stalled stranger goes
          // before a genuine peer would give up.
          std::chrono::milliseconds(std::max<uint32_t>(config.connect_timeout_ms / 2, 100)), {},
          transport::tcp::TcpListenerCounters{&ctx.metrics.counters.handshakes_timed_out_tcp,
                                              &ctx.metrics.counters.handshakes_refused_tcp,
                                              &ctx.metrics.counters.auth_failures});
      if (!listener) {
        Error e = std::move(listener).error();
        return e.context("tcp data listener on " + config.data_listen);
      }
      if (grpc_port != 0 && listener.value()->port() == grpc_port && collided.size() < 8) {
        collided.push_back(std::move(listener.value()));
        continue;
      }
      listener_ = std::move(listener.value());
    }
    for (auto& l : collided) l->stop();
    return {};
  }

  Made dial(const DialContext& ctx) override {
    auto fd = transport::tcp::dialData(
        ctx.host, static_cast<uint16_t>(ctx.ack.tcp_data_port()), ctx.session_id, ctx.token,
        std::chrono::milliseconds(ctx.config.connect_timeout_ms), {}, ctx.stop_fd);
    if (!fd) return std::move(fd).error();
    return shared(
        transport::tcp::TcpTransport::create(std::move(fd.value()), ctx.peer, tcpOptions(ctx.config)));
  }

 private:
  std::unique_ptr<transport::tcp::TcpDataListener> listener_;  // set once, by listen()
  LogLimiter log_session_;
};

// ---- grpc: chunks on the Link service's Data call, where only one port is open ----
class GrpcEntry final : public TransportEntry {
 public:
  static constexpr std::string_view kName = "grpc";
  std::string_view name() const noexcept override { return kName; }
  bool usable(uint64_t, std::string*) const override { return true; }
  Status listen(const ListenContext& ctx) override {
    hooks_ = ctx.hooks;
    auth_failures_ = &ctx.metrics.counters.auth_failures;
    return {};
  }
  Made dial(const DialContext& ctx) override {
    transport::GrpcTransportOptions options;
    options.chunk_bytes = ctx.config.grpc_chunk_bytes;
    return transport::GrpcTransport::connect(ctx.channel, {ctx.call_queue, ctx.data_calls}, ctx.session_id,
                                             ctx.token, options);
  }

  bool servesDataCalls() const noexcept override { return true; }
  ::grpc::Status admitDataCall(::grpc::ServerContext& ctx, uint64_t session_id) override {
    if (!hooks_.expected || !hooks_.expected(session_id)) {
      log_session_.warn("grpc data channel from {} for unknown session {:016x} refused", ctx.peer(),
                        session_id);
      return {::grpc::StatusCode::NOT_FOUND, "unknown session"};
    }
    // The channel proves the token its Session proved the peer's id with.
    if (!secretEquals(callToken(ctx), hooks_.token(session_id))) {
      auth_failures_->fetch_add(1, std::memory_order_relaxed);
      log_session_.warn("grpc data channel from {} for session {:016x} refused: not that session's token",
                        ctx.peer(), session_id);
      return {::grpc::StatusCode::UNAUTHENTICATED, "wrong token for this session"};
    }
    return ::grpc::Status::OK;
  }
  void dataCallAccepted(uint64_t session_id, std::shared_ptr<transport::Transport> t) override {
    hooks_.accepted(session_id, std::move(t));
  }

 private:
  AcceptHooks hooks_;                               // set once, by listen(), before the gRPC server starts
  std::atomic<uint64_t>* auth_failures_ = nullptr;  // set by listen()
  LogLimiter log_session_;
};

// ---- rdma: RC queue pairs set up with rdma_cm on a port of its own ----

// rdma_cm retransmits a lost connection request only after seconds (the CM
// response timeout), and right after a link comes back the first one is
// often lost: an rdma handshake gets this many connect timeouts.
constexpr int kRdmaHandshakeFactor = 3;

class RdmaEntry final : public TransportEntry {
 public:
#ifdef FRAMELINK_HAVE_RDMA
  // A link whose send queue completes nothing for link_timeout_ms goes (RdmaTransportOptions).
  static transport::rdma::RdmaTransportOptions linkOptions(const Config& config) {
    transport::rdma::RdmaTransportOptions options;
    options.send_stall_ms = config.link_timeout_ms;
    return options;
  }
#endif
  explicit RdmaEntry(RdmaSupport support)
      : device_(std::move(support.device)), unavailable_(std::move(support.unavailable)) {}

  static constexpr std::string_view kName = "rdma";
  std::string_view name() const noexcept override { return kName; }
  bool usable(uint64_t, std::string* why) const override {
    if (port() != 0) return true;
    if (why != nullptr) {
      MutexLock lock(mutex_);
      *why = unavailable_.empty() ? "this daemon has no usable RDMA device" : unavailable_;
    }
    return false;
  }
  uint16_t port() const noexcept override {
#ifdef FRAMELINK_HAVE_RDMA
    MutexLock lock(mutex_);
    return listener_ ? listener_->port() : 0;
#else
    return 0;
#endif
  }
  void stop() noexcept override {
#ifdef FRAMELINK_HAVE_RDMA
    std::unique_ptr<transport::rdma::RdmaListener> listener;
    {
      MutexLock lock(mutex_);
      listener = std::move(listener_);
    }
    listener.reset();  // joins its thread: outside the lock, which its hooks' callers may take
#endif
  }
  void announce(v1::HelloAck& ack, bool) const override { ack.set_rdma_port(port()); }
  bool peerListens(const v1::HelloAck& ack) const override { return ack.rdma_port() != 0; }
  std::chrono::milliseconds handshakeTimeout(const Config& config) const override {
    return std::chrono::milliseconds(config.connect_timeout_ms) * kRdmaHandshakeFactor;
  }
  std::chrono::milliseconds fallbackFor(const Config& config) const override {
    return std::chrono::milliseconds(config.rdma_retry_ms);
  }

  Status listen(const ListenContext& ctx) override {
#ifdef FRAMELINK_HAVE_RDMA
    if (!device_) return {};
    const Config& config = ctx.config;
    auto host_port = transport::tcp::parseHostPort(config.listen);
    std::string host = host_port ? host_port->first : std::string("0.0.0.0");
    AcceptHooks hooks = ctx.hooks;
    auto listener = transport::rdma::RdmaListener::listen(
        device_, host, static_cast<uint16_t>(config.rdma_port), hooks.expected,
        [hooks](uint64_t session_id, std::unique_ptr<transport::Transport> t) {
          hooks.accepted(session_id, std::shared_ptr<transport::Transport>(std::move(t)));
        },
        // Shorter than the dialer's whole dial (kRdmaHandshakeFactor connect
        // timeouts), long enough for one lost REP to be sent again: a stalled
        // stranger goes before a genuine peer would give up.
        linkOptions(config),
        std::chrono::milliseconds(config.connect_timeout_ms) * (kRdmaHandshakeFactor - 1),
        transport::rdma::RdmaListenerCounters{&ctx.metrics.counters.handshakes_timed_out_rdma,
                                              &ctx.metrics.counters.handshakes_refused_rdma,
                                              &ctx.metrics.counters.auth_failures},
        hooks.token);
    MutexLock lock(mutex_);
    if (!listener) {
      unavailable_ = "cannot listen for rdma connections on " + host + ": " + listener.error().message;
      spdlog::warn("rdma is not usable: {}; links use the next transport of {}", unavailable_,
                   joinedNames(config.transports));
      return {};
    }
    spdlog::info("rdma: listening on {}:{} (device {})", host, listener.value()->port(), device_->name());
    listener_ = std::move(listener.value());
#else
    (void)ctx;
#endif
    return {};
  }

  Made dial(const DialContext& ctx) override {
#ifdef FRAMELINK_HAVE_RDMA
    if (!device_ || ctx.ack.rdma_port() == 0) {
      return makeError(FL_ERR_TRANSPORT, "the peer chose rdma but announced no rdma port");
    }
    return shared(transport::rdma::dialRdma(device_, ctx.host, static_cast<uint16_t>(ctx.ack.rdma_port()),
                                            ctx.session_id, handshakeTimeout(ctx.config),
                                            linkOptions(ctx.config), ctx.stop_fd, ctx.token));
#else
    (void)ctx;
    return makeError(FL_ERR_TRANSPORT, "this framelinkd was built without rdma");
#endif
  }

 private:
  const std::shared_ptr<transport::rdma::RdmaDevice> device_;  // null: none
  mutable Mutex mutex_;
  std::string unavailable_ FL_GUARDED_BY(mutex_);  // why not; gets a reason when listening fails
#ifdef FRAMELINK_HAVE_RDMA
  std::unique_ptr<transport::rdma::RdmaListener> listener_ FL_GUARDED_BY(mutex_);
#endif
};

// ---- loopback: two daemons in one process, joined in memory ----

// The daemons of this process that listen for loopback links, by instance.
class LoopbackDirectory {
 public:
  static LoopbackDirectory& get() {
    static LoopbackDirectory directory;
    return directory;
  }
  void add(uint64_t instance, AcceptHooks hooks) {
    MutexLock lock(mutex_);
    listeners_[instance] = std::move(hooks);
  }
  void remove(uint64_t instance) {
    MutexLock lock(mutex_);
    listeners_.erase(instance);
  }
  bool has(uint64_t instance) const {
    MutexLock lock(mutex_);
    return listeners_.count(instance) != 0;
  }
  // Hands `end` to the listener `instance` for `session_id`; false when no
  // such daemon listens in this process.  Under the lock, so that remove()
  // (a daemon stopping) waits for a hand-over in progress.
  bool handOver(uint64_t instance, uint64_t session_id, std::shared_ptr<transport::Transport> end) {
    MutexLock lock(mutex_);
    auto it = listeners_.find(instance);
    if (it == listeners_.end()) return false;
    it->second.accepted(session_id, std::move(end));
    return true;
  }

 private:
  mutable Mutex mutex_;
  std::map<uint64_t, AcceptHooks> listeners_ FL_GUARDED_BY(mutex_);
};

constexpr const char* kLoopbackElsewhere =
    "the peer runs in another process: loopback joins two daemons of one process only (use tcp, grpc or rdma "
    "between processes)";

class LoopbackEntry final : public TransportEntry {
 public:
  ~LoopbackEntry() override { stop(); }
  static constexpr std::string_view kName = "loopback";
  std::string_view name() const noexcept override { return kName; }
  bool usable(uint64_t peer_instance, std::string* why) const override {
    if (instance_ == 0) {
      if (why != nullptr) *why = "loopback is not in this daemon's transports";
      return false;
    }
    // The dialer does not know the peer's instance yet; the listener checks.
    if (peer_instance == 0 || LoopbackDirectory::get().has(peer_instance)) return true;
    if (why != nullptr) *why = kLoopbackElsewhere;
    return false;
  }
  Status listen(const ListenContext& ctx) override {
    instance_ = ctx.instance;
    LoopbackDirectory::get().add(instance_, ctx.hooks);
    return {};
  }
  void stop() noexcept override {
    if (instance_ != 0) LoopbackDirectory::get().remove(instance_);
  }
  Made dial(const DialContext& ctx) override {
    auto pair = transport::loopback::makePair();
    if (!pair) return std::move(pair).error();
    if (!LoopbackDirectory::get().handOver(ctx.ack.instance(), ctx.session_id, pair.value().b)) {
      return makeError(FL_ERR_TRANSPORT, kLoopbackElsewhere);
    }
    return pair.value().a;
  }

 private:
  uint64_t instance_ = 0;  // set once, by listen(): 0 while not listening
};

// The table: one line per transport.
struct Entry {
  std::string_view name;
  std::unique_ptr<TransportEntry> (*make)(RdmaSupport& rdma);
};
constexpr Entry kEntries[] = {
    {TcpEntry::kName,
     [](RdmaSupport&) -> std::unique_ptr<TransportEntry> { return std::make_unique<TcpEntry>(); }},
    {GrpcEntry::kName,
     [](RdmaSupport&) -> std::unique_ptr<TransportEntry> { return std::make_unique<GrpcEntry>(); }},
    {RdmaEntry::kName,
     [](RdmaSupport& rdma) -> std::unique_ptr<TransportEntry> {
       return std::make_unique<RdmaEntry>(std::move(rdma));
     }},
    {LoopbackEntry::kName,
     [](RdmaSupport&) -> std::unique_ptr<TransportEntry> { return std::make_unique<LoopbackEntry>(); }},
};

// The configuration is checked against kTransportNames (without linking the
// transports): the table and that list must name the same, in one order.
constexpr bool sameNames() {
  if (std::size(kEntries) != kTransportNames.size()) return false;
  for (size_t i = 0; i < kTransportNames.size(); ++i) {
    if (kEntries[i].name != kTransportNames[i]) return false;
  }
  return true;
}
static_assert(sameNames(), "add the new transport to kTransportNames (transport_names.h) too");

}  // namespace

std::vector<std::unique_ptr<TransportEntry>> daemonTransportEntries(RdmaSupport rdma) {
  std::vector<std::unique_ptr<TransportEntry>> entries;
  for (const Entry& e : kEntries) entries.push_back(e.make(rdma));
  return entries;
}

TransportRegistry makeDaemonTransports(RdmaSupport rdma) {
  return TransportRegistry(daemonTransportEntries(std::move(rdma)));
}

}  // namespace framelink
