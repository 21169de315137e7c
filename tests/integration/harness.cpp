#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "harness.h"

#include "fd_keeper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <algorithm>

#include <catch2/catch.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#ifndef FRAMELINK_DAEMON_BIN
#define FRAMELINK_DAEMON_BIN ""
#endif
#ifndef FRAMELINK_CLI_BIN
#define FRAMELINK_CLI_BIN ""
#endif
#ifndef FRAMELINK_BENCH_BIN
#define FRAMELINK_BENCH_BIN ""
#endif

namespace framelink::integ {

namespace {

bool g_test_failed = false;

// Tracks whether the running test case has failed, so that fixtures print the
// logs of their processes only when there is something to diagnose.
class FailureListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    g_test_failed = false;
  }
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    if (!stats.assertionResult.isOk()) g_test_failed = true;
    return true;
  }
};

// The tests write to sockets a daemon may have closed on purpose.
struct IgnoreSigpipe {
  IgnoreSigpipe() { ::signal(SIGPIPE, SIG_IGN); }
} g_ignore_sigpipe;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Child side of fork(): stdout/stderr to `log_path`, die with the test
// process (so nothing outlives a crashed test run), then exec.
[[noreturn]] void execChild(const std::string& program, const std::vector<std::string>& args,
                            const std::vector<std::string>& env, const std::string& log_path) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
  }
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));  // child only; never freed
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  dprintf(STDERR_FILENO, "exec %s failed: %s\n", program.c_str(), strerror(errno));
  ::_exit(127);
}

// Child side of fork(), as systemd starts a unit with a file descriptor
// store: the kept descriptors at 3, 4, ... (first moved out of the way, above
// them all), and the environment that names them for this process.
std::vector<std::string> passKeptFds(const FdKeeper& keeper) {
  std::vector<std::string> env{"NOTIFY_SOCKET=" + keeper.notifySocket()};
  const auto kept = keeper.entries();
  if (kept.empty()) return env;
  std::vector<int> high;
  for (const auto& [name, fd] : kept) high.push_back(::fcntl(fd, F_DUPFD, 1000));
  std::string names;
  for (size_t i = 0; i < high.size(); ++i) {
    ::dup2(high[i], 3 + static_cast<int>(i));  // dup2 leaves FD_CLOEXEC clear
    ::close(high[i]);
    names += (i != 0 ? ":" : "") + kept[i].first;
  }
  env.push_back("LISTEN_FDS=" + std::to_string(kept.size()));
  env.push_back("LISTEN_FDNAMES=" + names);
  env.push_back("LISTEN_PID=" + std::to_string(::getpid()));
  return env;
}

int decodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Non-blocking reap; returns the wait status once the child has exited.
std::optional<int> tryReap(pid_t pid) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) return status;
  if (r < 0 && errno == ECHILD) return 0;  // already reaped elsewhere
  return std::nullopt;
}

// Bounded blocking reap: polls, so that a hung child cannot hang the test.
std::optional<int> reapWithin(pid_t pid, Millis timeout) {
  std::optional<int> status;
  waitUntil([&] { return (status = tryReap(pid)).has_value(); }, timeout, Millis(5));
  return status;
}

}  // namespace

CATCH_REGISTER_LISTENER(FailureListener)

bool currentTestFailed() { return g_test_failed; }

std::string daemonBinary() { return FRAMELINK_DAEMON_BIN; }
std::string cliBinary() { return FRAMELINK_CLI_BIN; }
std::string benchBinary() { return FRAMELINK_BENCH_BIN; }

bool waitUntil(const std::function<bool()>& condition, Millis timeout, Millis interval) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (Clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(interval);
  }
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------- TempDir

TempDir::TempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = (tmp && *tmp && std::strlen(tmp) < 48) ? tmp : "/tmp";
  std::string pattern = base + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    FAIL("mkdtemp(" << pattern << "): " << strerror(errno));
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  // Daemon logs and journals of a failed test are kept for the post-mortem.
  if (currentTestFailed() || std::getenv("FRAMELINK_KEEP_TEMP") != nullptr) {
    std::cerr << "kept " << path_ << (currentTestFailed() ? " (the test failed)\n" : "\n");
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

// ---------------------------------------------------------------- DaemonProcess

DaemonProcess::DaemonProcess(Options options) : options_(std::move(options)), dir_("fl-" + options_.id) {
  socket_path_ = dir_.file("d.sock");
  ready_path_ = dir_.file("ready");
  log_path_ = dir_.file("daemon.log");
  try {
    start();
  } catch (...) {
    // The destructor does not run for a half-constructed object.
    if (pid_ > 0 && alive()) terminate();
    throw;
  }
}

void DaemonProcess::start() {
  const std::string bin = daemonBinary();
  REQUIRE_FALSE(bin.empty());
  REQUIRE(::access(bin.c_str(), X_OK) == 0);

  std::vector<std::string> args = {"--id",          options_.id,          "--socket",    socket_path_,
                                   "--ready-file",  ready_path_,          "--listen",    options_.listen,
                                   "--data-listen", options_.data_listen, "--hugepages", "off"};
  // Empty: not passed (the log level then comes from a --config file, or is the default).
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string&>{"--log-level", options_.log_level},
        {"--token", options_.token},
        {"--transports", options_.transports}}) {
    if (!value.empty()) args.insert(args.end(), {flag, value});
  }
  for (const auto& p : options_.peers) {
    args.push_back("--peer");
    args.push_back(p);
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  // The destructor's SIGTERM waits 5 s: a test that leaves frames in flight
  // gets a drain well within it, unless it chose its own.
  if (std::find(args.begin(), args.end(), "--drain-timeout-ms") == args.end()) {
    args.insert(args.end(), {"--drain-timeout-ms", "1000"});
  }

  {
    std::ofstream cmd(log_path_, std::ios::app);  // a restart adds to the log
    cmd << "# " << bin;
    for (const auto& a : args) cmd << ' ' << a;
    cmd << '\n';
  }

  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    if (options_.max_fds != 0) {
      rlimit nofile{options_.max_fds, options_.max_fds};
      if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) ::_exit(126);
    }
    std::vector<std::string> env;
    if (options_.fd_keeper != nullptr) env = passKeptFds(*options_.fd_keeper);
    execChild(bin, args, env, log_path_);
  }

  awaitReady();
}

void DaemonProcess::restartInPlace() {
  ::unlink(ready_path_.c_str());
  REQUIRE(::kill(pid_, SIGUSR2) == 0);
  awaitReady();
}

void DaemonProcess::awaitReady() {
  // Ready = the ready file exists with a grpc_port line (the daemon writes it
  // atomically, so a partial file is never seen).
  bool ready = waitUntil(
      [&] {
        if (!alive()) return true;  // stop polling; reported below
        std::string text = readFile(ready_path_);
        return text.find("grpc_port=") != std::string::npos;
      },
      options_.ready_timeout, Millis(5));
  if (!alive() || !ready) {
    printLog();
    FAIL("framelinkd " << options_.id
                       << (alive() ? " did not write its ready file within "
                                   : " exited before it was ready; wait status ")
                       << (alive() ? std::to_string(options_.ready_timeout.count()) + " ms"
                                   : std::to_string(exit_status_.value_or(-1))));
  }

  std::istringstream in(readFile(ready_path_));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "grpc_port") grpc_port_ = static_cast<uint16_t>(std::stoul(value));
    if (key == "data_port") data_port_ = static_cast<uint16_t>(std::stoul(value));
    if (key == "metrics_port") metrics_port_ = static_cast<uint16_t>(std::stoul(value));
  }
  INFO("ready file of " << options_.id << ":\n" << readFile(ready_path_));
  REQUIRE(grpc_port_ != 0);
  // The ready file must be written only once the attach socket accepts.
  struct stat st {};
  REQUIRE(::stat(socket_path_.c_str(), &st) == 0);
  REQUIRE(S_ISSOCK(st.st_mode));
}

std::string DaemonProcess::httpGet(const std::string& path) const {
  if (metrics_port_ == 0) return "";
  httplib::Client client("127.0.0.1", metrics_port_);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  auto res = client.Get(path.c_str());
  return res && res->status == 200 ? res->body : std::string();
}

int64_t DaemonProcess::metric(const std::string& name) const {
  std::istringstream in(httpGet("/metrics"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + " ") == 0) return std::stoll(line.substr(name.size() + 1));
  }
  return -1;
}

bool DaemonProcess::idle() const {
  const std::string stats = httpGet("/stats");
  if (stats.empty()) return false;
  static const std::regex busy(
      R"re("(pending|unacked|credits_outstanding|frames_held_by_consumers)":[1-9])re");
  return stats.find("\"clients\":[]") != std::string::npos && !std::regex_search(stats, busy);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && alive()) {
    const int status = terminate();
    // A daemon that crashes on its way down (or on a peer's) is a failure of
    // the test that ran it -- unless that test is already unwinding.
    if (std::uncaught_exceptions() == 0) {
      INFO("framelinkd " << options_.id << " must exit 0 on SIGTERM; wait status " << status
                         << (WIFSIGNALED(status)
                                 ? " (killed by signal " + std::to_string(WTERMSIG(status)) + ")"
                                 : std::string()));
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
  if (currentTestFailed()) printLog();
}

bool DaemonProcess::alive() {
  if (pid_ <= 0 || exit_status_) return false;
  if (auto st = tryReap(pid_)) {
    exit_status_ = *st;
    return false;
  }
  return true;
}

void DaemonProcess::restart() {
  REQUIRE_FALSE(alive());
  ::unlink(ready_path_.c_str());
  exit_status_.reset();
  grpc_port_ = data_port_ = metrics_port_ = 0;
  start();
}

void DaemonProcess::restart(Options options) {
  options_ = std::move(options);
  restart();
}

void DaemonProcess::kill9() {
  if (!alive()) return;
  ::kill(pid_, SIGKILL);
  exit_status_ = reapWithin(pid_, Millis(5000));
}

int DaemonProcess::terminate(Millis timeout) {
  if (!alive()) return exit_status_.value_or(-1);
  ::kill(pid_, SIGTERM);
  exit_status_ = reapWithin(pid_, timeout);
  if (!exit_status_) {
    std::cerr << "framelinkd " << options_.id << " ignored SIGTERM for " << timeout.count()
              << " ms; sending SIGKILL\n";
    ::kill(pid_, SIGKILL);
    exit_status_ = reapWithin(pid_, Millis(5000));
  }
  return exit_status_.value_or(-1);
}

std::string DaemonProcess::log() const { return readFile(log_path_); }

bool DaemonProcess::waitForLog(const std::string& needle, Millis timeout) const {
  const std::string n = lower(needle);
  return waitUntil([&] { return lower(log()).find(n) != std::string::npos; }, timeout, Millis(20));
}

void DaemonProcess::printLog() const {
  std::string text = log();
  constexpr size_t kMax = 64 * 1024;  // the end of a long log is what matters
  if (text.size() > kMax) text = "[...]\n" + text.substr(text.size() - kMax);
  std::cerr << "----- framelinkd " << options_.id << " log (" << log_path_ << ") -----\n"
            << text << "----- end of " << options_.id << " log -----\n";
}

// ---------------------------------------------------------------- DaemonPair

DaemonPair::DaemonPair(const std::string& transport) : DaemonPair(Options{transport}) {}

DaemonPair::DaemonPair(Options options) {
  DaemonProcess::Options b;
  b.id = "hostB";
  b.token = options.token;
  b.transports = options.transport;
  b.extra_args = concat(options.extra_args, options.extra_args_b);
  b.log_level = options.log_level;
  b_ = std::make_unique<DaemonProcess>(b);

  DaemonProcess::Options a;
  a.id = "hostA";
  a.token = options.token_a.empty() ? options.token : options.token_a;
  a.transports = options.transport;
  a.peers = {"hostB=" + b_->grpcAddress()};
  a.extra_args = concat(options.extra_args, options.extra_args_a);
  a.log_level = options.log_level;
  a_ = std::make_unique<DaemonProcess>(a);
}

// ---------------------------------------------------------------- ChildProcess

ChildProcess::ChildProcess(std::string label, std::vector<std::string> args, std::vector<std::string> env,
                           std::string program)
    : label_(std::move(label)), args_(std::move(args)), program_(std::move(program)), dir_("fl-" + label_) {
  out_path_ = dir_.file("output.log");
  REQUIRE_FALSE(program_.empty());
  REQUIRE(::access(program_.c_str(), X_OK) == 0);
  ::close(::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) execChild(program_, args_, env, out_path_);
}

ChildProcess::~ChildProcess() {
  if (running()) kill9();
  if (currentTestFailed()) {
    std::cerr << "----- " << label_ << ": " << commandLine() << " (exit "
              << (exit_code_ ? std::to_string(*exit_code_) : std::string("?")) << ") -----\n"
              << output() << "----- end of " << label_ << " -----\n";
  }
}

std::string ChildProcess::commandLine() const {
  std::string s = program_;
  for (const auto& a : args_) s += " " + a;
  return s;
}

bool ChildProcess::running() {
  if (pid_ <= 0 || exit_code_) return false;
  if (auto st = tryReap(pid_)) {
    exit_code_ = decodeWaitStatus(*st);
    return false;
  }
  return true;
}

void ChildProcess::kill9() {
  if (!running()) return;
  ::kill(pid_, SIGKILL);
  if (auto st = reapWithin(pid_, Millis(5000))) exit_code_ = decodeWaitStatus(*st);
}

int ChildProcess::wait(Millis timeout) {
  if (exit_code_) return *exit_code_;
  if (auto st = reapWithin(pid_, timeout); st && !exit_code_) exit_code_ = decodeWaitStatus(*st);
  if (!exit_code_) {
    kill9();
    FAIL(label_ << " did not finish within " << timeout.count() << " ms: " << commandLine() << "\noutput:\n"
                << output());
  }
  return *exit_code_;
}

std::string ChildProcess::output() const { return readFile(out_path_); }

}  // namespace framelink::integ
