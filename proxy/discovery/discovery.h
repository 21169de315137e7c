// [discovery]: this daemon's entry in the fleet's registry (etcd_registry.h),
// kept alive and up to date (its readers and producers looked at every
// poll_ms), and the other daemons' entries, read at start and again when a
// watch of the registry says one changed; a thread for each.
//
// Or, where the fleet is the SRV records of a name (dns_srv.h): the records
// read every dns_refresh_s, and each daemon they name asked what it is
// (Describe, link/peer_describe.h) when its address is new.  Each call says
// what this daemon is too, so when its readers or producers change it asks
// every daemon at once -- they hear of it (heard()) as an etcd watch would
// tell them -- and while it has producers, whose routes follow the others'
// readers, it asks every daemon again at each read (what a call missed).
// Nothing is published: the DNS server's records are the operator's (or
// Kubernetes').  One thread.  What it finds
// goes to `found` when it changed: the daemon turns it into peers
// (DaemonImpl::applyFound).  An idle fleet makes no request but the
// keep-alives, one per daemon every third of the lease's TTL.
//
// A registry that stops answering changes nothing that runs: the last
// entries found stay, the daemon says so once (log, the gauge
// framelink_discovery_registry_up, doctor), and this daemon's entry is
// published again, under a new lease if etcd lost the old one, once it answers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "discovery/dns_srv.h"
#include "discovery/etcd_registry.h"

namespace framelink {

class Metrics;

// What a daemon said of itself (its entry: a Describe answer, or a call it
// made), and when, on its own monotonic clock: of two words of one instance
// (one process) the later counts.
struct Said {
  RegistryEntry entry;
  uint64_t as_of_ns = 0;
};

// A daemon found in the registry, and whether this one links to it now.
struct FoundDaemon {
  RegistryEntry entry;
  bool dial = false;
  bool operator==(const FoundDaemon&) const = default;
};

// Whether this daemon (`self`, with the streams its clients read and write)
// needs a link to `other`: it has a producer of a stream `other` reads.
bool needsLink(const RegistryEntry& self, const RegistryEntry& other);
// Whether it dials `other` when it needs a link: unless `other` needs one to
// it too and dials (its id sorts first) -- one link per pair.
bool dialsFor(const RegistryEntry& self, const RegistryEntry& other);

// `config` with the daemons found in the registry as its peers beside the
// written ones (PeerConfig::discovered; those found before are replaced).  A
// written [[peer]] of the same id wins.  Those it dials have their address;
// the others none (a link they dial is taken).  Their streams are the readers
// they announced; under TLS a found daemon's certificate must name its id.
Config withFoundPeers(Config config, const std::vector<FoundDaemon>& found);
// What changed between the found peers of two configurations, a line each:
// "hostc found at 10.0.0.3:7700 (readers: cam0)", "hostd gone from the registry".
std::vector<std::string> foundChanges(const Config& before, const Config& after);

class Discovery {
 public:
  using Found = std::function<void(const std::vector<FoundDaemon>& others)>;
  // Asks the daemons at `targets` what they are, saying `self` (the daemon's
  // describePeers): what each said, in their order, or why not.
  using Describe =
      std::function<std::vector<Result<Said>>(const std::vector<SrvTarget>& targets, const Said& self)>;
  // `self`: this daemon's entry but its readers and producers, which come
  // from `metrics` (Metrics::streamsHere) each round.  A
  // link is dialed while a stream needs it and link_idle_s after (dialsFor).
  // `describe`: used under dns_srv only.
  Discovery(const Config& config, RegistryEntry self, Metrics& metrics, Found found, Describe describe);
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Stops the thread.  `withdraw`: the entry goes from the registry at once (a
  // daemon that stops for good); else it lives out its lease (a hot restart:
  // the next daemon publishes it again).
  void stop(bool withdraw);

  // dns_srv: a daemon that asked this one said what it is (its id proven by
  // the call's credentials): taken at the next round, where it is the
  // instance a record's address answered for and later than what it said
  // then.  From a gRPC thread; never blocks on the registry.
  void heard(Said said);

 private:
  void run();
  void round();
  // Reads every entry (entries_, revision_); false when etcd did not answer.
  bool readRegistry();
  // dns_srv: a round.  The records read again when due, or at once when this
  // daemon's own streams changed (every daemon then is asked, and so told).
  void roundDns(const RegistryEntry& self, std::chrono::steady_clock::time_point now);
  // The records, and what the daemons they name say they are (described_);
  // false when no DNS server answered.  `all`: every daemon is asked, else
  // only those at an address not asked before.
  bool readDns(const RegistryEntry& self, bool all);
  // Asks the daemons at `ask`, saying `self`: what each answers goes in
  // described_, a refusal or silence in `refused` or `unanswered`.
  void askRecords(const std::vector<SrvTarget>& ask, const RegistryEntry& self,
                  std::vector<std::string>& refused, std::vector<std::string>& unanswered);
  // The DNS server is away, and this daemon's streams changed: the daemons
  // of the records it last read are told (and asked) all the same.
  void tellKnown(const RegistryEntry& self);
  // entries_ from described_, each updated by what its daemon told this one
  // since; the last read's refusals (dns_refused_) stand.  `answered`: from
  // a read the DNS server answered (else it is still away).
  void listDescribed(bool answered = true);
  // What a read found and left out ("what: why"), logged when it changed;
  // `refused` counted (discovery_entries_refused), `unanswered` not (a daemon
  // down or busy is no false claim); the registry answered, unless `answered` is false.
  void listed(std::vector<RegistryEntry> entries, const std::vector<std::string>& refused,
              const std::vector<std::string>& unanswered = {}, bool answered = true);
  // Which found daemons this one dials now, from entries_; `found_` when it changed.
  void decide(const RegistryEntry& self, std::chrono::steady_clock::time_point now);
  void watch();
  void registryFailed(const std::string& what, const Error& error);

  std::unique_ptr<EtcdRegistry> registry_;  // null under dns_srv
  const std::string registry_name_;         // "etcd URLS" or "DNS SRV NAME", for messages
  RegistryEntry self_;
  Metrics& metrics_;
  Found found_;
  const std::chrono::milliseconds poll_;
  const std::chrono::milliseconds keepalive_every_;
  std::chrono::steady_clock::time_point kept_alive_{};
  std::chrono::steady_clock::time_point retry_at_{};  // after a failed request: the next one
  bool published_ = false;
  RegistryEntry published_entry_;
  bool answered_ = true;  // the registry answered the last request (no outage to report)
  bool have_found_ = false;
  std::vector<FoundDaemon> last_found_;
  bool listed_ = false;                 // entries_ was read
  std::vector<RegistryEntry> entries_;  // the registry, as last read
  const std::chrono::seconds link_idle_;
  std::map<std::string, std::chrono::steady_clock::time_point> needed_until_;  // by id, while dialed
  RegistryEntry decided_for_;                            // the entry `last_found_` was decided for
  std::chrono::steady_clock::time_point next_expiry_{};  // the first of needed_until_
  std::string refused_before_;                           // what the last list refused, logged when it changes

  // dns_srv
  const std::string srv_name_;
  const std::string dns_server_;
  Describe describe_;
  const std::chrono::seconds dns_refresh_;
  std::chrono::steady_clock::time_point next_resolve_{};  // the records' next read
  std::map<std::string, Said> described_;                 // by the address asked: what it said last
  std::vector<SrvTarget> records_;                        // as the DNS server last gave them
  std::vector<std::string> dns_refused_;                  // what the last read refused, and why
  std::vector<std::string> dns_unanswered_;               // who did not answer it
  RegistryEntry told_;  // this daemon's streams as it last told every daemon
  // By id and instance: what daemons told this one (under mutex_).
  std::map<std::pair<std::string, uint64_t>, Said> heard_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool mine_changed_ = false;  // this daemon's readers or producers changed (Metrics' streams watcher)
  bool stopping_ = false;
  bool withdraw_ = false;
  bool changed_ = false;  // the watch saw a change (or ended): the registry is read again
  int64_t revision_ = 0;  // the registry's, when read last; the watch goes on from the next
  bool watch_exited_ = false;
  std::thread thread_;
  std::thread watch_thread_;
};

}  // namespace framelink
