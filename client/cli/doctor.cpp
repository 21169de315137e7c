#include "doctor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <poll.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timex.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "admin.h"
#include "cli_util.h"
#include "commands.h"
#include "framelink/framelink.h"

namespace framelink::cli {

std::string formatCheck(const Check& check) {
  const char* v = check.verdict == Verdict::kOk ? "OK  " : check.verdict == Verdict::kWarn ? "WARN" : "FAIL";
  std::string line = std::string(v) + " " + check.name;
  if (check.name.size() < 10) line += std::string(10 - check.name.size(), ' ');
  line += " " + check.what;
  if (check.verdict != Verdict::kOk && !check.fix.empty()) line += " -- fix: " + check.fix;
  return line;
}

Json checksJson(const std::vector<Check>& checks) {
  Json out = Json::array();
  for (const auto& c : checks) {
    const char* verdict = c.verdict == Verdict::kOk ? "ok" : c.verdict == Verdict::kWarn ? "warn" : "fail";
    out.push_back({{"verdict", verdict}, {"name", c.name}, {"what", c.what}, {"fix", c.fix}});
  }
  return out;
}

int doctorExitCode(const std::vector<Check>& checks) {
  for (const auto& c : checks) {
    if (c.verdict == Verdict::kFail) return 1;
  }
  return 0;
}

std::string fixForPeerProblem(const std::string& cause) {
  static constexpr const char* kToken =
      "configure the same token on both daemons: copy /etc/framelink/peer.token (link.token_file, or the "
      "[[peer]]'s token_file) from one host to the other, then restart both";
  static constexpr const char* kTrust =
      "append each host's /etc/framelink/tls/host.crt to the other's peers.pem (tls_ca_file), check that the "
      "certificate names the host of the [[peer]] address (or set tls_server_name) and its cert_name, then "
      "restart both";
  if (cause == "token") return kToken;
  if (cause == "credentials") {
    return std::string(kToken) + "; with TLS, the peer may have refused the certificate: " + kTrust;
  }
  if (cause == "unreachable_or_tls") {
    return std::string("the port answers, so the TLS handshake failed: ") + kTrust +
           " (or it was down and is redialled soon)";
  }
  if (cause == "version") return "run the same framelink version on both hosts";
  if (cause == "data_channel") {
    return "open the tcp data port between the hosts (link.data_listen: by default the port after "
           "link.listen's, 7701) or, for rdma, check both hosts' RDMA devices (framelink doctor on each)";
  }
  if (cause == "unreachable") {
    return "is the port open in the firewalls between (link.listen, 7700 by default)? is framelinkd running "
           "there?";
  }
  return "see framelinkd's log on both hosts (journalctl -u framelinkd) and framelink links";
}

namespace {

constexpr const char* kDefaultConfig = "/etc/framelink/framelinkd.toml";
constexpr const char* kInfiniband = "/sys/class/infiniband";

struct DoctorOptions {
  std::string socket;
  std::string config = kDefaultConfig;
  int peer_timeout_ms = 1000;
  bool json = false;
};

std::string readText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // 2 before 10
  });
  return names;
}

std::string userName(uid_t uid) {
  passwd* p = ::getpwuid(uid);
  return p != nullptr ? p->pw_name : std::to_string(uid);
}

std::string groupName(gid_t gid) {
  group* g = ::getgrgid(gid);
  return g != nullptr ? g->gr_name : std::to_string(gid);
}

std::string octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

// What the configuration file says, for when the daemon does not answer.
struct FileConfig {
  bool read = false;
  std::string error;
  std::string socket;
  std::vector<std::pair<std::string, std::string>> peers;  // name, address
  std::vector<std::string> transports;
};

FileConfig readConfig(const std::string& path) {
  FileConfig fc;
  if (::access(path.c_str(), R_OK) != 0) {
    fc.error = path + ": " + std::strerror(errno);
    return fc;
  }
  try {
    toml::table t = toml::parse_file(path);
    if (auto s = t["daemon"]["socket"].value<std::string>()) fc.socket = *s;
    if (auto* list = t["link"]["transports"].as_array()) {
      for (auto& v : *list) {
        if (auto s = v.value<std::string>()) fc.transports.push_back(*s);
      }
    }
    if (auto* peers = t["peer"].as_array()) {
      for (auto& p : *peers) {
        if (auto* pt = p.as_table()) {
          fc.peers.emplace_back((*pt)["name"].value_or(std::string()),
                                (*pt)["address"].value_or(std::string()));
        }
      }
    }
    fc.read = true;
  } catch (const toml::parse_error& e) {
    fc.error = path + ": " + std::string(e.description());
  }
  return fc;
}

Check checkDaemon(const std::string& socket, const AdminReply& reply) {
  Check c;
  c.name = "daemon";
  if (reply.status == FL_OK) {
    const Json& d = reply.snapshot["daemon"];
    c.what = "framelinkd '" + d.value("id", std::string()) + "' (pid " + std::to_string(d.value("pid", 0)) +
             ", version " + d.value("version", std::string()) + ") answers on " + socket;
    // Which configuration runs: compare with `framelinkd --check-config` of the file.
    const Json& config = reply.snapshot["metrics"]["config"];
    if (config.is_object()) {
      const uint64_t reloads = config.value("reloads", uint64_t{0});
      c.what +=
          "; configuration " + config.value("hash", std::string("?")) +
          (reloads == 0 ? std::string(" (as started)") : " (reloaded " + std::to_string(reloads) + "x)");
    }
    return c;
  }
  if (reply.status == FL_ERR_ATTACH_REFUSED) {
    c.verdict = Verdict::kWarn;
    c.what = "framelinkd answers on " + socket + " but not to this user: " + reply.error;
    c.fix = "run framelink doctor as root or as a member of the admin group to see the daemon's state";
    return c;
  }
  c.verdict = Verdict::kFail;
  c.what = reply.error;
  c.fix = "start it (systemctl start framelinkd, or framelinkd --config " + std::string(kDefaultConfig) +
          "); if it listens elsewhere pass --socket or set FRAMELINK_SOCKET";
  return c;
}

Check checkSocket(const std::string& socket) {
  Check c;
  c.name = "socket";
  struct stat st {};
  if (::stat(socket.c_str(), &st) != 0) {
    const int err = errno;
    c.verdict = Verdict::kFail;
    c.what = socket + ": " + std::strerror(err);
    c.fix = err == EACCES
                ? "this user cannot search the socket's directory; add it to the socket's group or "
                  "make the directory o+x"
                : "start framelinkd (it creates the socket), or pass --socket / set FRAMELINK_SOCKET "
                  "to where it listens";
    return c;
  }
  if (!S_ISSOCK(st.st_mode)) {
    c.verdict = Verdict::kFail;
    c.what = socket + " exists but is not a socket";
    c.fix = "remove it and restart framelinkd, or point --socket at the daemon's socket";
    return c;
  }
  const std::string group = groupName(st.st_gid);
  c.what =
      socket + ": mode " + octal(st.st_mode & 07777) + ", owner " + userName(st.st_uid) + ", group " + group;
  const bool may = ::faccessat(AT_FDCWD, socket.c_str(), W_OK, AT_EACCESS) == 0;
  const std::string me = userName(::geteuid());
  if (!may) {
    c.verdict = Verdict::kFail;
    c.what += "; this user (" + me + ") may not connect, so cannot attach";
    c.fix = "add the user to the group: usermod -aG " + group + " " + me + ", then log in again";
    return c;
  }
  c.what += "; this user (" + me + ") may connect and attach";
  if ((st.st_mode & 0002) != 0) {
    c.verdict = Verdict::kWarn;
    c.what += "; so may every user on this host";
    c.fix =
        "socket_mode = \"0660\" with socket_group = \"framelink\" in the config, unless allowed_uids / "
        "allowed_gids restrict who attaches";
  }
  return c;
}

bool hasRdmaDevices() { return !listDir(kInfiniband).empty(); }

Check checkMemlock(const Json* snapshot, bool rdma) {
  Check c;
  c.name = "memlock";
  std::optional<uint64_t> limit;
  std::string whose;
  if (snapshot != nullptr) {
    const int pid = (*snapshot)["daemon"].value("pid", 0);
    limit = parseMemlock(readText("/proc/" + std::to_string(pid) + "/limits"));
    whose = "framelinkd's (pid " + std::to_string(pid) + ")";
  }
  if (!limit) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
    }
    whose = "this shell's (a service gets LimitMEMLOCK from its unit)";
  }
  if (!limit) {
    c.verdict = Verdict::kWarn;
    c.what = "cannot read RLIMIT_MEMLOCK";
    c.fix = "check with ulimit -l";
    return c;
  }
  c.what = "RLIMIT_MEMLOCK " + whose + ": " + (*limit == UINT64_MAX ? "unlimited" : formatBytes(*limit));
  if (*limit == UINT64_MAX || *limit >= (uint64_t{1} << 30)) return c;
  if (!rdma) {
    c.what += " (only rdma registers memory; no RDMA device here)";
    return c;
  }
  c.verdict = Verdict::kWarn;
  c.what += ": rdma registers every client segment and fails beyond it";
  c.fix =
      "LimitMEMLOCK=infinity in framelinkd.service (the packaged unit has it), or ulimit -l unlimited "
      "before starting framelinkd by hand";
  return c;
}

Check checkHugepages() {
  Check c;
  c.name = "hugepages";
  auto h = parseMeminfo(readText("/proc/meminfo"));
  if (!h) {
    c.verdict = Verdict::kWarn;
    c.what = "cannot read HugePages_* from /proc/meminfo";
    c.fix = "check the kernel has CONFIG_HUGETLBFS";
    return c;
  }
  const std::string size = formatBytes(h->size_kib * 1024);
  if (h->total == 0) {
    c.verdict = Verdict::kWarn;
    c.what = "none reserved (page size " + size + "): client segments use normal pages (more TLB misses)";
    c.fix = "sysctl -w vm.nr_hugepages=512 (1 GiB of 2 MiB pages; persist it in /etc/sysctl.d/)";
    return c;
  }
  c.what = std::to_string(h->total) + " x " + size + " reserved, " + std::to_string(h->free) + " free";
  if (h->free == 0) {
    c.verdict = Verdict::kWarn;
    c.what += ": new clients get normal pages";
    c.fix = "reserve more: sysctl -w vm.nr_hugepages=" + std::to_string(h->total * 2);
  }
  return c;
}

std::vector<Check> checkRdma(const std::vector<std::string>& transports) {
  std::vector<Check> out;
  const bool wanted =
      transports.empty() || std::find(transports.begin(), transports.end(), "rdma") != transports.end();
  const auto devices = listDir(kInfiniband);
  if (devices.empty()) {
    Check c;
    c.name = "rdma";
    c.what = std::string("no RDMA devices (") + kInfiniband + " is empty): links use tcp or grpc";
    if (!wanted) {
      c.what += "; rdma is not among the daemon's transports";
    } else {
      c.verdict = Verdict::kWarn;
      c.fix =
          "load the NIC's RDMA driver (e.g. mlx5_ib), or for testing Soft-RoCE: modprobe rdma_rxe && rdma "
          "link add rxe0 type rxe netdev eth0";
    }
    out.push_back(c);
    return out;
  }
  for (const auto& dev : devices) {
    const std::string base = std::string(kInfiniband) + "/" + dev;
    const std::string numa = trim(readText(base + "/device/numa_node"));
    for (const auto& port : listDir(base + "/ports")) {
      const std::string pbase = base + "/ports/" + port;
      Check c;
      c.name = "rdma";
      const std::string state = trim(readText(pbase + "/state"));  // "4: ACTIVE"
      const std::string layer = trim(readText(pbase + "/link_layer"));
      const std::string ndev = trim(readText(pbase + "/gid_attrs/ndevs/0"));
      const std::string mtu =
          ndev.empty() ? std::string() : trim(readText("/sys/class/net/" + ndev + "/mtu"));
      std::vector<std::string> gids;
      for (const auto& index : listDir(pbase + "/gids")) {
        const std::string gid = trim(readText(pbase + "/gids/" + index));
        if (!gid.empty() && gid != "0000:0000:0000:0000:0000:0000:0000:0000") gids.push_back(gid);
      }
      c.what = dev + " port " + port + ": " + (state.empty() ? "state unknown" : state) + ", " +
               (layer.empty() ? "link layer unknown" : layer) +
               (ndev.empty() ? "" : ", netdev " + ndev + " MTU " + (mtu.empty() ? "?" : mtu)) + ", " +
               std::to_string(gids.size()) + " GID(s)";
      for (size_t i = 0; i < gids.size() && i < 3; ++i) c.what += (i == 0 ? " " : ", ") + gids[i];
      if (gids.size() > 3) c.what += ", ...";
      c.what += ", NUMA node " + (numa.empty() || numa == "-1" ? std::string("none") : numa);
      if (state.find("ACTIVE") == std::string::npos) {
        c.verdict = Verdict::kWarn;
        c.fix = "bring the port up: check cable and switch" +
                (ndev.empty() ? std::string() : ", ip link set " + ndev + " up") +
                "; ibv_devinfo shows the state";
      } else if (gids.empty()) {
        c.verdict = Verdict::kWarn;
        c.fix = "the port has no GID: give " + (ndev.empty() ? std::string("its netdev") : ndev) +
                " an IP address (RoCE GIDs follow the addresses)";
      }
      out.push_back(c);
    }
  }
  return out;
}

// TCP connect to HOST:PORT within `timeout_ms`; empty on success, else why not.
std::string tcpReach(const std::string& address, int timeout_ms, double* ms) {
  std::string host = address, port;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "not HOST:PORT";
  host = address.substr(0, colon);
  port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return std::string("cannot resolve: ") + gai_strerror(rc);
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  std::string why = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const uint64_t start = monotonicNs();
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms);
      if (rc == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    const int err = errno;
    ::close(fd);
    if (rc == 0) {
      *ms = static_cast<double>(monotonicNs() - start) / 1e6;
      return {};
    }
    why = err == ETIMEDOUT ? "no answer within " + std::to_string(timeout_ms) + " ms" : std::strerror(err);
  }
  return why;
}

std::vector<Check> checkPeers(const Json* snapshot, const FileConfig& file, int timeout_ms) {
  std::vector<Check> out;
  std::vector<std::pair<std::string, std::string>> peers;
  if (snapshot != nullptr) {
    for (const auto& p : (*snapshot)["peers"]) {
      peers.emplace_back(p.value("name", std::string()), p.value("address", std::string()));
    }
  } else if (file.read) {
    peers = file.peers;
  } else {
    Check c;
    c.name = "peers";
    c.verdict = Verdict::kWarn;
    c.what = "cannot tell which peers to check: the daemon does not answer and the config is not readable (" +
             file.error + ")";
    c.fix = "start framelinkd, or pass --config with its configuration file";
    out.push_back(c);
    return out;
  }
  if (peers.empty()) {
    Check c;
    c.name = "peers";
    c.what = "no peers configured (this daemon only accepts links)";
    out.push_back(c);
    return out;
  }
  for (const auto& [name, address] : peers) {
    Check c;
    c.name = "peer";
    double ms = 0;
    // A peer without an address only dials in: there is nothing to reach from here.
    const std::string why = address.empty() ? std::string() : tcpReach(address, timeout_ms, &ms);
    std::string link;
    std::string problem;  // what the daemon's own dials last ran into with this peer
    std::string cause;    // its kind (PeerProblems::causeName), which the fix goes by
    if (snapshot != nullptr) {
      for (const auto& l : (*snapshot)["metrics"]["detail"]["links"]) {
        if (l.value("peer", std::string()) == name) {
          link = ", link up over " + l.value("transport", std::string());
        }
      }
      const auto& problems = (*snapshot)["metrics"]["peer_problems"];
      if (problems.is_object() && problems.contains(name)) {
        problem = problems[name].value("last_error", std::string());
        cause = problems[name].value("cause", std::string());
      }
    }
    if (address.empty()) {
      c.what = name + " dials in (no address to check)" + (link.empty() ? ", no link up" : link);
    } else if (why.empty() && link.empty() && !problem.empty()) {
      // The port answers, but the daemon's real Hello (token, TLS,
      // versions, transports) did not make a link: that is what to fix.
      c.verdict = Verdict::kFail;
      c.what = name + " at " + address + " accepts TCP connections, but no link is up: " + problem;
      c.fix = fixForPeerProblem(cause);
    } else if (why.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", ms);
      c.what = name + " at " + address + " accepts TCP connections (" + buf + " ms)" +
               (snapshot == nullptr || !link.empty() ? link : ", no link up yet (the daemon keeps dialing)");
      if (snapshot != nullptr && link.empty()) {
        c.verdict = Verdict::kWarn;
        c.fix = "wait for the next dial, or see framelinkd's log (journalctl -u framelinkd)";
      }
    } else {
      c.verdict = Verdict::kFail;
      c.what = name + " at " + address + ": " + why;
      c.fix =
          "is framelinkd running on that host and listening there (its --listen / link.listen)? is the port "
          "open in the firewalls between? is the address right in this daemon's [[peer]]?";
    }
    out.push_back(c);
  }
  return out;
}

Check checkClock() {
  Check c;
  c.name = "clock";
  timex tx{};
  const int state = ::adjtimex(&tx);
  if (state < 0) {
    c.verdict = Verdict::kWarn;
    c.what = std::string("adjtimex failed: ") + std::strerror(errno);
    c.fix = "check the clock with timedatectl";
    return c;
  }
  char buf[160];
  if (state == TIME_ERROR || (tx.status & STA_UNSYNC) != 0) {
    std::snprintf(buf, sizeof buf, "the system clock is not synchronised (adjtimex: %s, max error %.1f ms)",
                  state == TIME_ERROR ? "TIME_ERROR" : "STA_UNSYNC",
                  static_cast<double>(tx.maxerror) / 1000.0);
    c.verdict = Verdict::kWarn;
    c.what = buf;
    c.fix =
        "enable NTP: timedatectl set-ntp true (systemd-timesyncd) or install chrony; frame timestamps and "
        "latencies across hosts depend on it";
    return c;
  }
  std::snprintf(buf, sizeof buf, "synchronised (estimated error %ld us, max error %.1f ms)",
                static_cast<long>(tx.esterror), static_cast<double>(tx.maxerror) / 1000.0);
  c.what = buf;
  return c;
}

int runDoctor(const DoctorOptions& o) {
  const FileConfig file = readConfig(o.config);
  std::string socket = o.socket;
  if (socket.empty() && std::getenv("FRAMELINK_SOCKET") == nullptr && file.read && !file.socket.empty()) {
    socket = file.socket;
  }
  socket = resolveSocket(socket);
  std::vector<Check> checks;
  AdminReply reply = fetchSnapshot(socket, 2000);
  const Json* snapshot = reply.status == FL_OK ? &reply.snapshot : nullptr;
  checks.push_back(checkDaemon(socket, reply));
  checks.push_back(checkSocket(socket));
  const bool rdma = hasRdmaDevices();
  checks.push_back(checkMemlock(snapshot, rdma));
  checks.push_back(checkHugepages());
  std::vector<std::string> transports = file.transports;
  if (snapshot != nullptr) {
    transports.clear();
    for (const auto& t : (*snapshot)["daemon"]["transports"]) transports.push_back(t.get<std::string>());
  }
  for (auto& c : checkRdma(transports)) checks.push_back(std::move(c));
  for (auto& c : checkPeers(snapshot, file, o.peer_timeout_ms)) checks.push_back(std::move(c));
  checks.push_back(checkClock());
  if (o.json) {
    std::printf("%s\n", checksJson(checks).dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    for (const auto& c : checks) std::printf("%s\n", formatCheck(c).c_str());
  }
  std::fflush(stdout);
  return doctorExitCode(checks);
}

}  // namespace

void addDoctorCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<DoctorOptions>();
  auto* cmd = app.add_subcommand(
      "doctor", "Preflight checks for framelinkd on this host (exit status 1 when a check FAILs)");
  cmd->add_option(
      "--socket", o->socket,
      "framelinkd attach socket (default: $FRAMELINK_SOCKET, the config's socket, or " FL_DEFAULT_SOCKET_PATH
      ")");
  cmd->add_option("--config", o->config,
                  "framelinkd's configuration, read for its socket and peers when the daemon does not answer "
                  "(default /etc/framelink/framelinkd.toml)");
  cmd->add_option("--peer-timeout-ms", o->peer_timeout_ms, "TCP connect timeout per peer (default 1000)")
      ->check(CLI::Range(1, 60000));
  cmd->add_flag("--json", o->json,
                "print the checks as a JSON array of {verdict: ok|warn|fail, name, what, fix}, for scripts "
                "(the exit status is the same)");
  cmd->callback([o, &exit_code] { exit_code = runDoctor(*o); });
}

}  // namespace framelink::cli
