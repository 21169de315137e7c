// The fleet's registry in etcd: each daemon's entry (its id, the address
// other daemons dial, the streams it has readers for) under a key of its
// own, attached to a lease it keeps alive, so that the entry of a daemon
// that died goes after lease_ttl_s.  Spoken through etcd's JSON gateway
// (/v3/..., keys and values base64), which Debian's etcd-server 3.4 serves
// on its client port: HTTP requests on a connection kept open, and a watch
// (one long response, a JSON message a line) that says when an entry
// changed; no etcd client library.
//
// Keys: PREFIX daemons/ID -> {"id", "address", "readers", "producers", "instance", "subscribed", "grouped"}.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"

namespace httplib {
class Client;
}

namespace framelink {

struct RegistryEntry {
  std::string id;
  std::string address;                 // HOST:PORT of its gRPC listener
  std::vector<std::string> readers;    // the streams consumers attached to it read, sorted
  std::vector<std::string> producers;  // the streams producers attached to it write, sorted
  uint64_t instance = 0;               // which run of the daemon published it
  // Of `readers`: the streams a subscriber reads there (each frame to every
  // such host), and those a member of a queue group reads there (each frame
  // to one such host).  Both empty but for `readers`: a release before queue
  // groups spanned hosts, which gets every frame.
  std::vector<std::string> subscribed;
  std::vector<std::string> grouped;
  bool operator==(const RegistryEntry&) const = default;
};

// An entry as the registry holds it (JSON) and back.  parseEntry refuses,
// with the reason, one that is not well formed or that its key does not name.
std::string formatEntry(const RegistryEntry& entry);
Result<RegistryEntry> parseEntry(const std::string& key_id, const std::string& value);
// An entry however it came (the registry, a Describe answer): its id and
// streams well formed (then sorted, each once), its address HOST:PORT --
// unless `with_address` is false (a daemon's word of itself, Discovery::heard,
// whose address is its record's).
Result<RegistryEntry> checkEntry(RegistryEntry e, bool with_address = true);

// The registry's entries, and its revision when they were read (a watch
// from the next one misses no change).
struct Listing {
  std::vector<RegistryEntry> entries;
  int64_t revision = 0;
};

class EtcdRegistry {
 public:
  // `endpoints`: http://HOST:PORT, tried in turn until one answers.
  EtcdRegistry(std::vector<std::string> endpoints, std::string prefix, uint32_t lease_ttl_s);
  ~EtcdRegistry();
  EtcdRegistry(const EtcdRegistry&) = delete;
  EtcdRegistry& operator=(const EtcdRegistry&) = delete;

  // Puts `self` under this daemon's lease, granting one first (and again
  // when etcd no longer knows the last one).
  Status publish(const RegistryEntry& self);
  // Renews the lease.  An error when etcd did not answer, or lost the lease
  // (then the next publish grants another).
  Status keepAlive();
  // Every entry under the prefix, this daemon's included.  Those that are not
  // well formed are left out and named in `refused` ("key: why").
  Result<Listing> list(std::vector<std::string>& refused);
  // Revokes the lease: the entry goes at once (a daemon that stops for good).
  void withdraw();

  // Watches the prefix from `revision` on, calling `changed` for each message
  // that carries events (an entry put, or gone), until the stream ends: an
  // error, the endpoint gone, the revision compacted away, or stopWatch().
  // Blocks; on a thread of its own (the others' calls go on meanwhile).
  Status watch(int64_t revision, const std::function<void()>& changed);
  // Ends the watch under way (from another thread): it returns an error.
  void interruptWatch();
  // Ends it, and refuses every watch after: the daemon stops.
  void stopWatch();

  bool leased() const noexcept { return lease_ != 0; }
  // The endpoint that answered last, for messages.
  const std::string& endpoint() const { return endpoints_[current_]; }

 private:
  // POSTs `body` (JSON) to PATH on an endpoint that answers, on a connection
  // kept open between calls; the reply's JSON text.
  Result<std::string> call(const std::string& path, const std::string& body);
  httplib::Client& client(size_t endpoint);

  std::vector<std::string> endpoints_;
  std::string prefix_;
  uint32_t ttl_s_;
  int64_t lease_ = 0;
  size_t current_ = 0;
  std::vector<std::unique_ptr<httplib::Client>> clients_;  // by endpoint, made when first used

  std::mutex watch_mutex_;  // the watch's client, swapped under it
  std::shared_ptr<httplib::Client> watching_;
  bool watch_stopped_ = false;
  size_t watch_endpoint_ = 0;  // the watch's turn through the endpoints (its thread's only)
};

}  // namespace framelink
