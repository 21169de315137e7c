// Who a dialing peer is.  Its Hello names a daemon id, and that id is what
// routes, dedup state and the link's ACKs are keyed by -- so the listener
// believes it only when the call's credentials prove it:
//   * the token: the one this daemon shares with that id (its [[peer]]'s own,
//     else link.token).  A token of one peer, or link.token where the id has
//     its own, does not pass for another id.  When some [[peer]] has its own
//     token and link.token is not set, an id with neither must be proven by
//     its certificate, or is refused.
//   * the certificate: where a name is required for the id ([[peer]]
//     cert_name, or the id itself under tls_require_cert_name), the verified
//     TLS client certificate must carry it (common name or a DNS name); and
//     no CRL of link.tls_crl_file may list it (the dialer checks the
//     listener's the same way: revokedPeer).
// A refusal is logged (rate-limited: strangers can cause it) and counted.
//
// PeerInstances counts the links of each peer id, by instance (the random
// id each daemon process draws at start), and admits a dialer's link:
//   * no more than kMaxLinksPerPeer links of one id are up at once, whatever
//     their instances: each is a socket or queue pair, buffers, and a
//     sender the receiving streams share their slots with;
//   * an id that nothing but the shared token proves (no token of its own,
//     no certificate name required) keeps the instance it linked from while
//     that link is up: another daemon claiming the id is refused until that
//     link has ended.  A restarted peer's old link ends with its process
//     (its sockets close), or is given up after link_timeout_ms.
// A second instance of an id proven on its own is admitted (the same
// credentials: a restart not seen yet), logged and counted.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "config/config.h"
#include "config/config_reload.h"
#include "framelink/v1/link.pb.h"

namespace framelink {

class Metrics;

// Whether `presented` equals `expected`, in a time that depends on the length
// of `presented` only (which the presenter knows), not on where they differ.
bool secretEquals(std::string_view presented, std::string_view expected) noexcept;

// The token a gRPC call carries in its metadata ("" when none).
std::string callToken(const ::grpc::ServerContextBase& ctx);

// Why the peer's verified certificate on this call is revoked by a CRL of
// link.tls_crl_file; "" when it is not (or there is no CRL, or no TLS).
std::string revokedPeer(const Config& config, const ::grpc::AuthContext* auth);

// The names the peer's verified certificate on a call carries: its common
// name and its DNS names.  None without TLS or without a certificate.
std::vector<std::string> certificateNames(const ::grpc::AuthContext* auth);

// The peer's verified certificate on this call (PEM); "" without TLS or a
// certificate.  Kept per link, so that a reload can check it against new CRLs.
std::string peerCertificate(const ::grpc::AuthContext* auth);

class PeerIdentity {
 public:
  // Reads the running configuration at each call: a reload changes who is accepted.
  PeerIdentity(const LiveConfig& config, Metrics& metrics) : config_(config), metrics_(metrics) {}

  // Before the Hello: whether the call's token could prove some id here.  One
  // that cannot is a stranger (the caller refuses and counts it).
  bool tokenAccepted(const ::grpc::ServerContextBase& ctx) const;
  // After the Hello: OK when the call's token and certificate prove the id
  // the Hello claims; else the status to refuse the Session with.
  ::grpc::Status prove(const ::grpc::ServerContextBase& ctx, const v1::Hello& hello, const std::string& from);
  // Whether a dialer that passed prove() for `id` holds credentials of that
  // id alone (its [[peer]]'s own token, or a certificate that must name it),
  // not only the token every peer shares.
  bool provenAlone(const std::string& id) const;

 private:
  // Whether `token` is one this daemon accepts from some id.
  static bool known(const Config& config, std::string_view token);
  ::grpc::Status refuseToken(const Config& config, const v1::Hello& hello, const std::string& from);
  ::grpc::Status refuseCertificate(const ::grpc::ServerContextBase& ctx, const std::string& id,
                                   const std::string& name, const std::string& from);
  ::grpc::Status refuseRevoked(const std::string& id, const std::string& why, const std::string& from);

  const LiveConfig& config_;
  Metrics& metrics_;
  LogLimiter log_;
};

// Links of one peer id up at once, from any instances: a dialer and a
// listener each way, and a restart overlapping its old link.
inline constexpr uint32_t kMaxLinksPerPeer = 4;

class PeerInstances {
 public:
  explicit PeerInstances(Metrics& metrics) : metrics_(metrics) {}

  // Marks `peer`'s link from `instance` up until the returned handle goes; a
  // link of another instance of `peer` up meanwhile is logged and counted.
  class Up {
   public:
    Up(PeerInstances* owner, std::string peer, uint64_t instance)
        : owner_(owner), peer_(std::move(peer)), instance_(instance) {}
    Up(const Up&) = delete;
    Up& operator=(const Up&) = delete;
    ~Up() { owner_->down(peer_, instance_); }

   private:
    PeerInstances* owner_;
    std::string peer_;
    uint64_t instance_;
  };
  // A link this daemon dialed: counted, never refused.
  Up up(const std::string& peer, uint64_t instance, const std::string& from);
  // A link a dialer opens: OK and `up` set, or the status it is refused with
  // (logged, rate-limited, and counted).  `proven`: the dialer's credentials
  // prove `peer` on their own (its own token, or a certificate name).
  ::grpc::Status admit(const std::string& peer, uint64_t instance, bool proven, const std::string& from,
                       std::unique_ptr<Up>& up);

 private:
  // Another instance of `peer` with a link up (0: none).
  uint64_t otherInstance(const std::string& peer, uint64_t instance) const FL_REQUIRES(mutex_);
  void conflict(const std::string& peer, uint64_t instance, uint64_t other, const std::string& from);
  void down(const std::string& peer, uint64_t instance);

  Metrics& metrics_;
  LogLimiter log_;
  Mutex mutex_;
  // Per peer id: how many links of each instance are up.
  std::map<std::string, std::map<uint64_t, uint32_t>> up_ FL_GUARDED_BY(mutex_);
};

}  // namespace framelink
