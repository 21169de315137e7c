// [discovery]: this daemon's entry in the fleet's registry (etcd_registry.h),
// kept alive and up to date (its readers and producers looked at every
// poll_ms), and the other daemons' entries, read at start and again when a
// watch of the registry says one changed; a thread for each.  What it finds
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
#include <vector>

#include "config/config.h"
#include "discovery/etcd_registry.h"

namespace framelink {

class Metrics;

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
  // `self`: this daemon's entry but its readers and producers, which come
  // from `metrics` (Metrics::readerStreams, producerStreams) each round.  A
  // link is dialed while a stream needs it and link_idle_s after (dialsFor).
  Discovery(const Config& config, RegistryEntry self, Metrics& metrics, Found found);
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Stops the thread.  `withdraw`: the entry goes from the registry at once (a
  // daemon that stops for good); else it lives out its lease (a hot restart:
  // the next daemon publishes it again).
  void stop(bool withdraw);

 private:
  void run();
  void round();
  // Reads every entry (entries_, revision_); false when etcd did not answer.
  bool readRegistry();
  // Which found daemons this one dials now, from entries_; `found_` when it changed.
  void decide(const RegistryEntry& self, std::chrono::steady_clock::time_point now);
  void watch();
  void registryFailed(const std::string& what, const Error& error);

  EtcdRegistry registry_;
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

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool withdraw_ = false;
  bool changed_ = false;  // the watch saw a change (or ended): the registry is read again
  int64_t revision_ = 0;  // the registry's, when read last; the watch goes on from the next
  bool watch_exited_ = false;
  std::thread thread_;
  std::thread watch_thread_;
};

}  // namespace framelink
