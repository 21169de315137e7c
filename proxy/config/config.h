// framelinkd configuration: one TOML file (--config) plus command-line flags
// that override it.  Everything is validated here, at start-up, so that a
// mistake in the file or on the command line stops the daemon with a message
// that names the key and says what to write instead -- rather than surfacing
// later as a refused peer link or a failed attach.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "framelink/framelink.h"

namespace framelink {

// The most peers one stream may be routed to (each gets every frame).
inline constexpr size_t kMaxRoutesPerStream = 63;

struct PeerConfig {
  std::string name;
  // HOST:PORT of the peer's gRPC listener; this daemon dials it.  Empty: the
  // peer only dials in (its [[peer]] names only how it proves its id).
  std::string address;
  std::vector<std::string> streams;  // stream names (or "*") routed to this peer; see routesFor()
  // The secret this daemon and this peer share, both ways: the peer proves its
  // id with it when it dials in, and this daemon presents it when it dials the
  // peer.  Empty: link.token.  A leaked token then lets its holder pass for
  // that one peer only.
  std::string token;
  std::string token_file;  // where `token` was read from, if from a file
  // With mutual TLS: the name its certificate (common name or a DNS name)
  // must carry when it dials in.  Empty: its id under tls_require_cert_name,
  // else the certificate's names are not checked.
  std::string cert_name;
  // Found in the registry ([discovery]), not written in the configuration:
  // `streams` are the streams it has readers for, routed there unless a
  // written peer's streams name them (Config::routesFor), and its id is a
  // claim its certificate (under TLS) and its HelloAck must prove.
  bool discovered = false;
  // Discovered: of `streams`, those a subscriber reads there, and those a
  // member of a queue group reads there (RegistryEntry).
  std::vector<std::string> subscribed;
  std::vector<std::string> grouped;
  bool operator==(const PeerConfig&) const = default;
};

// Which of a stream's frames a route carries: every frame (a written peer,
// or a daemon of an earlier release), or -- the readers a registry
// announced -- those of the subscribers there, and one frame in N for a
// queue group that spans N hosts (a frame goes to one of them).
enum class RouteReaders : uint8_t {
  kEvery,        // every frame, to every reader there
  kSubscribers,  // every frame, to the subscribers there only
  kGroup,        // the frames its queue group gets here
  kBoth,         // every frame to its subscribers, and the queue group's share
  kNone,         // none: a found daemon whose readers of it left (or that left the registry)
};

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// How often the daemon reads its TLS files (tls_cert_file, tls_key_file,
// tls_ca_file) again: what changed in them -- a peer's certificate appended,
// a certificate renewed in place -- applies to the handshakes that follow
// (link/peer_grpc_options.cpp), without a restart.
inline constexpr unsigned kTlsFilesRefreshSeconds = 5;

struct Config {
  // [daemon]
  std::string id;  // default: gethostname()
  std::string socket_path = FL_DEFAULT_SOCKET_PATH;
  uint32_t socket_mode = 0660;
  std::string socket_group;  // empty: leave the group the socket was created with
  // Members of this group (besides root and the daemon's own uid and gid) may
  // send admin requests (framelink stats/clients/links); empty: the socket's group.
  std::string admin_group;
  std::vector<uint32_t> allowed_uids, allowed_gids;  // both empty: anyone who can open the socket
  std::string hugepages = "auto";                    // auto | on | off
  std::string log_level = "info";                    // trace | debug | info | warn | error
  std::string ready_file;                            // empty: do not write one
  int cpu = -1;                                      // pin the data agent; -1: do not pin
  // The data agent spins this long after its last work, yields as long again,
  // then sleeps in epoll; 0: sleep at once (least CPU, more latency).
  uint32_t idle_spin_us = 50;
  // Written into each client's segment header: how long a client that sets
  // no wait_spin_us of its own looks at its ring before it sleeps, so that
  // one file sets both ends' spin; 0: the clients sleep at once.
  uint32_t client_wait_spin_us = FL_WAIT_SPIN_DEFAULT_US;
  // On SIGTERM the daemon refuses new frames and gives those in progress this
  // long to end with their true status before it stops; 0: stop at once.
  uint32_t drain_timeout_ms = 5000;

  // [link]
  std::string listen = "0.0.0.0:7700";
  std::string data_listen;  // empty: listen's host, its port + 1 (0 stays 0); set by parseConfig
  std::string token;        // empty: peer links are not authenticated
  std::string token_file;   // where `token` was read from, if from a file
  std::vector<std::string> transports{"tcp", "grpc"};  // preference order
  // Local delivery copies these streams' frames into the consumer's slot
  // instead of lending the producer's (design §4a).
  std::vector<std::string> copy_streams;
  // Local delivery skips a subscriber of these streams for a frame, instead
  // of waiting for it, while more than drop_lag frames wait (design §4a).
  // Below the producers' slot count (default_slot_count 8), or the producer
  // runs out of slots before a frame is ever skipped.
  std::vector<std::string> drop_streams;
  uint32_t drop_lag = 4;
  // Peers' frames of these streams are pulled by this daemon: the sender
  // offers each frame and this end reads it into a consumer's slot when it
  // has room, with at most pull_reads_per_link reads in flight per link
  // (design §5, "Pull").  The others are pushed (written by the sender).
  std::vector<std::string> pull_streams;
  uint32_t pull_reads_per_link = 32;
  uint32_t ack_timeout_ms = 30000, credit_timeout_ms = 30000, connect_timeout_ms = 5000, keepalive_ms = 1000,
           reconnect_min_ms = 100, reconnect_max_ms = 5000;
  // A link on which nothing arrives for this long is given up, although its
  // call is still open: the path carries only the other direction (or
  // nothing), and neither gRPC nor TCP notices while our writes still go.
  // 0: never.
  uint32_t link_timeout_ms = 10000;
  // How long a consumer's release may wait before its ACK and its slot's
  // credit go back to the sender, so that several go in one control record;
  // they go sooner once a quarter of the sender's window waits, or when the
  // sender says it is low on credits.  0: at the end of the round.
  uint32_t ack_delay_us = 20;
  uint64_t grpc_chunk_bytes = 4 * kMiB;
  uint64_t tcp_zerocopy_bytes = kMiB / 4;  // a tcp frame this large goes with MSG_ZEROCOPY; 0: never
  // rdma: the device (empty: the one that owns the host of `listen`, or the
  // address a peer link resolves to), the rdma_cm port this daemon listens
  // on (0: ephemeral; either way announced to peers in the HelloAck), and how
  // often a link that fell back to another transport tries rdma again.
  std::string rdma_device;
  uint32_t rdma_port = 0;
  uint32_t rdma_retry_ms = 30000;
  // TLS on the gRPC link (the control session and the grpc data transport):
  // on when tls_cert_file is set.  The listener presents cert + key and, with
  // tls_client_auth, requires a client certificate signed by tls_ca_file
  // (mutual TLS); a dialing daemon presents the same pair and verifies the
  // peer against tls_ca_file (empty: the system's CA store), by the host of
  // the peer address or by tls_server_name.  parseConfig reads the files into
  // the *_pem fields.
  std::string tls_cert_file, tls_key_file, tls_ca_file, tls_server_name;
  // CRLs of tls_ca_file's CAs (config/tls_crl.h): a peer whose certificate
  // they list is refused when it links, either way (link/peer_identity.h);
  // read at start and at each reload into tls_crl_pem; tls_crl_revoked: how
  // many serials they list in all (checkCrls counted them).
  std::string tls_crl_file, tls_crl_pem;
  size_t tls_crl_revoked = 0;
  bool tls_client_auth = false;
  // With tls_client_auth: a dialing peer's certificate must name the daemon
  // id its Hello claims (or its [[peer]]'s cert_name), so that a certificate
  // the CA signed for one host cannot pass for another.
  bool tls_require_cert_name = false;
  std::string tls_cert_pem, tls_key_pem, tls_ca_pem;  // as read at start or by the last reload
  // tls_ca_file is missing or holds no certificate (the packaged peers.pem
  // before the operator copies a peer's certificate into it): gRPC's watcher
  // reads no root from it, so the daemon trusts no one (not the system's CA
  // store) and links with no peer, but still serves local clients; a
  // certificate appended later is read within kTlsFilesRefreshSeconds.
  // tls_ca_pem then holds the daemon's own certificate, for the reload's
  // comparison only.
  bool tls_no_peer_certs = false;
  // Listening for peers on a non-loopback address with neither a token nor
  // TLS lets any host that reaches the port link and push frames: refused
  // unless this says the operator wants it (then a warning at start).
  bool allow_unauthenticated = false;
  // Whether peers can reach this daemon from other hosts without presenting
  // a token or a certificate.
  bool unauthenticatedFromNetwork() const;
  // Where a peer token crosses the network without TLS (metadata and Hello
  // carry it as it is): the address it goes to or comes from, the listener's
  // first; empty when there is no token, TLS is on, or every link stays on
  // this host.
  std::string tokenInClearAt() const;
  // The [[peer]] named `name`; nullptr when none is.
  const PeerConfig* peer(std::string_view name) const;
  // The token this daemon and the daemon `id` share: its [[peer]]'s own, else
  // link.token (empty: none).
  const std::string& peerToken(std::string_view id) const;
  // Whether some [[peer]] has a token of its own.  A dialer then proves its id
  // with a token (its own, or link.token for ids without one) or with a
  // certificate name; one with neither is refused.
  bool peerTokens() const;
  // The name a dialer claiming `id` must carry in its certificate: its
  // [[peer]]'s cert_name, else `id` under tls_require_cert_name, else "".
  std::string certNameFor(std::string_view id) const;
  bool tlsEnabled() const noexcept { return !tls_cert_file.empty(); }
  // Tests only: wrap every link's transport in the `faulty` decorator with
  // this spec (see transport/faulty/faulty_transport.h).  Empty: no faults.
  std::string fault_inject;

  // [limits]
  uint64_t max_slot_size = 64 * kMiB;
  uint32_t max_slots = 1024;
  uint64_t max_client_bytes = 1 * kGiB;
  // Segment bytes one uid's clients may hold together, and all clients
  // together: every byte is populated at attach and, for an rdma consumer,
  // pinned, so these bound the memory local users can make the daemon hold.
  // 0: "auto", sized from the host's RAM at start (attach/segment_quota.h).
  uint64_t max_uid_bytes = 0;
  uint64_t max_total_bytes = 0;
  uint32_t default_slot_count = 8;
  uint64_t default_slot_size = 4 * kMiB;
  // Clients one uid may have attached at once (each holds four of the
  // daemon's descriptors and its segments), and connections it may have
  // waiting to attach: one user cannot take every client slot and
  // descriptor from the others.
  uint32_t max_clients_per_uid = 256;

  // [metrics]
  std::string metrics_listen;  // empty: no metrics endpoint

  // [discovery]: the daemons find each other in etcd or DNS SRV records (discovery/).
  std::string discovery_etcd;                    // http://HOST:PORT[,...]; empty: no registry
  std::string discovery_prefix = "/framelink/";  // this fleet's keys: PREFIX daemons/ID
  std::string discovery_advertise;               // HOST:PORT peers dial; empty: link.listen
  uint32_t discovery_lease_ttl_s = 30;           // an entry outlives its daemon by this at most
  uint32_t discovery_poll_ms = 30000;            // own streams looked at, at the latest (changes: at once)
  uint32_t discovery_link_idle_s = 30;           // a found daemon's link no stream needs ends after this
  std::string discovery_dns_srv;                 // or: the fleet is the SRV records of this name
  std::string discovery_dns_server;              // IP[:PORT] asked for them; empty: resolv.conf's
  uint32_t discovery_dns_refresh_s = 5;          // how often the SRV records are read
  bool discoveryEnabled() const noexcept { return !discovery_etcd.empty() || !discovery_dns_srv.empty(); }

  // [[peer]]
  std::vector<PeerConfig> peers;

  // Where the configuration came from (empty: flags only); for the start-up log.
  std::string config_file;

  // --help, --version and --print-config-reference: parseConfig() succeeds with exit_now set and the text
  // to print in exit_message.  The caller prints it to stdout and exits 0
  // without starting anything; every other field is then unspecified.
  bool exit_now = false;
  std::string exit_message;

  // The peers a producer stream is routed to, in the order configured (each
  // gets every frame), or none:
  //   1. every peer whose streams list the name itself;
  //   2. else every peer whose streams contain "*";
  //   3. else, when exactly one peer has no streams list at all, that peer
  //      (so a daemon with a single peer and no routes sends everything there);
  //   4. else none (the frame goes to the consumers attached to this daemon,
  //      and fails with FL_ERR_NO_ROUTE when there is none).
  std::vector<std::string> routesFor(const std::string& stream) const;
  // Which of the stream's frames its route to `peer` carries (kEvery: a
  // written peer, one not found, or a daemon that did not say).
  RouteReaders routeReaders(const std::string& peer, const std::string& stream) const;
  // True when routesFor() names a peer by rule 3 only (no streams list
  // anywhere names this stream or "*"): a consumer of the stream attached to
  // this daemon then takes its frames instead (local delivery).
  bool routeIsImplicit(const std::string& stream) const;
  // What the peers' routes leave out although it is no error: a stream that
  // worked with one peer and no routes goes nowhere once a second peer
  // without a streams list is added (rule 3 needs exactly one).  One line
  // each, naming the peers and what to write; logged at start and printed
  // by --check-config.
  std::vector<std::string> routeWarnings() const;
  // Why routesFor(stream) is empty, for a refusal: "no peer is configured
  // for stream 'x'", or which rule left it out.
  std::string whyNoRoute(const std::string& stream) const;
};

// Every setting is a row of the option table (config_options.h): its TOML
// key, its flag, its help text and its checks are written once, there.
//
// Parses the framelinkd command line (see docs/reference/configuration.md).  With
// --config FILE the TOML file is loaded first and flags given on the command
// line override it: scalar flags replace the file's value, --allowed-uids /
// --allowed-gids / --transports replace the file's list, --peer adds a peer (or
// replaces the address of the file's peer of that name), --route STREAM=PEER
// adds STREAM to that peer's streams.  Errors carry FL_EINVAL and a message
// that names the offending flag or key (and file) and the expected form.
Result<Config> parseConfig(int argc, const char* const* argv);

// One line for the start-up log: every effective setting, the token redacted:
// "config=FILE [daemon] id=a socket=... [link] listen=... token=<redacted> ...
//  [limits] ... [metrics] listen=off [[peer]] {b=h:1[cam0]}".
std::string describe(const Config& config);
// The options whose shown values (describe's) differ between two
// configurations, as "[section] key" ("[[peer]]" for the peers): what a
// reload would change.  Secrets show redacted: a token changed within the
// same file or flag is not seen here.
std::vector<std::string> changedOptions(const Config& running, const Config& next);

// The configuration table of docs/reference/configuration.md (markdown), one row per setting; printed
// by framelinkd --print-config-reference.
std::string configReference();

// The token files (link.token_file, [[peer]] token_file) that users other
// than the daemon's can read or write: one warning each, for the start-up log.
std::vector<std::string> exposedTokenFiles(const Config& config);

}  // namespace framelink
