#include "bench_tool.h"

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
#include <cstdio>
#include <cstring>

#include "child_process.h"
#include "cli_util.h"

namespace framelink::cli {

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

Spawned spawnTool(const std::string& path, const std::vector<std::string>& args, const std::string& env) {
  Spawned s;
  std::vector<std::string> full = {path};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string env_var = env;
  const size_t name_len = env.find('=') == std::string::npos ? 0 : env.find('=') + 1;
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (name_len == 0 || std::strncmp(*e, env.c_str(), name_len) != 0) envp.push_back(*e);
  }
  if (name_len != 0) envp.push_back(env_var.data());
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

Spawned startToolServer(const std::string& path, const std::vector<std::string>& args, const std::string& env,
                        uint16_t port, uint64_t deadline, const std::string& what, std::string& error) {
  const Spawned server = spawnTool(path, args, env);
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
  error = what + " did not start listening on port " + std::to_string(port) + ":" + srv.tail();
  return Spawned{};
}

bool startToolPair(const std::string& path, const std::vector<std::string>& server_args,
                   const std::vector<std::string>& client_args, const std::string& env, uint16_t port,
                   uint64_t deadline, const std::string& what, ToolPair& pair, std::string& error) {
  pair.server = startToolServer(path, server_args, env, port, deadline, what, error);
  if (pair.server.pid < 0) return false;
  pair.client = spawnTool(path, client_args, env);
  if (pair.client.pid >= 0) return true;
  error = "cannot start " + path + ": " + std::strerror(errno);
  stopChild(pair.server.pid, 1000);
  ::close(pair.server.fd);
  pair.server = Spawned{};
  return false;
}

void endToolPair(ToolPair& pair, int client_grace_ms, int server_grace_ms) {
  if (waitChild(pair.client.pid, client_grace_ms) < 0) stopChild(pair.client.pid, 1000);
  if (waitChild(pair.server.pid, server_grace_ms) < 0) stopChild(pair.server.pid, 1000);
  ::close(pair.client.fd);
  ::close(pair.server.fd);
  pair = ToolPair{};
}

int LineReader::next(std::string& line, uint64_t deadline_ns) {
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

std::string LineReader::tail() const {
  std::string s;
  for (const auto& l : tail_) s += "\n    " + l;
  return s.empty() ? std::string(" (no output)") : s;
}

void LineReader::remember(const std::string& l) {
  if (l.empty() || l[0] == '+' || l[0] == '|') return;  // table rules and headers
  tail_.push_back(l);
  if (tail_.size() > 6) tail_.pop_front();
}

}  // namespace framelink::cli
