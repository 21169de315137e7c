// The local attach endpoint: an AF_UNIX SOCK_SEQPACKET socket.  Validates
// each fl_attach_request, applies the SO_PEERCRED policy and quotas, creates
// the client's segments and doorbells, passes them with SCM_RIGHTS, and
// watches the socket so the daemon learns when the client goes away.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attach/client_session.h"
#include "attach/segment_quota.h"
#include "common/log_limit.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "config/config.h"
#include "framelink/attach_proto.h"
#include "metrics/metrics.h"

namespace framelink {

struct DaemonIdentity {
  uint64_t pid = 0;
  uint64_t start_ns = 0;
};

class AttachServer {
 public:
  using OnAttach = std::function<void(std::shared_ptr<ClientSession>)>;
  using OnDetach = std::function<void(uint64_t client_id)>;

  // What a connection that has not attached yet may hold: it must send its
  // request within kHandshakeMs, and one uid may have at most as many such
  // connections at once as it may have clients (limits.max_clients_per_uid).
  // Idle connections are bounded by their deadline, not a burst by a count:
  // a service that starts all its workers at once is served whole.
  static constexpr int kHandshakeMs = 2000;
  // An attach over a memory cap waits this long at most for the segments of
  // clients that detached (held by their frames in flight) to go, if that
  // would make room: a client that restarts at once is not refused for the
  // memory of its own previous run.  Looked at every kQuotaPollMs.
  static constexpr int kQuotaWaitMs = 2000;
  static constexpr int kQuotaPollMs = 10;
  // Out of file descriptors: accepting pauses this long instead of spinning.
  static constexpr int kAcceptBackoffMs = 100;
  // Descriptors kept free for links, logs and the daemon's own work: new
  // clients are refused (FL_ERR_RESOURCES) rather than take the last ones.
  static constexpr uint64_t kFdReserve = 32;
  // Attach (and detach) lines logged per second at most; the rest are counted
  // in a "suppressed" line.
  static constexpr uint32_t kLoggedAttachesPerSecond = 20;

  // `inherited_listener`: the attach listener of the daemon before this one
  // (hot restart, hand_over.h), used when it listens on config.socket_path;
  // else the socket is bound anew.
  static Result<std::unique_ptr<AttachServer>> create(const Config& config, DaemonIdentity identity,
                                                      OnAttach on_attach, OnDetach on_detach,
                                                      Metrics* metrics = nullptr,
                                                      UniqueFd inherited_listener = UniqueFd());
  ~AttachServer();

  // Registers each client's data segment with the rdma device (producer:
  // local read; consumer: remote write) before the client gets it; the
  // returned handle lives as long as the segment, and its key goes with
  // every send from it.  `numa_node` >= 0 places segments on the NIC's node.
  // Call before start().
  using RegisterSegment = std::function<Result<SegmentRegistration>(ClientSegments& segments, uint32_t role)>;
  void setSegmentRegistrar(RegisterSegment registrar, int numa_node);

  // Builds the JSON an admin request gets (counters, clients, links); called
  // on the attach thread.  Call before start().
  using AdminSnapshot = std::function<std::string()>;
  void setAdminSnapshot(AdminSnapshot snapshot) { admin_snapshot_ = std::move(snapshot); }
  // Reloads the configuration (FL_ADMIN_RELOAD) and returns the outcome as JSON.
  void setAdminReload(AdminSnapshot reload) { admin_reload_ = std::move(reload); }

  // A client the daemon before this one attached (hot restart): its attach
  // socket, and its session rebuilt from the hand-over, segments and
  // doorbells included.  Registered with the rdma device, charged to the
  // memory caps and counted against its uid as an attach is, then handed to
  // on_attach.  Call before start().  An error: the client is not taken
  // over (closing `socket` tells it so: it attaches again).
  Status adopt(UniqueFd socket, std::shared_ptr<ClientSession> session);
  // Whether the listener came from the daemon before this one.
  bool inheritedListener() const noexcept { return inherited_listener_; }
  // The listener, for the hand-over to the next daemon (after stop(true)).
  int listenFd() const noexcept { return listen_fd_.get(); }
  // The id the next attach gets (the hand-over carries it on).
  uint64_t nextClientId() const noexcept { return next_client_id_; }
  // Ids go on from those of the daemon before (call before start()).
  void continueClientIds(uint64_t next) noexcept { next_client_id_ = std::max(next_client_id_, next); }

  void start();
  // Stops accepting.  `keep_listener`: the listener goes to the next daemon
  // (hot restart), so its socket file stays.
  void stop(bool keep_listener = false);

  // Whether a peer with these credentials may send admin requests: root, the
  // daemon's own uid or gid, or a member (primary or supplementary group) of
  // the admin group.  Empty when allowed, else the refusal naming the rule.
  std::string adminRefusal(uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const;

  // Validation of one request against the policy, without side effects
  // (exposed for unit tests).  Fills `request` defaults on success.
  static Status validateRequest(const Config& config, fl_attach_request& request, uid_t uid, gid_t gid);

 private:
  AttachServer(const Config& config, DaemonIdentity identity, OnAttach on_attach, OnDetach on_detach);
  // Who may send admin requests (adminRefusal): the daemon's own uid and
  // gid, and the configured admin group, else the group the socket has now.
  Status resolveAdminGroup();
  void run();
  void acceptAll();
  void handleRequest(int fd);
  // An attach request: admitted, its segments and doorbells made and passed
  // to the client, the session handed to on_attach_.
  void handleAttach(int fd, fl_attach_request& request, ssize_t size, const ucred& cred);
  // Checks its size, the policy (filling defaults), the per-uid client limit
  // and the segment memory caps; false: refused, counted and dropped.
  bool admitAttach(int fd, fl_attach_request& request, ssize_t size, const ucred& cred);
  // Whether the segments `request` asks for fit under the memory caps;
  // false: refused, counted and dropped.
  bool admitSegmentBytes(int fd, const fl_attach_request& request, const ucred& cred);
  // The client's segments, registered with the rdma device when there is
  // one; null: refused and dropped.
  std::shared_ptr<ClientSegments> makeSegments(int fd, const fl_attach_request& request, const ucred& cred,
                                               uint64_t client_id);
  // The success reply with the segments' and doorbells' client ends; false
  // (errno set) when it did not go out whole.
  bool sendAttachReply(int fd, uint64_t client_id, uint32_t role, const ClientSegments& segments,
                       const Doorbell& submit, const Doorbell& completion);
  // The connection's client is attached: it counts against the per-uid
  // limit, no longer as pending, and its segments' bytes against the caps
  // for as long as the segments live.
  void markAttached(int fd, uint64_t client_id, ClientSegments& segments);
  // The rest of an admitted attach: segments, doorbells, the reply.
  void attachAdmitted(int fd, const fl_attach_request& request, const ucred& cred);
  // A request over a memory cap that the segments of clients that detached
  // still hold waits for them (at most kQuotaWaitMs); false: not parked.
  bool parkForQuota(int fd, const fl_attach_request& request, const ucred& cred);
  // Parked requests that fit now are attached, those past their wait
  // refused; the epoll timeout until the next look (-1: none parked).
  int retryParked();
  void handleAdmin(int fd, const fl_admin_request& request, ssize_t size, const ucred& cred);
  void sendAdminReply(int fd, int status, const std::string& message, int json_fd, uint64_t json_size);
  void sendRefusal(int fd, int status, const std::string& message);
  // For a connection just accepted and not yet tracked: refuses it and closes it.
  void refuseAndClose(int fd, int status, const std::string& message);
  void dropConnection(int fd);
  // Drops connections that sent no request before their deadline; returns
  // the epoll timeout until the next deadline (-1: none).
  int expireHandshakes();
  void reject(Metrics::AttachReject reason);

  const Config& config_;
  DaemonIdentity identity_;
  OnAttach on_attach_;
  OnDetach on_detach_;
  RegisterSegment registrar_;
  int numa_node_ = -1;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd stop_fd_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool inherited_listener_ = false;
  bool keep_listener_ = false;
  uint64_t next_client_id_ = 1;
  Metrics* metrics_ = nullptr;  // may be null (tests)
  AdminSnapshot admin_snapshot_;
  AdminSnapshot admin_reload_;
  uid_t own_uid_ = 0;
  gid_t own_gid_ = 0;
  gid_t admin_gid_ = 0;
  std::string admin_group_;  // its name, for messages

  struct Connection {
    UniqueFd fd;
    uint64_t client_id = 0;  // 0 until attached
    uid_t uid = 0;
    std::chrono::steady_clock::time_point deadline{};  // for the request, while not attached
    // Its segments' charge to quota_ (they hold it): told when the client goes.
    std::weak_ptr<SegmentQuota::Charge> charge;
    // An attach request waiting for detached clients' segments to go
    // (parkForQuota); `deadline` is then the end of that wait.
    std::optional<fl_attach_request> parked;
    ucred parked_cred{};
  };
  // Owned by the attach thread.
  std::map<int, Connection> connections_;
  std::map<uid_t, size_t> pending_by_uid_;   // connections that have not attached yet
  std::map<uid_t, size_t> attached_by_uid_;  // attached clients (limits.max_clients_per_uid)
  SegmentQuota quota_;                       // their segments' bytes (limits.max_*_bytes)
  bool accept_paused_ = false;
  std::chrono::steady_clock::time_point accept_resume_{};
  uint64_t fd_limit_ = 0;  // RLIMIT_NOFILE at start
  bool fd_warned_ = false;
  LogLimiter log_accept_, log_pending_, log_timeout_, log_refused_, log_clients_, log_memory_;
  // Attaches are logged, but a user who attaches in a loop cannot flood the log.
  LogLimiter log_attached_{std::chrono::seconds(1), kLoggedAttachesPerSecond};
};

}  // namespace framelink
