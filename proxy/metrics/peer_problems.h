// What went wrong last between this daemon and each peer -- a connect that
// timed out, a Hello refused, a data channel that did not open, a link that
// went down -- and when, for `framelink links` and /stats: an operator sees
// why a peer is not linked without reading the log.  Written by the
// dialers and the data agent, read by the admin snapshot; one lock, taken
// only on those (rare) events.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "common/thread_annotations.h"

namespace framelink {

class PeerProblems {
 public:
  // Peer names come from the configuration and from links (authenticated);
  // beyond this many, the oldest problem makes room, counted in `forgotten`.
  static constexpr size_t kMaxPeers = 1024;
  // At most this many bytes of a message are kept.
  static constexpr size_t kMaxMessageBytes = 512;

  // What kind of problem, for `framelink doctor` to choose its fix by; the
  // message is for people and may change.
  enum class Cause {
    kBadAddress,        // the [[peer]] address does not parse
    kUnreachable,       // no connection (peer down, address, firewall)
    kUnreachableOrTls,  // no connection with TLS on: also a failed handshake
    kToken,             // the peer refused our token (no TLS)
    kCredentials,       // the peer refused our token or certificate (TLS)
    kRefused,           // the peer refused the session for another reason
    kVersion,           // the peer speaks another protocol version
    kProtocol,          // the peer answered the Hello with nonsense
    kDataChannel,       // the session was agreed, its data channel did not open
    kLinkDown,          // a link that was up went down
  };
  // "unreachable", "token", ...: the value of "cause" in /stats.
  static const char* causeName(Cause cause) noexcept;

  struct Problem {
    Cause cause = Cause::kLinkDown;
    std::string what;
    uint64_t at_ns = 0;  // CLOCK_REALTIME
    uint64_t count = 0;  // problems with this peer since the daemon started
  };

  explicit PeerProblems(std::atomic<uint64_t>& forgotten) noexcept : forgotten_(forgotten) {}

  void record(const std::string& peer, Cause cause, std::string what) noexcept;
  // By peer name; empty for a peer with no problem so far.
  std::map<std::string, Problem> snapshot() const;

 private:
  std::atomic<uint64_t>& forgotten_;
  mutable Mutex mu_;
  std::map<std::string, Problem> problems_ FL_GUARDED_BY(mu_);
};

}  // namespace framelink
