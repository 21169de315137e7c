#include "attach/attach_server.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#ifdef FRAMELINK_HAVE_NUMA
#include <numa.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "attach/send_fds.h"
#include "common/log_fields.h"

namespace framelink {

namespace {

std::string errnoText() { return std::strerror(errno); }

// Segments live on the NUMA node of the CPU the data agent is pinned to
// (the NIC's node, when the operator pinned it there); unpinned: no binding.
int numaNodeForSegments(const Config& config) {
#ifdef FRAMELINK_HAVE_NUMA
  if (config.cpu >= 0 && numa_available() >= 0) return numa_node_of_cpu(config.cpu);
#endif
  (void)config;
  return -1;
}

HugepageMode hugepageMode(const std::string& s) {
  if (s == "on") return HugepageMode::kOn;
  if (s == "off") return HugepageMode::kOff;
  return HugepageMode::kAuto;
}

}  // namespace

void AttachServer::setSegmentRegistrar(RegisterSegment registrar, int numa_node) {
  registrar_ = std::move(registrar);
  numa_node_ = numa_node;
}

AttachServer::AttachServer(const Config& config, DaemonIdentity identity, OnAttach on_attach,
                           OnDetach on_detach)
    : config_(config),
      identity_(identity),
      on_attach_(std::move(on_attach)),
      on_detach_(std::move(on_detach)),
      quota_(segmentCaps(config, physicalRam())) {}

AttachServer::~AttachServer() { stop(); }

void AttachServer::start() {
  spdlog::info("attach: clients' segments may hold {} bytes in all{}, {} per uid{}", quota_.caps().total,
               quota_.caps().total_auto ? " (auto: half of RAM)" : "", quota_.caps().per_uid,
               quota_.caps().per_uid_auto ? " (auto: half of that)" : "");
  running_ = true;
  thread_ = std::thread([this] { run(); });
}

void AttachServer::stop(bool keep_listener) {
  if (keep_listener) keep_listener_ = true;
  if (!running_.exchange(false)) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  // The client sockets stay open until the server is destroyed: the daemon
  // first lets the data agent finish (and mark every attachment DETACHED),
  // so a client never sees a hang-up while its frames are still completed.
  // A listener handed to the next daemon keeps its file: clients that
  // connect meanwhile wait in its backlog.
  if (!keep_listener_) ::unlink(config_.socket_path.c_str());
}

void AttachServer::reject(Metrics::AttachReject reason) {
  if (metrics_ != nullptr) metrics_->recordAttachReject(reason);
}

int AttachServer::expireHandshakes() {
  const auto now = std::chrono::steady_clock::now();
  if (accept_paused_ && now >= accept_resume_) {
    accept_paused_ = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_.get();
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  }
  std::vector<int> expired;
  auto next = std::chrono::steady_clock::time_point::max();
  const int parked_ms = retryParked();
  for (const auto& [fd, c] : connections_) {
    if (c.client_id != 0 || c.parked) continue;
    if (c.deadline <= now) {
      expired.push_back(fd);
    } else {
      next = std::min(next, c.deadline);
    }
  }
  for (int fd : expired) {
    const uid_t uid = connections_[fd].uid;
    log_timeout_.warn("attach: a connection of uid {} sent no attach request within {} ms: closed", uid,
                      kHandshakeMs);
    reject(Metrics::AttachReject::kHandshakeTimeout);
    sendRefusal(fd, FL_ERR_BAD_REQUEST,
                "no attach request within " + std::to_string(kHandshakeMs) + " ms of connecting");
    dropConnection(fd);
  }
  if (accept_paused_) next = std::min(next, accept_resume_);
  if (next == std::chrono::steady_clock::time_point::max()) return parked_ms;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  const int until_next = static_cast<int>(std::clamp<long long>(ms, 1, kHandshakeMs));
  return parked_ms < 0 ? until_next : std::min(until_next, parked_ms);
}

void AttachServer::run() {
  epoll_event events[32];
  while (running_) {
    int n = ::epoll_wait(epoll_fd_.get(), events, 32, expireHandshakes());
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("attach: epoll_wait failed: {}", errnoText());
      return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == stop_fd_.get()) return;
      if (fd == listen_fd_.get()) {
        acceptAll();
        continue;
      }
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      if (it->second.parked) {  // it sends nothing while it waits: any event is its close
        dropConnection(fd);
        continue;
      }
      if (it->second.client_id == 0 && (events[i].events & EPOLLIN)) {
        handleRequest(fd);
        continue;
      }
      if (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR | EPOLLIN)) {
        // An attached client sends nothing after its request: any readable
        // event is the close (or garbage, which we treat as a detach).
        dropConnection(fd);
      }
    }
  }
}

void AttachServer::acceptAll() {
  for (int accepted = 0; accepted < 64; ++accepted) {  // bounded: the other connections get their turn
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (outOfDescriptors(errno)) {
        // Out of descriptors: the connection stays in the backlog.  Pause
        // accepting instead of spinning on a listener that stays readable.
        reject(Metrics::AttachReject::kFdLimit);
        log_accept_.warn(
            "attach: accept failed: {}; not accepting for {} ms (raise LimitNOFILE, or find the process "
            "holding connections: framelink clients)",
            errnoText(), kAcceptBackoffMs);
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
        accept_paused_ = true;
        accept_resume_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAcceptBackoffMs);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        log_accept_.warn("attach: accept failed: {}", errnoText());
      }
      return;
    }
    if (fd_limit_ > 0 && static_cast<uint64_t>(fd) >= fd_limit_ * 8 / 10 && !fd_warned_) {
      spdlog::warn("attach: {} of {} file descriptors in use (80 %); raise LimitNOFILE for more clients", fd,
                   fd_limit_);
      fd_warned_ = true;
    } else if (fd_limit_ > 0 && static_cast<uint64_t>(fd) < fd_limit_ / 2) {
      fd_warned_ = false;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
    if (fd_limit_ > 0 && static_cast<uint64_t>(fd) + kFdReserve >= fd_limit_) {
      // The last descriptors stay for links, logs and the daemon's own work:
      // a new client is refused while it would have to use them.
      reject(Metrics::AttachReject::kFdLimit);
      log_accept_.warn("attach: {} of {} file descriptors in use: refusing new clients (raise LimitNOFILE)",
                       fd, fd_limit_);
      refuseAndClose(fd, FL_ERR_RESOURCES,
                     "the daemon is out of file descriptors (limit " + std::to_string(fd_limit_) +
                         "): try again later, or ask the operator to raise LimitNOFILE");
      continue;
    }
    if (const size_t pending = pending_by_uid_[cred.uid]; pending >= config_.max_clients_per_uid) {
      reject(Metrics::AttachReject::kTooManyPending);
      log_pending_.warn(
          "attach: uid {} (pid {}) already has {} connections without an attach request: refused", cred.uid,
          cred.pid, pending);
      const std::string deadline = std::to_string(kHandshakeMs) + " ms";
      refuseAndClose(fd, FL_ERR_QUOTA,
                     "this user has " + std::to_string(pending) +
                         " connections waiting to attach, as many as limits.max_clients_per_uid allows "
                         "(each is closed " +
                         deadline + " after connecting unless it asks): close the idle ones");
      continue;
    }
    ++pending_by_uid_[cred.uid];
    Connection c;
    c.fd = UniqueFd(fd);
    c.uid = cred.uid;
    c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kHandshakeMs);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    connections_.emplace(fd, std::move(c));
  }
}

void AttachServer::dropConnection(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  uint64_t client_id = it->second.client_id;
  auto& by_uid = client_id == 0 ? pending_by_uid_ : attached_by_uid_;
  auto p = by_uid.find(it->second.uid);
  if (p != by_uid.end() && --p->second == 0) by_uid.erase(p);
  // Its segments' bytes stay charged until whatever holds them lets go.
  if (auto charge = it->second.charge.lock()) charge->detached();
  connections_.erase(it);
  if (client_id != 0) on_detach_(client_id);
}

void AttachServer::refuseAndClose(int fd, int status, const std::string& message) {
  sendRefusal(fd, status, message);
  // A request already queued is read first: closing over unread data resets
  // the connection, and the client might see that before the refusal.
  char discard[sizeof(fl_attach_request)];
  [[maybe_unused]] ssize_t unread = ::recv(fd, discard, sizeof(discard), MSG_DONTWAIT);
  ::close(fd);
}

void AttachServer::sendRefusal(int fd, int status, const std::string& message) {
  fl_attach_reply reply{};
  reply.magic = FL_ATTACH_MAGIC;
  reply.version = FL_ATTACH_VERSION;
  reply.status = status;
  std::strncpy(reply.message, message.c_str(), sizeof(reply.message) - 1);
  [[maybe_unused]] auto n = ::send(fd, &reply, sizeof(reply), MSG_NOSIGNAL);
}

std::string AttachServer::adminRefusal(uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const {
  if (uid == 0 || uid == own_uid_ || gid == own_gid_ || gid == admin_gid_) return {};
  for (gid_t g : groups) {
    if (g == own_gid_ || g == admin_gid_) return {};
  }
  return "admin requests are refused to uid " + std::to_string(uid) + " (gid " + std::to_string(gid) +
         "): only root, the daemon's uid " + std::to_string(own_uid_) + " or gid " +
         std::to_string(own_gid_) + ", and members of the admin group '" + admin_group_ +
         "' may ask (daemon.admin_group); add the user to that group or run as root";
}

void AttachServer::sendAdminReply(int fd, int status, const std::string& message, int json_fd,
                                  uint64_t json_size) {
  fl_admin_reply reply{};
  reply.magic = FL_ADMIN_MAGIC;
  reply.version = FL_ADMIN_VERSION;
  reply.status = status;
  reply.fd_count = json_fd >= 0 ? 1 : 0;
  reply.json_size = json_size;
  std::strncpy(reply.message, message.c_str(), sizeof(reply.message) - 1);
  const std::span<const int> fds = json_fd >= 0 ? std::span<const int>(&json_fd, 1) : std::span<const int>();
  // The connection is fresh and the reply one small datagram: it fits, and
  // MSG_DONTWAIT makes sure a full queue costs the client its answer, never
  // the daemon its time.
  [[maybe_unused]] auto n = sendWithFds(fd, &reply, sizeof(reply), fds, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void AttachServer::handleAdmin(int fd, const fl_admin_request& req, ssize_t size, const ucred& cred) {
  auto refuse = [&](int status, const std::string& why) {
    if (metrics_ != nullptr) metrics_->counters.admin_refused.fetch_add(1, std::memory_order_relaxed);
    log_refused_.warn("admin: pid {} uid {} refused: {}", cred.pid, cred.uid, why);
    sendAdminReply(fd, status, why, -1, 0);
    dropConnection(fd);
  };
  if (static_cast<size_t>(size) != sizeof(req)) {
    return refuse(FL_ERR_BAD_REQUEST, "admin request of " + std::to_string(size) + " bytes, expected " +
                                          std::to_string(sizeof(req)) + "; use a matching framelink tool");
  }
  if (req.version != FL_ADMIN_VERSION) {
    return refuse(FL_ERR_VERSION, "admin protocol version " + std::to_string(req.version) +
                                      ", this framelinkd speaks " + std::to_string(FL_ADMIN_VERSION) +
                                      ": install matching versions of framelink and framelinkd");
  }
  if ((req.command != FL_ADMIN_SNAPSHOT && req.command != FL_ADMIN_RELOAD) || req.flags != 0) {
    return refuse(FL_ERR_BAD_REQUEST, "unknown admin command " + std::to_string(req.command) + " (flags " +
                                          std::to_string(req.flags) + "); use a matching framelink tool");
  }
  // Supplementary groups as they were when the peer connected.
  std::vector<gid_t> groups(64);
  socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0 && errno == ERANGE) {
    groups.resize(glen / sizeof(gid_t));
    glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) glen = 0;
  }
  groups.resize(glen / sizeof(gid_t));
  if (std::string why = adminRefusal(cred.uid, cred.gid, groups); !why.empty()) {
    return refuse(FL_ERR_ATTACH_REFUSED, why);
  }
  const AdminSnapshot& make = req.command == FL_ADMIN_RELOAD ? admin_reload_ : admin_snapshot_;
  const std::string json = make ? make() : std::string("{}");
  if (json.size() > FL_ADMIN_JSON_MAX) {
    return refuse(FL_ERR_RESOURCES, "the snapshot is " + std::to_string(json.size()) + " bytes, more than " +
                                        std::to_string(FL_ADMIN_JSON_MAX) + "; read /stats with --metrics");
  }
  UniqueFd mem(::memfd_create("framelink-admin", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  size_t written = 0;
  while (mem.valid() && written < json.size()) {
    ssize_t w = ::write(mem.get(), json.data() + written, json.size() - written);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    written += static_cast<size_t>(w);
  }
  // Sealed: the client reads exactly what was written, and cannot hand the
  // daemon's memory back to it grown.
  if (!mem.valid() || written != json.size() ||
      ::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    return refuse(FL_ERR_RESOURCES, "the daemon cannot make the snapshot: " + errnoText());
  }
  if (metrics_ != nullptr) metrics_->counters.admin_requests.fetch_add(1, std::memory_order_relaxed);
  const char* what = req.command == FL_ADMIN_RELOAD ? "reload" : "snapshot";
  spdlog::debug("admin: pid {} uid {}: {} of {} bytes", cred.pid, cred.uid, what, json.size());
  sendAdminReply(fd, FL_OK, what, mem.get(), json.size());
  dropConnection(fd);
}

void AttachServer::handleRequest(int fd) {
  // Big enough for either kind of request; MSG_TRUNC gives the real size.
  union {
    fl_attach_request attach;
    fl_admin_request admin;
  } buf{};
  ssize_t n = ::recv(fd, &buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    dropConnection(fd);
    return;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  if (n >= static_cast<ssize_t>(sizeof(uint32_t)) && buf.admin.magic == FL_ADMIN_MAGIC) {
    handleAdmin(fd, buf.admin, n, cred);
    return;
  }
  handleAttach(fd, buf.attach, n, cred);
}

void AttachServer::handleAttach(int fd, fl_attach_request& req, ssize_t size, const ucred& cred) {
  if (admitAttach(fd, req, size, cred)) attachAdmitted(fd, req, cred);
}

void AttachServer::attachAdmitted(int fd, const fl_attach_request& req, const ucred& cred) {
  // Admitted, so the stream name is terminated within its array.
  const LogScope scope(LogFields{.client = next_client_id_, .stream = req.stream});
  uint64_t client_id = next_client_id_++;
  std::shared_ptr<ClientSegments> segments = makeSegments(fd, req, cred, client_id);
  if (!segments) return;
  Doorbell submit_doorbell;
  Doorbell completion_doorbell;
  bool doorbells = makeSubmitDoorbell(&submit_doorbell) && makeCompletionDoorbell(&completion_doorbell);
  UniqueFd socket_dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!doorbells || !socket_dup.valid()) {
    sendRefusal(fd, FL_ERR_RESOURCES, "the daemon ran out of file descriptors: " + errnoText());
    dropConnection(fd);
    return;
  }
  // A producer's segment may be lent to consumers on this host, and so may
  // a consumer's, where frames from a peer land for every reader here: a
  // read-only file of it is kept for them.  A consumer gets one too, and
  // cannot attach without it: it must never hold a writable file.
  if (!segments->keepReadOnlyDataFd()) {
    if (req.role == FL_ROLE_CONSUMER) {
      sendRefusal(fd, FL_ERR_RESOURCES,
                  "the daemon cannot open a read-only file of the segment: " + errnoText());
      dropConnection(fd);
      return;
    }
    spdlog::warn(
        "attach: pid {}: no read-only file of its data segment ({}); its frames are copied to "
        "the other readers on this host",
        cred.pid, errnoText());
  }

  auto session = std::make_shared<ClientSession>();
  session->id = client_id;
  session->role = req.role;
  session->stream = req.stream;
  session->subscriber = (req.flags & FL_ATTACH_SUBSCRIBE) != 0;
  session->pull = (req.flags & FL_ATTACH_PULL) != 0;
  session->name = req.client_name;
  session->pid = cred.pid;
  session->uid = cred.uid;
  session->gid = cred.gid;
  session->segments = segments;
  session->submit_doorbell = std::move(submit_doorbell.daemon_end);
  session->completion_doorbell = std::move(completion_doorbell.daemon_end);
  session->completion_reader = std::move(completion_doorbell.reader);
  session->socket = std::move(socket_dup);
  session->ring_capacity = segments->geometry().ring_capacity;
  session->slots.resize(req.slot_count);
  markAttached(fd, client_id, *segments);
  // The data agent hears of the client before the client hears it is
  // attached: a subscriber whose fl_attach returned gets every frame from
  // then on, also one a producer elsewhere sends the next moment.  What the
  // agent writes meanwhile waits in the rings and the doorbell's queue.
  const std::shared_ptr<ClientSession> attached = session;
  on_attach_(std::move(session));
  if (!sendAttachReply(fd, client_id, req.role, *segments, submit_doorbell, completion_doorbell)) {
    spdlog::warn("attach: pid {}: sending the reply failed: {}", cred.pid, errnoText());
    dropConnection(fd);  // the agent lets the client go
    return;
  }
  attached->replied.store(true, std::memory_order_release);
  log_attached_.info("client {} attached: pid {} uid {} '{}' {} stream '{}' {} x {} bytes{}", client_id,
                     cred.pid, cred.uid, req.client_name,
                     req.role == FL_ROLE_PRODUCER ? "producer" : "consumer", req.stream, req.slot_count,
                     req.slot_size, segments->onHugepages() ? " (hugepages)" : "");
}

std::shared_ptr<ClientSegments> AttachServer::makeSegments(int fd, const fl_attach_request& req,
                                                           const ucred& cred, uint64_t client_id) {
  SegmentRequest sreq;
  sreq.role = req.role;
  sreq.slot_count = req.slot_count;
  sreq.slot_size = req.slot_size;
  sreq.client_id = client_id;
  sreq.stream = req.stream;
  sreq.hugepages = hugepageMode(config_.hugepages);
  sreq.numa_node = numa_node_ >= 0 ? numa_node_ : numaNodeForSegments(config_);
  sreq.daemon_pid = identity_.pid;
  sreq.daemon_start_ns = identity_.start_ns;
  sreq.client_wait_spin_us = config_.client_wait_spin_us;
  auto segments = ClientSegments::create(sreq);
  if (!segments) {
    spdlog::error("attach: pid {} stream '{}': {}", cred.pid, req.stream, segments.error().message);
    sendRefusal(fd, segments.error().code, segments.error().message);
    dropConnection(fd);
    return nullptr;
  }
  if (registrar_) {
    auto registration = registrar_(*segments.value(), req.role);
    if (!registration) {
      spdlog::error("attach: pid {} stream '{}': cannot register the segment with the RDMA device: {}",
                    cred.pid, req.stream, registration.error().message);
      sendRefusal(fd, FL_ERR_RESOURCES,
                  "the daemon cannot register the segment with its RDMA device (" +
                      registration.error().message +
                      "); ask for fewer or smaller slots, or raise its memlock limit");
      dropConnection(fd);
      return nullptr;
    }
    segments.value()->holdRegistration(std::move(registration.value()));
  }
  return std::move(segments.value());
}

bool AttachServer::sendAttachReply(int fd, uint64_t client_id, uint32_t role, const ClientSegments& segments,
                                   const Doorbell& submit, const Doorbell& completion) {
  fl_attach_reply reply{};
  reply.magic = FL_ATTACH_MAGIC;
  reply.version = FL_ATTACH_VERSION;
  reply.status = FL_OK;
  reply.fd_count = FL_ATTACH_FD_COUNT;
  reply.client_id = client_id;
  reply.control_size = segments.geometry().control_size;
  reply.data_size = segments.geometry().data_size;
  std::snprintf(reply.message, sizeof(reply.message), "attached as client %llu",
                static_cast<unsigned long long>(client_id));
  const int fds[FL_ATTACH_FD_COUNT] = {segments.controlFd(), segments.clientDataFd(role),
                                       submit.client_end.get(), completion.client_end.get()};
  return sendWithFds(fd, &reply, sizeof(reply), fds, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply));
}

void AttachServer::markAttached(int fd, uint64_t client_id, ClientSegments& segments) {
  Connection& conn = connections_[fd];
  conn.client_id = client_id;
  auto charge = quota_.charge(conn.uid, segmentBytes(segments.geometry()));
  conn.charge = charge;
  segments.holdCharge(std::move(charge));
  if (auto p = pending_by_uid_.find(conn.uid); p != pending_by_uid_.end() && --p->second == 0) {
    pending_by_uid_.erase(p);
  }
  ++attached_by_uid_[conn.uid];
}

}  // namespace framelink
