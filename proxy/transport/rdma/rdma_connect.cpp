#include "transport/rdma/rdma_connect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <spdlog/spdlog.h>

#include "transport/handshake_table.h"
#include "transport/rdma/rdma_addr.h"
#include "transport/rdma/rdma_wire.h"

namespace framelink::transport::rdma {
namespace {

using Clock = std::chrono::steady_clock;

// rnr_retry 7 = retry for ever on "receiver not ready": the receiver keeps
// receive WRs posted and replenishes them from poll(), so an RNR only means
// its data agent is a moment behind.  retry_count bounds transport retries
// (a peer that vanished is noticed after about 7 x the ACK timeout).
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetryCount = 7;
// The local ACK timeout, 4.096 us x 2^14 = 67 ms (perftest's default).  For
// RoCE rdma_cm otherwise derives it from a fixed packet lifetime: 2^17, about
// 0.54 s, so one lost packet stalls the queue pair for half a second before
// the retransmission -- seen as throughput collapsing on a lossy Soft-RoCE
// link.  A peer that vanished is noticed after ~7 x 67 ms.
constexpr uint8_t kAckTimeout = 14;

// Best effort: a kernel that refuses the option keeps its default.
void setAckTimeout(VerbsApi& api, rdma_cm_id* id, const std::string& where) {
  if (api.setAckTimeout(id, kAckTimeout) != 0) {
    spdlog::debug("{}: cannot set the ACK timeout ({}); the rdma_cm default applies", where,
                  std::strerror(errno));
  }
}

struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_CONNECT_ERROR;
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<uint8_t> private_data;
};

std::string addressText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (sa == nullptr) return buf;
  if (sa->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(v6->sin6_port));
  }
  return buf;
}

// Takes the next event off `channel` (non-blocking fd), waiting until
// `deadline`; copies what callers need and acks it at once, so that
// rdma_migrate_id / rdma_destroy_id never wait for it.  1: an event, 0: timed
// out, -1: `wake_fd` became readable or polling failed.
int nextCmEvent(VerbsApi& api, rdma_event_channel* channel, int wake_fd, Clock::time_point deadline,
                CmEvent* out) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (api.getCmEvent(channel, &ev) == 0) {
      out->type = ev->event;
      out->status = ev->status;
      out->id = ev->id;
      out->private_data.clear();
      if (ev->param.conn.private_data != nullptr && ev->param.conn.private_data_len > 0) {
        const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
        out->private_data.assign(p, p + ev->param.conn.private_data_len);
      }
      api.ackCmEvent(ev);
      return 1;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd fds[2] = {{channel->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) return -1;
    if (wake_fd >= 0 && n > 0 && fds[1].revents != 0) return -1;
  }
}

Result<CmId> newCmId(const std::shared_ptr<VerbsApi>& api) {
  rdma_event_channel* channel = api->createEventChannel();
  if (channel == nullptr) {
    return makeError(FL_ERR_RESOURCES, std::string("rdma_create_event_channel: ") + std::strerror(errno) +
                                           " (is rdma_ucm loaded? /dev/infiniband/rdma_cm must exist)");
  }
  rdma_cm_id* id = nullptr;
  if (api->createId(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    int e = errno;
    api->destroyEventChannel(channel);
    return makeError(FL_ERR_RESOURCES, std::string("rdma_create_id: ") + std::strerror(e));
  }
  CmId cm(api, channel, id);
  if (!setNonBlocking(channel->fd)) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("O_NONBLOCK on the rdma_cm channel: ") + std::strerror(errno));
  }
  return cm;
}

// Milliseconds to `deadline`, as the rdma_cm calls take them (1 ms to 60 s).
int leftMs(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 1, 60'000));
}

// rdma_resolve_addr from `src` (null: any) to `dst`, then rdma_resolve_route,
// each waiting for its event on the id's channel until `deadline`.
Status resolveRoute(VerbsApi& api, const CmId& cm, sockaddr* src, sockaddr* dst, int wake_fd,
                    Clock::time_point deadline, const std::string& where) {
  CmEvent ev;
  if (api.resolveAddr(cm.id(), src, dst, leftMs(deadline)) != 0) {
    return makeError(FL_ERR_TRANSPORT, where + ": rdma_resolve_addr: " + std::strerror(errno));
  }
  int got = nextCmEvent(api, cm.channel(), wake_fd, deadline, &ev);
  if (got == 0) return makeError(FL_ERR_TRANSPORT, where + ": timed out resolving the address");
  if (got < 0 || ev.type != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return makeError(FL_ERR_TRANSPORT,
                     where + ": cannot resolve the address (" +
                         (got < 0 ? std::string(std::strerror(errno)) : rdma_event_str(ev.type)) +
                         ", status " + std::to_string(ev.status) +
                         "): is there a route to it over an RDMA device?");
  }
  if (api.resolveRoute(cm.id(), leftMs(deadline)) != 0) {
    return makeError(FL_ERR_TRANSPORT, where + ": rdma_resolve_route: " + std::strerror(errno));
  }
  got = nextCmEvent(api, cm.channel(), wake_fd, deadline, &ev);
  if (got == 0) return makeError(FL_ERR_TRANSPORT, where + ": timed out resolving the route");
  if (got < 0 || ev.type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return makeError(FL_ERR_TRANSPORT,
                     where + ": cannot resolve the route (" +
                         (got < 0 ? std::string(std::strerror(errno)) : rdma_event_str(ev.type)) +
                         ", status " + std::to_string(ev.status) + ")");
  }
  return {};
}

// What a REJECTED event says: the peer's own status and reason when its
// private data is a framelink reject, else that nobody listens there.
Error rejection(const CmEvent& ev, const std::string& where) {
  RdmaRejectData why{};
  if (ev.private_data.size() >= sizeof why) std::memcpy(&why, ev.private_data.data(), sizeof why);
  if (why.magic == kRdmaConnectMagic) {
    int status = why.status != 0 ? why.status : FL_ERR_TRANSPORT;
    const char* why_text =
        status == FL_ERR_AUTH
            ? "it does not know this session, or the token is wrong (check both daemons' tokens)"
        : status == FL_ERR_PEER_VERSION ? "it speaks another rdma protocol version"
        : status == FL_ERR_RESOURCES    ? "it has too many rdma handshakes in progress (try again)"
                                        : "see its log";
    return makeError(status, where + ": the peer refused the connection: " + why_text + " (status " +
                                 std::to_string(status) + ")");
  }
  return makeError(FL_ERR_TRANSPORT, where + ": rejected (status " + std::to_string(ev.status) +
                                         "): is a framelinkd listening for rdma on that address and port?");
}

// rdma_connect with private data {magic, version, session id, token proof},
// then waits until `deadline` for ESTABLISHED on the transport's channel.
Status connectSession(VerbsApi& api, RdmaTransport& t, uint64_t session_id, const std::string& token,
                      int wake_fd, Clock::time_point deadline, const std::string& where) {
  RdmaConnectData data{kRdmaConnectMagic, kRdmaProtocolVersion, 0, session_id, {}};
  tokenDigest(token, session_id, data.token);
  rdma_conn_param param{};
  param.private_data = &data;
  param.private_data_len = sizeof data;
  // RDMA READs in flight each way (pull): the peer reads offered slots of
  // ours, and we read its.
  param.responder_resources = t.readDepth();
  param.initiator_depth = t.readDepth();
  param.retry_count = kRetryCount;
  param.rnr_retry_count = kRnrRetryCount;
  setAckTimeout(api, t.cmId(), where);
  if (api.connect(t.cmId(), &param) != 0) {
    return makeError(FL_ERR_TRANSPORT, where + ": rdma_connect: " + std::strerror(errno));
  }
  CmEvent ev;
  for (;;) {
    int got = nextCmEvent(api, t.cmChannel(), wake_fd, deadline, &ev);
    if (got == 0) return makeError(FL_ERR_TRANSPORT, where + ": timed out waiting for the peer to accept");
    if (got < 0) return makeError(FL_ERR_TRANSPORT, where + ": rdma_get_cm_event: " + std::strerror(errno));
    if (ev.type == RDMA_CM_EVENT_ESTABLISHED) return {};
    if (ev.type == RDMA_CM_EVENT_REJECTED) return rejection(ev, where);
    if (ev.type == RDMA_CM_EVENT_UNREACHABLE || ev.type == RDMA_CM_EVENT_CONNECT_ERROR) {
      return makeError(FL_ERR_TRANSPORT, where + ": " + rdma_event_str(ev.type) + " (status " +
                                             std::to_string(ev.status) + ")");
    }
    // Anything else (e.g. a stray CONNECT_RESPONSE) is not for us: keep waiting.
  }
}

}  // namespace

// ---------------------------------------------------------------- dialer

Result<std::unique_ptr<Transport>> dialRdma(std::shared_ptr<RdmaDevice> device, const std::string& host,
                                            uint16_t port, uint64_t session_id,
                                            std::chrono::milliseconds timeout, RdmaTransportOptions options,
                                            int wake_fd, const std::string& token) {
  if (!device) return makeError(FL_EINVAL, "dialRdma: no device");
  const std::string where = "rdma connect to " + host + ":" + std::to_string(port);
  const auto deadline = Clock::now() + timeout;
  auto dst = parseIp(host, port);
  if (!dst) return std::move(dst).error().context(where);
  std::optional<sockaddr_storage> src;
  if (!device->bindIp().empty()) {
    auto s = parseIp(device->bindIp(), 0);
    if (!s) return std::move(s).error().context(where);
    src = s.value();
  }
  VerbsApi& api = device->api();
  auto cm = newCmId(device->apiPtr());
  if (!cm) return std::move(cm).error().context(where);
  if (Status s = resolveRoute(api, *cm, src ? reinterpret_cast<sockaddr*>(&*src) : nullptr,
                              reinterpret_cast<sockaddr*>(&dst.value()), wake_fd, deadline, where);
      !s) {
    return std::move(s).error();
  }

  auto created = RdmaTransport::create(device, std::move(cm).value(), options);
  if (!created) return std::move(created).error().context(where);
  std::unique_ptr<RdmaTransport> t = std::move(created).value();
  if (Status s = connectSession(api, *t, session_id, token, wake_fd, deadline, where); !s) {
    return std::move(s).error();
  }
  t->established(host + ":" + std::to_string(port));
  return std::unique_ptr<Transport>(std::move(t));
}

// ---------------------------------------------------------------- listener

Result<std::unique_ptr<RdmaListener>> RdmaListener::listen(
    std::shared_ptr<RdmaDevice> device, const std::string& host, uint16_t port, Authorize authorize,
    OnConnected on_connected, RdmaTransportOptions options, std::chrono::milliseconds handshake_timeout,
    RdmaListenerCounters counters, TokenFor token_for) {
  if (!device) return makeError(FL_EINVAL, "RdmaListener: no device");
  const std::string where = "rdma listen on " + host + ":" + std::to_string(port);
  auto addr = parseIp(host, port);
  if (!addr) return std::move(addr).error().context(where);
  auto cm = newCmId(device->apiPtr());
  if (!cm) return std::move(cm).error().context(where);
  VerbsApi& api = device->api();
  if (api.bindAddr(cm->id(), reinterpret_cast<sockaddr*>(&addr.value())) != 0) {
    return makeError(FL_ERR_TRANSPORT, where + ": rdma_bind_addr: " + std::strerror(errno));
  }
  if (cm->id()->verbs != nullptr && cm->id()->verbs != device->context()) {
    const char* other = api.deviceName(cm->id()->verbs);
    return makeError(FL_ERR_TRANSPORT, where + ": that address belongs to RDMA device " +
                                           (other ? other : "?") + ", not to " + device->name());
  }
  if (api.listen(cm->id(), static_cast<int>(kMaxPendingHandshakes)) != 0) {
    return makeError(FL_ERR_TRANSPORT, where + ": rdma_listen: " + std::strerror(errno));
  }
  const uint16_t bound = api.getSrcPort(cm->id());
  int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) return makeError(FL_ERR_RESOURCES, where + ": eventfd: " + std::strerror(errno));
  std::unique_ptr<RdmaListener> l(
      new RdmaListener(std::move(device), std::move(cm).value(), UniqueFd(wake), bound, std::move(authorize),
                       std::move(on_connected), options, handshake_timeout, counters, std::move(token_for)));
  try {
    l->thread_ = std::thread([p = l.get()] { p->loop(); });
  } catch (const std::system_error& e) {
    return makeError(FL_ERR_RESOURCES, where + ": cannot start the listener thread: " + e.what());
  }
  spdlog::info("rdma: listening on {}:{} ({})", host, bound, l->device_->name());
  return l;
}

RdmaListener::RdmaListener(std::shared_ptr<RdmaDevice> device, CmId listen_id, UniqueFd wake_fd,
                           uint16_t port, Authorize authorize, OnConnected on_connected,
                           RdmaTransportOptions options, std::chrono::milliseconds handshake_timeout,
                           RdmaListenerCounters counters, TokenFor token_for)
    : device_(std::move(device)),
      listen_id_(std::move(listen_id)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      authorize_(std::move(authorize)),
      on_connected_(std::move(on_connected)),
      options_(options),
      handshake_timeout_(handshake_timeout),
      counters_(counters),
      token_for_(std::move(token_for)) {}

RdmaListener::~RdmaListener() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
    thread_.join();
  }
  // Connect requests still queued on the channel are rejected by the
  // kernel when the listening id goes away.
  listen_id_.reset();
}

// An accepted connect request waiting for ESTABLISHED.  Its transport owns
// the id (on a channel of its own) and the QP: destroying it rejects the
// request.
struct RdmaListener::Pending {
  std::unique_ptr<RdmaTransport> transport;
  std::string peer;  // address:port
  std::string host;  // address
  uint64_t session_id = 0;
  Clock::time_point deadline{};
};

void RdmaListener::loop() noexcept {
  HandshakeTable<Pending> table;
  for (;;) {
    // Deadlines first: a handshake that stalls half-way is dropped here.
    table.expire(Clock::now(), [this](const Pending& p) {
      if (counters_.timed_out != nullptr) counters_.timed_out->fetch_add(1, std::memory_order_relaxed);
      log_failed_.warn(
          "rdma listener on port {}: {} (session {:#x}) did not complete the connection within {} ms", port_,
          p.peer, p.session_id, handshake_timeout_.count());
    });
    auto waited = table.wait(wake_fd_.get(), listen_id_.channel()->fd, Clock::time_point::max(),
                             [](const Pending& p) { return p.transport->cmChannel()->fd; });
    if (waited == HandshakeWait::kFailed) {
      spdlog::error("rdma listener on port {}: poll failed: {}", port_, std::strerror(errno));
      return;
    }
    if (waited == HandshakeWait::kWoken) return;
    table.advanceReady([this](Pending& p) { return advance(p); });
    if (table.listenReady() && !drainListenChannel(table.pending())) return;
  }
}

bool RdmaListener::drainListenChannel(std::vector<Pending>& pending) noexcept {
  VerbsApi& api = device_->api();
  rdma_cm_event* ev = nullptr;
  while (api.getCmEvent(listen_id_.channel(), &ev) == 0) {
    const rdma_cm_event_type type = ev->event;
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_cm_id* id = ev->id;
      std::vector<uint8_t> pd;
      if (ev->param.conn.private_data != nullptr && ev->param.conn.private_data_len > 0) {
        const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
        pd.assign(p, p + ev->param.conn.private_data_len);
      }
      const std::string peer = addressText(reinterpret_cast<const sockaddr*>(&id->route.addr.dst_addr));
      api.ackCmEvent(ev);
      onConnectRequest(id, peer, pd, pending);
      continue;
    }
    const int status = ev->status;
    api.ackCmEvent(ev);
    if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      spdlog::error("rdma listener on port {}: device {} was removed; no more connections", port_,
                    device_->name());
      return false;
    }
    log_failed_.warn("rdma listener on port {}: rdma_cm event {} (status {})", port_, rdma_event_str(type),
                     status);
  }
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    spdlog::error("rdma listener on port {}: rdma_get_cm_event: {}", port_, std::strerror(errno));
    return false;
  }
  return true;
}

void RdmaListener::reject(rdma_cm_id* id, int status, const std::string& peer, const std::string& why,
                          LogLimiter& log) noexcept {
  log.warn("rdma listener on port {}: refused connection from {}: {}", port_, peer, why);
  RdmaRejectData data{kRdmaConnectMagic, kRdmaProtocolVersion, 0, status, 0};
  device_->api().reject(id, &data, sizeof data);
  device_->api().destroyId(id);
}

void RdmaListener::onConnectRequest(rdma_cm_id* id, const std::string& peer,
                                    const std::vector<uint8_t>& private_data,
                                    std::vector<Pending>& pending) noexcept {
  const std::optional<uint64_t> session_id = checkRequest(id, peer, private_data);
  if (!session_id) return;
  const std::string host = peer.substr(0, peer.rfind(':'));
  if (!roomFor(id, peer, host, pending)) return;
  rdma_event_channel* channel = ownChannel(id, peer);
  if (channel == nullptr) return;
  CmId cm(device_->apiPtr(), channel, id);
  auto created = RdmaTransport::create(device_, std::move(cm), options_);
  if (!created) {
    // Destroying a requested id rejects the request.
    log_failed_.warn("rdma listener on port {}: refused connection from {}: {}", port_, peer,
                     created.error().message);
    return;
  }
  acceptRequest(std::move(created).value(), peer, host, *session_id, pending);
}

std::optional<uint64_t> RdmaListener::checkRequest(rdma_cm_id* id, const std::string& peer,
                                                   const std::vector<uint8_t>& private_data) noexcept {
  VerbsApi& api = device_->api();
  RdmaConnectData data{};
  if (private_data.size() < kRdmaConnectPrefixBytes) {
    reject(id, FL_ERR_PROTOCOL, peer, "no framelink connect data (not a framelinkd?)", log_refused_);
    return std::nullopt;
  }
  std::memcpy(&data, private_data.data(), std::min(private_data.size(), sizeof data));
  if (data.magic != kRdmaConnectMagic) {
    reject(id, FL_ERR_PROTOCOL, peer, "bad connect magic", log_refused_);
    return std::nullopt;
  }
  if (data.version != kRdmaProtocolVersion) {
    reject(id, FL_ERR_PEER_VERSION, peer,
           "rdma protocol version " + std::to_string(data.version) + ", this daemon speaks " +
               std::to_string(kRdmaProtocolVersion),
           log_refused_);
    return std::nullopt;
  }
  if (private_data.size() < sizeof data) {
    reject(id, FL_ERR_PROTOCOL, peer, "connect data without its token proof", log_refused_);
    return std::nullopt;
  }
  if (id->verbs != device_->context()) {
    const char* other = id->verbs ? api.deviceName(id->verbs) : "no device";
    reject(id, FL_ERR_TRANSPORT, peer,
           std::string("arrived on RDMA device ") + (other ? other : "?") + ", this daemon uses " +
               device_->name(),
           log_refused_);
    return std::nullopt;
  }
  const char* why = nullptr;
  try {
    if (!authorize_ || !authorize_(data.session_id)) {
      why = " is not known here";
    } else {
      uint8_t expected[kTokenDigestBytes];
      tokenDigest(token_for_ ? token_for_(data.session_id) : std::string(), data.session_id, expected);
      if (!digestEqual(expected, data.token)) why = ": wrong token (check the peer tokens on both daemons)";
    }
  } catch (...) {
    why = " is not known here";
  }
  if (why != nullptr) {
    if (counters_.auth_failures != nullptr) counters_.auth_failures->fetch_add(1, std::memory_order_relaxed);
    reject(id, FL_ERR_AUTH, peer, "session " + std::to_string(data.session_id) + why, log_refused_);
    return std::nullopt;
  }
  return data.session_id;
}

// Bounded: a host that opens handshakes and stalls them cannot take every
// slot, and nobody can make the table grow without limit.
bool RdmaListener::roomFor(rdma_cm_id* id, const std::string& peer, const std::string& host,
                           const std::vector<Pending>& pending) noexcept {
  size_t same = 0;
  for (const auto& p : pending) same += p.host == host ? 1 : 0;
  if (pending.size() >= kMaxPendingHandshakes || same >= kMaxPendingPerHost) {
    if (counters_.refused != nullptr) counters_.refused->fetch_add(1, std::memory_order_relaxed);
    reject(id, FL_ERR_RESOURCES, peer,
           pending.size() >= kMaxPendingHandshakes
               ? std::to_string(kMaxPendingHandshakes) + " handshakes in progress already"
               : std::to_string(kMaxPendingPerHost) + " handshakes from " + host + " in progress already",
           log_busy_);
    return false;
  }
  return true;
}

// The connection's own event channel: its transport watches it for
// DISCONNECTED later, and this thread polls it for ESTABLISHED meanwhile.
rdma_event_channel* RdmaListener::ownChannel(rdma_cm_id* id, const std::string& peer) noexcept {
  VerbsApi& api = device_->api();
  rdma_event_channel* channel = api.createEventChannel();
  if (channel == nullptr) {
    reject(id, FL_ERR_RESOURCES, peer, "rdma_create_event_channel failed", log_failed_);
    return nullptr;
  }
  if (!setNonBlocking(channel->fd) || api.migrateId(id, channel) != 0) {
    const std::string why = std::string("cannot move the id to its own channel: ") + std::strerror(errno);
    api.destroyEventChannel(channel);
    reject(id, FL_ERR_RESOURCES, peer, why, log_failed_);
    return nullptr;
  }
  return channel;
}

void RdmaListener::acceptRequest(std::unique_ptr<RdmaTransport> transport, const std::string& peer,
                                 const std::string& host, uint64_t session_id,
                                 std::vector<Pending>& pending) noexcept {
  VerbsApi& api = device_->api();
  Pending p;
  p.transport = std::move(transport);
  p.peer = peer;
  p.host = host;
  p.session_id = session_id;
  p.deadline = Clock::now() + handshake_timeout_;
  rdma_conn_param param{};
  param.responder_resources = p.transport->readDepth();
  param.initiator_depth = p.transport->readDepth();
  param.retry_count = kRetryCount;
  param.rnr_retry_count = kRnrRetryCount;
  setAckTimeout(api, p.transport->cmId(), "rdma listener");
  if (api.accept(p.transport->cmId(), &param) != 0) {
    log_failed_.warn("rdma listener on port {}: rdma_accept for {} failed: {}", port_, peer,
                     std::strerror(errno));
    return;
  }
  pending.push_back(std::move(p));
}

bool RdmaListener::advance(Pending& p) noexcept {
  VerbsApi& api = device_->api();
  rdma_cm_event* ev = nullptr;
  while (api.getCmEvent(p.transport->cmChannel(), &ev) == 0) {
    const rdma_cm_event_type type = ev->event;
    const int status = ev->status;
    api.ackCmEvent(ev);
    if (type == RDMA_CM_EVENT_ESTABLISHED) {
      // Whatever follows on the channel (a DISCONNECTED) is the transport's.
      p.transport->established(p.peer);
      spdlog::info("rdma: connection from {} for session {} on {}", p.peer, p.session_id, device_->name());
      try {
        on_connected_(p.session_id, std::unique_ptr<Transport>(std::move(p.transport)));
      } catch (...) {
        spdlog::error("rdma listener on port {}: the connection handler threw; connection dropped", port_);
      }
      return true;
    }
    if (type == RDMA_CM_EVENT_CONNECT_ERROR || type == RDMA_CM_EVENT_UNREACHABLE ||
        type == RDMA_CM_EVENT_REJECTED || type == RDMA_CM_EVENT_DISCONNECTED) {
      log_failed_.warn("rdma listener on port {}: connection from {} failed: {} (status {})", port_, p.peer,
                       rdma_event_str(type), status);
      return true;
    }
  }
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    log_failed_.warn("rdma listener on port {}: connection from {}: rdma_get_cm_event: {}", port_, p.peer,
                     std::strerror(errno));
    return true;
  }
  return false;
}

}  // namespace framelink::transport::rdma
