// Another program's benchmark as a baseline of `framelink-bench run`: UCX's ucx_perftest and
// sockperf each run as a server and a client process on this machine, their output read line by
// line, every wait bounded.
#ifndef FRAMELINK_CLI_BENCH_TOOL_H
#define FRAMELINK_CLI_BENCH_TOOL_H

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace framelink::cli {

// A free TCP port on 127.0.0.1 for a tool's own connection (two benches on one machine must not
// meet on a tool's default port), or 0 with errno set.
uint16_t freeLoopbackPort();

// Whether something listens on TCP `port` (any local address), from /proc/net/tcp{,6}.
bool tcpListening(uint16_t port);

struct Spawned {
  pid_t pid = -1;
  int fd = -1;  // its stdout and stderr
};

// `path args...` with this process's environment, where `env` ("NAME=value", or empty) replaces any
// NAME of it.  pid -1 with errno set when it could not start.  The child dies with this process.
Spawned spawnTool(const std::string& path, const std::vector<std::string>& args, const std::string& env);

// Starts a tool's server and waits until it listens on `port` (for up to 10 s, not past
// `deadline`); a server that does not is stopped and `error` says why, with its last lines and
// `what` as its name.  pid -1 then.
Spawned startToolServer(const std::string& path, const std::vector<std::string>& args, const std::string& env,
                        uint16_t port, uint64_t deadline, const std::string& what, std::string& error);

// A tool's server and its client, each with its output on a pipe.
struct ToolPair {
  Spawned server;
  Spawned client;
};

// startToolServer, then the client (`client_args`, the same `env`): false with `error` set, and
// nothing left running, when either did not start.
bool startToolPair(const std::string& path, const std::vector<std::string>& server_args,
                   const std::vector<std::string>& client_args, const std::string& env, uint16_t port,
                   uint64_t deadline, const std::string& what, ToolPair& pair, std::string& error);

// Waits up to client_grace_ms for the client to exit by itself and up to server_grace_ms for the
// server, stops either that did not, and closes their output.
void endToolPair(ToolPair& pair, int client_grace_ms, int server_grace_ms);

// Lines of a child's output as they come, each wait bounded by a deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // 1: a line; 0: end of output; -1: deadline passed.
  int next(std::string& line, uint64_t deadline_ns);
  // The last few lines, for an error message.
  std::string tail() const;

 private:
  void remember(const std::string& l);
  int fd_;
  std::string buf_;
  bool eof_ = false;
  std::deque<std::string> tail_;
};

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_BENCH_TOOL_H
