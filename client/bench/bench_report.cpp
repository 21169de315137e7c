#include "bench_report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "bench_sockperf.h"
#include "bench_ucx.h"
#include "cli_util.h"

namespace framelink::cli {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

namespace {

// Three significant digits below 1 GB/s (an emulated RDMA link runs at
// 0.05 GB/s, where two decimals would round ratios by up to 10 %).
std::string gbpsText(double gbps) { return fmt(gbps < 1 ? "%.3f GB/s" : "%.2f GB/s", gbps); }

std::string cpuPair(double a, double b) {
  if (a < 0 || b < 0) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%% / %.1f%%", a, b);
  return buf;
}

std::string usPair(double a, double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, a < 10 && b < 10 ? "%.2f / %.2f us" : "%.1f / %.1f us", a, b);
  return buf;
}

// "all / all us (user / user us)": the daemons' CPU per frame, and the part
// of it in their own code; the rest is the kernel's (under rxe, its copies).
std::string usPerFramePair(const CaseResult& r) {
  if (r.cpu_us_per_frame_a < 0 || r.cpu_us_per_frame_b < 0) return "n/a";
  std::string cell = usPair(r.cpu_us_per_frame_a, r.cpu_us_per_frame_b);
  if (r.user_us_per_frame_a >= 0 && r.user_us_per_frame_b >= 0) {
    cell += " (user " + usPair(r.user_us_per_frame_a, r.user_us_per_frame_b) + ")";
  }
  return cell;
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

// The daemon CPU columns of a framelink case.
void setCpuCells(Row& row, const CaseResult& r) {
  row.cpu = cpuPair(r.cpu_a, r.cpu_b);
  row.us_per_frame = usPerFramePair(r);
  row.sleeps = sleepsPerFramePair(r);
}

std::string ucxCell(const ThroughputResult& u) {
  if (u.gbps() > 0) return gbpsText(u.gbps()) + fmt(" (%.0f msg/s)", u.fps());
  if (u.error == kUcxMissing) return kUcxMissing;
  return u.error.empty() ? "-" : "failed";
}

// UCX's one-way latency, or why there is none.
std::string ucxLatencyCell(const LatencyResult& u) {
  return u.samples > 0            ? fmt("tag_lat p50 %.1f us", u.p50_us) + fmt(" / p99 %.1f us", u.p99_us)
         : u.error == kUcxMissing ? kUcxMissing
                                  : "failed";
}

// sockperf's one-way latency, or why there is none.
std::string sockperfCell(const LatencyResult& s) {
  return s.samples > 0 ? fmt("sockperf p50 %.1f us", s.p50_us) + fmt(" / p99 %.1f us", s.p99_us)
         : s.error == kSockperfMissing ? kSockperfMissing
                                       : "sockperf failed";
}

// The machine, the path a frame takes, and the column headers.
void printHeader(const BenchOptions& o) {
  utsname u{};
  uname(&u);
  std::printf(
      "\nframelink-bench run: %ld CPUs, Linux %s, %.0f s per throughput case, same machine, same run\n",
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
}

// A throughput case next to the plain TCP or gRPC baseline of its size (and UCX for tcp).
Row throughputRow(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res,
                  const BenchResults::E2E& e) {
  size_t si = 0;
  while (si < plan.sizes.size() && plan.sizes[si] != e.size) ++si;
  const ThroughputResult* base = nullptr;
  std::string base_name;
  if (e.transport == "tcp" && si < res.tcp_base.size()) {
    base = &res.tcp_base[si];
    base_name = "plain TCP";
  } else if (e.transport == "grpc" && si < res.grpc_base.size()) {
    base = &res.grpc_base[si];
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
  if (e.transport == "tcp" && !o.no_baselines && si < res.ucx_base.size()) {
    row.ucx = ucxCell(res.ucx_base[si]);
    if (res.ucx_base[si].gbps() > 0 && e.r.gbps > 0) {
      row.ucx_ratio = fmt("%.2f", e.r.gbps / res.ucx_base[si].gbps());
    }
  }
  setCpuCells(row, e.r);
  return row;
}

// The many-pairs case next to one pair of the same frame size, with the slowest and fastest pair.
Row manyPairsRow(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res,
                 const BenchResults::Many& m) {
  const CaseResult& r = m.r.total;
  Row row;
  row.what =
      m.transport + " " + formatBytes(plan.pairs_size) + ", " + std::to_string(o.pairs) + " pairs at once";
  row.ours = r.gbps > 0 ? gbpsText(r.gbps) : "failed";
  if (r.verify_bad != 0 || r.verified < kVerifyFrames * o.pairs) row.ours += " UNVERIFIED";
  if (r.gbps > 0) row.fps = fmt("%.0f", r.fps);
  const CaseResult* one = nullptr;
  for (const auto& e : res.e2e) {
    if (e.transport == m.transport && e.size == plan.pairs_size) one = &e.r;
  }
  double lo = 0, hi = 0;
  if (!m.r.pair_gbps.empty()) {
    lo = *std::min_element(m.r.pair_gbps.begin(), m.r.pair_gbps.end());
    hi = *std::max_element(m.r.pair_gbps.begin(), m.r.pair_gbps.end());
  }
  const std::string spread = hi > 0 ? "; pairs " + fmt("%.3f", lo) + " .. " + fmt("%.3f GB/s", hi) : "";
  if (one == nullptr) {
    row.baseline = "one pair n/a (add " + formatBytes(plan.pairs_size) + " to --sizes)" + spread;
  } else {
    row.baseline = "one pair " + (one->gbps > 0 ? gbpsText(one->gbps) : std::string("failed")) + spread;
  }
  const std::string vs_one =
      one != nullptr && one->gbps > 0 && r.gbps > 0 ? fmt("%.2f", r.gbps / one->gbps) : "-";
  row.ratio = vs_one + " (slowest / fastest pair " + (hi > 0 ? fmt("%.2f", lo / hi) : std::string("-")) + ")";
  setCpuCells(row, r);
  return row;
}

// --baselines-only: a row per size and baseline that has a figure, then the latency baselines.
void printBaselineRows(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res) {
  const bool want_ucx = !o.no_baselines;
  for (size_t si = 0; si < plan.sizes.size(); ++si) {
    const std::string sz = formatBytes(plan.sizes[si]);
    if (res.tcp_base[si].gbps() > 0 || want_ucx) {
      Row row;
      row.what = "plain TCP " + sz;
      if (res.tcp_base[si].gbps() > 0) {
        row.baseline = gbpsText(res.tcp_base[si].gbps()) + fmt(" (%.0f msg/s)", res.tcp_base[si].fps());
      }
      if (want_ucx) row.ucx = ucxCell(res.ucx_base[si]);
      printRow(row);
    }
    if (res.grpc_base[si].gbps() > 0) {
      Row row;
      row.what = "plain gRPC " + sz;
      row.baseline = gbpsText(res.grpc_base[si].gbps()) + fmt(" (%.0f msg/s)", res.grpc_base[si].fps());
      printRow(row);
    }
  }
  if (res.tcp_lat.samples > 0 || res.ucx_lat_done) {
    Row row;
    row.what = "4 KiB latency, one-way";
    if (res.tcp_lat.samples > 0) {
      row.baseline = "TCP (RTT/2, " + std::to_string(res.tcp_lat.samples) + " samples) " +
                     fmt("p50 %.1f us", res.tcp_lat.p50_us) + fmt(" / p99 %.1f us", res.tcp_lat.p99_us);
    }
    if (res.sockperf_done) row.baseline += "; " + sockperfCell(res.sockperf_lat);
    if (res.ucx_lat_done) row.ucx = ucxLatencyCell(res.ucx_lat);
    printRow(row);
  }
}

// A latency case next to sockperf's one-way time (and plain TCP's ping-pong, and UCX's for tcp);
// the ratio is to sockperf's when there is one.
Row latencyRow(const BenchOptions& o, const BenchResults& res, const std::string& t, const CaseResult& r) {
  const LatencyResult& tcp = res.tcp_lat;
  const LatencyResult& ucx = res.ucx_lat;
  const LatencyResult& sp = res.sockperf_lat;
  Row row;
  row.what = t + " latency 4 KiB submit->receive (" + std::to_string(r.samples) + " samples)";
  row.ours = r.samples > 0 ? fmt("p50 %.1f us", r.p50_us) + fmt(" / p99 %.1f us", r.p99_us) : "failed";
  if (!o.no_baselines) {
    row.baseline = tcp.samples > 0
                       ? fmt("TCP one-way p50 %.1f us", tcp.p50_us) + fmt(" / p99 %.1f us", tcp.p99_us)
                       : "n/a";
    if (res.sockperf_done) row.baseline = sockperfCell(sp) + "; " + row.baseline;
  }
  if (r.samples > 0 && sp.samples > 0 && sp.p50_us > 0) {
    row.ratio = fmt("%.1f", r.p50_us / sp.p50_us) + " (p50, sockperf)";
  } else if (r.samples > 0 && tcp.samples > 0 && tcp.p50_us > 0) {
    row.ratio = fmt("%.1f", r.p50_us / tcp.p50_us) + " (p50, TCP)";
  }
  if (t == "tcp" && res.ucx_lat_done) {
    row.ucx = ucxLatencyCell(ucx);
    if (r.samples > 0 && ucx.samples > 0 && ucx.p50_us > 0) {
      row.ucx_ratio = fmt("%.1f", r.p50_us / ucx.p50_us) + " (p50)";
    }
  }
  setCpuCells(row, r);
  return row;
}

void printSubscriberRow(const std::string& what, const std::string& one, const std::string& many,
                        const std::string& ratio) {
  std::printf("| %s | %s | %s | %s |\n", what.c_str(), one.c_str(), many.c_str(), ratio.c_str());
}

// Frames per second over all `readers` of a case (each reader gets every frame).
std::string allReadersFps(const CaseResult& r, uint32_t readers) {
  return r.fps > 0 ? fmt("%.0f", r.fps * readers) : "failed";
}

std::string allReadersGbps(const CaseResult& r, uint32_t readers) {
  if (r.gbps <= 0) return "failed";
  return gbpsText(r.gbps * readers) + (r.verify_bad != 0 || r.verified < kVerifyFrames ? " UNVERIFIED" : "");
}

// The bytes the link carried per frame, as a multiple of the frame size.
std::string linkBytesCell(const CaseResult& r, uint64_t size) {
  if (r.link_bytes_per_frame < 0) return "n/a";
  return fmt("%.2f x frame", r.link_bytes_per_frame / static_cast<double>(size)) +
         fmt(" (%.0f B)", r.link_bytes_per_frame);
}

// The bytes the link carried per frame and the daemons' CPU per frame of both sides of a case.
void printLinkAndCpuRows(const std::string& what, const CaseResult& one, const CaseResult& many,
                         uint64_t size) {
  printSubscriberRow(what + "link bytes per frame", linkBytesCell(one, size), linkBytesCell(many, size),
                     one.link_bytes_per_frame > 0 && many.link_bytes_per_frame >= 0
                         ? fmt("%.2f", many.link_bytes_per_frame / one.link_bytes_per_frame)
                         : "-");
  printSubscriberRow(what + "daemon CPU per frame A / B", usPerFramePair(one), usPerFramePair(many), "-");
}

// One subscriber against --subscribers of one stream on daemon B, per transport, side by side.
void printSubscriberTable(const BenchOptions& o, const BenchResults& res) {
  if (res.subscribers.empty()) return;
  const uint32_t n = o.subscribers;
  const std::string size = formatBytes(o.fanout_size);
  std::printf(
      "\nsubscribers of one stream on daemon B, %s frames: each frame should cross the link once, land in "
      "one reader's\nslot, and be lent by B to the others (read-only); the producer's completion waits for "
      "the slowest reader\n\n",
      size.c_str());
  std::printf("| case | 1 subscriber | %u subscribers | ratio %u / 1 |\n", n, n);
  std::printf("|---|---|---|---|\n");
  for (const auto& s : res.subscribers) {
    const CaseResult& one = s.r.one;
    const CaseResult& many = s.r.many;
    const std::string what = s.transport + " " + size + ", ";
    const double ratio = s.r.aggregateRatio();
    const std::string ratio_cell = ratio > 0 ? fmt("%.2f", ratio) : "-";
    printSubscriberRow(what + "frames/s delivered, all readers", allReadersFps(one, 1),
                       allReadersFps(many, n), ratio_cell);
    printSubscriberRow(what + "GB/s delivered, all readers", allReadersGbps(one, 1), allReadersGbps(many, n),
                       ratio_cell);
    printLinkAndCpuRows(what, one, many, o.fanout_size);
  }
  std::printf(
      "\nall readers = each frame counted once per reader; each side runs in two halves (one, N, N, one);\n"
      "link bytes per frame = the rise of daemon A's transport_bytes_sent "
      "(framelink_transport_bytes_sent_total "
      "on\n/metrics) over a side's first half / the frames its producer sent in it (verification and "
      "timed);\n"
      "CPU per frame = per frame sent, whatever the readers.\n");
}

// --hosts 2: one stream to hostB alone against the same to hostB and hostC, per transport, side by
// side.
void printTwoHostsTable(const BenchOptions& o, const BenchResults& res) {
  if (res.hosts.empty()) return;
  const std::string size = formatBytes(o.fanout_size);
  std::printf(
      "\none stream to two hosts, %s frames: daemon A sends each frame to hostB and to hostC from the same "
      "producer slot,\none reader on each host; the producer's completion waits for both\n\n",
      size.c_str());
  std::printf("| case | hostB alone | hostB and hostC, each | ratio each / alone |\n");
  std::printf("|---|---|---|---|\n");
  for (const auto& h : res.hosts) {
    const CaseResult& one = h.r.one;
    const CaseResult& many = h.r.many;
    const std::string what = h.transport + " " + size + ", ";
    const std::string ratio_cell = one.fps > 0 && many.fps > 0 ? fmt("%.2f", many.fps / one.fps) : "-";
    printSubscriberRow(what + "frames/s delivered per host", allReadersFps(one, 1), allReadersFps(many, 1),
                       ratio_cell);
    printSubscriberRow(what + "GB/s delivered per host", allReadersGbps(one, 1), allReadersGbps(many, 1),
                       ratio_cell);
    printLinkAndCpuRows(what, one, many, o.fanout_size);
  }
  std::printf(
      "\neach = what each host got: every frame reaches both (the reader on hostC had as many as the one "
      "on hostB,\nelse the case fails); each side runs in two halves (alone, both, both, alone); link "
      "bytes per frame as above:\ndaemon A's transport_bytes_sent, so once per host; hostC shares the "
      "machine with A, B and the clients.\n");
}

// "8 x 4 KiB, ...": the slots of each throughput case.
std::string slotsText(const std::vector<uint64_t>& sizes) {
  std::string s;
  for (uint64_t size : sizes) {
    if (!s.empty()) s += ", ";
    s += std::to_string(slotsFor(size)) + " x " + formatBytes(size);
  }
  return s;
}

// What the figures mean and how each was measured.
void printNotes(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res) {
  std::printf(
      "\nframelink GB/s = bytes delivered (consumer released) / first submit .. last completion; slots: %s;\n"
      "payload verified byte-for-byte on %llu frames per case before the timed loop.  Baselines: one TCP\n"
      "connection, size-byte send()/recv() between two processes; one gRPC bidi stream "
      "(client/cli/bench.proto)\n"
      "between two processes, server acks every 8 MiB.  CPU = utime+stime of each framelinkd / wall time;\n"
      "CPU per frame = the same CPU time / frames delivered in the timed part, and in brackets its utime\n"
      "alone (the daemon's own code; the rest is the kernel's: syscalls, and a software NIC's copies);\n"
      "sleeps per frame = times a thread of the daemon blocked (voluntary context switches of all its\n"
      "threads) / the same frames.\n",
      slotsText(plan.sizes).c_str(), (unsigned long long)kVerifyFrames);
  if (!res.many.empty()) {
    std::printf(
        "%u pairs: %u producer/consumer pairs on %u streams through the same two daemons, timed together, "
        "%u x %s slots each;\naggregate GB/s over the earliest first submit .. latest last completion; ratio "
        "= "
        "aggregate / one pair at %s above.\n",
        o.pairs, o.pairs, o.pairs, pairSlotsFor(plan.pairs_size, o.pairs),
        formatBytes(plan.pairs_size).c_str(), formatBytes(plan.pairs_size).c_str());
  }
  if (!o.no_baselines) {
    std::printf(
        "UCX: ucx_perftest -t tag_bw -s SIZE (and -t tag_lat -s 4096, one-way) with UCX_TLS=tcp, server and "
        "client "
        "processes,\nclient to 127.0.0.1; UCX picks its own tcp devices (all local); GB/s from its overall "
        "MB/s (2^20 bytes).\nBoth ucx_perftest processes busy-poll: on a machine with other load their "
        "figures "
        "drop by up to 20x.\n");
  }
}

}  // namespace

void printBenchTable(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res) {
  printHeader(o);
  for (const auto& e : res.e2e) printRow(throughputRow(o, plan, res, e));
  for (const auto& m : res.many) printRow(manyPairsRow(o, plan, res, m));
  if (o.baselines_only) printBaselineRows(o, plan, res);
  for (const auto& [t, r] : res.lat) printRow(latencyRow(o, res, t, r));
  for (const auto& [t, c] : res.idle) {
    Row row;
    row.what = t + " daemons idle (" + fmt("%.1f s", o.idle_seconds) + ", link up, no clients)";
    row.cpu = cpuPair(c.a, c.b);
    printRow(row);
  }
  printSubscriberTable(o, res);
  printTwoHostsTable(o, res);
  printNotes(o, plan, res);
  printTargetsTable(o, plan, res);
  std::fflush(stdout);
}

}  // namespace framelink::cli
