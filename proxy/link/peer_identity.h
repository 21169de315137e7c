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
//     TLS client certificate must carry it (common name or a DNS name).
// A refusal is logged (rate-limited: strangers can cause it) and counted.
//
// PeerInstances notices a second instance of one id while the first one's
// link is up: a restart this daemon has not seen end yet, or another daemon
// using that id where nothing tells them apart (one shared token).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/log_limit.h"
#include "common/thread_annotations.h"
#include "config/config.h"
#include "framelink/v1/link.pb.h"

namespace framelink {

class Metrics;

// Whether `presented` equals `expected`, in a time that depends on the length
// of `presented` only (which the presenter knows), not on where they differ.
bool secretEquals(std::string_view presented, std::string_view expected) noexcept;

// The token a gRPC call carries in its metadata ("" when none).
std::string callToken(const ::grpc::ServerContext& ctx);

class PeerIdentity {
 public:
  PeerIdentity(const Config& config, Metrics& metrics) : config_(config), metrics_(metrics) {}

  // Before the Hello: whether the call's token could prove some id here.  One
  // that cannot is a stranger (the caller refuses and counts it).
  bool tokenAccepted(const ::grpc::ServerContext& ctx) const;
  // After the Hello: OK when the call's token and certificate prove the id
  // the Hello claims; else the status to refuse the Session with.
  ::grpc::Status prove(const ::grpc::ServerContext& ctx, const v1::Hello& hello, const std::string& from);

 private:
  // Whether `token` is one this daemon accepts from some id.
  bool known(std::string_view token) const;
  ::grpc::Status refuseToken(const v1::Hello& hello, const std::string& from);
  ::grpc::Status refuseCertificate(const ::grpc::ServerContext& ctx, const std::string& id,
                                   const std::string& name, const std::string& from);

  const Config& config_;
  Metrics& metrics_;
  LogLimiter log_;
};

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
  Up up(const std::string& peer, uint64_t instance, const std::string& from);

 private:
  void down(const std::string& peer, uint64_t instance);

  Metrics& metrics_;
  LogLimiter log_;
  Mutex mutex_;
  // Per peer id: how many links of each instance are up.
  std::map<std::string, std::map<uint64_t, uint32_t>> up_ FL_GUARDED_BY(mutex_);
};

}  // namespace framelink
