#include "config/config_reload.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace framelink {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "-" : out;
}

// One line per peer added, removed or changed, and what changed.
void comparePeers(const Config& running, const Config& read, std::vector<std::string>& applied) {
  for (const PeerConfig& old : running.peers) {
    if (read.peer(old.name) != nullptr) continue;
    // Only a token of its own is a credential the removal takes away: one
    // that proves its id with link.token or a certificate may dial in again.
    applied.push_back("[[peer]] " + old.name + " removed" +
                      (old.token.empty()
                           ? " (no longer dialed; it may still dial in with link.token or its certificate)"
                           : " (its links end and its token is refused)"));
  }
  for (const PeerConfig& p : read.peers) {
    const PeerConfig* old = running.peer(p.name);
    if (old == nullptr) {
      applied.push_back("[[peer]] " + p.name + " added" +
                        (p.address.empty() ? " (dials in)" : " (dials " + p.address + ")"));
      continue;
    }
    if (old->address != p.address) {
      applied.push_back("[[peer]] " + p.name + " address " + (old->address.empty() ? "-" : old->address) +
                        " -> " + (p.address.empty() ? "-" : p.address) + " (its dialed link moves)");
    }
    if (old->streams != p.streams) {
      applied.push_back("[[peer]] " + p.name + " streams " + joined(old->streams) + " -> " +
                        joined(p.streams));
    }
    if (old->token != p.token) applied.push_back("[[peer]] " + p.name + " token rotated (new links use it)");
    if (old->cert_name != p.cert_name) {
      applied.push_back("[[peer]] " + p.name + " cert_name '" + old->cert_name + "' -> '" + p.cert_name +
                        "'");
    }
  }
}

}  // namespace

void copyReloadable(const Config& from, Config& into) {
  into.log_level = from.log_level;
  into.peers = from.peers;
  into.token = from.token;
  into.token_file = from.token_file;
  into.ack_timeout_ms = from.ack_timeout_ms;
  into.credit_timeout_ms = from.credit_timeout_ms;
  into.tls_crl_file = from.tls_crl_file;
  into.tls_crl_pem = from.tls_crl_pem;
  into.tls_crl_revoked = from.tls_crl_revoked;
}

ReloadPlan planReload(const Config& running, const Config& read) {
  ReloadPlan plan{running, {}, {}};
  Config& next = plan.next;
  if (running.log_level != read.log_level) {
    plan.applied.push_back("[daemon] log_level " + running.log_level + " -> " + read.log_level);
  }
  comparePeers(running, read, plan.applied);
  if (running.token != read.token) plan.applied.emplace_back("[link] token rotated (new links use it)");
  if (running.ack_timeout_ms != read.ack_timeout_ms) {
    plan.applied.push_back("[link] ack_timeout_ms " + std::to_string(running.ack_timeout_ms) + " -> " +
                           std::to_string(read.ack_timeout_ms) + " (frames sent from now)");
  }
  if (running.credit_timeout_ms != read.credit_timeout_ms) {
    plan.applied.push_back("[link] credit_timeout_ms " + std::to_string(running.credit_timeout_ms) + " -> " +
                           std::to_string(read.credit_timeout_ms) + " (frames sent from now)");
  }
  if (running.tls_crl_file != read.tls_crl_file || running.tls_crl_pem != read.tls_crl_pem) {
    plan.applied.push_back(
        read.tls_crl_file.empty()
            ? std::string("[link] tls_crl_file removed (no certificate is refused as revoked)")
            : "[link] tls_crl_file " + read.tls_crl_file + ": " + std::to_string(read.tls_crl_revoked) +
                  " certificates revoked (links of those peers are cut; they are refused when they link "
                  "again)");
  }
  copyReloadable(read, next);
  // What is left different needs a restart.
  for (std::string& key : changedOptions(next, read)) plan.restart.push_back(std::move(key));
  // The same TLS files with other contents: applied, as the listener and the
  // dialers watch the files (peer_grpc_options.cpp) -- each handshake after
  // the next read uses them.  Other files are a restart (the paths are options).
  struct TlsContents {
    std::string Config::*pem;
    const char* name;
  };
  static constexpr TlsContents kTlsContents[] = {
      {&Config::tls_ca_pem, "[link] tls_ca_file: the certificates in it"},
      {&Config::tls_cert_pem, "[link] tls_cert_file: the certificate in it"},
      {&Config::tls_key_pem, "[link] tls_key_file: the key in it"}};
  const bool same_files = running.tls_ca_file == read.tls_ca_file &&
                          running.tls_cert_file == read.tls_cert_file &&
                          running.tls_key_file == read.tls_key_file;
  for (const TlsContents& t : kTlsContents) {
    if (!same_files || running.*t.pem == read.*t.pem) continue;
    plan.applied.push_back(std::string(t.name) + " changed (links set up from now use it; links up run on)");
    next.*t.pem = read.*t.pem;
  }
  if (same_files) next.tls_no_peer_certs = read.tls_no_peer_certs;
  return plan;
}

std::string configHash(const Config& config) {
  // FNV-1a over the described settings and the secrets describe() redacts.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const std::string& s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 0x100000001b3ULL;
    }
    h ^= 0xff;  // a separator no text holds
    h *= 0x100000001b3ULL;
  };
  Config shown = config;
  shown.config_file.clear();  // the same settings from another path are the same configuration
  mix(describe(shown));
  mix(config.token);
  for (const PeerConfig& p : config.peers) mix(p.token);
  mix(config.tls_cert_pem);  // a certificate renewed in place
  mix(config.tls_ca_pem);
  char out[17];
  std::snprintf(out, sizeof out, "%016" PRIx64, h);
  return out;
}

}  // namespace framelink
