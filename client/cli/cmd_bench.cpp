// `framelink bench`: end-to-end throughput and latency through two framelinkd on this machine,
// next to plain TCP, plain gRPC and UCX (ucx_perftest, UCX_TLS=tcp) baselines measured in the same
// run, plus daemon CPU (share of a core, and microseconds per frame) and N pairs at once.
// --host-a / --host-b put the two daemons on given local addresses (two RDMA devices, e.g. the
// Soft-RoCE lane's rxe_a and rxe_b); rdma has no in-program baseline (compare with perftest's
// ib_write_bw and UCX rc_verbs, as tests/softroce/bench.sh does).
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_baselines.h"
#include "bench_case.h"
#include "bench_ucx.h"
#include "child_process.h"
#include "cli_util.h"
#include "commands.h"
#include "daemon_pair.h"

namespace framelink::cli {
namespace {

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
};

bool hasBaseline(const std::string& transport) { return transport == "tcp" || transport == "grpc"; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Three significant digits below 1 GB/s (an emulated RDMA link runs at
// 0.05 GB/s, where two decimals would round ratios by up to 10 %).
std::string gbpsText(double gbps) { return fmt(gbps < 1 ? "%.3f GB/s" : "%.2f GB/s", gbps); }

std::string cpuPair(double a, double b) {
  if (a < 0 || b < 0) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%% / %.1f%%", a, b);
  return buf;
}

std::string usPerFramePair(const CaseResult& r) {
  if (r.cpu_us_per_frame_a < 0 || r.cpu_us_per_frame_b < 0) return "n/a";
  const char* f =
      r.cpu_us_per_frame_a < 10 && r.cpu_us_per_frame_b < 10 ? "%.2f / %.2f us" : "%.1f / %.1f us";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, r.cpu_us_per_frame_a, r.cpu_us_per_frame_b);
  return buf;
}

std::string sleepsPerFramePair(const CaseResult& r) {
  if (r.sleeps_per_frame_a < 0 || r.sleeps_per_frame_b < 0) return "n/a";
  return fmt("%.2f", r.sleeps_per_frame_a) + fmt(" / %.2f", r.sleeps_per_frame_b);
}

// One line of the table.
struct Row {
  std::string what;
  std::string ours = "-";
  std::string fps = "-";
  std::string baseline = "-";
  std::string ratio = "-";
  std::string ucx = "-";
  std::string ucx_ratio = "-";
  std::string cpu = "-";
  std::string us_per_frame = "-";
  std::string sleeps = "-";
};

void printRow(const Row& r) {
  std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.ours.c_str(),
              r.fps.c_str(), r.baseline.c_str(), r.ratio.c_str(), r.ucx.c_str(), r.ucx_ratio.c_str(),
              r.cpu.c_str(), r.us_per_frame.c_str(), r.sleeps.c_str());
}

std::string ucxCell(const ThroughputResult& u) {
  if (u.gbps() > 0) return gbpsText(u.gbps()) + fmt(" (%.0f msg/s)", u.fps());
  if (u.error == kUcxMissing) return kUcxMissing;
  return u.error.empty() ? "-" : "failed";
}

// Slots per stream in the many-pairs case: all pairs together keep about what one pair keeps in
// flight, but never fewer than 8 each (memory: pairs x slots x size, twice).
uint32_t pairSlotsFor(uint64_t size, uint32_t pairs) { return std::max<uint32_t>(8, slotsFor(size) / pairs); }

void status(const char* fmt_str, const std::string& a) {
  std::fprintf(stderr, fmt_str, a.c_str());
  std::fflush(stderr);
}

int runBench(const BenchOptions& o) {
  installInterruptHandler();
  keepFreedMemoryLikeTheDaemon();  // for the plain TCP ends this process forks
  auto sizes = parseSizeList(o.sizes);
  if (!sizes) {
    std::fprintf(stderr, "framelink bench: --sizes '%s' is not a comma list of sizes (e.g. 4K,64K,1M,4M)\n",
                 o.sizes.c_str());
    return 2;
  }
  const auto pairs_size = parseSize(o.pairs_size);
  if (!pairs_size || *pairs_size == 0) {
    std::fprintf(stderr, "framelink bench: --pairs-size '%s' is not a size (e.g. 1M)\n",
                 o.pairs_size.c_str());
    return 2;
  }
  if (o.pairs == 1 || o.pairs > 64) {
    std::fprintf(stderr,
                 "framelink bench: --pairs %u: give 2 to 64 pairs for the many-pairs case, or 0 to skip it "
                 "(one pair is every other case)\n",
                 o.pairs);
    return 2;
  }
  const auto transports = splitList(o.transports, ',');
  for (const auto& t : transports) {
    if (t != "tcp" && t != "grpc" && t != "rdma") {
      std::fprintf(stderr, "framelink bench: unknown transport '%s' in --transports (tcp, grpc, rdma)\n",
                   t.c_str());
      return 2;
    }
  }
  if (o.baselines_only && o.no_baselines) {
    std::fprintf(stderr, "framelink bench: --baselines-only and --no-baselines exclude each other\n");
    return 2;
  }
  if (transports.empty() || o.seconds <= 0) {
    std::fprintf(stderr, "framelink bench: need at least one transport and --seconds > 0\n");
    return 2;
  }
  std::string err;
  DaemonPair::Options dopt;
  if (!o.baselines_only) dopt.framelinkd = findFramelinkd(o.framelinkd, err);
  if (!o.baselines_only && dopt.framelinkd.empty()) {
    std::fprintf(stderr, "framelink bench: %s\n", err.c_str());
    return 1;
  }
  dopt.temp_prefix = "framelink-bench";
  dopt.log_level = "warn";
  dopt.host_a = o.host_a;
  dopt.host_b = o.host_b;
  dopt.extra_args = o.daemon_args;

  bool any_error = false;
  std::vector<std::string> errors;
  struct E2E {
    std::string transport;
    uint64_t size;
    CaseResult r;
  };
  std::vector<E2E> e2e;
  struct Many {
    std::string transport;
    PairsResult r;
  };
  std::vector<Many> many;
  std::vector<std::pair<std::string, CaseResult>> lat;
  std::vector<std::pair<std::string, IdleCpu>> idle;

  // UCX over tcp is the baseline of the tcp rows; a missing ucx_perftest is said in every UCX cell.
  const bool want_ucx = !o.no_baselines;
  const bool have_ucx = !ucxPerftestPath().empty();
  if (want_ucx && !have_ucx) {
    std::fprintf(stderr, "framelink bench: UCX column: %s\n", kUcxMissing);
  }

  // Each baseline runs right after the framelink case it is compared with (the daemons sit idle
  // meanwhile), so both see the same machine: on a shared 2-vCPU host load changes by the minute.
  std::vector<ThroughputResult> tcp_base(sizes->size()), grpc_base(sizes->size()), ucx_base(sizes->size());
  LatencyResult tcp_lat;
  LatencyResult ucx_lat;
  bool ucx_lat_done = false;
  auto runBaseline = [&](const std::string& t, size_t si) {
    if (o.no_baselines || !hasBaseline(t)) return;
    const uint64_t size = (*sizes)[si];
    if (t == "tcp") {
      status("  %s ...\n", "plain TCP " + formatBytes(size));
      tcp_base[si] = plainTcpThroughput(size, o.seconds);
      if (!tcp_base[si].error.empty()) errors.push_back("plain TCP: " + tcp_base[si].error);
      if (have_ucx) {
        status("  %s ...\n", "UCX tag_bw (UCX_TLS=tcp) " + formatBytes(size));
        ucx_base[si] = ucxTagBandwidth("tcp", size, o.seconds);
        if (!ucx_base[si].error.empty()) {
          errors.push_back("UCX " + formatBytes(size) + ": " + ucx_base[si].error);
        }
      } else {
        ucx_base[si].error = kUcxMissing;
      }
    } else {
      status("  %s ...\n", "plain gRPC " + formatBytes(size));
      grpc_base[si] = plainGrpcThroughput(size, o.seconds);
      if (!grpc_base[si].error.empty()) errors.push_back("plain gRPC: " + grpc_base[si].error);
    }
  };
  auto runPingPong = [&] {
    if (o.no_baselines) return;
    status("  %s ...\n", std::string("plain TCP ping-pong 4 KiB"));
    tcp_lat = plainTcpOneWay(4096, o.latency_samples);
    if (!tcp_lat.error.empty()) errors.push_back("plain TCP ping-pong: " + tcp_lat.error);
  };
  auto runUcxLatency = [&] {
    if (!want_ucx || ucx_lat_done) return;
    ucx_lat_done = true;
    if (!have_ucx) {
      ucx_lat.error = kUcxMissing;
      return;
    }
    status("  %s ...\n", std::string("UCX tag_lat (UCX_TLS=tcp) 4 KiB"));
    ucx_lat = ucxTagLatency("tcp", 4096, std::max<uint64_t>(o.latency_samples, 10000));
    if (!ucx_lat.error.empty()) errors.push_back("UCX tag_lat: " + ucx_lat.error);
  };
  for (const auto& t : transports) {
    if (g_interrupted.load() || o.baselines_only) break;
    dopt.transport = t;
    status("starting two framelinkd over %s ...\n", t);
    auto pair = DaemonPair::start(dopt, err);
    if (!pair) {
      std::fprintf(stderr, "framelink bench: %s\n", err.c_str());
      return 1;
    }
    int stream_no = 0;
    for (size_t si = 0; si < sizes->size(); ++si) {
      const uint64_t size = (*sizes)[si];
      if (g_interrupted.load()) break;
      status("  %s ...\n", t + " " + formatBytes(size) + " frames, " + fmt("%.0f s", o.seconds));
      CaseConfig c;
      c.size = size;
      c.slots = slotsFor(size);
      c.seconds = o.seconds;
      CaseResult r = runCase(*pair, "bench" + std::to_string(stream_no++), c);
      if (!r.error.empty()) {
        errors.push_back(t + " " + formatBytes(size) + ": " + r.error);
        any_error = true;
      }
      e2e.push_back({t, size, r});
      if (!g_interrupted.load()) runBaseline(t, si);
    }
    if (!g_interrupted.load() && o.pairs > 1) {
      status("  %s ...\n", t + " " + std::to_string(o.pairs) + " pairs at once, " + formatBytes(*pairs_size) +
                               " frames, " + fmt("%.0f s", o.seconds));
      CaseConfig c;
      c.size = *pairs_size;
      c.slots = pairSlotsFor(*pairs_size, o.pairs);
      c.seconds = o.seconds;
      PairsResult r = runPairs(*pair, "pairs", c, o.pairs);
      if (!r.total.error.empty()) {
        errors.push_back(t + " " + std::to_string(o.pairs) + " pairs: " + r.total.error);
        any_error = true;
      }
      many.push_back({t, std::move(r)});
    }
    if (!g_interrupted.load() && o.latency_samples > 0) {
      status("  %s ...\n", t + " latency, 4 KiB frames one at a time");
      CaseConfig c;
      c.size = 4096;
      c.slots = 8;
      c.count = o.latency_samples + kLatencyWarmup;
      c.max_in_flight = 1;
      c.latency = true;
      CaseResult r = runCase(*pair, "latency", c);
      if (!r.error.empty()) {
        errors.push_back(t + " latency: " + r.error);
        any_error = true;
      }
      lat.emplace_back(t, r);
      if (!g_interrupted.load() && tcp_lat.samples == 0) runPingPong();
      if (!g_interrupted.load() && t == "tcp") runUcxLatency();
    }
    if (!g_interrupted.load() && o.idle_seconds > 0) {
      status("  %s ...\n", t + " idle daemons, " + fmt("%.1f s", o.idle_seconds));
      idle.emplace_back(t, measureIdle(*pair, o.idle_seconds));
    }
    if (!any_error) {
      pair->stop();
    } else {
      pair->keepDir();
      errors.push_back("daemon logs kept in " + pair->dir());
    }
  }

  if (o.baselines_only) {
    for (size_t si = 0; si < sizes->size() && !g_interrupted.load(); ++si) {
      runBaseline("tcp", si);
      runBaseline("grpc", si);
    }
    if (!g_interrupted.load() && o.latency_samples > 0) {
      runPingPong();
      runUcxLatency();
    }
  }

  // ---- the table ----
  utsname u{};
  uname(&u);
  std::printf("\nframelink bench: %ld CPUs, Linux %s, %.0f s per throughput case, same machine, same run\n",
              sysconf(_SC_NPROCESSORS_ONLN), u.release, o.seconds);
  if (o.host_a != "127.0.0.1" || o.host_b != "127.0.0.1") {
    std::printf("daemon A on %s, daemon B on %s\n", o.host_a.c_str(), o.host_b.c_str());
  }
  std::printf(
      "framelink = producer app -> framelinkd hostA -> framelinkd hostB -> consumer app (separate "
      "processes)\n\n");
  std::printf(
      "| case | framelink | frames/s | baseline | ratio | UCX (UCX_TLS=tcp) | ratio to UCX | daemon CPU A / "
      "B | "
      "CPU per frame A / B | sleeps per frame A / B |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  auto sizeIndex = [&](uint64_t size) {
    size_t si = 0;
    while (si < sizes->size() && (*sizes)[si] != size) ++si;
    return si;
  };
  for (const auto& e : e2e) {
    const size_t si = sizeIndex(e.size);
    const ThroughputResult* base = nullptr;
    std::string base_name;
    if (e.transport == "tcp" && si < tcp_base.size()) {
      base = &tcp_base[si];
      base_name = "plain TCP";
    } else if (e.transport == "grpc" && si < grpc_base.size()) {
      base = &grpc_base[si];
      base_name = "plain gRPC";
    }
    Row row;
    row.what = e.transport + " " + formatBytes(e.size);
    row.ours = e.r.gbps > 0 ? gbpsText(e.r.gbps) : "failed";
    if (e.r.verify_bad != 0 || e.r.verified < kVerifyFrames) row.ours += " UNVERIFIED";
    if (e.r.gbps > 0) row.fps = fmt("%.0f", e.r.fps);
    if (base) {
      row.baseline = base->gbps() > 0 ? base_name + " " + gbpsText(base->gbps()) : base_name + " n/a";
      if (base->gbps() > 0 && e.r.gbps > 0) row.ratio = fmt("%.2f", e.r.gbps / base->gbps());
    }
    if (e.transport == "tcp" && want_ucx && si < ucx_base.size()) {
      row.ucx = ucxCell(ucx_base[si]);
      if (ucx_base[si].gbps() > 0 && e.r.gbps > 0) {
        row.ucx_ratio = fmt("%.2f", e.r.gbps / ucx_base[si].gbps());
      }
    }
    row.cpu = cpuPair(e.r.cpu_a, e.r.cpu_b);
    row.us_per_frame = usPerFramePair(e.r);
    row.sleeps = sleepsPerFramePair(e.r);
    printRow(row);
  }
  for (const auto& m : many) {
    const CaseResult& r = m.r.total;
    Row row;
    row.what =
        m.transport + " " + formatBytes(*pairs_size) + ", " + std::to_string(o.pairs) + " pairs at once";
    row.ours = r.gbps > 0 ? gbpsText(r.gbps) : "failed";
    if (r.verify_bad != 0 || r.verified < kVerifyFrames * o.pairs) row.ours += " UNVERIFIED";
    if (r.gbps > 0) row.fps = fmt("%.0f", r.fps);
    const CaseResult* one = nullptr;
    for (const auto& e : e2e) {
      if (e.transport == m.transport && e.size == *pairs_size) one = &e.r;
    }
    double lo = 0, hi = 0;
    if (!m.r.pair_gbps.empty()) {
      lo = *std::min_element(m.r.pair_gbps.begin(), m.r.pair_gbps.end());
      hi = *std::max_element(m.r.pair_gbps.begin(), m.r.pair_gbps.end());
    }
    const std::string spread = hi > 0 ? "; pairs " + fmt("%.3f", lo) + " .. " + fmt("%.3f GB/s", hi) : "";
    if (one == nullptr) {
      row.baseline = "one pair n/a (add " + formatBytes(*pairs_size) + " to --sizes)" + spread;
    } else {
      row.baseline = "one pair " + (one->gbps > 0 ? gbpsText(one->gbps) : std::string("failed")) + spread;
    }
    const std::string vs_one =
        one != nullptr && one->gbps > 0 && r.gbps > 0 ? fmt("%.2f", r.gbps / one->gbps) : "-";
    row.ratio =
        vs_one + " (slowest / fastest pair " + (hi > 0 ? fmt("%.2f", lo / hi) : std::string("-")) + ")";
    row.cpu = cpuPair(r.cpu_a, r.cpu_b);
    row.us_per_frame = usPerFramePair(r);
    row.sleeps = sleepsPerFramePair(r);
    printRow(row);
  }
  if (o.baselines_only) {
    for (size_t si = 0; si < sizes->size(); ++si) {
      const std::string sz = formatBytes((*sizes)[si]);
      if (tcp_base[si].gbps() > 0 || want_ucx) {
        Row row;
        row.what = "plain TCP " + sz;
        if (tcp_base[si].gbps() > 0) {
          row.baseline = gbpsText(tcp_base[si].gbps()) + fmt(" (%.0f msg/s)", tcp_base[si].fps());
        }
        if (want_ucx) row.ucx = ucxCell(ucx_base[si]);
        printRow(row);
      }
      if (grpc_base[si].gbps() > 0) {
        Row row;
        row.what = "plain gRPC " + sz;
        row.baseline = gbpsText(grpc_base[si].gbps()) + fmt(" (%.0f msg/s)", grpc_base[si].fps());
        printRow(row);
      }
    }
    if (tcp_lat.samples > 0 || ucx_lat_done) {
      Row row;
      row.what = "4 KiB latency, one-way";
      if (tcp_lat.samples > 0) {
        row.baseline = "TCP (RTT/2, " + std::to_string(tcp_lat.samples) + " samples) " +
                       fmt("p50 %.1f us", tcp_lat.p50_us) + fmt(" / p99 %.1f us", tcp_lat.p99_us);
      }
      if (ucx_lat_done) {
        row.ucx = ucx_lat.samples > 0
                      ? fmt("tag_lat p50 %.1f us", ucx_lat.p50_us) + fmt(" / p99 %.1f us", ucx_lat.p99_us)
                  : ucx_lat.error == kUcxMissing ? kUcxMissing
                                                 : "failed";
      }
      printRow(row);
    }
  }
  for (const auto& [t, r] : lat) {
    Row row;
    row.what = t + " latency 4 KiB submit->receive (" + std::to_string(r.samples) + " samples)";
    row.ours = r.samples > 0 ? fmt("p50 %.1f us", r.p50_us) + fmt(" / p99 %.1f us", r.p99_us) : "failed";
    if (!o.no_baselines) {
      row.baseline = tcp_lat.samples > 0 ? fmt("TCP one-way p50 %.1f us", tcp_lat.p50_us) +
                                               fmt(" / p99 %.1f us", tcp_lat.p99_us)
                                         : "n/a";
    }
    if (r.samples > 0 && tcp_lat.samples > 0 && tcp_lat.p50_us > 0) {
      row.ratio = fmt("%.1f", r.p50_us / tcp_lat.p50_us) + " (p50)";
    }
    if (t == "tcp" && ucx_lat_done) {
      row.ucx = ucx_lat.samples > 0
                    ? fmt("tag_lat p50 %.1f us", ucx_lat.p50_us) + fmt(" / p99 %.1f us", ucx_lat.p99_us)
                : ucx_lat.error == kUcxMissing ? kUcxMissing
                                               : "failed";
      if (r.samples > 0 && ucx_lat.samples > 0 && ucx_lat.p50_us > 0) {
        row.ucx_ratio = fmt("%.1f", r.p50_us / ucx_lat.p50_us) + " (p50)";
      }
    }
    row.cpu = cpuPair(r.cpu_a, r.cpu_b);
    row.us_per_frame = usPerFramePair(r);
    row.sleeps = sleepsPerFramePair(r);
    printRow(row);
  }
  for (const auto& [t, c] : idle) {
    Row row;
    row.what = t + " daemons idle (" + fmt("%.1f s", o.idle_seconds) + ", link up, no clients)";
    row.cpu = cpuPair(c.a, c.b);
    printRow(row);
  }
  std::printf(
      "\nframelink GB/s = bytes delivered (consumer released) / first submit .. last completion; slots: %s;\n"
      "payload verified byte-for-byte on %llu frames per case before the timed loop.  Baselines: one TCP\n"
      "connection, size-byte send()/recv() between two processes; one gRPC bidi stream "
      "(client/cli/bench.proto)\n"
      "between two processes, server acks every 8 MiB.  CPU = utime+stime of each framelinkd / wall time;\n"
      "CPU per frame = the same CPU time / frames delivered in the timed part; sleeps per frame = times a\n"
      "thread of the daemon blocked (voluntary context switches of all its threads) / the same frames.\n",
      [&] {
        std::string s;
        for (uint64_t size : *sizes) {
          if (!s.empty()) s += ", ";
          s += std::to_string(slotsFor(size)) + " x " + formatBytes(size);
        }
        return s;
      }()
          .c_str(),
      (unsigned long long)kVerifyFrames);
  if (!many.empty()) {
    std::printf(
        "%u pairs: %u producer/consumer pairs on %u streams through the same two daemons, timed together, "
        "%u x %s slots each;\naggregate GB/s over the earliest first submit .. latest last completion; ratio "
        "= "
        "aggregate / one pair at %s above.\n",
        o.pairs, o.pairs, o.pairs, pairSlotsFor(*pairs_size, o.pairs), formatBytes(*pairs_size).c_str(),
        formatBytes(*pairs_size).c_str());
  }
  if (want_ucx) {
    std::printf(
        "UCX: ucx_perftest -t tag_bw -s SIZE (and -t tag_lat -s 4096, one-way) with UCX_TLS=tcp, server and "
        "client "
        "processes,\nclient to 127.0.0.1; UCX picks its own tcp devices (all local); GB/s from its overall "
        "MB/s (2^20 bytes).\nBoth ucx_perftest processes busy-poll: on a machine with other load their "
        "figures "
        "drop by up to 20x.\n");
  }
  std::fflush(stdout);
  for (const auto& e : errors) std::fprintf(stderr, "framelink bench: %s\n", e.c_str());
  if (g_interrupted.load()) return 130;
  return errors.empty() ? 0 : 1;
}

}  // namespace

void addBenchCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd =
      app.add_subcommand("bench", "Throughput, latency and daemon CPU vs plain TCP / gRPC / UCX baselines");
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
  cmd->callback([o, &exit_code] { exit_code = runBench(*o); });
}

}  // namespace framelink::cli
