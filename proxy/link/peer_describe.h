// Describe: a daemon asks another what it is -- its id, its instance, the
// streams its clients read and write -- where a DNS SRV record gave nothing
// but an address ([discovery] dns_srv; discovery/dns_srv.h), and says the
// same of itself: a daemon whose readers change tells the others so by
// asking them again.  The answer is a claim, as a registry entry is: under
// TLS the answerer's certificate must name the host dialed and the id it
// gives, and the link made later proves the id again (peer_identity.h).  The
// asker's word is proven as a Hello's daemon id is, before it is heard.  The
// answering side is PeerLinksImpl::Describe (peer_describe.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace framelink {

struct Config;

struct DescribeTarget {
  std::string address;  // IP:PORT (or HOST:PORT) of its gRPC listener
  std::string host;     // the name its certificate must carry under TLS (the SRV record's target)
};

struct Described {
  std::string id;
  uint64_t instance = 0;
  std::vector<std::string> readers;     // sorted
  std::vector<std::string> producers;   // sorted
  uint64_t as_of_ns = 0;                // on the describing daemon's monotonic clock
  std::vector<std::string> subscribed;  // of readers: read by a subscriber there (RegistryEntry)
  std::vector<std::string> grouped;     // of readers: read by a queue group member there
};

// A Describe call's readers and producers together, at most: more is refused.
inline constexpr size_t kMaxDescribedStreams = 4096;

// Asks every target at once (one channel each, closed after), each within
// `timeout`; the answers in the order of `targets`.  An error says what went
// wrong with that one: FL_ERR_AUTH when it refused this daemon's credentials
// or its certificate does not name the id it gave, FL_ERR_LINK_LOST when it
// did not answer (unreachable, busy, a release without Describe).
// `self`: what this daemon says of itself in each call.
std::vector<Result<Described>> describePeers(const Config& config, const std::vector<DescribeTarget>& targets,
                                             const Described& self, std::chrono::milliseconds timeout);

}  // namespace framelink
