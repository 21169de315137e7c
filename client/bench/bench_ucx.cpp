#include "bench_ucx.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "child_process.h"
#include "cli_util.h"

namespace framelink::cli {
namespace {

// A free TCP port on 127.0.0.1 for ucx_perftest's own connection setup (-p): two benches on one
// machine must not meet on its default port 13337.
uint16_t freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// Whether something listens on TCP `port` (any local address), from /proc/net/tcp{,6}.
bool tcpListening(uint16_t port) {
  char want[16];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(table, "re");
    if (f == nullptr) continue;
    char buf[512];
    bool found = false;
    while (!found && std::fgets(buf, sizeof buf, f) != nullptr) {
      char local[64], remote[64], state[8];
      // "  sl  local_address rem_address   st ..."; 0A is LISTEN.
      if (std::sscanf(buf, "%*s %63s %63s %7s", local, remote, state) == 3) {
        const std::string l = local;
        found = l.size() >= 5 && l.compare(l.size() - 5, 5, want) == 0 && std::strcmp(state, "0A") == 0;
      }
    }
    std::fclose(f);
    if (found) return true;
  }
  return false;
}

struct Spawned {
  pid_t pid = -1;
  int fd = -1;  // its stdout and stderr
};

// `path args...` with UCX_TLS=tls and this process's other variables.  The environment is built
// before fork: nothing but async-signal-safe calls may run between fork and exec.
Spawned spawnPerftest(const std::string& path, const std::vector<std::string>& args, const std::string& tls) {
  Spawned s;
  std::vector<std::string> full = {path};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string tls_var = "UCX_TLS=" + tls;
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "UCX_TLS=", 8) != 0) envp.push_back(*e);
  }
  envp.push_back(tls_var.data());
  envp.push_back(nullptr);
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return s;
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
    if (getppid() != parent) _exit(127);
    dup2(p[1], STDOUT_FILENO);
    dup2(p[1], STDERR_FILENO);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  ::close(p[1]);
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) {
    ::close(p[0]);
    return s;
  }
  s.pid = pid;
  s.fd = p[0];
  return s;
}

// Lines of a child's output as they come, each wait bounded by a deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // 1: a line; 0: end of output; -1: deadline passed.
  int next(std::string& line, uint64_t deadline_ns) {
    while (true) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        remember(line);
        return 1;
      }
      if (eof_) {
        if (buf_.empty()) return 0;
        line.swap(buf_);
        buf_.clear();
        remember(line);
        return 1;
      }
      const uint64_t now = monotonicNs();
      if (now >= deadline_ns) return -1;
      pollfd pfd{fd_, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>((deadline_ns - now) / 1000000 + 1));
      if (r <= 0) continue;  // EINTR or timeout: the loop checks the deadline
      char tmp[4096];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n > 0) {
        buf_.append(tmp, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        eof_ = true;
      }
    }
  }
  // The last few lines, for an error message.
  std::string tail() const {
    std::string s;
    for (const auto& l : tail_) s += "\n    " + l;
    return s.empty() ? std::string(" (no output)") : s;
  }

 private:
  void remember(const std::string& l) {
    if (l.empty() || l[0] == '+' || l[0] == '|') return;  // table rules and headers
    tail_.push_back(l);
    if (tail_.size() > 6) tail_.pop_front();
  }
  int fd_;
  std::string buf_;
  bool eof_ = false;
  std::deque<std::string> tail_;
};

struct UcxRun {
  UcxReport last;
  bool got = false;
  std::string error;
};

// Starts the server and waits until it listens on `port` (for up to 10 s, not past `deadline`); a
// server that does not is stopped and `error` says why, with its last lines.  pid -1 then.
Spawned startServer(const std::string& path, const std::vector<std::string>& args, const std::string& tls,
                    uint16_t port, uint64_t deadline, std::string& error) {
  const Spawned server = spawnPerftest(path, args, tls);
  if (server.pid < 0) {
    error = "cannot start " + path + ": " + std::strerror(errno);
    return server;
  }
  LineReader srv(server.fd);
  // Its "Waiting for connection..." sits in a stdio buffer while stdout is a pipe, and a probe
  // connection would be taken for the client: watch the kernel's socket table instead.
  bool listening = false;
  bool server_gone = false;
  const uint64_t listen_deadline = std::min<uint64_t>(deadline, monotonicNs() + 10'000'000'000ull);
  while (!listening && !server_gone && monotonicNs() < listen_deadline) {
    listening = tcpListening(port);
    if (!listening) {
      server_gone = waitChild(server.pid, 10) >= 0;
    }
  }
  if (listening) return server;
  if (!server_gone) stopChild(server.pid, 1000);
  std::string line;
  while (srv.next(line, monotonicNs() + 1'000'000'000ull) == 1) {
  }
  ::close(server.fd);
  error = "ucx_perftest server (UCX_TLS=" + tls + ") did not start listening on port " +
          std::to_string(port) + ":" + srv.tail();
  return Spawned{};
}

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
  const Spawned server = startServer(path, args, tls, port, deadline, run.error);
  if (server.pid < 0) return run;
  std::vector<std::string> client_args = {"127.0.0.1"};
  client_args.insert(client_args.end(), args.begin(), args.end());
  const Spawned client = spawnPerftest(path, client_args, tls);
  if (client.pid < 0) {
    stopChild(server.pid, 1000);
    ::close(server.fd);
    run.error = "cannot start " + path + ": " + std::strerror(errno);
    return run;
  }
  LineReader cli(client.fd);
  const bool timed_out = readReports(cli, stop_after_reports, deadline, run);
  // After its final line a client exits by itself, and so does the server; a timed run is cut.
  const int grace = run.got && run.last.final ? 3000 : 0;
  if (waitChild(client.pid, grace) < 0) stopChild(client.pid, 1000);
  if (waitChild(server.pid, grace) < 0) stopChild(server.pid, 1000);
  ::close(client.fd);
  ::close(server.fd);
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
