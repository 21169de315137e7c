// `framelink-bench run`: end-to-end throughput and latency through two framelinkd on this machine,
// next to plain TCP, plain gRPC and UCX (ucx_perftest, UCX_TLS=tcp) baselines measured in the same
// run, plus daemon CPU (share of a core, and microseconds per frame), N pairs at once, and one
// against N subscribers of a stream on daemon B (frames delivered over all readers, and the bytes
// the link carried per frame: once, however many readers), and with --hosts 2 one stream to two
// hosts against one host alone (each host's frames/s; the link carries each frame once per host).
// --host-a / --host-b put the two daemons on given local addresses (two RDMA devices, e.g. the
// Soft-RoCE lane's rxe_a and rxe_b); rdma has no in-program baseline (compare with perftest's
// ib_write_bw and UCX rc_verbs, as tests/softroce/bench.sh does).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_baselines.h"
#include "bench_case.h"
#include "bench_commands.h"
#include "bench_report.h"
#include "bench_sockperf.h"
#include "bench_ucx.h"
#include "child_process.h"
#include "cli_util.h"
#include "daemon_pair.h"

namespace framelink::cli {

// bench_local.cpp
int runLocalBench(const BenchOptions& o, const std::vector<uint64_t>& sizes, DaemonPair::Options daemons);

namespace {

bool hasBaseline(const std::string& transport) { return transport == "tcp" || transport == "grpc"; }

void status(const char* fmt_str, const std::string& a) {
  std::fprintf(stderr, fmt_str, a.c_str());
  std::fflush(stderr);
}

// Parses --sizes, --pairs-size and --transports into `plan` and checks the rest; 0, or the exit
// code after saying what is wrong.
int checkOptions(const BenchOptions& o, BenchPlan& plan) {
  auto sizes = parseSizeList(o.sizes);
  if (!sizes) {
    std::fprintf(stderr,
                 "framelink-bench run: --sizes '%s' is not a comma list of sizes (e.g. 4K,64K,1M,4M)\n",
                 o.sizes.c_str());
    return 2;
  }
  const auto pairs_size = parseSize(o.pairs_size);
  if (!pairs_size || *pairs_size == 0) {
    std::fprintf(stderr, "framelink-bench run: --pairs-size '%s' is not a size (e.g. 1M)\n",
                 o.pairs_size.c_str());
    return 2;
  }
  if (o.pairs == 1 || o.pairs > 64) {
    std::fprintf(
        stderr,
        "framelink-bench run: --pairs %u: give 2 to 64 pairs for the many-pairs case, or 0 to skip it "
        "(one pair is every other case)\n",
        o.pairs);
    return 2;
  }
  plan.transports = splitList(o.transports, ',');
  for (const auto& t : plan.transports) {
    if (t != "tcp" && t != "grpc" && t != "rdma") {
      std::fprintf(stderr, "framelink-bench run: unknown transport '%s' in --transports (tcp, grpc, rdma)\n",
                   t.c_str());
      return 2;
    }
  }
  if (o.baselines_only && o.no_baselines) {
    std::fprintf(stderr, "framelink-bench run: --baselines-only and --no-baselines exclude each other\n");
    return 2;
  }
  if (o.hosts != 0 && o.hosts != 2) {
    std::fprintf(stderr, "framelink-bench run: --hosts %u: give 2 for the two-hosts case, or 0 to skip it\n",
                 o.hosts);
    return 2;
  }
  if (o.hosts != 0 && o.local) {
    std::fprintf(stderr, "framelink-bench run: --hosts sends to other daemons: drop it or --local\n");
    return 2;
  }
  if (plan.transports.empty() || o.seconds <= 0) {
    std::fprintf(stderr, "framelink-bench run: need at least one transport and --seconds > 0\n");
    return 2;
  }
  plan.sizes = std::move(*sizes);
  plan.pairs_size = *pairs_size;
  return 0;
}

// How each pair of daemons starts (framelinkd is looked for unless only baselines run); false
// after saying why not.
bool planDaemons(const BenchOptions& o, DaemonPair::Options& dopt) {
  std::string err;
  if (!o.baselines_only) dopt.framelinkd = findFramelinkd(o.framelinkd, err);
  if (!o.baselines_only && dopt.framelinkd.empty()) {
    std::fprintf(stderr, "framelink-bench run: %s\n", err.c_str());
    return false;
  }
  dopt.temp_prefix = "framelink-bench";
  dopt.log_level = "warn";
  dopt.host_a = o.host_a;
  dopt.host_b = o.host_b;
  dopt.extra_args = o.daemon_args;
  return true;
}

// Runs the framelink cases transport by transport and the baselines, into a BenchResults.
// Each baseline runs right after the framelink case it is compared with (the daemons sit idle
// meanwhile), so both see the same machine: on a shared 2-vCPU host load changes by the minute.
class BenchRunner {
 public:
  BenchRunner(const BenchOptions& o, const BenchPlan& plan, const DaemonPair::Options& daemons, bool have_ucx,
              BenchResults& res)
      : o_(o), plan_(plan), daemons_(daemons), have_ucx_(have_ucx), res_(res) {}

  // Every transport in turn, until Ctrl-C; false when a pair of daemons did not start (said on
  // stderr).
  bool runTransports() {
    for (const auto& t : plan_.transports) {
      if (g_interrupted.load() || o_.baselines_only) break;
      if (!runTransport(t)) return false;
    }
    return true;
  }

  // --baselines-only: every baseline, without daemons.
  void runBaselinesOnly() {
    for (size_t si = 0; si < plan_.sizes.size() && !g_interrupted.load(); ++si) {
      runBaseline("tcp", si);
      runBaseline("grpc", si);
    }
    if (!g_interrupted.load() && o_.latency_samples > 0) {
      runPingPong();
      runSockperf();
      runUcxLatency();
    }
  }

 private:
  // Two daemons over `t` and every case on them, then the two-hosts case on three daemons.
  bool runTransport(const std::string& t) {
    DaemonPair::Options dopt = daemons_;
    dopt.transport = t;
    status("starting two framelinkd over %s ...\n", t);
    auto pair = startDaemons(dopt);
    if (!pair) return false;
    runSizes(*pair, t);
    if (!g_interrupted.load() && o_.subscribers > 1) runSubscriberCases(*pair, t);
    if (!g_interrupted.load() && o_.pairs > 1) runManyPairs(*pair, t);
    if (!g_interrupted.load() && o_.latency_samples > 0) runLatency(*pair, t);
    if (!g_interrupted.load() && o_.idle_seconds > 0) {
      status("  %s ...\n", t + " idle daemons, " + fmt("%.1f s", o_.idle_seconds));
      res_.idle.emplace_back(t, measureIdle(*pair, o_.idle_seconds));
    }
    finish(*pair);
    if (!g_interrupted.load() && o_.hosts == 2) return runTwoHostsCase(dopt, t);
    return true;
  }

  // nullptr after saying why the daemons did not start.
  static std::unique_ptr<DaemonPair> startDaemons(const DaemonPair::Options& dopt) {
    std::string err;
    auto daemons = DaemonPair::start(dopt, err);
    if (!daemons) std::fprintf(stderr, "framelink-bench run: %s\n", err.c_str());
    return daemons;
  }

  // Stops the daemons; their logs are kept once any case failed.
  void finish(DaemonPair& daemons) {
    if (!any_error_) {
      daemons.stop();
    } else {
      daemons.keepDir();
      res_.errors.push_back("daemon logs kept in " + daemons.dir());
    }
  }

  // A framelink case's error goes on the list and keeps the daemons' logs.
  void caseFailed(const std::string& what) {
    res_.errors.push_back(what);
    any_error_ = true;
  }

  // One timed throughput case per frame size, each followed by its baselines.
  void runSizes(DaemonPair& pair, const std::string& t) {
    int stream_no = 0;
    for (size_t si = 0; si < plan_.sizes.size(); ++si) {
      const uint64_t size = plan_.sizes[si];
      if (g_interrupted.load()) break;
      status("  %s ...\n", t + " " + formatBytes(size) + " frames, " + fmt("%.0f s", o_.seconds));
      CaseResult r = runCase(pair, "bench" + std::to_string(stream_no++), throughputCase(size, o_.seconds));
      if (!r.error.empty()) caseFailed(t + " " + formatBytes(size) + ": " + r.error);
      res_.e2e.push_back({t, size, r});
      if (!g_interrupted.load()) runBaseline(t, si);
    }
  }

  // One subscriber, then --subscribers, of one stream on daemon B, each case with the bytes A's
  // transports sent per frame.
  void runSubscriberCases(DaemonPair& pair, const std::string& t) {
    const uint64_t size = o_.fanout_size;
    status("  %s ...\n", t + " " + formatBytes(size) + " frames, 1 then " + std::to_string(o_.subscribers) +
                             " subscribers on B, " + fmt("%.0f s", o_.seconds) + " each");
    CaseConfig c = throughputCase(size, o_.seconds);
    c.count_link = true;
    SubscribersResult r = runSubscribers(pair, "subscribers", c, o_.subscribers);
    if (!r.one.error.empty()) caseFailed(t + " 1 subscriber: " + r.one.error);
    if (!r.many.error.empty()) {
      caseFailed(t + " " + std::to_string(o_.subscribers) + " subscribers: " + r.many.error);
    }
    res_.subscribers.push_back({t, std::move(r)});
  }

  // One stream to hostB alone, then to hostB and hostC, one reader on each host, with the bytes
  // A's transports sent per frame.  Daemons of their own: with two peers, every stream of the
  // other cases would need a route.
  bool runTwoHostsCase(DaemonPair::Options dopt, const std::string& t) {
    const std::string streams = "hosts";
    dopt.host_c = true;
    const std::vector<std::string> routes = twoHostsRoutes(streams);
    dopt.extra_args_a.insert(dopt.extra_args_a.end(), routes.begin(), routes.end());
    status("starting three framelinkd over %s ...\n", t);
    auto daemons = startDaemons(dopt);
    if (!daemons) return false;
    const uint64_t size = o_.fanout_size;
    status("  %s ...\n", t + " " + formatBytes(size) + " frames to hostB alone, then to hostB and hostC, " +
                             fmt("%.0f s", o_.seconds) + " each");
    CaseConfig c = throughputCase(size, o_.seconds);
    c.count_link = true;
    SubscribersResult r = runTwoHosts(*daemons, streams, c);
    if (!r.one.error.empty()) caseFailed(t + " to hostB alone: " + r.one.error);
    if (!r.many.error.empty()) caseFailed(t + " to hostB and hostC: " + r.many.error);
    res_.hosts.push_back({t, std::move(r)});
    finish(*daemons);
    return true;
  }

  // --pairs producer/consumer pairs at once, timed together.
  void runManyPairs(DaemonPair& pair, const std::string& t) {
    status("  %s ...\n", t + " " + std::to_string(o_.pairs) + " pairs at once, " +
                             formatBytes(plan_.pairs_size) + " frames, " + fmt("%.0f s", o_.seconds));
    CaseConfig c;
    c.size = plan_.pairs_size;
    c.slots = pairSlotsFor(plan_.pairs_size, o_.pairs);
    c.seconds = o_.seconds;
    PairsResult r = runPairs(pair, "pairs", c, o_.pairs);
    if (!r.total.error.empty()) caseFailed(t + " " + std::to_string(o_.pairs) + " pairs: " + r.total.error);
    res_.many.push_back({t, std::move(r)});
  }

  // 4 KiB frames one at a time, then the latency baselines (each measured once).
  void runLatency(DaemonPair& pair, const std::string& t) {
    status("  %s ...\n", t + " latency, 4 KiB frames one at a time");
    CaseResult r = runCase(pair, "latency", latencyCase(o_.latency_samples));
    if (!r.error.empty()) caseFailed(t + " latency: " + r.error);
    res_.lat.emplace_back(t, r);
    if (!g_interrupted.load() && res_.tcp_lat.samples == 0) runPingPong();
    if (!g_interrupted.load() && t == "tcp") runSockperf();
    if (!g_interrupted.load() && t == "tcp") runUcxLatency();
  }

  // The baselines of transport `t` at size number `si`: plain TCP and UCX for tcp, plain gRPC for grpc.
  void runBaseline(const std::string& t, size_t si) {
    if (o_.no_baselines || !hasBaseline(t)) return;
    const uint64_t size = plan_.sizes[si];
    if (t == "tcp") {
      runTcpBaselines(si, size);
      return;
    }
    status("  %s ...\n", "plain gRPC " + formatBytes(size));
    res_.grpc_base[si] = plainGrpcThroughput(size, o_.seconds);
    if (!res_.grpc_base[si].error.empty()) res_.errors.push_back("plain gRPC: " + res_.grpc_base[si].error);
  }

  // UCX over tcp is the baseline of the tcp rows next to plain TCP; a missing ucx_perftest is said
  // in every UCX cell.
  void runTcpBaselines(size_t si, uint64_t size) {
    status("  %s ...\n", "plain TCP " + formatBytes(size));
    res_.tcp_base[si] = plainTcpThroughput(size, o_.seconds);
    if (!res_.tcp_base[si].error.empty()) res_.errors.push_back("plain TCP: " + res_.tcp_base[si].error);
    if (!have_ucx_) {
      res_.ucx_base[si].error = kUcxMissing;
      return;
    }
    status("  %s ...\n", "UCX tag_bw (UCX_TLS=tcp) " + formatBytes(size));
    res_.ucx_base[si] = ucxTagBandwidth("tcp", size, o_.seconds);
    if (!res_.ucx_base[si].error.empty()) {
      res_.errors.push_back("UCX " + formatBytes(size) + ": " + res_.ucx_base[si].error);
    }
  }

  // Plain TCP ping-pong: the one-way latency baseline.
  void runPingPong() {
    if (o_.no_baselines) return;
    status("  %s ...\n", std::string("plain TCP ping-pong 4 KiB"));
    res_.tcp_lat = plainTcpOneWay(4096, o_.latency_samples);
    if (!res_.tcp_lat.error.empty()) res_.errors.push_back("plain TCP ping-pong: " + res_.tcp_lat.error);
  }

  // sockperf ping-pong over TCP, once per run: the raw-TCP latency a user would measure.
  void runSockperf() {
    if (o_.no_baselines || res_.sockperf_done) return;
    res_.sockperf_done = true;
    status("  %s ...\n", std::string("sockperf ping-pong --tcp 4 KiB"));
    res_.sockperf_lat = sockperfOneWay(4096, std::max(2.0, o_.seconds));
    if (!res_.sockperf_lat.error.empty() && res_.sockperf_lat.error != kSockperfMissing) {
      res_.errors.push_back("sockperf: " + res_.sockperf_lat.error);
    }
  }

  // UCX tag_lat over tcp, once per run: the UCX latency cell.
  void runUcxLatency() {
    if (o_.no_baselines || res_.ucx_lat_done) return;
    res_.ucx_lat_done = true;
    if (!have_ucx_) {
      res_.ucx_lat.error = kUcxMissing;
      return;
    }
    status("  %s ...\n", std::string("UCX tag_lat (UCX_TLS=tcp) 4 KiB"));
    res_.ucx_lat = ucxTagLatency("tcp", 4096, std::max<uint64_t>(o_.latency_samples, 10000));
    if (!res_.ucx_lat.error.empty()) res_.errors.push_back("UCX tag_lat: " + res_.ucx_lat.error);
  }

  const BenchOptions& o_;
  const BenchPlan& plan_;
  const DaemonPair::Options& daemons_;
  const bool have_ucx_;
  BenchResults& res_;
  bool any_error_ = false;  // a framelink case failed: the daemons' logs are kept from then on
};

// Options, then every case and baseline, then the table; the errors come last, on stderr.
int runBench(const BenchOptions& o) {
  installInterruptHandler();
  keepFreedMemoryLikeTheDaemon();  // for the plain TCP ends this process forks
  BenchPlan plan;
  if (const int rc = checkOptions(o, plan); rc != 0) return rc;
  DaemonPair::Options daemons;
  if (!planDaemons(o, daemons)) return 1;
  if (o.local) return runLocalBench(o, plan.sizes, daemons);
  const bool have_ucx = !ucxPerftestPath().empty();
  if (!o.no_baselines && !have_ucx) {
    std::fprintf(stderr, "framelink-bench run: UCX column: %s\n", kUcxMissing);
  }
  if (!o.no_baselines && sockperfPath().empty()) {
    std::fprintf(stderr, "framelink-bench run: latency baseline: %s\n", kSockperfMissing);
  }
  BenchResults res(plan.sizes.size());
  BenchRunner runner(o, plan, daemons, have_ucx, res);
  if (!runner.runTransports()) return 1;
  if (o.baselines_only) runner.runBaselinesOnly();
  printBenchTable(o, plan, res);
  for (const auto& e : res.errors) std::fprintf(stderr, "framelink-bench run: %s\n", e.c_str());
  if (g_interrupted.load()) return 130;
  return res.errors.empty() ? 0 : 1;
}

}  // namespace

void addBenchCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd =
      app.add_subcommand("run", "Throughput, latency and daemon CPU vs plain TCP / gRPC / UCX baselines");
  cmd->add_option("--transports", o->transports, "comma list of transports (default tcp,grpc)");
  cmd->add_option("--sizes", o->sizes, "comma list of frame sizes (default 4K,64K,1M,4M)");
  cmd->add_option(
      "--pairs", o->pairs,
      "producer/consumer pairs on as many streams at once, one case per transport (default 16; 0 = skip)");
  cmd->add_option("--pairs-size", o->pairs_size, "frame size of the many-pairs case (default 1M)");
  cmd->add_option("--seconds", o->seconds, "seconds per throughput case (default 3)");
  cmd->add_option("--latency-samples", o->latency_samples,
                  "4 KiB frames for the latency case (default 2000; 0 = skip)");
  cmd->add_option("--idle-seconds", o->idle_seconds,
                  "seconds to sample idle daemon CPU (default 2; 0 = skip)");
  cmd->add_option("--framelinkd", o->framelinkd,
                  "path of framelinkd (default: the build tree's, then $PATH)");
  cmd->add_flag("--baselines-only", o->baselines_only,
                "measure only the plain TCP / gRPC / UCX baselines (no daemons)");
  cmd->add_flag("--no-baselines", o->no_baselines, "skip the plain TCP / gRPC / UCX baselines");
  cmd->add_option(
      "--host-a", o->host_a,
      "local address daemon A (producer side) listens on; it dials B at --host-b (default 127.0.0.1)");
  cmd->add_option("--host-b", o->host_b,
                  "local address daemon B (consumer side) listens on (default 127.0.0.1)");
  cmd->add_option("--daemon-arg", o->daemon_args,
                  "extra framelinkd argument for both daemons (repeatable; e.g. --daemon-arg=--rdma-port=0)")
      ->allow_extra_args(false);
  cmd->add_flag("--local", o->local,
                "producer and consumers on one daemon (no network, no copy): GB/s per frame size next to "
                "memcpy, 4 KiB latency, and one subscriber against --subscribers (default sizes 4K,1M,64M)");
  cmd->add_option("--subscribers", o->subscribers,
                  "subscribers of one stream, each getting every frame, against one, 1 MiB frames: on "
                  "daemon B, with the bytes the link carried per frame (--local: on the one daemon) "
                  "(default 4; 0 = skip)");
  cmd->add_option("--idle-clients", o->idle_clients,
                  "with --local: that many consumers of streams of their own stay attached, idle, while "
                  "the local cases run (default 0)");
  cmd->add_option("--hosts", o->hosts,
                  "2: one stream from daemon A to a reader on daemon B alone, then to readers on B and on a "
                  "third daemon C, 1 MiB frames: each host's frames/s against B's alone, with the bytes the "
                  "link carried per frame (default 0 = skip)");
  auto* sizes_option = cmd->get_option("--sizes");
  cmd->callback([o, sizes_option, &exit_code] {
    if (o->local && sizes_option->count() == 0) o->sizes = "4K,1M,64M";
    exit_code = runBench(*o);
  });
}

}  // namespace framelink::cli
