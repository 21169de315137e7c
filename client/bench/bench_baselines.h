// Baselines for `framelink-bench run`, measured by the same program on the same machine: a plain TCP
// socket pair over loopback and a plain gRPC bidi stream of `bytes`, each sender and receiver in
// its own process, like the producer and the daemons on framelink's path.
#ifndef FRAMELINK_CLI_BENCH_BASELINES_H
#define FRAMELINK_CLI_BENCH_BASELINES_H

#include <cstdint>
#include <string>

namespace framelink::cli {

// The daemon's malloc setting (proxy/main.cpp, keepFreedMemory): freed heap
// memory is kept, not handed back to the kernel at once.  The baselines run
// with it too, so that a ratio compares like with like; `framelink-bench run`
// sets it before it forks the plain TCP ends, the gRPC helpers at start.
void keepFreedMemoryLikeTheDaemon();

struct ThroughputResult {
  uint64_t bytes = 0;
  uint64_t messages = 0;
  double seconds = 0;
  std::string error;
  // Plain TCP: the CPU time (user + system) of the sending and the receiving process per message,
  // the kernel's price of a message of this size on this machine; -1 when not measured.
  double send_cpu_us_per_msg = -1;
  double recv_cpu_us_per_msg = -1;
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double fps() const { return seconds > 0 ? messages / seconds : 0; }
};

struct LatencyResult {
  double p50_us = 0;
  double p99_us = 0;
  uint64_t samples = 0;
  std::string error;
};

// Sender (this process) writes `size`-byte messages for `seconds`; a forked receiver reads each
// one fully.  Throughput = bytes / (first send .. receiver saw the last byte).
ThroughputResult plainTcpThroughput(uint64_t size, double seconds);

// Ping-pong of `size`-byte messages with a forked echo process (TCP_NODELAY, blocking sockets);
// one-way latency = RTT / 2.
LatencyResult plainTcpOneWay(uint64_t size, uint64_t samples);

// A gRPC server and a gRPC client, each a child process running `framelink __bench-grpc-*`
// (gRPC's threads do not survive fork, so neither side is forked from this process).
ThroughputResult plainGrpcThroughput(uint64_t size, double seconds);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_BASELINES_H
