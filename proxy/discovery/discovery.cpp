#include "discovery/discovery.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>

#include "metrics/metrics.h"

namespace framelink {

namespace {

// The most daemons whose word (heard()) is kept between two reads of the records.
constexpr size_t kMaxHeard = 4096;
// The most SRV records asked (by priority, weight, host): the rest are left out.
constexpr size_t kMaxRecords = 1024;

std::vector<std::string> splitEndpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// "readers: cam0 [subscribers, queue group], cam1 [queue group]" (no
// brackets: a release that does not say which).
std::string readersText(const PeerConfig& p) {
  if (p.streams.empty()) return "no readers";
  std::string out = "readers: ";
  for (size_t i = 0; i < p.streams.size(); ++i) {
    const std::string& name = p.streams[i];
    const bool subscribed = std::binary_search(p.subscribed.begin(), p.subscribed.end(), name);
    const bool grouped = std::binary_search(p.grouped.begin(), p.grouped.end(), name);
    out += (i ? ", " : "") + name;
    if (subscribed || grouped) {
      out += std::string(" [") + (subscribed ? "subscribers" : "") + (subscribed && grouped ? ", " : "") +
             (grouped ? "queue group" : "") + "]";
    }
  }
  return out;
}

}  // namespace

bool needsLink(const RegistryEntry& self, const RegistryEntry& other) {
  // Both sorted: one walk.
  auto p = self.producers.begin();
  auto r = other.readers.begin();
  while (p != self.producers.end() && r != other.readers.end()) {
    if (*p == *r) return true;
    if (*p < *r) {
      ++p;
    } else {
      ++r;
    }
  }
  return false;
}

bool dialsFor(const RegistryEntry& self, const RegistryEntry& other) {
  return !(needsLink(other, self) && other.id < self.id);
}

Config withFoundPeers(Config config, const std::vector<FoundDaemon>& found) {
  std::erase_if(config.peers, [](const PeerConfig& p) { return p.discovered; });
  const size_t written = config.peers.size();
  for (const FoundDaemon& f : found) {
    const RegistryEntry& e = f.entry;  // a name, not a binding: the lambda below captures it
    if (e.id == config.id) continue;
    const auto same = std::find_if(config.peers.begin(), config.peers.begin() + static_cast<long>(written),
                                   [&](const PeerConfig& p) { return p.name == e.id; });
    if (same != config.peers.begin() + static_cast<long>(written)) continue;
    PeerConfig p;
    p.name = e.id;
    p.address = f.dial ? e.address : "";
    p.streams = e.readers;
    p.subscribed = e.subscribed;
    p.grouped = e.grouped;
    p.cert_name = config.tlsEnabled() ? e.id : "";
    p.discovered = true;
    config.peers.push_back(std::move(p));
  }
  return config;
}

std::vector<std::string> foundChanges(const Config& before, const Config& after) {
  std::vector<std::string> out;
  auto find = [](const Config& c, const std::string& name) -> const PeerConfig* {
    for (const auto& p : c.peers) {
      if (p.discovered && p.name == name) return &p;
    }
    return nullptr;
  };
  for (const auto& p : after.peers) {
    if (!p.discovered) continue;
    const PeerConfig* was = find(before, p.name);
    const std::string how = p.address.empty() ? "not dialed from here" : "dialed at " + p.address;
    if (was == nullptr) {
      out.push_back(p.name + " found (" + how + "; " + readersText(p) + ")");
    } else if (!(*was == p)) {
      out.push_back(p.name + " changed (" + how + "; " + readersText(p) + ")");
    }
  }
  for (const auto& p : before.peers) {
    if (p.discovered && find(after, p.name) == nullptr) out.push_back(p.name + " gone from the registry");
  }
  return out;
}

Discovery::Discovery(const Config& config, RegistryEntry self, Metrics& metrics, Found found,
                     Describe describe)
    : registry_(config.discovery_etcd.empty()
                    ? nullptr
                    : std::make_unique<EtcdRegistry>(splitEndpoints(config.discovery_etcd),
                                                     config.discovery_prefix, config.discovery_lease_ttl_s)),
      registry_name_(registry_ ? "etcd " + config.discovery_etcd : "DNS SRV " + config.discovery_dns_srv),
      self_(std::move(self)),
      metrics_(metrics),
      found_(std::move(found)),
      poll_(config.discovery_poll_ms),
      keepalive_every_(std::chrono::milliseconds(config.discovery_lease_ttl_s * 1000 / 3)),
      link_idle_(config.discovery_link_idle_s),
      srv_name_(config.discovery_dns_srv),
      dns_server_(config.discovery_dns_server),
      describe_(std::move(describe)),
      dns_refresh_(config.discovery_dns_refresh_s) {
  if (registry_) {
    spdlog::info("discovery: publishing '{}' at {} in etcd {} ({}daemons/), lease {} s", self_.id,
                 self_.address, config.discovery_etcd, config.discovery_prefix, config.discovery_lease_ttl_s);
  } else {
    spdlog::info("discovery: the fleet is the SRV records of {} (read every {} s{}{})", srv_name_,
                 dns_refresh_.count(), dns_server_.empty() ? "" : ", from the DNS server at ", dns_server_);
  }
  // Whatever changes here is told at once, not at the next poll: an idle
  // fleet's daemons then need not look often (poll_ms is the safety net).
  metrics_.setStreamsWatcher([this] {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mine_changed_ = true;
    }
    wake_.notify_all();
  });
  thread_ = std::thread([this] { run(); });
  if (registry_) watch_thread_ = std::thread([this] { watch(); });
}

Discovery::~Discovery() { stop(false); }

void Discovery::stop(bool withdraw) {
  metrics_.setStreamsWatcher({});  // before mutex_: the watcher runs under the metrics' lock and takes it
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    withdraw_ = withdraw;
  }
  wake_.notify_all();
  // Again until the watch thread is out: a watch stopped just before its
  // connection was made would otherwise wait on it for good.
  std::unique_lock<std::mutex> lock(mutex_);
  while (watch_thread_.joinable() && !watch_exited_) {
    lock.unlock();
    registry_->stopWatch();
    lock.lock();
    wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return watch_exited_; });
  }
  lock.unlock();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (thread_.joinable()) thread_.join();
}

void Discovery::run() {
  ::pthread_setname_np(::pthread_self(), "fl-discovery");
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    mine_changed_ = false;  // round() reads them
    lock.unlock();
    round();
    lock.lock();
    // Awake for the next of: the lease's keep-alive (a third of its TTL), a
    // change of this daemon's own readers and producers (the streams
    // watcher; poll_ms at the latest), a change the watch saw, and the end
    // of a link's idle time.
    // After a failure, not before retry_at_: a registry that does not answer is not hammered.
    const auto now = std::chrono::steady_clock::now();
    auto next = now + poll_;
    if (published_) next = std::min(next, kept_alive_ + keepalive_every_);
    if (!registry_) next = std::min(next, next_resolve_);
    if (next_expiry_ != std::chrono::steady_clock::time_point{}) next = std::min(next, next_expiry_);
    wake_.wait_until(lock, std::max({next, now, retry_at_}), [this] {
      return stopping_ || ((changed_ || mine_changed_) && std::chrono::steady_clock::now() >= retry_at_);
    });
  }
  if (withdraw_ && registry_) {
    lock.unlock();
    registry_->withdraw();
    spdlog::info("discovery: '{}' withdrawn from the registry", self_.id);
  }
}

void Discovery::watch() {
  ::pthread_setname_np(::pthread_self(), "fl-disc-watch");
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    // From the revision after the last read: every change since is seen.
    wake_.wait(lock, [this] { return stopping_ || revision_ > 0; });
    if (stopping_) break;
    const int64_t from = revision_ + 1;
    lock.unlock();
    const Status watched = registry_->watch(from, [this] {
      {
        std::lock_guard<std::mutex> changed(mutex_);
        changed_ = true;
      }
      wake_.notify_all();
    });
    lock.lock();
    if (stopping_) break;
    // Whatever the stream missed while it was down is read again.
    metrics_.counters.discovery_watch_restarts.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("discovery: the registry's watch ended ({}); reading it again",
                  watched ? std::string("no error") : watched.error().message);
    changed_ = true;
    wake_.notify_all();
    wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
  }
  watch_exited_ = true;
  wake_.notify_all();
}

void Discovery::round() {
  RegistryEntry self = self_;
  Metrics::StreamsHere here = metrics_.streamsHere();
  self.readers = std::move(here.readers);
  self.producers = std::move(here.producers);
  self.subscribed = std::move(here.subscribed);
  self.grouped = std::move(here.grouped);
  const auto now = std::chrono::steady_clock::now();
  if (!registry_) return roundDns(self, now);
  if (published_ && now - kept_alive_ >= keepalive_every_) {
    if (Status kept = registry_->keepAlive(); !kept) {
      // A watch on a server that vanished without closing would wait for good: it starts again.
      registry_->interruptWatch();
      if (registry_->leased()) return registryFailed("keeping this daemon's lease alive", kept.error());
      spdlog::warn("discovery: {}; publishing '{}' again under a new lease", kept.error().message, self.id);
      published_ = false;  // the lease is gone, and the entry with it
    } else {
      kept_alive_ = now;
    }
  }
  if (!published_ || !(self == published_entry_)) {
    if (Status put = registry_->publish(self); !put) {
      return registryFailed("publishing this daemon", put.error());
    }
    published_ = true;
    published_entry_ = self;
    kept_alive_ = now;
  }
  bool relist = !listed_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    relist = relist || changed_;
    changed_ = false;
  }
  if (relist && !readRegistry()) return;
  // Nothing to decide again unless the registry, this daemon's streams, or a
  // link's idle time changed: the round of an idle daemon ends here.
  if (!relist && self == decided_for_ && now < next_expiry_) return;
  decide(self, now);
}

bool Discovery::readRegistry() {
  std::vector<std::string> refused;
  auto read = registry_->list(refused);
  if (!read) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      changed_ = true;  // read again after retry_at_
    }
    registryFailed("reading the registry", read.error());
    return false;
  }
  listed(std::move(read->entries), refused);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    revision_ = read->revision;
  }
  wake_.notify_all();
  return true;
}

void Discovery::roundDns(const RegistryEntry& self, std::chrono::steady_clock::time_point now) {
  bool heard_new = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    heard_new = changed_;
    changed_ = false;
  }
  const bool mine_changed = told_.id.empty() || self != told_;  // told_: a `self` of an earlier round
  if (now >= next_resolve_ || mine_changed) {
    if (!readDns(self, mine_changed || !self.producers.empty())) {
      // The DNS server is away: what runs stays, and the daemons it named
      // last go on telling each other what changes.
      if (mine_changed && !described_.empty()) {
        tellKnown(self);
      } else if (!heard_new) {
        return;
      }
      listDescribed(false);
    }
  } else if (heard_new) {
    listDescribed();
  } else if (self == decided_for_ && now < next_expiry_) {
    return;  // nothing new: the round of an idle daemon ends here
  }
  decide(self, now);
}

bool Discovery::readDns(const RegistryEntry& self, bool all) {
  const auto now = std::chrono::steady_clock::now();
  auto records = resolveSrv(srv_name_, dns_server_);
  if (!records) {
    // Read again at retry_at_ (registryFailed), when the thread wakes next.
    registryFailed("reading the SRV records", records.error());
    return false;
  }
  next_resolve_ = now + dns_refresh_;
  std::vector<std::string> refused, unanswered;
  if (records->size() > kMaxRecords) {
    // A name the DNS server lets anyone fill would otherwise have this daemon ask without end.
    refused.push_back(std::to_string(records->size() - kMaxRecords) + " records past the first " +
                      std::to_string(kMaxRecords) + " (a fleet of more daemons is not asked)");
    records->resize(kMaxRecords);
  }
  std::vector<SrvTarget> ask;
  for (const SrvTarget& t : *records) {
    if (all || described_.count(t.address) == 0) ask.push_back(t);
  }
  askRecords(ask, self, refused, unanswered);
  if (all) told_ = self;  // a daemon the call missed hears it at its next call here, or asks
  records_ = *records;
  std::map<std::string, Said> named;              // the records' daemons, by the address they are at now
  std::map<std::string, std::string> address_of;  // by id: the first record's daemon of each id
  for (const SrvTarget& t : *records) {
    auto d = described_.find(t.address);
    if (d == described_.end()) continue;
    auto [first, fresh] = address_of.emplace(d->second.entry.id, t.address);
    if (!fresh && first->second != t.address) {
      refused.push_back(t.host + " (" + t.address + "): it says it is '" + d->second.entry.id + "', as " +
                        first->second + " does: the first record's is taken");
      continue;
    }
    named.emplace(t.address, d->second);
  }
  described_ = std::move(named);  // an address gone from the records is forgotten
  {
    // What daemons no record names told this one is dropped with them, and
    // what an instance that is not the one a record's address answered for said.
    std::set<std::pair<std::string, uint64_t>> answering;
    for (const auto& [address, said] : described_) answering.emplace(said.entry.id, said.entry.instance);
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(heard_, [&](const auto& h) { return answering.count(h.first) == 0; });
  }
  dns_refused_ = std::move(refused);
  dns_unanswered_ = std::move(unanswered);
  listDescribed();
  return true;
}

void Discovery::askRecords(const std::vector<SrvTarget>& ask, const RegistryEntry& self,
                           std::vector<std::string>& refused, std::vector<std::string>& unanswered) {
  if (ask.empty()) return;
  const Said me{self, static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::vector<Result<Said>> answers = describe_(ask, me);
  for (size_t i = 0; i < ask.size() && i < answers.size(); ++i) {
    Result<Said>& answer = answers[i];
    Result<RegistryEntry> checked =
        answer ? checkEntry(answer->entry) : Result<RegistryEntry>(answer.error());
    if (checked) {
      described_[ask[i].address] = Said{std::move(checked).value(), answer->as_of_ns};
    } else {
      // One that answered before keeps what it said: a daemon that does not
      // answer for a while keeps its links and routes, as under etcd.  Only a
      // refusal (its credentials, its id, its answer) counts as a refused entry.
      (checked.error().code == FL_ERR_LINK_LOST ? unanswered : refused)
          .push_back(ask[i].host + " (" + ask[i].address + "): " + checked.error().message);
    }
  }
}

void Discovery::tellKnown(const RegistryEntry& self) {
  std::vector<SrvTarget> ask;
  for (const SrvTarget& t : records_) {
    // Only those it knows: a record whose daemon never answered was no daemon of the fleet then.
    if (described_.count(t.address) != 0) ask.push_back(t);
  }
  std::vector<std::string> refused, unanswered;
  const std::map<std::string, Said> before = described_;
  askRecords(ask, self, refused, unanswered);
  // Not read from the records: an answer that now names another id is left for the next read to judge.
  for (auto& [address, said] : described_) {
    auto was = before.find(address);
    if (was != before.end() && was->second.entry.id != said.entry.id) said = was->second;
  }
  told_ = self;
}

void Discovery::listDescribed(bool answered) {
  std::map<std::pair<std::string, uint64_t>, Said> heard;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    heard = heard_;
  }
  std::vector<RegistryEntry> entries;
  for (auto& [address, said] : described_) {
    // Only the word of the process the record's address answered for: another
    // that gives the same id (a twin, a restart not asked yet) is not it.
    auto h = heard.find({said.entry.id, said.entry.instance});
    if (h != heard.end() && h->second.as_of_ns > said.as_of_ns) {
      // Its word, of the same id and instance, at the record's address.
      said.entry = h->second.entry;
      said.entry.address = address;
      said.as_of_ns = h->second.as_of_ns;
    }
    entries.push_back(said.entry);
  }
  listed(std::move(entries), dns_refused_, dns_unanswered_, answered);
}

void Discovery::heard(Said said) {
  auto checked = checkEntry(std::move(said.entry), false);
  if (!checked) {
    metrics_.counters.discovery_words_dropped.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("discovery: a daemon's word left out: {}", checked.error().message);
    return;
  }
  said.entry = std::move(checked).value();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || registry_) return;
    const std::pair<std::string, uint64_t> key{said.entry.id, said.entry.instance};
    auto known = heard_.find(key);
    if (known == heard_.end()) {
      // Bounded: one word per daemon of the records, which readDns keeps to.
      if (heard_.size() >= kMaxHeard) {
        metrics_.counters.discovery_words_dropped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      heard_.emplace(key, std::move(said));
    } else if (said.as_of_ns > known->second.as_of_ns) {
      known->second = std::move(said);
    } else {
      return;
    }
    changed_ = true;
  }
  wake_.notify_all();
}

void Discovery::listed(std::vector<RegistryEntry> entries, const std::vector<std::string>& refused,
                       const std::vector<std::string>& unanswered, bool answered) {
  if (!answered_ && answered) {
    spdlog::info("discovery: {} answers again{}; {} daemons in the registry",
                 registry_ ? "etcd" : registry_name_, registry_ ? " (" + registry_->endpoint() + ")" : "",
                 entries.size());
    answered_ = true;
  }
  if (answered) metrics_.counters.discovery_registry_up.store(1, std::memory_order_relaxed);
  std::string refused_now;
  for (const auto& why : refused) {
    refused_now += (refused_now.empty() ? "" : "; ") + why;
    // Counted once while it stays: each read that finds it again is not a new one.
    if (refused_before_.find(why) == std::string::npos) {
      metrics_.counters.discovery_entries_refused.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (const auto& why : unanswered) refused_now += (refused_now.empty() ? "" : "; ") + why;
  if (!refused_now.empty() && refused_now != refused_before_) {
    spdlog::warn("discovery: {} registry entries left out: {}", refused.size() + unanswered.size(),
                 refused_now);
  }
  refused_before_ = std::move(refused_now);
  listed_ = true;
  entries_ = std::move(entries);
}

void Discovery::decide(const RegistryEntry& self, std::chrono::steady_clock::time_point now) {
  decided_for_ = self;
  next_expiry_ = std::chrono::steady_clock::time_point::max();
  std::vector<FoundDaemon> others;
  std::map<std::string, std::chrono::steady_clock::time_point> needed;
  for (const auto& e : entries_) {
    if (e.id == self.id) continue;
    // Dialed while a stream needs it (until: max), and link_idle_s after (a
    // producer that comes back soon finds its link up).
    constexpr auto kNeeded = std::chrono::steady_clock::time_point::max();
    auto until = needed_until_.find(e.id);
    if (needsLink(self, e) && dialsFor(self, e)) {
      needed[e.id] = kNeeded;
    } else if (until != needed_until_.end() && dialsFor(self, e)) {
      const auto idle_end = until->second == kNeeded ? now + link_idle_ : until->second;
      if (now < idle_end) needed[e.id] = idle_end;
    }
    const auto need = needed.find(e.id);
    if (need != needed.end() && need->second != kNeeded) next_expiry_ = std::min(next_expiry_, need->second);
    others.push_back(FoundDaemon{e, need != needed.end()});
  }
  needed_until_ = std::move(needed);
  std::sort(others.begin(), others.end(),
            [](const auto& a, const auto& b) { return a.entry.id < b.entry.id; });
  if (have_found_ && others == last_found_) return;
  have_found_ = true;
  last_found_ = others;
  found_(others);
}

void Discovery::registryFailed(const std::string& what, const Error& error) {
  retry_at_ =
      std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(poll_, std::chrono::seconds(1));
  metrics_.counters.discovery_registry_errors.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.discovery_registry_up.store(0, std::memory_order_relaxed);
  if (answered_) {
    spdlog::warn(
        "discovery: {} failed: {}.  The links and routes up stay as they are, and daemons not yet found wait "
        "until {} answers again",
        what, error.message, registry_name_);
    answered_ = false;
  }
}

}  // namespace framelink
