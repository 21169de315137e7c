// The targets of small frames at wire speed, as one table after `framelink-bench run`'s own: each
// case's figure when the work began (main at 8a44352, the same command on the same kind of
// machine), its target, and this run's figure from the cases and baselines above it.
#include <cstdio>
#include <string>
#include <vector>

#include "bench_report.h"
#include "cli_util.h"

namespace framelink::cli {
namespace {

// One figure of this run: its text, and whether it meets the target (unknown when it was not
// measured).
struct Figure {
  std::string text = "-";
  bool measured = false;
  bool met = false;
};

const BenchResults::E2E* findCase(const BenchResults& res, const std::string& transport, uint64_t size) {
  for (const auto& e : res.e2e) {
    if (e.transport == transport && e.size == size && e.r.gbps > 0) return &e;
  }
  return nullptr;
}

const ThroughputResult* baseOf(const BenchPlan& plan, const std::vector<ThroughputResult>& base,
                               uint64_t size) {
  for (size_t si = 0; si < plan.sizes.size() && si < base.size(); ++si) {
    if (plan.sizes[si] == size && base[si].gbps() > 0) return &base[si];
  }
  return nullptr;
}

// framelink's `transport` at each of `sizes` over a baseline, "a / b / c"; met when every ratio is
// at least `target`.  What is missing is said: the option that adds it.
Figure ratios(const BenchPlan& plan, const BenchResults& res, const std::string& transport,
              const std::vector<uint64_t>& sizes, const std::vector<ThroughputResult>& base, double target) {
  Figure f;
  f.text.clear();
  f.measured = true;
  f.met = true;
  for (uint64_t size : sizes) {
    const auto* e = findCase(res, transport, size);
    const auto* b = baseOf(plan, base, size);
    if (!f.text.empty()) f.text += " / ";
    if (e == nullptr || b == nullptr) {
      f.text += "not run (" + transport + " " + formatBytes(size) + " with its baseline)";
      f.measured = false;
      continue;
    }
    const double r = e->r.gbps / b->gbps();
    f.text += fmt("%.2f", r);
    f.met = f.met && r >= target;
  }
  return f;
}

// With plain TCP's sending and receiving process's CPU per 4 KiB message beside it: the kernel's
// price of the same bytes, which daemon A (a sender) and B (a receiver) pay too.
Figure cpuPerFrame(const BenchPlan& plan, const BenchResults& res, double target_us) {
  Figure f;
  const auto* e = findCase(res, "tcp", 4096);
  if (e == nullptr || e->r.cpu_us_per_frame_a < 0 || e->r.cpu_us_per_frame_b < 0) {
    f.text = "not run (tcp 4K)";
    return f;
  }
  f.text = fmt("%.2f", e->r.cpu_us_per_frame_a) + fmt(" / %.2f us", e->r.cpu_us_per_frame_b);
  const auto* b = baseOf(plan, res.tcp_base, 4096);
  if (b != nullptr && b->send_cpu_us_per_msg > 0) {
    f.text += " (plain TCP's sender / receiver: " + fmt("%.2f", b->send_cpu_us_per_msg) +
              fmt(" / %.2f us a message)", b->recv_cpu_us_per_msg);
  }
  f.measured = true;
  f.met = e->r.cpu_us_per_frame_a <= target_us && e->r.cpu_us_per_frame_b <= target_us;
  return f;
}

// After a ratio of large frames: daemon A's CPU per frame beside plain TCP's sender's per message of
// each size, "(A / plain TCP's sender: 297 / 240 us, ...)": how much of A's time the same send
// costs a plain sender.
void addSenderCpu(const BenchPlan& plan, const BenchResults& res, const std::vector<uint64_t>& sizes,
                  Figure& f) {
  std::string beside;
  for (uint64_t size : sizes) {
    const auto* e = findCase(res, "tcp", size);
    const auto* b = baseOf(plan, res.tcp_base, size);
    if (e == nullptr || b == nullptr || e->r.cpu_us_per_frame_a < 0 || b->send_cpu_us_per_msg < 0) return;
    beside += (beside.empty() ? "" : ", ") + fmt("%.0f", e->r.cpu_us_per_frame_a) +
              fmt(" / %.0f us", b->send_cpu_us_per_msg);
  }
  f.text += " (CPU of A a frame / of plain TCP's sender a message: " + beside + ")";
}

Figure latencyRatio(const BenchResults& res, double target) {
  Figure f;
  const CaseResult* tcp = nullptr;
  for (const auto& [t, r] : res.lat) {
    if (t == "tcp" && r.samples > 0) tcp = &r;
  }
  if (tcp == nullptr) {
    f.text = "not run (tcp, --latency-samples)";
    return f;
  }
  const LatencyResult& s = res.sockperf_lat;
  if (s.samples == 0 || s.p50_us <= 0) {
    f.text = s.error.empty() ? "no sockperf figure" : s.error;
    return f;
  }
  const double r = tcp->p50_us / s.p50_us;
  f.text = fmt("%.2f", r) + fmt(" (%.1f us", tcp->p50_us) + fmt(" / %.1f us)", s.p50_us);
  f.measured = true;
  f.met = r <= target;
  return f;
}

void printTarget(const char* what, const char* filed, const char* target, const Figure& f) {
  const char* verdict = !f.measured ? "-" : f.met ? "met" : "not met";
  std::printf("| %s | %s | %s | %s | %s |\n", what, filed, target, f.text.c_str(), verdict);
}

}  // namespace

void printTargetsTable(const BenchOptions& o, const BenchPlan& plan, const BenchResults& res) {
  if (o.baselines_only || o.no_baselines || res.e2e.empty()) return;
  constexpr uint64_t k4K = 4096, k64K = 64 << 10, k1M = 1 << 20, k4M = 4 << 20;
  std::printf(
      "\nsmall frames at wire speed: the targets (ratios of this run; CPU per frame per daemon)\n\n"
      "| case | when filed (8a44352) | target | this run | |\n|---|---|---|---|---|\n");
  printTarget("tcp 4 KiB frames/s / plain TCP 4 KiB messages/s", "0.15", ">= 0.8",
              ratios(plan, res, "tcp", {k4K}, res.tcp_base, 0.8));
  printTarget("tcp 4 KiB / UCX tag_bw", "0.47", ">= 1.0", ratios(plan, res, "tcp", {k4K}, res.ucx_base, 1.0));
  printTarget("daemon CPU per 4 KiB frame, tcp (A / B)", "14.1 / 13.4 us", "<= 1.5 us",
              cpuPerFrame(plan, res, 1.5));
  Figure large = ratios(plan, res, "tcp", {k1M, k4M}, res.tcp_base, 0.95);
  if (large.measured) addSenderCpu(plan, res, {k1M, k4M}, large);
  printTarget("tcp 1 MiB / 4 MiB / plain TCP", "0.74 / 0.97", ">= 0.95", large);
  printTarget("grpc 64 KiB / 1 MiB / 4 MiB / plain gRPC", "0.62 / 0.82 / 0.80", ">= 0.9",
              ratios(plan, res, "grpc", {k64K, k1M, k4M}, res.grpc_base, 0.9));
  printTarget("tcp 4 KiB latency p50 / sockperf one-way p50", "7.3 (to TCP one-way)", "<= 2.0",
              latencyRatio(res, 2.0));
  Figure rdma;
  rdma.text = "Soft-RoCE lane: tests/softroce/bench.sh prints it";
  printTarget("rdma 4 KiB frames/s / ib_write_bw 4 KiB", "not measured", ">= 0.8", rdma);
  std::printf(
      "\nzero-copy send (tcp_zerocopy_bytes) changes nothing on loopback: the kernel copies a packet to a "
      "local socket;\nits saving, the sending daemon's copy, is for a real NIC.  Frame rates on two shared "
      "cores mostly measure the\nscheduler: CPU per frame is the figure that travels.\n");
}

}  // namespace framelink::cli
