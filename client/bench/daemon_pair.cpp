#include "daemon_pair.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli_util.h"

namespace framelink::cli {

std::string findFramelinkd(const std::string& explicit_path, std::string& err) {
  if (!explicit_path.empty()) {
    if (access(explicit_path.c_str(), X_OK) == 0) return explicit_path;
    err = "--framelinkd " + explicit_path + " is not an executable file";
    return {};
  }
  const std::string here = selfDir();
  for (const std::string& candidate :
       {here + "../../proxy/framelinkd", here + "framelinkd", here + "../sbin/framelinkd"}) {
    if (access(candidate.c_str(), X_OK) == 0) {
      std::error_code ec;
      auto canon = std::filesystem::weakly_canonical(candidate, ec);
      return ec ? candidate : canon.string();
    }
  }
  std::string in_path = findInPath("framelinkd");
  if (!in_path.empty()) return in_path;
  err = "cannot find framelinkd: looked in " + here +
        "../../proxy/ (build tree), next to this binary and in "
        "$PATH -- build it (cmake --build <dir> --target framelinkd) or pass --framelinkd PATH";
  return {};
}

static std::string randomToken() {
  unsigned char raw[16] = {};
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (::read(fd, raw, sizeof raw) != static_cast<ssize_t>(sizeof raw)) {
      // Fall through with whatever we got plus the clock: the token only guards a loopback demo.
    }
    ::close(fd);
  }
  const uint64_t t = monotonicNs() ^ (static_cast<uint64_t>(getpid()) << 32);
  std::memcpy(raw, &t, 4);
  std::string out;
  char buf[3];
  for (unsigned char c : raw) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

std::unique_ptr<DaemonPair> DaemonPair::start(const Options& options, std::string& err) {
  std::unique_ptr<DaemonPair> pair(new DaemonPair());
  pair->options_ = options;
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/" + options.temp_prefix + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    err = "cannot create a temporary directory " + tmpl + ": " + std::strerror(errno) + " -- check $TMPDIR";
    return nullptr;
  }
  pair->dir_ = buf.data();
  const std::string token = randomToken();

  auto setup = [&](DaemonProcess& d, const char* id, const char* tag) {
    d.id = id;
    d.socket = pair->dir_ + "/" + tag + ".sock";
    d.ready_file = pair->dir_ + "/" + tag + ".ready";
    d.log_file = pair->dir_ + "/" + tag + ".log";
  };
  setup(pair->b_, "hostB", "b");
  setup(pair->c_, "hostC", "c");
  setup(pair->a_, "hostA", "a");

  auto common = [&](const DaemonProcess& d, const std::string& host) {
    std::vector<std::string> args = {options.framelinkd,
                                     "--id",
                                     d.id,
                                     "--socket",
                                     d.socket,
                                     "--listen",
                                     host + ":0",
                                     "--data-listen",
                                     host + ":0",
                                     "--transports",
                                     options.transport,
                                     "--token",
                                     token,
                                     "--ready-file",
                                     d.ready_file,
                                     "--log-level",
                                     options.log_level};
    args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
    return args;
  };

  // The listening sides first: hostA dials each of them once it runs.
  std::vector<DaemonProcess*> peers = {&pair->b_};
  if (options.host_c) peers.push_back(&pair->c_);
  auto args_a = common(pair->a_, options.host_a);
  for (DaemonProcess* d : peers) {
    if (!pair->spawn(*d, common(*d, options.host_b), err) ||
        !pair->waitReady(*d, options.ready_timeout_ms, err)) {
      pair->keepDir();
      return nullptr;
    }
    args_a.emplace_back("--peer");
    args_a.push_back(d->id + "=" + options.host_b + ":" + std::to_string(d->grpc_port));
  }
  args_a.insert(args_a.end(), options.extra_args_a.begin(), options.extra_args_a.end());
  if (!pair->spawn(pair->a_, args_a, err) || !pair->waitReady(pair->a_, options.ready_timeout_ms, err)) {
    pair->keepDir();
    return nullptr;
  }
  return pair;
}

bool DaemonPair::spawn(DaemonProcess& d, const std::vector<std::string>& args, std::string& err) {
  const int log_fd = ::open(d.log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    err = "cannot create " + d.log_file + ": " + std::strerror(errno);
    return false;
  }
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    err = std::string("fork failed: ") + std::strerror(errno);
    ::close(log_fd);
    return false;
  }
  if (pid == 0) {
    // Own process group: a Ctrl-C at the terminal reaches us, and we stop the daemons in order.
    setpgid(0, 0);
    // If we die without cleaning up, the daemons must not outlive us.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  ::close(log_fd);
  d.pid = pid;
  return true;
}

static std::map<std::string, std::string> readKeyValues(const std::string& path) {
  std::map<std::string, std::string> kv;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

bool DaemonPair::waitReady(DaemonProcess& d, int timeout_ms, std::string& err) {
  const uint64_t deadline = monotonicNs() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  while (true) {
    if (access(d.ready_file.c_str(), R_OK) == 0) {
      auto kv = readKeyValues(d.ready_file);
      if (kv.count("grpc_port") != 0) {
        d.grpc_port = static_cast<uint16_t>(std::strtoul(kv["grpc_port"].c_str(), nullptr, 10));
        if (kv.count("data_port") != 0) {
          d.data_port = static_cast<uint16_t>(std::strtoul(kv["data_port"].c_str(), nullptr, 10));
        }
        if (d.grpc_port == 0) {
          err = "framelinkd " + d.id + " wrote " + d.ready_file + " without a usable grpc_port";
          return false;
        }
        return true;
      }
    }
    int status = 0;
    const pid_t r = waitpid(d.pid, &status, WNOHANG);
    if (r == d.pid) {
      d.pid = -1;
      std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
      err = "framelinkd " + d.id + " " + how + " before it was ready; its log (" + d.log_file + "):\n" +
            logTail(d);
      return false;
    }
    if (monotonicNs() > deadline || g_interrupted.load()) {
      err = g_interrupted.load() ? "interrupted while waiting for framelinkd " + d.id
                                 : "framelinkd " + d.id + " did not write " + d.ready_file + " within " +
                                       std::to_string(timeout_ms / 1000) + " s; its log:\n" + logTail(d);
      return false;
    }
    usleep(10000);
  }
}

std::vector<DaemonProcess*> DaemonPair::daemons() {
  std::vector<DaemonProcess*> all = {&a_, &b_};
  if (options_.host_c) all.push_back(&c_);
  return all;
}

std::string DaemonPair::checkAlive() {
  for (DaemonProcess* d : daemons()) {
    if (d->pid <= 0) return "framelinkd " + d->id + " is not running";
    int status = 0;
    if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
      d->pid = -1;
      std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                          : "was killed by signal " + std::to_string(WTERMSIG(status));
      return "framelinkd " + d->id + " " + how + "; its log (" + d->log_file + "):\n" + logTail(*d);
    }
  }
  return {};
}

std::string DaemonPair::logTail(const DaemonProcess& d, int lines) const {
  std::ifstream in(d.log_file);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string out;
  for (const auto& l : tail) out += "    " + l + "\n";
  if (out.empty()) out = "    (empty)\n";
  return out;
}

void DaemonPair::stop() {
  // The producer side first, so its frames fail fast rather than waiting for a gone peer.
  const std::vector<DaemonProcess*> all = daemons();
  for (DaemonProcess* d : all) {
    if (d->pid > 0) ::kill(d->pid, SIGTERM);
  }
  const uint64_t deadline = monotonicNs() + 5'000'000'000ull;
  for (DaemonProcess* d : all) {
    while (d->pid > 0) {
      int status = 0;
      const pid_t r = waitpid(d->pid, &status, WNOHANG);
      if (r == d->pid || (r < 0 && errno == ECHILD)) {
        d->pid = -1;
        break;
      }
      if (monotonicNs() > deadline) {
        std::fprintf(stderr, "framelink-bench: framelinkd %s did not exit 5 s after SIGTERM; killing it\n",
                     d->id.c_str());
        ::kill(d->pid, SIGKILL);
        waitpid(d->pid, &status, 0);
        d->pid = -1;
        break;
      }
      usleep(10000);
    }
  }
}

DaemonPair::~DaemonPair() {
  stop();
  if (!dir_.empty() && !keep_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

ProcessCpu processCpu(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = all.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream rest(all.substr(paren + 1));
  std::string tok;
  unsigned long long utime = 0, stime = 0;
  for (int i = 0; i <= 12 && rest >> tok; ++i) {
    if (i == 11) utime = std::strtoull(tok.c_str(), nullptr, 10);
    if (i == 12) stime = std::strtoull(tok.c_str(), nullptr, 10);
  }
  const auto tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {static_cast<double>(utime) / tick, static_cast<double>(stime) / tick};
}

long long processSleeps(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator tasks("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return -1;
  long long total = 0;
  for (const auto& task : tasks) {
    std::ifstream in(task.path() / "status");
    std::string line;
    while (std::getline(in, line)) {
      static constexpr char kKey[] = "voluntary_ctxt_switches:";
      if (line.rfind(kKey, 0) == 0) {
        total += std::strtoll(line.c_str() + sizeof kKey - 1, nullptr, 10);
        break;
      }
    }
  }
  return total;
}

}  // namespace framelink::cli
