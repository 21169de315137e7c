// The report of `framelink-bench run`: what it was asked for (BenchOptions), what it measured
// (BenchResults), and the table it prints of them once every case has run.
#ifndef FRAMELINK_CLI_BENCH_REPORT_H
#define FRAMELINK_CLI_BENCH_REPORT_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_baselines.h"
#include "bench_case.h"

namespace framelink::cli {

struct BenchOptions {
  std::string transports = "tcp,grpc";
  std::string sizes = "4K,64K,1M,4M";
  double seconds = 3;
  uint64_t latency_samples = 2000;
  std::string framelinkd;
  double idle_seconds = 2;
  bool baselines_only = false;
  bool no_baselines = false;
  uint32_t pairs = 16;  // 0: no many-pairs case
  std::string pairs_size = "1M";
  std::string host_a = "127.0.0.1";
  std::string host_b = "127.0.0.1";
  std::vector<std::string> daemon_args;
  bool local = false;  // --local: one daemon, producer and consumers on it
  // That many subscribers of one stream against one (0, 1: skip), on the one daemon with --local,
  // else on daemon B.
  uint32_t subscribers = 4;
  // --local: that many consumers of streams of their own stay attached to the daemon, idle, while
  // the local cases run (what many applications on one host cost a busy stream).
  uint32_t idle_clients = 0;
  // 2: one stream to hostB and hostC against hostB alone, on three daemons of their own; 0: skip.
  uint32_t hosts = 0;
  // The frames of the subscriber and two-hosts cases, 1 MiB: a few thousand a second on two
  // cores, enough for a steady ratio in a few seconds whatever --sizes says.
  uint64_t fanout_size = 1 << 20;
};

// The options once checked: --transports, --sizes and --pairs-size parsed.
struct BenchPlan {
  std::vector<std::string> transports;
  std::vector<uint64_t> sizes;
  uint64_t pairs_size = 0;
};

// Every case in the order it ran, the baselines by index into BenchPlan::sizes, and what went
// wrong (said on stderr after the table).
struct BenchResults {
  struct E2E {
    std::string transport;
    uint64_t size;
    CaseResult r;
  };
  struct Many {
    std::string transport;
    PairsResult r;
  };
  struct Subscribers {
    std::string transport;
    SubscribersResult r;
  };
  explicit BenchResults(size_t sizes) : tcp_base(sizes), grpc_base(sizes), ucx_base(sizes) {}

  std::vector<E2E> e2e;
  std::vector<Many> many;
  std::vector<Subscribers> subscribers;
  std::vector<Subscribers> hosts;  // runTwoHosts: `many` has one reader on each of two hosts
  std::vector<std::pair<std::string, CaseResult>> lat;
  std::vector<std::pair<std::string, IdleCpu>> idle;
  std::vector<ThroughputResult> tcp_base;
  std::vector<ThroughputResult> grpc_base;
  std::vector<ThroughputResult> ucx_base;
  LatencyResult tcp_lat;
  LatencyResult ucx_lat;
  bool ucx_lat_done = false;
  LatencyResult sockperf_lat;  // sockperf ping-pong, the raw-TCP one-way latency
  bool sockperf_done = false;
  std::vector<std::string> errors;
};

// printf with one double, as a string: fmt("%.2f GB/s", 1.5).
std::string fmt(const char* f, double v);

// The table on stdout: the machine, one row per case next to its baselines, what the columns mean.
void printBenchTable(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res);

// The targets of small frames at wire speed (bench_targets.cpp): each with its figure when the work
// began and this run's, from the cases above.  Nothing without daemons or baselines.
void printTargetsTable(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_REPORT_H
