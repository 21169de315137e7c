// Operator commands against real daemons: `framelink stats / clients /
// links` over the attach socket's admin request, who may send one (a forked
// child drops to nobody/nogroup, as in test_security.cpp), and `framelink
// doctor` with a daemon and without one.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"
#include "raw_client.h"

using namespace framelink::integ;
using Json = nlohmann::json;

namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

// Runs the CLI as nobody:nogroup in a forked child (root needed to switch).
CliRun runCliAsNobody(const TempDir& dir, const std::vector<std::string>& args) {
  REQUIRE(::geteuid() == 0);  // "needs root to switch to a second user"
  const std::string out = dir.file("nobody.out");
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  ::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNogroup) != 0 || ::setuid(kNobody) != 0) ::_exit(250);
    std::vector<char*> argv;
    const std::string program = cliBinary();
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fd);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CliRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = readFile(out);
  return r;
}

// Sends `length` bytes of `message` on a fresh connection and reads the admin
// reply (bounded); bytes is 0 when none came.
struct RawAdmin {
  size_t bytes = 0;
  fl_admin_reply reply{};
  int fds = 0;
};
RawAdmin rawAdmin(const std::string& socket, const void* message, size_t length) {
  const int s = connectSeqpacket(socket);
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  REQUIRE(::send(s, message, length, MSG_NOSIGNAL) == static_cast<ssize_t>(length));
  RawAdmin r;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  iovec iov{&r.reply, sizeof r.reply};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
  r.bytes = n > 0 ? static_cast<size_t>(n) : 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      ::close(fd);
      ++r.fds;
    }
  }
  ::close(s);
  return r;
}

const Json* findClient(const Json& clients, const std::string& role) {
  for (const auto& c : clients) {
    if (c.value("role", "") == role) return &c;
  }
  return nullptr;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("admin: stats, clients and links show a producer and a consumer that moved frames", "[admin]") {
  DaemonPair::Options po;
  po.extra_args = {"--metrics", "127.0.0.1:0"};  // and /healthz
  DaemonPair pair(po);
  const std::string sock_a = pair.a().socketPath(), sock_b = pair.b().socketPath();
  Client producer = attachProducer(pair.a(), "adm-cam", 4, 256 * 1024);
  Client consumer = attachConsumer(pair.b(), "adm-cam", 6, 512 * 1024);
  constexpr int kFrames = 12;
  for (int i = 0; i < kFrames; ++i) {
    submitFrame(producer.get(), static_cast<uint64_t>(i), 100000);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  }
  REQUIRE(collectCompletions(producer.get(), kFrames, Millis(15000)).size() == kFrames);
  // The HTTP health probe: 200 from both daemons, their agents publishing.
  CHECK(pair.a().httpGet("/healthz").rfind("ok: ", 0) == 0);
  CHECK(pair.b().httpGet("/healthz").rfind("ok: ", 0) == 0);
  const auto me = static_cast<uint64_t>(::getpid());

  // The data agent publishes its detail twice a second: wait for the frames to show.
  Json clients_a, clients_b;
  REQUIRE(waitUntil(
      [&] {
        clients_a = cliJson("clients-a", {"clients", "--json", "--socket", sock_a});
        clients_b = cliJson("clients-b", {"clients", "--json", "--socket", sock_b});
        const Json* p = findClient(clients_a, "producer");
        const Json* c = findClient(clients_b, "consumer");
        return p != nullptr && c != nullptr && p->value("frames", 0) >= kFrames &&
               c->value("frames", 0) >= kFrames;
      },
      Millis(10000), Millis(300)));
  INFO("A: " << clients_a.dump() << "\nB: " << clients_b.dump());
  REQUIRE(clients_a.size() == 1);
  REQUIRE(clients_b.size() == 1);
  const Json& p = clients_a[0];
  CHECK(p.value("pid", 0ull) == me);
  CHECK(p.value("uid", -1) == static_cast<int>(::getuid()));
  CHECK(p.value("role", "") == "producer");
  CHECK(p.value("stream", "") == "adm-cam");
  CHECK(p.value("slots", 0) == 4);
  CHECK(p.value("slot_size", 0) == 256 * 1024);
  CHECK(p.value("bytes", 0ull) == uint64_t{kFrames} * 100000);
  CHECK(p.value("in_flight", -1) == 0);  // every frame was acknowledged
  const Json& c = clients_b[0];
  CHECK(c.value("pid", 0ull) == me);
  CHECK(c.value("role", "") == "consumer");
  CHECK(c.value("stream", "") == "adm-cam");
  CHECK(c.value("slots", 0) == 6);
  CHECK(c.value("slot_size", 0) == 512 * 1024);

  // The table says the same.
  CliRun table = runCli("clients-table", {"clients", "--socket", sock_a});
  REQUIRE(table.code == 0);
  CHECK(table.output.find("PID") != std::string::npos);
  CHECK(table.output.find(" " + std::to_string(me) + " ") != std::string::npos);
  CHECK(table.output.find("producer") != std::string::npos);
  CHECK(table.output.find("4 x 256 KiB") != std::string::npos);

  Json links_a = cliJson("links-a", {"links", "--json", "--socket", sock_a});
  Json links_b = cliJson("links-b", {"links", "--json", "--socket", sock_b});
  INFO("links A: " << links_a.dump() << "\nlinks B: " << links_b.dump());
  REQUIRE(links_a.size() == 1);
  REQUIRE(links_b.size() == 1);
  CHECK(links_a[0].value("peer", "") == pair.b().id());
  CHECK(links_a[0].value("address", "") == pair.b().grpcAddress());
  CHECK(links_a[0].value("state", "") == "up");
  CHECK(links_a[0].value("transport", "") == "tcp");
  CHECK(links_a[0].value("frames_out", 0) >= kFrames);
  CHECK(links_a[0].value("in_flight", -1) == 0);
  CHECK(links_a[0].value("replayed", -1) == 0);
  CHECK(links_b[0].value("peer", "") == pair.a().id());
  CHECK(links_b[0].value("address", "").rfind("127.0.0.1:", 0) == 0);
  CHECK(links_b[0].value("frames_in", 0) >= kFrames);
  // Both sides echo keepalives (every second when idle): each measures the round trip.
  REQUIRE(waitUntil(
      [&] {
        links_a = cliJson("links-rtt", {"links", "--json", "--socket", sock_a});
        return links_a.size() == 1 && links_a[0].value("rtt_ns", 0ull) > 0;
      },
      Millis(10000), Millis(500)));
  CHECK(links_a[0].value("rtt_ns", 0ull) < 1'000'000'000ull);
  CliRun links_table = runCli("links-table", {"links", "--socket", sock_a});
  REQUIRE(links_table.code == 0);
  CHECK(links_table.output.find(pair.b().id()) != std::string::npos);
  CHECK(links_table.output.find(" up ") != std::string::npos);
  CHECK(links_table.output.find(" ms ") != std::string::npos);

  Json stats_a = cliJson("stats-a", {"stats", "--once", "--json", "--interval", "0.2", "--socket", sock_a});
  Json stats_b = cliJson("stats-b", {"stats", "--once", "--json", "--interval", "0.2", "--socket", sock_b});
  INFO("stats A: " << stats_a.dump() << "\nstats B: " << stats_b.dump());
  CHECK(stats_a["counters"].value("frames_submitted", 0) == kFrames);
  CHECK(stats_a["counters"].value("frames_delivered", 0) == kFrames);
  CHECK(stats_a["counters"].value("bytes_sent", 0ull) == uint64_t{kFrames} * 100000);
  CHECK(stats_a["counters"].value("links_up", 0) == 1);
  CHECK(stats_b["counters"].value("frames_received", 0) == kFrames);
  CHECK(stats_b["counters"].value("frames_released", 0) == kFrames);
  CHECK(stats_a["daemon"].value("id", "") == pair.a().id());
  CHECK(stats_a["daemon"].value("pid", 0) == pair.a().pid());
  CHECK(stats_a["rates_per_s"].contains("frames_delivered"));
  // Each admin request is counted (this run asked at least twice: --once takes two samples).
  CHECK(stats_a["counters"].value("admin_requests", 0) >= 2);

  // Rates: frames moving while `stats` samples show as a non-zero rate.
  ChildProcess sampler("stats-rate", {"stats", "--once", "--json", "--interval", "1.5", "--socket", sock_a});
  for (int i = 0; i < 6; ++i) {
    submitFrame(producer.get(), static_cast<uint64_t>(100 + i), 100000);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    std::this_thread::sleep_for(Millis(200));
  }
  REQUIRE(sampler.wait(Millis(20000)) == 0);
  Json rated = Json::parse(sampler.output());
  INFO("rated: " << rated.dump());
  CHECK(rated["rates_per_s"].value("frames_submitted", 0.0) > 0.0);

  CliRun text = runCli("stats-text", {"stats", "--once", "--interval", "0.2", "--socket", sock_a});
  REQUIRE(text.code == 0);
  CHECK(text.output.find("framelinkd '" + pair.a().id() + "'") != std::string::npos);
  CHECK(text.output.find("frames delivered") != std::string::npos);
}

namespace {

// How many times the daemon's threads named `name` were put on a CPU
// (/proc/PID/task/TID/schedstat, its third field), summed.
uint64_t timesScheduled(pid_t pid, const std::string& name) {
  uint64_t sum = 0;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks)) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    if (thread_name != name) continue;
    std::ifstream stat(task.path() / "schedstat");
    uint64_t run_ns = 0, wait_ns = 0, slices = 0;
    stat >> run_ns >> wait_ns >> slices;
    sum += slices;
  }
  return sum;
}

}  // namespace

TEST_CASE("admin: an idle daemon's agent sleeps until something comes, and its health probe still says ok",
          "[admin]") {
  DaemonProcess::Options o;
  o.id = "idle";
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  DaemonProcess d(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // its start-up published
  const uint64_t before = timesScheduled(d.pid(), "fl-data-agent");
  REQUIRE(before > 0);
  // Past the health window (5 s): the agent has published nothing since.
  std::this_thread::sleep_for(std::chrono::milliseconds(5500));
  // It used to wake every 2 s with nothing to do (2 or 3 times here).
  CHECK(timesScheduled(d.pid(), "fl-data-agent") - before == 0);
  // The probe finds its state old, asks, and the agent answers at once.
  const std::string health = d.httpGet("/healthz");
  INFO(health);
  CHECK(health.rfind("ok: ", 0) == 0);
  CHECK(timesScheduled(d.pid(), "fl-data-agent") - before >= 1);
  // An attached client wakes it too, and it serves as before.
  Client producer = attachProducer(d, "idle-cam", 2, 64 * 1024);
  CHECK(waitUntil([&] { return d.metric("framelink_clients_attached_total") >= 1; }, Millis(5000),
                  Millis(100)));
}

TEST_CASE("admin: a user outside the admin rule is refused, the admin group is answered",
          "[admin][security]") {
  DaemonPair::Options po;
  // World-connectable sockets, so that only the admin rule stands between
  // nobody and the snapshot: A keeps the default (the socket's group, root's
  // here), B names nogroup as its admin group.
  po.extra_args_a = {"--socket-mode", "0666", "--metrics", "127.0.0.1:0"};
  po.extra_args_b = {"--socket-mode", "0666", "--admin-group", "nogroup"};
  DaemonPair pair(po);
  for (auto* d : {&pair.a(), &pair.b()}) REQUIRE(::chmod(dirOf(d->socketPath()).c_str(), 0711) == 0);
  TempDir dir("fl-admin");
  REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);

  CliRun refused = runCliAsNobody(dir, {"stats", "--once", "--socket", pair.a().socketPath()});
  INFO("as nobody on A: " << refused.output);
  CHECK(refused.code == 1);
  CHECK(refused.output.find("admin requests are refused to uid 65534") != std::string::npos);
  CHECK(refused.output.find("daemon.admin_group") != std::string::npos);
  CHECK(pair.a().metric("framelink_admin_refused_total") == 1);
  CHECK(pair.a().waitForLog("admin: pid", Millis(5000)));
  // Attaching stays what it was: the socket mode and allow-lists decide that.
  CHECK(tryAttach(pair.a().socketPath(), FL_PRODUCER, "adm", 2, 65536).status == FL_OK);

  CliRun allowed = runCliAsNobody(dir, {"clients", "--json", "--socket", pair.b().socketPath()});
  INFO("as nobody on B: " << allowed.output);
  CHECK(allowed.code == 0);
  CHECK_NOTHROW(Json::parse(allowed.output));
  // Root is always allowed.
  CHECK(runCli("root-links", {"links", "--socket", pair.a().socketPath()}).code == 0);
  CHECK(pair.a().metric("framelink_admin_requests_total") == 1);
  // The per-link gauges the Grafana dashboard shows.
  const std::string up_series = "framelink_link_up{peer=\"" + pair.b().id() + "\",transport=\"tcp\"} 1";
  CHECK(waitUntil([&] { return pair.a().httpGet("/metrics").find(up_series) != std::string::npos; },
                  Millis(10000), Millis(100)));
  CHECK(pair.a().httpGet("/metrics").find("framelink_frames_in_flight 0") != std::string::npos);
}

TEST_CASE("admin: doctor against a running daemon and against none", "[admin]") {
  DaemonPair pair("tcp");
  TempDir dir("fl-doctor");
  const std::string no_config = dir.file("absent.toml");
  // The link shows in the daemon's detail once the data agent published it.
  REQUIRE(waitUntil(
      [&] {
        Json links = cliJson("links-up", {"links", "--json", "--socket", pair.a().socketPath()});
        return links.size() == 1 && links[0].value("state", "") == "up";
      },
      Millis(10000), Millis(200)));

  CliRun up = runCli("doctor-up", {"doctor", "--socket", pair.a().socketPath(), "--config", no_config});
  INFO("doctor with a daemon:\n" << up.output);
  const auto up_lines = lines(up.output);
  REQUIRE(up_lines.size() >= 6);
  bool failed = false;
  for (const auto& line : up_lines) {
    INFO(line);
    const bool ok = line.rfind("OK   ", 0) == 0, warn = line.rfind("WARN ", 0) == 0,
               fail = line.rfind("FAIL ", 0) == 0;
    CHECK((ok || warn || fail));
    if (warn || fail) CHECK(line.find(" -- fix: ") != std::string::npos);
    failed = failed || fail;
  }
  CHECK(up.code == (failed ? 1 : 0));
  CHECK(up_lines[0].rfind("OK   daemon", 0) == 0);
  CHECK(up_lines[0].find("'" + pair.a().id() + "'") != std::string::npos);
  CHECK(up.output.find("OK   socket") != std::string::npos);
  CHECK(up.output.find("may connect and attach") != std::string::npos);
  CHECK(up.output.find("memlock") != std::string::npos);
  CHECK(up.output.find("hugepages") != std::string::npos);
  CHECK(up.output.find(" rdma ") != std::string::npos);
  CHECK(up.output.find(" clock ") != std::string::npos);
  // A's one configured peer is B, which listens: reachable, and the link is up.
  CHECK(up.output.find("OK   peer       " + pair.b().id() + " at " + pair.b().grpcAddress() +
                       " accepts TCP connections") != std::string::npos);
  CHECK(up.output.find("link up over tcp") != std::string::npos);
  // The same checks as JSON, for scripts: one object per line above, the same exit status.
  CliRun up_json =
      runCli("doctor-json", {"doctor", "--json", "--socket", pair.a().socketPath(), "--config", no_config});
  INFO("doctor --json:\n" << up_json.output);
  CHECK(up_json.code == up.code);
  const Json checks = Json::parse(up_json.output, nullptr, false);
  REQUIRE(checks.is_array());
  CHECK(checks.size() == up_lines.size());
  for (const auto& c : checks) {
    const std::string verdict = c.value("verdict", "");
    CHECK((verdict == "ok" || verdict == "warn" || verdict == "fail"));
    CHECK_FALSE(c.value("name", "").empty());
    CHECK_FALSE(c.value("what", "").empty());
    if (verdict != "ok") CHECK_FALSE(c.value("fix", "").empty());
  }
  CHECK(checks[0].value("name", "") == "daemon");
  CHECK(checks[0].value("verdict", "") == "ok");

  // No daemon: the checks that need it FAIL and say so; the peers come from
  // the configuration file, one reachable (B) and one not (a port nobody
  // listens on: taken from a socket that is closed again).
  int closed_port = 0;
  {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    closed_port = ntohs(a.sin_port);
    ::close(s);
  }
  const std::string config = dir.file("framelinkd.toml");
  std::ofstream(config) << "[daemon]\nsocket = \"" << dir.file("none.sock")
                        << "\"\n\n[[peer]]\nname = \"b\"\n"
                        << "address = \"" << pair.b().grpcAddress() << "\"\n\n[[peer]]\nname = \"gone\"\n"
                        << "address = \"127.0.0.1:" << closed_port << "\"\n";
  CliRun down = runCli("doctor-down", {"doctor", "--config", config});
  INFO("doctor without a daemon:\n" << down.output);
  CHECK(down.code == 1);
  const auto down_lines = lines(down.output);
  REQUIRE(down_lines.size() >= 6);
  CHECK(down_lines[0].rfind("FAIL daemon", 0) == 0);
  CHECK(down_lines[0].find(dir.file("none.sock")) != std::string::npos);
  CHECK(down_lines[0].find("No such file or directory -- fix: start it (systemctl start framelinkd") !=
        std::string::npos);
  CHECK(down_lines[1].rfind("FAIL socket", 0) == 0);
  CHECK(down.output.find("OK   peer       b at " + pair.b().grpcAddress()) != std::string::npos);
  CHECK(down.output.find("FAIL peer       gone at 127.0.0.1:" + std::to_string(closed_port) +
                         ": Connection refused -- fix: ") != std::string::npos);
}

TEST_CASE("admin: a client name with control and non-ASCII bytes leaves the snapshot valid JSON", "[admin]") {
  DaemonPair pair("tcp");
  fl_client_options opt;
  fl_client_options_init(&opt);
  const std::string socket = pair.a().socketPath();
  opt.socket_path = socket.c_str();
  opt.role = FL_PRODUCER;
  opt.stream = "adm-odd";
  opt.slot_count = 2;
  opt.slot_size = 64 * 1024;
  opt.client_name = "cam\xff\x01\"x\\";  // invalid UTF-8, a control byte, a quote, a backslash
  fl_client* raw = nullptr;
  REQUIRE(fl_attach(&opt, &raw) == FL_OK);
  Client odd(raw);
  Json clients;
  REQUIRE(waitUntil(
      [&] {
        clients = cliJson("clients-odd", {"clients", "--json", "--socket", socket});
        return clients.size() == 1;
      },
      Millis(10000), Millis(200)));
  // Invalid UTF-8 replaced (U+FFFD), the control byte escaped, quote and backslash kept.
  CHECK(clients[0].value("name", "") == "cam\xef\xbf\xbd\x01\"x\\");
  const CliRun table = runCli("clients-odd-table", {"clients", "--socket", socket});
  CHECK(table.code == 0);
  CHECK(table.output.find('\x01') == std::string::npos);  // control bytes never reach the terminal
}

TEST_CASE("admin: malformed admin requests get a clear refusal; unread snapshots cost the daemon nothing",
          "[admin]") {
  DaemonPair pair("tcp");
  const std::string socket = pair.a().socketPath();
  fl_admin_request req{};
  req.magic = FL_ADMIN_MAGIC;
  req.version = 99;
  req.command = FL_ADMIN_SNAPSHOT;
  RawAdmin wrong_version = rawAdmin(socket, &req, sizeof req);
  REQUIRE(wrong_version.bytes == sizeof(fl_admin_reply));
  CHECK(wrong_version.reply.magic == FL_ADMIN_MAGIC);
  CHECK(wrong_version.reply.status == FL_ERR_VERSION);
  CHECK(std::string(wrong_version.reply.message).find("admin protocol version 99") != std::string::npos);
  CHECK(wrong_version.fds == 0);

  req.version = FL_ADMIN_VERSION;
  RawAdmin short_request = rawAdmin(socket, &req, 12);
  REQUIRE(short_request.bytes == sizeof(fl_admin_reply));
  CHECK(short_request.reply.status == FL_ERR_BAD_REQUEST);
  CHECK(std::string(short_request.reply.message).find("admin request of 12 bytes, expected 32") !=
        std::string::npos);

  req.command = 7;
  RawAdmin unknown = rawAdmin(socket, &req, sizeof req);
  CHECK(unknown.reply.status == FL_ERR_BAD_REQUEST);
  CHECK(std::string(unknown.reply.message).find("unknown admin command 7") != std::string::npos);

  req.command = FL_ADMIN_SNAPSHOT;
  RawAdmin good = rawAdmin(socket, &req, sizeof req);
  REQUIRE(good.bytes == sizeof(fl_admin_reply));
  CHECK(good.reply.status == FL_OK);
  CHECK(good.reply.fd_count == 1);
  CHECK(good.fds == 1);
  CHECK(good.reply.json_size > 0);

  // Admin clients that ask and never read: the daemon answers each with one
  // datagram and moves on; attaching and the commands keep working.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int s = connectSeqpacket(socket);
    REQUIRE(::send(s, &req, sizeof req, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof req));
    idle.push_back(s);
  }
  requireServing(pair.a(), pair.b(), "adm-after-idle");
  CHECK(runCli("clients-after-idle", {"clients", "--socket", socket}).code == 0);
  for (int s : idle) ::close(s);
}
