// The UCX baseline of `framelink-bench run`: UCX's own `ucx_perftest` (Debian ucx-utils), server and
// client as two processes on this machine, tag-matching bandwidth and latency over the transports
// named by UCX_TLS.  UCX is what a user would link into both applications instead of running a
// sidecar, so it is the figure framelink's per-frame overhead is judged against.
#ifndef FRAMELINK_CLI_BENCH_UCX_H
#define FRAMELINK_CLI_BENCH_UCX_H

#include <cstdint>
#include <string>

#include "bench_baselines.h"

namespace framelink::cli {

// What the UCX cells say when the tool is missing: never an empty cell.
inline constexpr const char* kUcxMissing = "n/a (ucx_perftest not installed: apt-get install ucx-utils)";

// One line of ucx_perftest's table: "[thread 0] <iterations> <latency or overhead, us: percentile,
// average, overall> <bandwidth, MB/s = 2^20 bytes/s: average, overall> <messages/s: average,
// overall>", printed about once a second, and the same after "Final:" at the end.
struct UcxReport {
  double iterations = 0;
  double percentile_us = 0;
  double avg_us = 0;
  double overall_us = 0;
  double bw_avg = 0;
  double bw_overall = 0;
  double rate_avg = 0;
  double rate_overall = 0;
  bool final = false;
};

// False for every other line (headers, rules, UCX's log lines).
bool parseUcxReport(const std::string& line, UcxReport& r);

// Path of ucx_perftest in $PATH, or "".
std::string ucxPerftestPath();

// `ucx_perftest -t tag_bw -s size` between a server and a client on 127.0.0.1 with UCX_TLS=tls
// (other UCX_* variables of this process pass through), for about `seconds` after UCX's warm-up.
// ThroughputResult::messages/bytes/seconds are UCX's own overall figures.
ThroughputResult ucxTagBandwidth(const std::string& tls, uint64_t size, double seconds);

// `ucx_perftest -t tag_lat -s size -n samples`: UCX's one-way latency (half its round trip) at the
// 50th and 99th percentile (two runs, `-R 50` and `-R 99`).
LatencyResult ucxTagLatency(const std::string& tls, uint64_t size, uint64_t samples);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_UCX_H
