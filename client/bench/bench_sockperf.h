// The raw-TCP latency baseline of `framelink-bench run`: sockperf (Debian sockperf), the tool a
// user would measure a TCP path's latency with, as a server and a ping-pong client on 127.0.0.1.
#ifndef FRAMELINK_CLI_BENCH_SOCKPERF_H
#define FRAMELINK_CLI_BENCH_SOCKPERF_H

#include <cstdint>
#include <string>

#include "bench_baselines.h"

namespace framelink::cli {

// What the sockperf cells say when the tool is missing: never an empty cell.
inline constexpr const char* kSockperfMissing = "n/a (sockperf not installed: apt-get install sockperf)";

// Path of sockperf in $PATH, or "".
std::string sockperfPath();

// One line of sockperf's report that gives a percentile, "sockperf: ---> percentile 50.000 =
// 40.745" (microseconds, half a round trip); false for every other line.
bool parseSockperfPercentile(const std::string& line, double& percentile, double& us);

// `sockperf ping-pong --tcp -m size -t seconds` against `sockperf server --tcp`, both on
// 127.0.0.1: one-way latency (sockperf's figure: half the round trip) at the 50th and 99th
// percentile, and the round trips it counted (after its own warm-up).
LatencyResult sockperfOneWay(uint64_t size, double seconds);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_SOCKPERF_H
