// `framelink-bench run --local`: producer and consumers attached to one framelinkd (no peer, no
// network): the consumers read the producer's slots where they are (lent read-only), so bytes per
// second grow with the frame size.  Next to it, in the same run: the memcpy bandwidth of this
// machine at the largest size (what a copying local path could at best do), and one subscriber
// against N subscribers of one stream (each gets every frame).
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_case.h"
#include "bench_report.h"
#include "child_process.h"
#include "cli_util.h"
#include "daemon_pair.h"
#include "framelink/framelink.h"

namespace framelink::cli {
namespace {

// GB/s of memcpy between two fresh buffers of `size` bytes (best of a few rounds, pages touched).
double memcpyGbps(uint64_t size, double seconds) {
  auto* src = static_cast<uint8_t*>(
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* dst = static_cast<uint8_t*>(
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (src == MAP_FAILED || dst == MAP_FAILED) return 0;
  std::memset(src, 0x5A, size);
  std::memset(dst, 0, size);
  uint64_t bytes = 0;
  const uint64_t t0 = monotonicNs();
  const uint64_t end = t0 + static_cast<uint64_t>(seconds * 1e9);
  uint64_t now = t0;
  do {
    std::memcpy(dst, src, size);
    bytes += size;
    now = monotonicNs();
  } while (now < end);
  volatile uint8_t sink = dst[size / 2];
  (void)sink;
  ::munmap(src, size);
  ::munmap(dst, size);
  return bytes / ((now - t0) / 1e9) / 1e9;
}

CaseConfig localCase(uint64_t size, double seconds) {
  CaseConfig c = throughputCase(size, seconds);
  c.local = true;
  return c;
}

// `count` consumers of streams nobody sends, on daemon A; stops at the first that cannot attach
// (its error in `errors`).
std::vector<fl_client*> attachIdleClients(const DaemonPair& pair, uint32_t count,
                                          std::vector<std::string>& errors) {
  std::vector<fl_client*> idle;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string stream = "idle" + std::to_string(i);
    fl_client_options co;
    fl_client_options_init(&co);
    co.role = FL_CONSUMER;
    co.socket_path = pair.a().socket.c_str();
    co.stream = stream.c_str();
    co.client_name = "bench-idle";
    co.slot_count = 1;
    co.slot_size = 4096;
    fl_client* c = nullptr;
    if (fl_attach(&co, &c) != FL_OK) {
      errors.push_back("idle client " + std::to_string(i) + ": " + fl_last_error());
      break;
    }
    idle.push_back(c);
  }
  return idle;
}

}  // namespace

int runLocalBench(const BenchOptions& o, const std::vector<uint64_t>& sizes, DaemonPair::Options daemons) {
  daemons.transport = "tcp";  // the link is not used: every reader is on daemon A
  std::string err;
  auto pair = DaemonPair::start(daemons, err);
  if (!pair) {
    std::fprintf(stderr, "framelink-bench run: %s\n", err.c_str());
    return 1;
  }
  std::vector<std::string> errors;
  // Idle neighbours: consumers of streams nobody sends, attached for the whole run.
  std::vector<fl_client*> idle = attachIdleClients(*pair, o.idle_clients, errors);
  if (!idle.empty()) std::fprintf(stderr, "  %zu idle clients attached\n", idle.size());
  struct Row {
    uint64_t size;
    CaseResult r;
  };
  std::vector<Row> rows;
  int stream_no = 0;
  for (const uint64_t size : sizes) {
    if (g_interrupted.load()) break;
    std::fprintf(stderr, "  local %s frames, one reader, %.0f s ...\n", formatBytes(size).c_str(), o.seconds);
    CaseResult r = runCase(*pair, "local" + std::to_string(stream_no++), localCase(size, o.seconds));
    if (!r.error.empty()) errors.push_back("local " + formatBytes(size) + ": " + r.error);
    rows.push_back({size, r});
  }
  const uint64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  const double copy_gbps = largest > 0 ? memcpyGbps(largest, 1.0) : 0;

  CaseResult lat;
  if (!g_interrupted.load() && o.latency_samples > 0) {
    std::fprintf(stderr, "  local latency, 4 KiB frames one at a time ...\n");
    CaseConfig c = latencyCase(o.latency_samples);
    c.local = true;
    lat = runCase(*pair, "local-latency", c);
    if (!lat.error.empty()) errors.push_back("local latency: " + lat.error);
  }

  SubscribersResult subs;
  const uint64_t sub_size = o.fanout_size;
  if (!g_interrupted.load() && o.subscribers > 1) {
    std::fprintf(stderr, "  local %s frames, 1 then %u subscribers ...\n", formatBytes(sub_size).c_str(),
                 o.subscribers);
    subs = runSubscribers(*pair, "local-sub", localCase(sub_size, o.seconds), o.subscribers);
    if (!subs.one.error.empty()) errors.push_back("local 1 subscriber: " + subs.one.error);
    if (!subs.many.error.empty()) errors.push_back("local subscribers: " + subs.many.error);
  }
  for (fl_client* c : idle) fl_detach(c);
  pair->stop();

  std::printf(
      "\nlocal delivery: producer and consumers on one framelinkd, no copy (the reader maps the producer's "
      "slot)\n");
  std::printf("%-8s %10s %12s %14s %12s\n", "size", "GB/s", "frames/s", "x memcpy", "verified");
  for (const Row& row : rows) {
    std::printf("%-8s %10.2f %12.0f %14s %8llu/%llu\n", formatBytes(row.size).c_str(), row.r.gbps, row.r.fps,
                copy_gbps > 0 ? fmt("%.1f", row.r.gbps / copy_gbps).c_str() : "-",
                static_cast<unsigned long long>(row.r.verified),
                static_cast<unsigned long long>(kVerifyFrames));
  }
  if (!idle.empty()) std::printf("with %zu idle clients attached to the daemon\n", idle.size());
  if (copy_gbps > 0) {
    std::printf("memcpy %s in this process, same run: %.2f GB/s (the ratio's baseline)\n",
                formatBytes(largest).c_str(), copy_gbps);
  }
  if (lat.samples > 0) {
    std::printf("latency 4 KiB, one at a time: p50 %.1f us, p99 %.1f us (%llu samples)\n", lat.p50_us,
                lat.p99_us, static_cast<unsigned long long>(lat.samples));
  }
  if (subs.aggregateRatio() > 0) {
    std::printf(
        "%u subscribers, %s frames: %.2f GB/s each, %.2f GB/s aggregate = %.2f x one subscriber "
        "(%.2f GB/s)\n",
        o.subscribers, formatBytes(sub_size).c_str(), subs.many.gbps, subs.many.gbps * o.subscribers,
        subs.aggregateRatio(), subs.one.gbps);
  }
  for (const auto& e : errors) std::fprintf(stderr, "framelink-bench run: %s\n", e.c_str());
  if (g_interrupted.load()) return 130;
  return errors.empty() ? 0 : 1;
}

}  // namespace framelink::cli
