// One case of `framelink-bench run`: producer and consumer processes attached to the two daemons of a
// DaemonPair (one pair, or N pairs on N streams at once), frames checked byte-for-byte and then
// timed (or one at a time, for latency), with the daemons' CPU over the timed part; and the
// daemons' CPU while idle.
#ifndef FRAMELINK_CLI_BENCH_CASE_H
#define FRAMELINK_CLI_BENCH_CASE_H

#include <cstdint>
#include <string>
#include <vector>

#include "daemon_pair.h"

namespace framelink::cli {

constexpr uint64_t kVerifyFrames = 8;  // checked byte-for-byte before each timed run
constexpr uint64_t kLatencyWarmup = 100;

struct CaseConfig {
  uint64_t size = 0;
  uint32_t slots = 8;
  double seconds = 0;  // timed run length; 0: send `count` frames
  uint64_t count = 0;
  uint32_t max_in_flight = 0;  // 1 for latency
  bool latency = false;
  bool local = false;        // the consumers attach to the producer's daemon (a), not to b
  uint32_t readers = 1;      // > 1: that many subscribers per stream (each gets every frame)
  bool subscribe = false;    // the one reader attaches as a subscriber too, not as a queue-group member
  bool others_on_c = false;  // the readers beyond the first attach to daemon c (DaemonPair::Options::host_c)
  bool count_link = false;   // measure CaseResult::link_bytes_per_frame (adds about 1.2 s)
};

struct CaseResult {
  double gbps = 0;  // frames' bytes delivered per second (each frame once, however many readers)
  double fps = 0;
  double seconds = 0;
  uint64_t delivered = 0;
  uint64_t failed = 0;
  uint64_t verified = 0;
  uint64_t verify_bad = 0;
  double cpu_a = -1;  // % of one core over the timed part
  double cpu_b = -1;
  double cpu_us_per_frame_a = -1;  // CPU microseconds of each daemon per frame delivered
  double cpu_us_per_frame_b = -1;
  double user_us_per_frame_a = -1;  // the part of it in the daemon's own code (utime)
  double user_us_per_frame_b = -1;
  double sleeps_per_frame_a = -1;  // times a thread of each daemon went to sleep, per frame delivered
  double sleeps_per_frame_b = -1;
  double p50_us = 0;
  double p99_us = 0;
  uint64_t samples = 0;
  // Payload bytes daemon A's transports sent (its transport_bytes_sent counter) per frame the
  // producers sent, over the whole case: the frame size when the link carries each frame once,
  // however many readers there are on b.  < 0: not measured.
  double link_bytes_per_frame = -1;
  std::string error;
};

// Slots per stream for frames of `size`.
uint32_t slotsFor(uint64_t size);
// Slots per stream in the many-pairs case: all pairs together keep about what one pair keeps in
// flight, but never fewer than 8 each (memory: pairs x slots x size, twice).
uint32_t pairSlotsFor(uint64_t size, uint32_t pairs);
// A throughput case: frames of `size` for `seconds`, slotsFor(size) slots.
CaseConfig throughputCase(uint64_t size, double seconds);
// The latency case: 4 KiB frames one at a time, `samples` of them timed after kLatencyWarmup.
CaseConfig latencyCase(uint64_t samples);

// Runs one case on `stream`; CaseResult::error says what went wrong, if anything.
CaseResult runCase(DaemonPair& pair, const std::string& stream, const CaseConfig& c);

struct PairsResult {
  // All pairs together: bytes and frames delivered by every pair over the earliest first submit ..
  // the latest last completion; the daemons' CPU over the same timed part.
  CaseResult total;
  std::vector<double> pair_gbps;  // each pair's own GB/s over its own first submit .. last completion
};

// `pairs` producer/consumer pairs on the streams <prefix>0 .. <prefix>N-1 through the same daemons
// at once: every producer verifies its first frames, then all start their timed runs together.
PairsResult runPairs(DaemonPair& pair, const std::string& stream_prefix, const CaseConfig& c, uint32_t pairs);

struct SubscribersResult {
  uint32_t subscribers = 0;
  CaseResult one;   // one subscriber
  CaseResult many;  // `subscribers` of the same stream; its gbps and fps count each frame once
  // Frames (and bytes) delivered per second over all readers, N subscribers against one; 0 when
  // either case delivered nothing.
  double aggregateRatio() const;
};

// Timed case `c` with one subscriber, and with `subscribers` of one stream (each gets every frame;
// the producer's completion waits for the slowest), `c.seconds` each, on streams <prefix>1a,
// <prefix>Na, <prefix>Nb and <prefix>1b.
SubscribersResult runSubscribers(DaemonPair& pair, const std::string& stream_prefix, CaseConfig c,
                                 uint32_t subscribers);

// The --route arguments of hostA for runTwoHosts on streams <prefix>...: the single-host streams
// to hostB, the others to hostB and hostC.
std::vector<std::string> twoHostsRoutes(const std::string& stream_prefix);

// Fan-out to two hosts, on daemons started with host_c and twoHostsRoutes(stream_prefix): case `c`
// with one reader on B and the stream routed to B alone (`one`), against one reader on B and one on
// C with the stream routed to both (`many`, whose fps is each host's: every frame reaches both, the
// producer's completion waits for both), in halves as runSubscribers runs them.
SubscribersResult runTwoHosts(DaemonPair& daemons, const std::string& stream_prefix, CaseConfig c);

struct IdleCpu {
  double a = -1;
  double b = -1;
};

// The CPU each daemon uses (% of one core) over `seconds` with no client.
IdleCpu measureIdle(DaemonPair& pair, double seconds);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_CASE_H
