// `framelink bench`: end-to-end throughput and latency through two framelinkd on this machine,
// next to plain TCP and plain gRPC baselines measured by this same program, plus daemon CPU.
// --host-a / --host-b put the two daemons on given local addresses (two RDMA devices, e.g. the
// Soft-RoCE lane's rxe_a and rxe_b); rdma has no in-program baseline (compare with perftest's
// ib_write_bw, as tests/softroce/bench.sh does).
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_baselines.h"
#include "bench_case.h"
#include "child_process.h"
#include "cli_util.h"
#include "commands.h"
#include "daemon_pair.h"

namespace framelink::cli {
namespace {

struct BenchOptions {
  std::string transports = "tcp,grpc";
  std::string sizes = "64K,1M,4M";
  double seconds = 3;
  uint64_t latency_samples = 2000;
  std::string framelinkd;
  double idle_seconds = 2;
  bool baselines_only = false;
  bool no_baselines = false;
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

struct Row {
  std::string what;
  std::string ours;
  std::string baseline;
  std::string ratio;
  std::string cpu;
  std::string note;
};

void status(const char* fmt_str, const std::string& a) {
  std::fprintf(stderr, fmt_str, a.c_str());
  std::fflush(stderr);
}

int runBench(const BenchOptions& o) {
  installInterruptHandler();
  auto sizes = parseSizeList(o.sizes);
  if (!sizes) {
    std::fprintf(stderr, "framelink bench: --sizes '%s' is not a comma list of sizes (e.g. 64K,1M,4M)\n",
                 o.sizes.c_str());
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

  std::vector<Row> rows;
  bool any_error = false;
  std::vector<std::string> errors;
  struct E2E {
    std::string transport;
    uint64_t size;
    CaseResult r;
  };
  std::vector<E2E> e2e;
  std::vector<std::pair<std::string, CaseResult>> lat;
  std::vector<std::pair<std::string, IdleCpu>> idle;

  // Each baseline runs right after the framelink case it is compared with (the daemons sit idle
  // meanwhile), so both see the same machine: on a shared 2-vCPU host load changes by the minute.
  std::vector<ThroughputResult> tcp_base(sizes->size()), grpc_base(sizes->size());
  LatencyResult tcp_lat;
  auto runBaseline = [&](const std::string& t, size_t si) {
    if (o.no_baselines || !hasBaseline(t)) return;
    if (t == "tcp") {
      status("  %s ...\n", "plain TCP " + formatBytes((*sizes)[si]));
      tcp_base[si] = plainTcpThroughput((*sizes)[si], o.seconds);
      if (!tcp_base[si].error.empty()) errors.push_back("plain TCP: " + tcp_base[si].error);
    } else {
      status("  %s ...\n", "plain gRPC " + formatBytes((*sizes)[si]));
      grpc_base[si] = plainGrpcThroughput((*sizes)[si], o.seconds);
      if (!grpc_base[si].error.empty()) errors.push_back("plain gRPC: " + grpc_base[si].error);
    }
  };
  auto runPingPong = [&] {
    if (o.no_baselines) return;
    status("  %s ...\n", std::string("plain TCP ping-pong 4 KiB"));
    tcp_lat = plainTcpOneWay(4096, o.latency_samples);
    if (!tcp_lat.error.empty()) errors.push_back("plain TCP ping-pong: " + tcp_lat.error);
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
    }
    if (!g_interrupted.load()) {
      status("  %s ...\n", t + " idle daemons, " + fmt("%.0f s", o.idle_seconds));
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
    if (!g_interrupted.load() && o.latency_samples > 0) runPingPong();
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
  std::printf("| case | framelink | baseline | ratio | daemon CPU A / B |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const auto& e : e2e) {
    size_t si = 0;
    while (si < sizes->size() && (*sizes)[si] != e.size) ++si;
    const ThroughputResult* base = nullptr;
    std::string base_name;
    if (e.transport == "tcp" && si < tcp_base.size()) {
      base = &tcp_base[si];
      base_name = "plain TCP";
    } else if (e.transport == "grpc" && si < grpc_base.size()) {
      base = &grpc_base[si];
      base_name = "plain gRPC";
    }
    std::string ours = e.r.gbps > 0 ? gbpsText(e.r.gbps) + fmt(" (%.0f frames/s)", e.r.fps) : "failed";
    if (e.r.verify_bad != 0 || e.r.verified < kVerifyFrames) ours += " UNVERIFIED";
    std::string b = !base              ? "-"
                    : base->gbps() > 0 ? base_name + " " + gbpsText(base->gbps())
                                       : base_name + " n/a";
    std::string ratio = base && base->gbps() > 0 && e.r.gbps > 0 ? fmt("%.2f", e.r.gbps / base->gbps()) : "-";
    std::printf("| %s %s | %s | %s | %s | %s |\n", e.transport.c_str(), formatBytes(e.size).c_str(),
                ours.c_str(), b.c_str(), ratio.c_str(), cpuPair(e.r.cpu_a, e.r.cpu_b).c_str());
  }
  if (o.baselines_only) {
    for (size_t si = 0; si < sizes->size(); ++si) {
      if (tcp_base[si].gbps() > 0) {
        std::printf("| plain TCP %s | - | %s | - | - |\n", formatBytes((*sizes)[si]).c_str(),
                    (gbpsText(tcp_base[si].gbps()) + fmt(" (%.0f msg/s)", tcp_base[si].fps())).c_str());
      }
      if (grpc_base[si].gbps() > 0) {
        std::printf("| plain gRPC %s | - | %s | - | - |\n", formatBytes((*sizes)[si]).c_str(),
                    (gbpsText(grpc_base[si].gbps()) + fmt(" (%.0f msg/s)", grpc_base[si].fps())).c_str());
      }
    }
    if (tcp_lat.samples > 0) {
      std::printf(
          "| plain TCP 4 KiB one-way (RTT/2, %llu samples) | - | p50 %.1f us / p99 %.1f us | - | - |\n",
          (unsigned long long)tcp_lat.samples, tcp_lat.p50_us, tcp_lat.p99_us);
    }
  }
  for (const auto& [t, r] : lat) {
    std::string ours =
        r.samples > 0 ? fmt("p50 %.1f us", r.p50_us) + fmt(" / p99 %.1f us", r.p99_us) : "failed";
    std::string b = tcp_lat.samples > 0 ? fmt("TCP one-way p50 %.1f us", tcp_lat.p50_us) +
                                              fmt(" / p99 %.1f us", tcp_lat.p99_us)
                                        : "n/a";
    std::string ratio = r.samples > 0 && tcp_lat.samples > 0 && tcp_lat.p50_us > 0
                            ? fmt("%.1f", r.p50_us / tcp_lat.p50_us) + " (p50)"
                            : "-";
    std::printf("| %s latency 4 KiB submit->receive (%llu samples) | %s | %s | %s | - |\n", t.c_str(),
                (unsigned long long)r.samples, ours.c_str(), b.c_str(), ratio.c_str());
  }
  for (const auto& [t, c] : idle) {
    std::printf("| %s daemons idle (%.0f s, link up, no clients) | - | - | - | %s |\n", t.c_str(),
                o.idle_seconds, cpuPair(c.a, c.b).c_str());
  }
  std::printf(
      "\nframelink GB/s = bytes delivered (consumer released) / first submit .. last completion; slots: %s;\n"
      "payload verified byte-for-byte on %llu frames per case before the timed loop.  Baselines: one TCP\n"
      "connection, size-byte send()/recv() between two processes; one gRPC bidi stream "
      "(client/cli/bench.proto)\n"
      "between two processes, server acks every 8 MiB.  CPU = utime+stime of each framelinkd / wall time.\n",
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
  std::fflush(stdout);
  for (const auto& e : errors) std::fprintf(stderr, "framelink bench: %s\n", e.c_str());
  if (g_interrupted.load()) return 130;
  return errors.empty() ? 0 : 1;
}

}  // namespace

void addBenchCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Throughput, latency and daemon CPU vs plain TCP / gRPC baselines");
  cmd->add_option("--transports", o->transports, "comma list of transports (default tcp,grpc)");
  cmd->add_option("--sizes", o->sizes, "comma list of frame sizes (default 64K,1M,4M)");
  cmd->add_option("--seconds", o->seconds, "seconds per throughput case (default 3)");
  cmd->add_option("--latency-samples", o->latency_samples,
                  "4 KiB frames for the latency case (default 2000; 0 = skip)");
  cmd->add_option("--idle-seconds", o->idle_seconds, "seconds to sample idle daemon CPU (default 2)");
  cmd->add_option("--framelinkd", o->framelinkd,
                  "path of framelinkd (default: the build tree's, then $PATH)");
  cmd->add_flag("--baselines-only", o->baselines_only,
                "measure only the plain TCP / gRPC baselines (no daemons)");
  cmd->add_flag("--no-baselines", o->no_baselines, "skip the plain TCP / gRPC baselines");
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
