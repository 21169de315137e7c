#include "bench_sockperf.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_tool.h"
#include "cli_util.h"

namespace framelink::cli {

std::string sockperfPath() { return findInPath("sockperf"); }

bool parseSockperfPercentile(const std::string& line, double& percentile, double& us) {
  const size_t at = line.find("---> percentile ");
  if (at == std::string::npos) return false;
  char eq = 0;
  return std::sscanf(line.c_str() + at + 16, "%lf %c %lf", &percentile, &eq, &us) == 3 && eq == '=';
}

namespace {

// "[Valid Duration] RunTime=2.550 sec; SentMessages=29320; ReceivedMessages=29320": the round
// trips measured.
bool parseReceived(const std::string& line, uint64_t& received) {
  const size_t at = line.find("[Valid Duration]");
  if (at == std::string::npos) return false;
  const size_t r = line.find("ReceivedMessages=", at);
  unsigned long long n = 0;
  if (r == std::string::npos || std::sscanf(line.c_str() + r + 17, "%llu", &n) != 1) return false;
  received = n;
  return true;
}

}  // namespace

LatencyResult sockperfOneWay(uint64_t size, double seconds) {
  LatencyResult res;
  const std::string path = sockperfPath();
  if (path.empty()) {
    res.error = kSockperfMissing;
    return res;
  }
  const uint16_t port = freeLoopbackPort();
  if (port == 0) {
    res.error = std::string("cannot find a free port on 127.0.0.1 for sockperf: ") + std::strerror(errno);
    return res;
  }
  const std::vector<std::string> where = {"--tcp", "-i", "127.0.0.1", "-p", std::to_string(port)};
  std::vector<std::string> server_args = {"server"};
  server_args.insert(server_args.end(), where.begin(), where.end());
  const uint64_t deadline = monotonicNs() + static_cast<uint64_t>((seconds + 30) * 1e9);
  std::vector<std::string> client_args = {"ping-pong"};
  client_args.insert(client_args.end(), where.begin(), where.end());
  const int secs = std::max(1, static_cast<int>(std::lround(seconds)));
  client_args.insert(client_args.end(), {"-m", std::to_string(size), "-t", std::to_string(secs)});
  ToolPair pair;
  if (!startToolPair(path, server_args, client_args, "", port, deadline, "sockperf server", pair,
                     res.error)) {
    return res;
  }
  LineReader out(pair.client.fd);
  std::string line;
  double p50 = -1, p99 = -1;
  while (out.next(line, deadline) == 1) {
    double pct = 0, us = 0;
    if (parseSockperfPercentile(line, pct, us)) {
      if (pct == 50) p50 = us;
      if (pct == 99) p99 = us;
    }
    parseReceived(line, res.samples);
  }
  endToolPair(pair, 3000, 0);  // sockperf's server never ends by itself
  if (p50 < 0 || p99 < 0 || res.samples == 0) {
    res.samples = 0;
    res.error = "sockperf ping-pong gave no percentiles:" + out.tail();
    return res;
  }
  res.p50_us = p50;
  res.p99_us = p99;
  return res;
}

}  // namespace framelink::cli
