// `faulty`: a Transport decorator that injects the faults a real link has,
// from a seeded random source, so that the data agent's recovery paths
// (replay, duplicate suppression, CRC NACK and resend, ACK timeouts) run in
// tests as often as wanted and reproducibly.
//
// Faults, each with its own probability (0 disables it):
//   drop        a posted frame never reaches the peer; like an RC queue pair
//               whose retry count ran out, its send completes
//               FL_ERR_LINK_LOST and the link breaks (LinkError).
//   fail        a posted frame is sent, but its completion is reported as a
//               failed work request and the link breaks: the peer may hold
//               the frame although this side replays it.
//   disconnect  after a post, the link breaks for no reason of its own.
//   dup         a send completion is reported twice.
//   delay       an event is held back for delay_ms: send completions then
//               overtake each other and the peer's ACKs; a held-back arrival
//               or control record holds back those behind it (links deliver
//               in order).
//   corrupt     one payload byte of an arriving frame that carries a CRC32C is
//               flipped before the arrival is reported.
//
// After the decorator broke a link it behaves as the transport contract asks
// of a broken one: post() answers kNotConnected, no send completes FL_OK any
// more, and arrivals still coming from the wrapped transport are not reported.
//
// The daemon wraps every link's transport in it when started with
// --fault-inject SPEC (for tests only; see docs/guide/failure-semantics.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "transport/transport.h"

namespace framelink::transport {

struct FaultSpec {
  uint64_t seed = 1;
  double drop = 0, fail = 0, disconnect = 0, dup = 0, delay = 0, corrupt = 0;
  // A read that completed is never reported, nor any read after it, until
  // the link ends: reads on a queue pair that lost a read's responses and
  // does not retransmit them (in-order completion holds the rest back).
  double stall = 0;
  // A frame or control record posted is taken and never delivered, nor is
  // anything posted after it (records, frames, reads), until the link ends:
  // a data path that went silent while the Session's keepalives still flow.
  double mute = 0;
  uint32_t delay_ms = 5;

  bool any() const noexcept { return drop + fail + disconnect + dup + delay + corrupt + stall + mute > 0; }
};

// "seed=7,drop=0.001,fail=0.001,disconnect=0.001,dup=0.01,delay=0.05,delay_ms=20,corrupt=0.01,stall=0.01,mute=0.01".
// Every key is optional; probabilities are in [0, 1].  Errors name the key.
Result<FaultSpec> parseFaultSpec(const std::string& text);
std::string describe(const FaultSpec& spec);

// What one decorator injected so far (for logs and tests).
struct FaultCounts {
  uint64_t drops = 0, fails = 0, disconnects = 0, dups = 0, delays = 0, corruptions = 0, stalls = 0,
           mutes = 0;
};

class FaultyTransport : public Transport {
 public:
  // `stream_seed` varies the random sequence per link (e.g. the link id)
  // while the spec's seed keeps a test run reproducible.
  static Result<std::shared_ptr<FaultyTransport>> wrap(std::shared_ptr<Transport> inner,
                                                       const FaultSpec& spec, uint64_t stream_seed);
  virtual FaultCounts counts() const = 0;
};

}  // namespace framelink::transport
