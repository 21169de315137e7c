#include "bench_ucx.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_tool.h"
#include "cli_util.h"

namespace framelink::cli {
namespace {

struct UcxRun {
  UcxReport last;
  bool got = false;
  std::string error;
};

// Reads the client's progress lines into `run` until its final line, `stop_after_reports` of
// them (0: the final line only) or `deadline`; true when the deadline passed.
bool readReports(LineReader& cli, int stop_after_reports, uint64_t deadline, UcxRun& run) {
  std::string line;
  int reports = 0;
  while (true) {
    const int r = cli.next(line, deadline);
    if (r <= 0) return r < 0;
    UcxReport rep;
    if (!parseUcxReport(line, rep)) continue;
    run.last = rep;
    run.got = true;
    if (rep.final || (stop_after_reports > 0 && ++reports >= stop_after_reports)) return false;
  }
}

// Server, then client on 127.0.0.1; stops both after `stop_after_reports` progress lines (one a
// second; 0: wait for the final line) or at `timeout_s`.
UcxRun runPerftest(const std::string& tls, std::vector<std::string> args, int stop_after_reports,
                   double timeout_s) {
  UcxRun run;
  const std::string path = ucxPerftestPath();
  if (path.empty()) {
    run.error = kUcxMissing;
    return run;
  }
  const uint16_t port = freeLoopbackPort();
  if (port == 0) {
    run.error = std::string("cannot find a free port on 127.0.0.1 for ucx_perftest: ") + std::strerror(errno);
    return run;
  }
  args.emplace_back("-p");
  args.push_back(std::to_string(port));
  const uint64_t deadline = monotonicNs() + static_cast<uint64_t>(timeout_s * 1e9);
  std::vector<std::string> client_args = {"127.0.0.1"};
  client_args.insert(client_args.end(), args.begin(), args.end());
  ToolPair pair;
  if (!startToolPair(path, args, client_args, "UCX_TLS=" + tls, port, deadline,
                     "ucx_perftest server (UCX_TLS=" + tls + ")", pair, run.error)) {
    return run;
  }
  LineReader cli(pair.client.fd);
  const bool timed_out = readReports(cli, stop_after_reports, deadline, run);
  // After its final line a client exits by itself, and so does the server; a timed run is cut.
  const int grace = run.got && run.last.final ? 3000 : 0;
  endToolPair(pair, grace, grace);
  if (!run.got) {
    run.error = timed_out ? "ucx_perftest (UCX_TLS=" + tls + ") gave no result within " +
                                std::to_string(static_cast<int>(timeout_s)) + " s:" + cli.tail()
                          : "ucx_perftest (UCX_TLS=" + tls + ") failed:" + cli.tail();
  }
  return run;
}

}  // namespace

bool parseUcxReport(const std::string& line, UcxReport& r) {
  size_t from;
  if (line.rfind("Final:", 0) == 0) {
    from = 6;
    r.final = true;
  } else if (line.rfind("[thread", 0) == 0 && line.find(']') != std::string::npos) {
    from = line.find(']') + 1;
    r.final = false;
  } else {
    return false;
  }
  return std::sscanf(line.c_str() + from, "%lf %lf %lf %lf %lf %lf %lf %lf", &r.iterations, &r.percentile_us,
                     &r.avg_us, &r.overall_us, &r.bw_avg, &r.bw_overall, &r.rate_avg, &r.rate_overall) == 8;
}

std::string ucxPerftestPath() { return findInPath("ucx_perftest"); }

ThroughputResult ucxTagBandwidth(const std::string& tls, uint64_t size, double seconds) {
  ThroughputResult res;
  size = std::max<uint64_t>(size, 1);
  // More iterations than it can do in `seconds` (the run is stopped after its seconds' progress
  // lines); a warm-up of about 64 MiB, as UCX's default 10000 iterations would be 40 GiB at 4 MiB.
  const auto iters =
      static_cast<uint64_t>(std::clamp(seconds * 20e9 / static_cast<double>(size), 1000.0, 1e9));
  const uint64_t warmup = std::clamp<uint64_t>((64ull << 20) / size, 10, 10000);
  const int reports = std::max(1, static_cast<int>(std::lround(seconds)));
  UcxRun run = runPerftest(
      tls,
      {"-t", "tag_bw", "-s", std::to_string(size), "-n", std::to_string(iters), "-w", std::to_string(warmup)},
      reports, seconds + 60);
  if (!run.got) {
    res.error = run.error;
    return res;
  }
  if (run.last.rate_overall <= 0) {
    res.error = "ucx_perftest reported a message rate of 0";
    return res;
  }
  res.messages = static_cast<uint64_t>(run.last.iterations);
  res.bytes = res.messages * size;
  res.seconds = run.last.iterations / run.last.rate_overall;
  return res;
}

LatencyResult ucxTagLatency(const std::string& tls, uint64_t size, uint64_t samples) {
  LatencyResult res;
  samples = std::max<uint64_t>(samples, 100);
  double p[2] = {0, 0};
  const char* ranks[2] = {"50", "99"};
  for (int i = 0; i < 2; ++i) {
    UcxRun run = runPerftest(tls,
                             {"-t", "tag_lat", "-s", std::to_string(size), "-n", std::to_string(samples),
                              "-w", std::to_string(std::min<uint64_t>(samples, 1000)), "-R", ranks[i]},
                             0, 60);
    if (!run.got || !run.last.final) {
      res.error = run.error.empty() ? "ucx_perftest tag_lat stopped before its final line" : run.error;
      return res;
    }
    p[i] = run.last.percentile_us;
  }
  res.p50_us = p[0];
  res.p99_us = p[1];
  res.samples = samples;
  return res;
}

}  // namespace framelink::cli
