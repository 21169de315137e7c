// Real-process fixtures for the integration tests: framelinkd daemons and
// `framelink` CLI runs as child processes, each in its own temporary
// directory (socket, ready file, log), every wait bounded by a deadline.
//
// Failures are reported through Catch2 (REQUIRE/FAIL), so these helpers are
// meant to be used from inside a TEST_CASE.  When a test case has failed, the
// destructors print the logs of the processes they own before removing them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace framelink::integ {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Paths of the binaries under test (compile definitions set by CMake).
std::string daemonBinary();
std::string cliBinary();
std::string benchBinary();  // framelink-bench: the demo and the benchmark

// Polls `condition` every `interval` until it is true or `timeout` expires.
// Returns the last value of the condition.
bool waitUntil(const std::function<bool()>& condition, Millis timeout, Millis interval = Millis(2));

// A directory under $TMPDIR (default /tmp) removed with everything in it on
// destruction.  Kept short: Unix socket paths are limited to 107 bytes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "fl-integ");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string readFile(const std::string& path);

// `a` followed by `b` (command lines put together from parts).
inline std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The directory part of `path` (up to its last '/').
inline std::string dirOf(const std::string& path) { return path.substr(0, path.rfind('/')); }

// True once any assertion of the running test case has failed (maintained
// by a Catch2 listener in harness.cpp).
bool currentTestFailed();

// One framelinkd.  The constructor starts it with a socket, a ready file and a
// log file in a fresh temp dir, --listen 127.0.0.1:0 --data-listen 127.0.0.1:0,
// and waits (bounded) for the ready file; REQUIRE fails when the daemon exits
// or does not get ready in time.  The destructor sends SIGTERM, then SIGKILL
// when the daemon does not exit within a few seconds.
class DaemonProcess {
 public:
  struct Options {
    std::string id;
    std::string token;                        // empty: no --token
    std::string transports;                   // empty: the daemon's default
    std::vector<std::string> peers;           // NAME=HOST:PORT
    std::vector<std::string> extra_args;      // anything else, e.g. {"--credit-timeout-ms", "1000"}
    std::string log_level = "info";           // empty: no --log-level (the --config file's, or the default)
    std::string listen = "127.0.0.1:0";       // gRPC listener; a fixed port to restart "the same" peer
    std::string data_listen = "127.0.0.1:0";  // tcp data listener (its port goes to peers in Hello)
    Millis ready_timeout = Millis(15000);
    uint64_t max_fds = 0;  // non-zero: the daemon's RLIMIT_NOFILE
    // Non-null: the daemon runs as under systemd with a file descriptor store
    // -- $NOTIFY_SOCKET names the keeper, and what the keeper holds is
    // passed to the daemon at start (a hot restart).  Must outlive the daemon.
    class FdKeeper* fd_keeper = nullptr;
  };

  explicit DaemonProcess(Options options);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& id() const noexcept { return options_.id; }
  const std::string& socketPath() const noexcept { return socket_path_; }
  uint16_t grpcPort() const noexcept { return grpc_port_; }
  uint16_t dataPort() const noexcept { return data_port_; }
  // 0 unless the daemon was started with --metrics.
  uint16_t metricsPort() const noexcept { return metrics_port_; }
  // GET http://127.0.0.1:<metrics port><path>; the body, or "" when the
  // request failed.
  std::string httpGet(const std::string& path) const;
  // A counter (or gauge) from /metrics, e.g. "framelink_frames_replayed_total";
  // -1 when the request failed or the metric is missing.
  int64_t metric(const std::string& name) const;
  // From /stats: no client, nothing pending or unacknowledged, no credit
  // outstanding and no frame held -- nothing leaked.  False without --metrics.
  bool idle() const;
  pid_t pid() const noexcept { return pid_; }
  std::string grpcAddress() const { return "127.0.0.1:" + std::to_string(grpc_port_); }

  // True while the process has not exited (reaps it when it has).
  bool alive();
  // The exit status as from waitpid, once the process has exited.
  std::optional<int> exitStatus() const noexcept { return exit_status_; }
  void kill9();
  // Starts the daemon again, after it exited, with the same options, socket and
  // log file (the log gets the new run appended).
  void restart();
  // The same, with other options (e.g. the fixed port it first got from the kernel).
  void restart(Options options);
  // SIGUSR2: the daemon restarts in place (the same process execs its binary
  // again and takes its clients over); waits until it is ready again.
  void restartInPlace();
  // SIGTERM and a bounded wait; SIGKILL after `timeout`.  Returns the wait status.
  int terminate(Millis timeout = Millis(5000));

  std::string log() const;
  std::string logPath() const { return log_path_; }
  // Waits until the log contains `needle` (case-insensitive).
  bool waitForLog(const std::string& needle, Millis timeout) const;
  void printLog() const;

 private:
  void start();
  // Waits (bounded) for the ready file and reads the ports from it.
  void awaitReady();

  Options options_;
  TempDir dir_;
  std::string socket_path_, ready_path_, log_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  uint16_t grpc_port_ = 0;
  uint16_t data_port_ = 0;
  uint16_t metrics_port_ = 0;
};

// Two daemons on loopback: B listens, A dials B (--peer <B id>=127.0.0.1:<B port>),
// both with the same token and `--transports <transport>` ("tcp" or "grpc").
// With no routes configured, every stream on A goes to B.
class DaemonPair {
 public:
  struct Options {
    std::string transport = "tcp";
    std::string token = "integ-secret";
    std::string token_a;                    // non-empty: A uses this token instead (wrong-token tests)
    std::vector<std::string> extra_args;    // both daemons
    std::vector<std::string> extra_args_a;  // A only
    std::vector<std::string> extra_args_b;  // B only
    std::string log_level = "info";         // empty: no --log-level (the --config file's, or the default)
  };

  explicit DaemonPair(Options options);
  explicit DaemonPair(const std::string& transport);

  DaemonProcess& a() noexcept { return *a_; }
  DaemonProcess& b() noexcept { return *b_; }

 private:
  // B is declared first so that it is destroyed last: A stops first and fails
  // its pending frames with FL_ERR_SHUTDOWN instead of chasing a vanished peer.
  std::unique_ptr<DaemonProcess> b_;
  std::unique_ptr<DaemonProcess> a_;
};

// A run of the `framelink` CLI (or any program): stdout and stderr go to one
// file in its own temp dir.  The destructor kills it if it is still running.
class ChildProcess {
 public:
  ChildProcess(std::string label, std::vector<std::string> args, std::vector<std::string> env = {},
               std::string program = cliBinary());
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Waits for the exit; on deadline kills it (SIGKILL) and FAILs the test.
  // Returns the exit code (128 + signal when killed by a signal).
  int wait(Millis timeout);
  bool running();
  void kill9();
  pid_t pid() const noexcept { return pid_; }
  std::string output() const;
  const std::string& label() const noexcept { return label_; }
  std::string commandLine() const;

 private:
  std::string label_;
  std::vector<std::string> args_;
  std::string program_;
  TempDir dir_;
  std::string out_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace framelink::integ
