// Two framelinkd processes on this machine, "hostA" (dials) and "hostB" (listens), wired to each
// other over loopback with a random token: the setup `framelink-bench demo` and `bench` run on.  On
// request a third, "hostC", listens beside hostB as hostA's second peer (bench --hosts).
#ifndef FRAMELINK_CLI_DAEMON_PAIR_H
#define FRAMELINK_CLI_DAEMON_PAIR_H

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace framelink::cli {

// --framelinkd if given, else next to this binary (the build tree's proxy/framelinkd, or an
// installed sibling), else $PATH.  "" and `err` set when none is found.
std::string findFramelinkd(const std::string& explicit_path, std::string& err);

struct DaemonProcess {
  std::string id;
  std::string socket;
  std::string ready_file;
  std::string log_file;
  pid_t pid = -1;
  uint16_t grpc_port = 0;
  uint16_t data_port = 0;
};

class DaemonPair {
 public:
  struct Options {
    std::string framelinkd;
    std::string transport;  // "tcp", "grpc" or "rdma" (a --transports list)
    // Addresses the daemons listen on (gRPC and data); A dials B there.  Two addresses on RDMA
    // devices place the pair on two "hosts" (e.g. the Soft-RoCE lane's rxe_a / rxe_b).
    std::string host_a = "127.0.0.1";
    std::string host_b = "127.0.0.1";
    std::string temp_prefix = "framelink";
    std::string log_level = "info";
    std::vector<std::string> extra_args;    // appended to both daemons' command lines
    std::vector<std::string> extra_args_a;  // hostA's only (after its --peer)
    // Also start hostC on host_b's address and make it hostA's second peer; which streams go
    // where is the caller's to say (--route in extra_args_a): two peers without routes are ambiguous.
    bool host_c = false;
    int ready_timeout_ms = 15000;
  };

  static std::unique_ptr<DaemonPair> start(const Options& options, std::string& err);
  ~DaemonPair();
  DaemonPair(const DaemonPair&) = delete;
  DaemonPair& operator=(const DaemonPair&) = delete;

  const DaemonProcess& a() const { return a_; }  // producer side
  const DaemonProcess& b() const { return b_; }  // consumer side
  const DaemonProcess& c() const { return c_; }  // the second consumer side, with Options::host_c
  const std::string& dir() const { return dir_; }

  // "" while every daemon runs; otherwise which one exited and how, plus its log tail.
  std::string checkAlive();
  // SIGTERM every daemon, SIGKILL whatever still runs after 5 s; idempotent.
  void stop();
  std::string logTail(const DaemonProcess& d, int lines = 15) const;
  // Keep the temporary directory (logs) after stop, e.g. after a failure.
  void keepDir() { keep_dir_ = true; }

 private:
  DaemonPair() = default;
  bool spawn(DaemonProcess& d, const std::vector<std::string>& args, std::string& err);
  bool waitReady(DaemonProcess& d, int timeout_ms, std::string& err);
  // hostA first (the producer side), then the consumer sides that were started.
  std::vector<DaemonProcess*> daemons();

  Options options_;
  std::string dir_;
  DaemonProcess a_;
  DaemonProcess b_;
  DaemonProcess c_;
  bool keep_dir_ = false;
};

// The CPU time a process has used so far, in seconds (utime and stime of
// /proc/<pid>/stat); each < 0 when unreadable.
struct ProcessCpu {
  double user = -1;    // its own code
  double system = -1;  // the kernel on its behalf: syscalls, and the copies of a software NIC (rxe)
  double total() const { return user < 0 || system < 0 ? -1 : user + system; }
};
ProcessCpu processCpu(pid_t pid);
// How often the threads of a process went to sleep so far: the sum of
// voluntary_ctxt_switches over /proc/<pid>/task/*/status; < 0 when unreadable.
long long processSleeps(pid_t pid);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_DAEMON_PAIR_H
