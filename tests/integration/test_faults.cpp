// Faults between processes: a peer with the wrong token, a consumer that dies
// while it holds frames.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "client_util.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "harness.h"
#include "raw_client.h"

using namespace framelink::integ;

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A log line about authentication at warning or error level.
bool hasAuthErrorLine(const std::string& log) {
  std::istringstream in(lower(log));
  std::string line;
  while (std::getline(in, line)) {
    const bool about_auth = line.find("auth") != std::string::npos || line.find("token") != std::string::npos;
    const bool is_error = line.find("warn") != std::string::npos || line.find("error") != std::string::npos;
    if (about_auth && is_error) return true;
  }
  return false;
}

// Reads one byte from `fd` within `timeout`; -1 on timeout or EOF.
int readByte(int fd, Millis timeout) {
  pollfd pfd{fd, POLLIN, 0};
  if (::poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return -1;
  char c;
  return ::read(fd, &c, 1) == 1 ? static_cast<unsigned char>(c) : -1;
}

// Drains `consumer` (verifying and releasing every frame) and the producer's
// completions until every frame in `submitted` has one, then checks the
// "nothing lost silently" rules: exactly one completion per frame; DELIVERED
// exactly for the frames `consumer` received and released; every frame with
// id >= `must_deliver_from` delivered.
void drainAndCheck(fl_client* producer, fl_client* consumer, const std::set<uint64_t>& submitted,
                   uint64_t must_deliver_from, uint64_t length,
                   std::map<uint64_t, uint32_t>* flags = nullptr) {
  std::map<uint64_t, int> received;  // frame id -> times received by `consumer`
  std::map<uint64_t, std::vector<int>> completions;
  size_t completion_count = 0;
  const auto deadline = Clock::now() + Millis(30000);
  while (completion_count < submitted.size() && Clock::now() < deadline) {
    fl_frame f{};
    int rc = fl_receive(consumer, &f, 20);
    if (rc == FL_OK) {
      ++received[f.frame_id];
      if (flags != nullptr) (*flags)[f.frame_id] = f.flags;
      checkSyntheticFrame(f, f.frame_id, length);
      REQUIRE(fl_release(consumer, f.slot) == FL_OK);
    } else {
      INFO("fl_receive: " << statusName(rc));
      REQUIRE((rc == FL_ETIMEDOUT || rc == FL_EAGAIN));
    }
    fl_completion buf[16];
    size_t n = 0;
    REQUIRE(fl_poll_completions(producer, buf, 16, &n) == FL_OK);
    for (size_t i = 0; i < n; ++i) {
      completions[buf[i].frame_id].push_back(buf[i].status);
      ++completion_count;
    }
  }
  // Anything late would be a second completion for some frame.
  for (const auto& c : collectCompletions(producer, 1, Millis(500))) {
    completions[c.frame_id].push_back(c.status);
    ++completion_count;
  }

  CHECK(completion_count == submitted.size());
  for (uint64_t id : submitted) {
    const auto& st = completions[id];
    std::string statuses;
    for (int s : st) statuses += statusName(s) + " ";
    INFO("frame " << id << ": completions [" << statuses << "], received by the new consumer " << received[id]
                  << " time(s)");
    CHECK(st.size() == 1);
    CHECK(received[id] <= 1);
    if (st.size() == 1) {
      // DELIVERED means a consumer released it: only frames `consumer` got.
      CHECK((st[0] == FL_OK) == (received[id] == 1));
    }
    if (id >= must_deliver_from) CHECK(received[id] == 1);
  }
}

}  // namespace

TEST_CASE("faults: a peer with the wrong token gets nothing through", "[integration][faults]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair::Options opt;
  opt.transport = transport;
  opt.token = "the-right-token";
  opt.token_a = "a-wrong-token";
  opt.extra_args = {"--credit-timeout-ms", "1000"};
  DaemonPair pair(opt);

  Client consumer = attachConsumer(pair.b(), "auth", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "auth", 4, 64 * 1024);
  submitFrame(producer.get(), 1, 1000);
  submitFrame(producer.get(), 2, 2000);
  auto done = collectCompletions(producer.get(), 2, Millis(20000));
  REQUIRE(done.size() == 2);
  for (const auto& c : done) {
    INFO("frame " << c.frame_id << " completion " << statusName(c.status));
    CHECK(c.status != FL_OK);
    CHECK(c.status == FL_ERR_NO_LINK);  // the link never came up
  }
  fl_frame none{};
  CHECK(fl_receive(consumer.get(), &none, 0) == FL_EAGAIN);

  INFO("B must log the refused peer (a warn/error line about auth/token)");
  CHECK(waitUntil([&] { return hasAuthErrorLine(pair.b().log()); }, Millis(5000), Millis(50)));
  // A's operator sees why without the log: `links` names the refusal.
  const auto links = cliJson("links-a", {"links", "--json", "--socket", pair.a().socketPath()});
  INFO("links A: " << links.dump());
  REQUIRE(links.size() == 1);
  CHECK(links[0].value("state", "") == "down");
  CHECK(links[0].value("last_error", "").find("refused the session") != std::string::npos);
  CHECK(links[0].value("last_error", "").find("token") != std::string::npos);
  CHECK(links[0].value("last_error_ns", uint64_t{0}) > 0);
  // And doctor fails the peer with the fix for it, though its port answers.
  const CliRun doctor =
      runCli("doctor-a", {"doctor", "--socket", pair.a().socketPath(), "--config", "/nonexistent"});
  INFO("doctor A:\n" << doctor.output);
  CHECK(doctor.code == 1);
  const size_t peer_line = doctor.output.find("FAIL peer");
  REQUIRE(peer_line != std::string::npos);
  const std::string line = doctor.output.substr(peer_line, doctor.output.find('\n', peer_line) - peer_line);
  CHECK(line.find("accepts TCP connections, but no link is up: refused the session") != std::string::npos);
  CHECK(line.find("fix: configure the same token on both daemons") != std::string::npos);
  REQUIRE(pair.b().alive());
  REQUIRE(pair.a().alive());

  // B still serves a peer with the right token.
  DaemonProcess::Options c;
  c.id = "hostC";
  c.token = opt.token;
  c.transports = transport;
  c.peers = {"hostB=" + pair.b().grpcAddress()};
  c.extra_args = opt.extra_args;
  DaemonProcess good_peer(c);
  requireServing(good_peer, pair.b(), "auth-ok");
}

TEST_CASE("faults: a consumer killed while holding frames", "[integration][faults]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair::Options opt;
  opt.transport = transport;
  opt.extra_args = {"--credit-timeout-ms", "3000", "--metrics", "127.0.0.1:0"};
  DaemonPair pair(opt);
  constexpr uint32_t kConsumerSlots = 4;
  constexpr uint64_t kLen = 50000;

  Client producer = attachProducer(pair.a(), "victim", 8, 64 * 1024);

  // The doomed consumer is a forked copy of this process: it attaches, takes
  // every frame it can hold without releasing any, reports, and waits to die.
  int to_parent[2];
  REQUIRE(::pipe(to_parent) == 0);
  const std::string b_socket = pair.b().socketPath();
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(to_parent[0]);
    AttachResult r = tryAttach(b_socket, FL_CONSUMER, "victim", kConsumerSlots, 64 * 1024);
    if (r.status != FL_OK) ::_exit(2);
    (void)!::write(to_parent[1], "A", 1);
    for (uint32_t i = 0; i < kConsumerSlots; ++i) {
      fl_frame f{};
      if (fl_receive(r.client.get(), &f, 15000) != FL_OK) ::_exit(3);
    }
    (void)!::write(to_parent[1], "R", 1);
    for (;;) ::pause();
  }
  ::close(to_parent[1]);
  struct ChildGuard {
    pid_t pid;
    int fd;
    ~ChildGuard() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
      ::close(fd);
    }
  } guard{child, to_parent[0]};

  REQUIRE(readByte(to_parent[0], Millis(10000)) == 'A');
  std::set<uint64_t> submitted;
  for (uint64_t id = 0; id < kConsumerSlots; ++id) {
    submitFrame(producer.get(), id, kLen);
    submitted.insert(id);
  }
  REQUIRE(readByte(to_parent[0], Millis(15000)) == 'R');
  // Two more wait for credit the dead consumer will never give.
  for (uint64_t id = kConsumerSlots; id < kConsumerSlots + 2; ++id) {
    submitFrame(producer.get(), id, kLen);
    submitted.insert(id);
  }
  uint32_t in_flight = 0;
  REQUIRE(fl_in_flight(producer.get(), &in_flight) == FL_OK);
  CHECK(in_flight == kConsumerSlots + 2);

  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  guard.pid = -1;
  REQUIRE(WIFSIGNALED(status));

  REQUIRE(pair.b().alive());
  Client consumer = attachConsumer(pair.b(), "victim", 4, 64 * 1024);
  const uint64_t first_new = kConsumerSlots + 2;
  for (uint64_t id = first_new; id < first_new + 4; ++id) {
    submitFrame(producer.get(), id, kLen);
    submitted.insert(id);
  }

  drainAndCheck(producer.get(), consumer.get(), submitted, first_new, kLen);
  CHECK(pair.a().alive());
  CHECK(pair.b().alive());
  // The dead consumer's frames are not counted as held any more.
  CHECK(waitUntil(
      [&] { return pair.b().httpGet("/stats").find("\"frames_held_by_consumers\":0") != std::string::npos; },
      Millis(5000), Millis(100)));
  INFO("B /stats " << pair.b().httpGet("/stats"));
  requireServing(pair.a(), pair.b(), "after-consumer-death");
}

TEST_CASE("faults: SIGTERM fails pending frames with FL_ERR_SHUTDOWN", "[integration][faults]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);  // default credit timeout (30 s): the frames stay pending

  auto expectShutdownExit = [&] {
    const int status = pair.a().terminate(Millis(10000));
    INFO("framelinkd wait status " << status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  };

  SECTION("frames the daemon has already taken from the submit ring") {
    RawClient raw(pair.a().socketPath(), FL_ROLE_PRODUCER, "pending", 4, 64 * 1024);
    for (uint32_t slot = 0; slot < 2; ++slot) {
      raw.writeMeta(slot, slot + 1);
      raw.submit(slot, 1000);
    }
    fl_ring_header* ring = raw.submitRing();
    REQUIRE(waitUntil(
        [&] {
          return __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE) ==
                 __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
        },
        Millis(5000)));
    expectShutdownExit();
    // The completion ring outlives the daemon: it is shared memory we map.
    for (int i = 0; i < 2; ++i) {
      auto c = raw.waitCompletion(Millis(2000));
      REQUIRE(c.has_value());
      INFO("completion for slot " << c->slot << ": " << statusName(c->status));
      CHECK(c->status == FL_ERR_SHUTDOWN);
    }
    CHECK_FALSE(raw.waitCompletion(Millis(100)).has_value());
    CHECK(__atomic_load_n(&raw.header()->daemon_state, __ATOMIC_ACQUIRE) == FL_DAEMON_DETACHED);
  }

  SECTION("frames submitted just before the signal") {
    // No wait between fl_submit and SIGTERM: descriptors may still sit in
    // the submit ring (or the attach may still be queued inside the daemon).
    // They were submitted, so each must still end in exactly one completion.
    Client producer = attachProducer(pair.a(), "pending", 4, 64 * 1024);
    submitFrame(producer.get(), 1, 1000);
    submitFrame(producer.get(), 2, 1000);
    expectShutdownExit();
    std::map<uint64_t, std::vector<int>> completions;
    waitUntil(
        [&] {
          fl_completion buf[8];
          size_t n = 0;
          if (fl_poll_completions(producer.get(), buf, 8, &n) != FL_OK) return true;
          for (size_t i = 0; i < n; ++i) completions[buf[i].frame_id].push_back(buf[i].status);
          return completions.size() >= 2;
        },
        Millis(3000), Millis(5));
    for (uint64_t id : {1, 2}) {
      const auto& st = completions[id];
      std::string statuses;
      for (int s : st) statuses += statusName(s) + " ";
      INFO("frame " << id << ": completions [" << statuses << "]");
      REQUIRE(st.size() == 1);
      CHECK(st[0] == FL_ERR_SHUTDOWN);
    }
    CHECK(fl_check_daemon(producer.get()) == FL_ERR_DAEMON_GONE);
  }
  // The peer sees A's FIN / a closed link, never a reason to exit.
  const bool b_alive = pair.b().alive();
  INFO("hostB wait status " << pair.b().exitStatus().value_or(-1));
  REQUIRE(b_alive);
}

// A stop tells the truth: what a consumer received ends DELIVERED, not FAILED,
// when its producer's daemon takes SIGTERM while the frames are in flight.
TEST_CASE("faults: SIGTERM drains: frames in flight end delivered, new ones are refused",
          "[integration][faults]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  constexpr uint64_t kLen = 1000;
  DaemonPair::Options po;
  po.transport = transport;
  const bool expire = GENERATE(false, true);  // the consumer never releases: the drain's bound ends it
  po.extra_args_a = {"--drain-timeout-ms", expire ? "700" : "20000"};
  DaemonPair pair(po);
  Client consumer = attachConsumer(pair.b(), "drain", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "drain", 4, 64 * 1024);
  // The consumer holds the frames: their ACKs wait for its releases.
  std::vector<fl_frame> held;
  for (uint64_t id = 1; id <= 3; ++id) submitFrame(producer.get(), id, kLen);
  for (int i = 0; i < 3; ++i) held.push_back(receiveFrame(consumer.get(), Millis(10000)));
  REQUIRE(::kill(pair.a().pid(), SIGTERM) == 0);
  REQUIRE(pair.a().waitForLog("draining 3 frames in progress", Millis(5000)));

  // A frame submitted while the daemon drains is refused at once, never sent.
  submitFrame(producer.get(), 4, kLen);
  std::map<uint64_t, int> status;
  auto collect = [&](size_t want, Millis timeout) {
    waitUntil(
        [&] {
          fl_completion buf[8];
          size_t n = 0;
          if (fl_poll_completions(producer.get(), buf, 8, &n) != FL_OK) return true;
          for (size_t i = 0; i < n; ++i) status[buf[i].frame_id] = buf[i].status;
          return status.size() >= want;
        },
        timeout, Millis(5));
  };
  collect(1, Millis(5000));
  INFO("completions so far: " << status.size());
  REQUIRE(status.count(4) == 1);
  CHECK(status[4] == FL_ERR_SHUTDOWN);
  CHECK(status.size() == 1);  // 1-3 wait for their consumer
  fl_frame none{};
  CHECK(fl_receive(consumer.get(), &none, 300) == FL_ETIMEDOUT);

  if (!expire) {
    for (const auto& f : held) REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  }
  collect(4, Millis(10000));
  for (uint64_t id = 1; id <= 3; ++id) {
    INFO("frame " << id << ": " << (status.count(id) ? statusName(status[id]) : "no completion"));
    REQUIRE(status.count(id) == 1);
    CHECK(status[id] == (expire ? FL_ERR_SHUTDOWN : FL_OK));
  }
  const int wstatus = pair.a().terminate(Millis(10000));
  CHECK((WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
  CHECK(pair.a().log().find(expire ? "3 frames still in progress after"
                                   : "every frame in progress ended within") != std::string::npos);
  CHECK(pair.b().alive());
}

TEST_CASE("faults: the peer daemon is killed and restarted on the same port", "[integration][faults]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  constexpr uint64_t kLen = 30000;
  const std::vector<std::string> timeouts = {"--credit-timeout-ms", "5000",       "--ack-timeout-ms", "10000",
                                             "--metrics",           "127.0.0.1:0"};

  DaemonProcess::Options bo;
  bo.id = "hostB";
  bo.token = "restart-token";
  bo.transports = transport;
  bo.extra_args = timeouts;
  auto b1 = std::make_unique<DaemonProcess>(bo);
  const uint16_t port = b1->grpcPort();

  DaemonProcess::Options ao = bo;
  ao.id = "hostA";
  ao.peers = {"hostB=127.0.0.1:" + std::to_string(port)};
  DaemonProcess a(ao);

  Client producer = attachProducer(a, "restart", 8, 64 * 1024);
  std::set<uint64_t> submitted;
  {
    Client holder = attachConsumer(*b1, "restart", 4, 64 * 1024);
    for (uint64_t id = 0; id < 2; ++id) {
      submitFrame(producer.get(), id, kLen);
      submitted.insert(id);
    }
    for (int i = 0; i < 2; ++i) (void)receiveFrame(holder.get(), Millis(15000));  // held, never released
    b1->kill9();
    CHECK(waitUntil([&] { return fl_check_daemon(holder.get()) == FL_ERR_DAEMON_GONE; }, Millis(5000),
                    Millis(10)));
  }
  REQUIRE(a.alive());

  bo.listen = "127.0.0.1:" + std::to_string(port);
  DaemonProcess b2(bo);
  Client consumer = attachConsumer(b2, "restart", 4, 64 * 1024);
  for (uint64_t id = 2; id < 4; ++id) {
    submitFrame(producer.get(), id, kLen);
    submitted.insert(id);
  }
  // Frames 0 and 1 died with hostB's first instance or were replayed to the
  // second; 2 and 3 must arrive.  Either way, one completion each.
  std::map<uint64_t, uint32_t> flags;
  drainAndCheck(producer.get(), consumer.get(), submitted, 2, kLen, &flags);
  // The first instance delivered 0 and 1 before it died: a replay of them is
  // flagged as a possible redelivery, the frames sent after are not.
  for (const auto& [id, f] : flags) {
    INFO("frame " << id << " flags " << f);
    CHECK(((f & FL_SLOT_MAYBE_REDELIVERED) != 0) == (id < 2));
  }
  if (flags.count(0) != 0) CHECK(a.metric("framelink_frames_maybe_redelivered_total") >= 1);
  CHECK(a.alive());
  CHECK(b2.alive());
  requireServing(a, b2, "after-restart");
}

TEST_CASE("faults: a peer that cannot be reached is a warning once per outage, not one per retry",
          "[integration][faults]") {
  // A port nothing listens on.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string ghost = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  ::close(s);

  DaemonProcess::Options o;
  o.id = "lonely";
  o.token = "integ-secret";
  o.peers = {"ghost=" + ghost};
  o.extra_args = {"--connect-timeout-ms", "200", "--reconnect-max-ms", "200"};
  DaemonProcess d(o);
  const std::string warning = "peer ghost at " + ghost + ": no connection within 200 ms";
  REQUIRE(d.waitForLog(warning, Millis(10000)));
  std::this_thread::sleep_for(Millis(1500));  // several more attempts
  const std::string log = d.log();
  size_t count = 0;
  for (size_t at = log.find(warning); at != std::string::npos; at = log.find(warning, at + 1)) ++count;
  CHECK(count == 1);
  CHECK(log.find("warning [lonely] " + warning) != std::string::npos);
}

TEST_CASE(
    "faults: a producer killed right after submitting large zero-copy frames (tcp): what arrives is whole, "
    "nothing leaks",
    "[integration][faults]") {
  DaemonPair::Options opt;
  opt.transport = "tcp";
  opt.extra_args = {"--metrics", "127.0.0.1:0", "--tcp-zerocopy-bytes", "256K"};
  DaemonPair pair(opt);
  constexpr uint64_t kLen = 4 << 20;
  Client consumer = attachConsumer(pair.b(), "zc-victim", 4, kLen);

  // The producer is a forked copy of this process: it submits four 4 MiB
  // frames (sent from its slots with MSG_ZEROCOPY), says so, and is killed
  // while they are on their way.
  int to_parent[2];
  REQUIRE(::pipe(to_parent) == 0);
  const std::string a_socket = pair.a().socketPath();
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(to_parent[0]);
    AttachResult r = tryAttach(a_socket, FL_PRODUCER, "zc-victim", 4, kLen);
    if (r.status != FL_OK) ::_exit(2);
    for (uint64_t id = 0; id < 4; ++id) {
      if (!trySubmitFrame(r.client.get(), id, kLen).empty()) ::_exit(3);
    }
    (void)!::write(to_parent[1], "S", 1);
    for (;;) ::pause();
  }
  ::close(to_parent[1]);
  REQUIRE(readByte(to_parent[0], Millis(15000)) == 'S');
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  ::close(to_parent[0]);

  // What arrives of the dead producer's frames arrives whole.
  fl_frame f{};
  uint64_t arrived = 0;
  while (fl_receive(consumer.get(), &f, 3000) == FL_OK) {
    checkSyntheticFrame(f, f.frame_id, kLen);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    ++arrived;
  }
  INFO(arrived << " of the dead producer's 4 frames arrived");
  CHECK(arrived <= 4);
  CHECK(pair.a().metric("framelink_transport_zerocopy_sends_total") > 0);
  // Its slots are let go once the kernel let their pages go: A holds nothing
  // of it (no client, no frame in flight), B no frame.
  CHECK(waitUntil([&] { return pair.a().idle(); }, Millis(15000), Millis(200)));
  INFO("A /stats " << pair.a().httpGet("/stats"));
  CHECK(pair.b().httpGet("/stats").find("\"frames_held_by_consumers\":0") != std::string::npos);
  // The link serves the next producer, large frames intact.
  Client producer = attachProducer(pair.a(), "zc-victim", 4, kLen);
  for (uint64_t id = 10; id < 13; ++id) {
    submitFrame(producer.get(), id, kLen);
    fl_frame g = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(g, id, kLen);
    REQUIRE(fl_release(consumer.get(), g.slot) == FL_OK);
  }
  auto done = collectCompletions(producer.get(), 3, Millis(15000));
  REQUIRE(done.size() == 3);
  for (const auto& c : done) CHECK(c.status == FL_OK);
  CHECK(pair.a().alive());
  CHECK(pair.b().alive());
}
