// What went wrong last between this daemon and each peer -- a connect that
// timed out, a Hello refused, a data channel that did not open, a link that
// went down -- and when, for `framelink links` and /stats: an operator sees
// why a peer is not linked without reading the log.  Written by the
// dialers and the data agent, read by the admin snapshot; one lock, taken
// only on those (rare) events.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/thread_annotations.h"

namespace framelink {

class PeerProblems {
 public:
  // Peer names come from the configuration and from links (authenticated);
  // beyond this many, the oldest problem makes room.
  static constexpr size_t kMaxPeers = 1024;
  // At most this many bytes of a message are kept.
  static constexpr size_t kMaxMessageBytes = 512;

  struct Problem {
    std::string what;
    uint64_t at_ns = 0;  // CLOCK_REALTIME
    uint64_t count = 0;  // problems with this peer since the daemon started
  };

  void record(const std::string& peer, std::string what) noexcept;
  // By peer name; empty for a peer with no problem so far.
  std::map<std::string, Problem> snapshot() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, Problem> problems_ FL_GUARDED_BY(mu_);
};

}  // namespace framelink
