#include "link/peer_identity.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <vector>

#include "config/tls_crl.h"
#include "metrics/metrics.h"
#include "transport/grpc/grpc_limits.h"

namespace framelink {

namespace {

std::string firstValue(const ::grpc::AuthContext* auth, const char* property) {
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return {};
  const auto values = auth->FindPropertyValues(property);
  return values.empty() ? std::string() : std::string(values.front().data(), values.front().size());
}

std::string listed(const std::vector<std::string>& names) {
  if (names.empty()) return "no name (no client certificate)";
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "'" : ", '") + name.substr(0, 128) + "'";
  return out;
}

}  // namespace

std::vector<std::string> certificateNames(const ::grpc::AuthContext* auth) {
  std::vector<std::string> names;
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME}) {
    for (const auto& value : auth->FindPropertyValues(property)) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return names;
}

bool secretEquals(std::string_view presented, std::string_view expected) noexcept {
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < presented.size(); ++i) {
    const unsigned char want =
        expected.empty() ? 0 : static_cast<unsigned char>(expected[i % expected.size()]);
    diff |= static_cast<unsigned char>(static_cast<unsigned char>(presented[i]) ^ want);
  }
  return diff == 0;
}

std::string callToken(const ::grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(transport::kTokenMetadataKey);
  return it != md.end() ? std::string(it->second.data(), it->second.size()) : std::string();
}

std::string revokedPeer(const Config& config, const ::grpc::AuthContext* auth) {
  if (config.tls_crl_pem.empty()) return {};
  return revocation(config.tls_crl_pem, peerCertificate(auth));
}

std::string peerCertificate(const ::grpc::AuthContext* auth) {
  return firstValue(auth, GRPC_X509_PEM_CERT_PROPERTY_NAME);
}

bool PeerIdentity::known(const Config& config, std::string_view token) {
  // Every configured token is compared, so that the time says nothing of which one matched.
  bool match = !config.token.empty() && secretEquals(token, config.token);
  for (const auto& peer : config.peers) {
    match = (!peer.token.empty() && secretEquals(token, peer.token)) || match;
  }
  return match;
}

bool PeerIdentity::tokenAccepted(const ::grpc::ServerContextBase& ctx) const {
  const std::shared_ptr<const Config> config = config_.get();
  if (config->token.empty() && !config->peerTokens()) return true;  // peers are not authenticated by token
  const std::string token = callToken(ctx);
  if (known(*config, token)) return true;
  // A dialer without a token may still prove its id by its certificate.
  const bool names_checked =
      config->tls_require_cert_name || std::any_of(config->peers.begin(), config->peers.end(),
                                                   [](const PeerConfig& p) { return !p.cert_name.empty(); });
  return token.empty() && names_checked;
}

::grpc::Status PeerIdentity::prove(const ::grpc::ServerContextBase& ctx, const v1::Hello& hello,
                                   const std::string& from) {
  const std::string& id = hello.daemon_id();
  const std::shared_ptr<const Config> config = config_.get();
  const std::string& expected = config->peerToken(id);
  const std::string cert_name = config->certNameFor(id);
  if (!expected.empty()) {
    // Both are compared, whatever the first one says.
    const bool hello_ok = secretEquals(hello.token(), expected);
    const bool call_ok = secretEquals(callToken(ctx), expected);
    if (!hello_ok || !call_ok) {
      return refuseToken(*config, hello, from);
    }
  } else if (config->peerTokens() && cert_name.empty()) {
    metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
    log_.warn(
        "peer at {} refused: it claims to be '{}', which has no token of its own here, and link.token is not "
        "set (FL_ERR_AUTH)",
        from, id);
    return {
        ::grpc::StatusCode::UNAUTHENTICATED,
        "daemon id '" + id +
            "' is not accepted here: give it a [[peer]] with its own token (or cert_name) on this daemon"};
  }
  if (const std::string why = revokedPeer(*config, ctx.auth_context().get()); !why.empty()) {
    return refuseRevoked(id, why, from);
  }
  if (cert_name.empty()) return ::grpc::Status::OK;
  const std::vector<std::string> names = certificateNames(ctx.auth_context().get());
  for (const auto& name : names) {
    if (name == cert_name) return ::grpc::Status::OK;
  }
  return refuseCertificate(ctx, id, cert_name, from);
}

::grpc::Status PeerIdentity::refuseToken(const Config& config, const v1::Hello& hello,
                                         const std::string& from) {
  const std::string& id = hello.daemon_id();
  if (!known(config, hello.token())) {
    metrics_.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
    log_.warn("peer at {} refused: wrong token in Hello (FL_ERR_AUTH)", from);
    return {::grpc::StatusCode::UNAUTHENTICATED, "wrong token: configure the same token on both daemons"};
  }
  // A token this daemon accepts, but from another id: a leaked or shared
  // token used to pass for someone else, or a peer configured with the
  // wrong one.
  metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
  log_.warn(
      "peer at {} refused: it claims to be '{}', but its token is not the one '{}' has here (another peer's, "
      "or "
      "link.token where '{}' has a token of its own) (FL_ERR_AUTH)",
      from, id, id, id);
  return {::grpc::StatusCode::UNAUTHENTICATED, "the token does not prove daemon id '" + id +
                                                   "': present the token of its [[peer]] on this daemon"};
}

::grpc::Status PeerIdentity::refuseCertificate(const ::grpc::ServerContextBase& ctx, const std::string& id,
                                               const std::string& name, const std::string& from) {
  metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
  const std::string names = listed(certificateNames(ctx.auth_context().get()));
  log_.warn("peer at {} refused: it claims to be '{}', but its certificate names {}, not '{}' (FL_ERR_AUTH)",
            from, id, names, name);
  return {::grpc::StatusCode::UNAUTHENTICATED, "the certificate does not prove daemon id '" + id +
                                                   "': it must name '" + name + "'; it names " + names};
}

::grpc::Status PeerIdentity::refuseRevoked(const std::string& id, const std::string& why,
                                           const std::string& from) {
  metrics_.counters.peer_identity_refused.fetch_add(1, std::memory_order_relaxed);
  log_.warn("peer at {} refused: it claims to be '{}', but {} (link.tls_crl_file; FL_ERR_AUTH)", from, id,
            why);
  return {::grpc::StatusCode::UNAUTHENTICATED, "daemon id '" + id + "' is not accepted here: " + why};
}

bool PeerIdentity::provenAlone(const std::string& id) const {
  const std::shared_ptr<const Config> config = config_.get();
  return &config->peerToken(id) != &config->token || !config->certNameFor(id).empty();
}

uint64_t PeerInstances::otherInstance(const std::string& peer, uint64_t instance) const {
  auto it = up_.find(peer);
  if (it == up_.end()) return 0;
  for (const auto& [i, links] : it->second) {
    if (i != instance) return i;
  }
  return 0;
}

PeerInstances::Up PeerInstances::up(const std::string& peer, uint64_t instance, const std::string& from) {
  uint64_t other = 0;
  {
    MutexLock lock(mutex_);
    other = otherInstance(peer, instance);
    ++up_[peer][instance];
  }
  if (other != 0) conflict(peer, instance, other, from);
  return Up(this, peer, instance);
}

::grpc::Status PeerInstances::admit(const std::string& peer, uint64_t instance, bool proven,
                                    const std::string& from, std::unique_ptr<Up>& up) {
  uint64_t other = 0;
  uint32_t links = 0;
  {
    MutexLock lock(mutex_);
    other = otherInstance(peer, instance);
    if (auto it = up_.find(peer); it != up_.end()) {
      for (const auto& [i, n] : it->second) links += n;
    }
    if (links < kMaxLinksPerPeer && (other == 0 || proven)) ++up_[peer][instance];
  }
  if (links >= kMaxLinksPerPeer) {
    metrics_.counters.peer_links_over_limit.fetch_add(1, std::memory_order_relaxed);
    log_.warn("peer {} at {} refused: it has {} links up already, the most one peer id may have", peer, from,
              links);
    return {::grpc::StatusCode::RESOURCE_EXHAUSTED,
            "daemon id '" + peer + "' has " + std::to_string(links) +
                " links up already, the most one id may have: close one first"};
  }
  if (other != 0 && !proven) {
    metrics_.counters.peer_instance_refused.fetch_add(1, std::memory_order_relaxed);
    log_.warn(
        "peer at {} refused: it claims to be '{}' (instance {:016x}) while '{}' is linked from instance "
        "{:016x}; only the shared token proves that id, so the linked daemon keeps it until its link ends "
        "(a restarted daemon's old link ends with it; give each [[peer]] a token of its own, or set "
        "tls_require_cert_name)",
        from, peer, instance, peer, other);
    return {::grpc::StatusCode::ALREADY_EXISTS,
            "daemon id '" + peer +
                "' is linked from another daemon; the shared token does not prove you are that one: try "
                "again once its link has ended, or give each daemon a token or certificate of its own"};
  }
  if (other != 0) conflict(peer, instance, other, from);
  up = std::make_unique<Up>(this, peer, instance);
  return ::grpc::Status::OK;
}

void PeerInstances::conflict(const std::string& peer, uint64_t instance, uint64_t other,
                             const std::string& from) {
  metrics_.counters.peer_instance_conflicts.fetch_add(1, std::memory_order_relaxed);
  log_.warn(
      "peer {} at {}: another instance ({:016x}) comes up while the link from instance {:016x} is up: {} "
      "restarted and its old link has not ended yet, or another daemon holds the credentials of '{}'",
      peer, from, instance, other, peer, peer);
}

void PeerInstances::down(const std::string& peer, uint64_t instance) {
  MutexLock lock(mutex_);
  auto it = up_.find(peer);
  if (it == up_.end()) return;
  auto link = it->second.find(instance);
  if (link != it->second.end() && --link->second == 0) it->second.erase(link);
  if (it->second.empty()) up_.erase(it);
}

}  // namespace framelink
