// Hostile neighbours: a local client or a network host that abuses what it
// can reach -- its doorbells, the attach socket, stream names, descriptors,
// the tcp data port, the gRPC Session -- must not stall, wedge or flood the
// daemon.  After each attack every other client is still served with every
// frame verified, the daemons end idle (no held slot, credit or stream) and
// stop cleanly on SIGTERM within a second.  This file has the local clients'
// attacks; test_hostile_network.cpp those of network hosts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "harness.h"
#include "hostile_util.h"
#include "raw_client.h"

using namespace framelink::integ;

TEST_CASE("hostile: a client that makes its doorbells blocking and floods them stalls nobody",
          "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  // A producer and a consumer of their own stream, both abusing their doorbells.
  RawClient producer(pair.a().socketPath(), FL_ROLE_PRODUCER, "evil", 4, 64 * 1024);
  RawClient consumer(pair.b().socketPath(), FL_ROLE_CONSUMER, "evil", 4, 64 * 1024);
  for (RawClient* raw : {&producer, &consumer}) {
    // Fill the submit doorbell while it is still non-blocking, then make both
    // of our ends blocking: the daemon's ends must not care.
    uint64_t one = 1;
    int rings = 0;
    while (::write(raw->fd(2), &one, sizeof one) == sizeof one && rings < 100000) ++rings;
    CHECK(rings > 0);
    clearNonBlocking(raw->fd(2));
    clearNonBlocking(raw->fd(3));
    // Asleep on completions, never reading the completion doorbell: every
    // completion makes the daemon ring it.
    fl_ring_prepare_sleep(raw->completionRing());
  }
  // Bad submits, each answered with a completion and a ring of the full
  // doorbell, until the ring is full and the daemon detaches the client.
  for (uint32_t i = 0; i < producer.ringCapacity() + 4; ++i) {
    fl_submit_desc d{99, 0, 10};
    if (fl_ring_push(producer.submitRing(), producer.ringCapacity(), sizeof d, &d) != FL_RING_OK) break;
  }
  // The daemon's doorbell queue is full: a ring from us would block now, so
  // the daemon has to find the work by itself (its spin phase or a neighbour's ring).
  requireServing(pair.a(), pair.b(), "good", 20);
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

TEST_CASE("hostile: a client that closes its doorbells stalls nobody", "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  RawClient producer(pair.a().socketPath(), FL_ROLE_PRODUCER, "deaf", 4, 64 * 1024);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  REQUIRE(null_fd >= 0);
  // The completion doorbell closed (its fd now /dev/null), the client asleep
  // on completions: the daemon rings a doorbell nobody reads, once for every
  // completion of a bad submit, more rings than the pipe holds.
  REQUIRE(::dup2(null_fd, producer.fd(3)) == producer.fd(3));
  // Pops what the daemon answered; each must be the bad slot's refusal.
  uint32_t answered = 0;
  auto takeAnswers = [&] {
    fl_completion_desc c{};
    while (fl_ring_pop(producer.completionRing(), producer.ringCapacity(), sizeof c, &c) == FL_RING_OK) {
      CHECK(c.status == FL_ERR_BAD_SLOT);
      ++answered;
    }
    fl_ring_prepare_sleep(producer.completionRing());
  };
  fl_ring_prepare_sleep(producer.completionRing());
  uint32_t pushed = 0;
  const auto deadline = Clock::now() + Millis(20000);
  while (answered < 600 && Clock::now() < deadline) {
    fl_submit_desc d{99, 0, 10};
    // No more requests unanswered than the completion ring holds: the daemon
    // detaches a client whose completion ring overflows.
    if (pushed < 600 && pushed - answered < producer.ringCapacity() &&
        fl_ring_push(producer.submitRing(), producer.ringCapacity(), sizeof d, &d) == FL_RING_OK) {
      ++pushed;
      producer.doorbell();
    } else {
      std::this_thread::sleep_for(Millis(1));
    }
    takeAnswers();  // so the completion ring never fills and the client stays attached
  }
  CHECK(answered == 600);
  // The submit doorbell closed too: the daemon finds a submit by itself (its
  // spin, or at the latest when its sleep's bound ends).
  REQUIRE(::dup2(null_fd, producer.fd(2)) == producer.fd(2));
  ::close(null_fd);
  fl_submit_desc d{99, 0, 10};
  REQUIRE(fl_ring_push(producer.submitRing(), producer.ringCapacity(), sizeof d, &d) == FL_RING_OK);
  CHECK(waitUntil(
      [&] {
        takeAnswers();
        return answered == 601;
      },
      Millis(5000), Millis(1)));
  CHECK(pair.a().alive());
  requireServing(pair.a(), pair.b(), "good", 20);
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

TEST_CASE("hostile: connections that never send an attach request are closed and bounded",
          "[integration][hostile]") {
  DaemonPair::Options o = pairOptions();
  o.extra_args_a = {"--max-clients-per-uid", "32"};
  DaemonPair pair(o);
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(connectSeqpacket(pair.a().socketPath()));
  // A user may have as many connections waiting to attach as it may have
  // clients: beyond, they are refused at once; an attach of the same user is
  // refused too while the cap is reached -- quickly, and saying why --
  // instead of hanging.
  const auto start = std::chrono::steady_clock::now();
  AttachResult refused = tryAttach(pair.a().socketPath(), FL_PRODUCER, "good", 2, 64 * 1024);
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  INFO("fl_attach: " << statusName(refused.status) << ": " << refused.message << " after " << took.count()
                     << " ms");
  CHECK(refused.status == FL_ERR_QUOTA);
  CHECK(refused.message.find("waiting to attach") != std::string::npos);
  CHECK(took < Millis(1500));
  // The daemon closes the idle ones at their deadline; then attaching works again.
  CHECK(waitUntil(
      [&] { return pair.a().metric("framelink_attach_rejected_total{reason=\"handshake_timeout\"}") >= 32; },
      Millis(6000), Millis(50)));
  CHECK(pair.a().metric("framelink_attach_rejected_total{reason=\"too_many_pending\"}") >= 8);
  for (int fd : idle) {
    char buf[512];
    // Closed by the daemon (after a refusal message), not left open.
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    CHECK(n == 0);
    ::close(fd);
  }
  requireServing(pair.a(), pair.b(), "good", 5);
  // The daemon's log says so, but not 40 times.
  const std::string log = pair.a().log();
  size_t lines = 0;
  for (size_t at = log.find("sent no attach request"); at != std::string::npos;
       at = log.find("sent no attach request", at + 1)) {
    ++lines;
  }
  CHECK(lines >= 1);
  CHECK(lines <= 3);
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

TEST_CASE("hostile: fl_attach gives up on a daemon that does not answer, and says why",
          "[integration][hostile]") {
  TempDir dir("fl-mute");
  const std::string path = dir.file("mute.sock");
  int l = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  REQUIRE(l >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(l, 0) == 0);  // accepts nothing: the backlog fills at once
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.socket_path = path.c_str();
  o.stream = "cam";
  o.attach_timeout_ms = 300;
  std::vector<int> fillers;
  for (int i = 0; i < 8; ++i) {
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(s);
      break;
    }
    fillers.push_back(s);
  }
  fl_client* c = nullptr;
  const auto start = std::chrono::steady_clock::now();
  const int rc = fl_attach(&o, &c);
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  INFO(fl_last_error() << " after " << took.count() << " ms");
  CHECK(rc == FL_ERR_DAEMON_UNREACHABLE);
  CHECK(took < Millis(2000));
  const std::string why = fl_last_error();
  // Either the backlog was full (connect) or the connection was queued and
  // nobody answered (reply): the message names the step.
  CHECK((why.find("did not accept the connection within 300 ms") != std::string::npos ||
         why.find("did not answer the attach request within 300 ms") != std::string::npos));
  for (int s : fillers) ::close(s);
  ::close(l);
}

TEST_CASE("hostile: a producer churning through stream names does not break the link for others",
          "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  Client consumer = attachConsumer(pair.b(), "steady", 8, 64 * 1024);
  Client producer = attachProducer(pair.a(), "steady", 8, 64 * 1024);
  const int64_t failures_before = pair.b().metric("framelink_link_failures_total");
  // More names than a link takes at once (4096), each attached and detached
  // without sending, while frames flow on "steady".
  constexpr int kNames = 4300;
  uint64_t next_id = 1;
  const auto churn_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kNames; ++i) {
    AttachResult churn = tryAttach(pair.a().socketPath(), FL_PRODUCER, "churn-" + std::to_string(i), 1, 4096);
    REQUIRE(churn.status == FL_OK);
    churn.client.reset();
    if (i % 100 == 0) {
      submitFrame(producer.get(), next_id, 4096 + uint64_t(i));
      fl_frame f = receiveFrame(consumer.get(), Millis(15000));
      checkSyntheticFrame(f, next_id, 4096 + uint64_t(i));
      REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
      auto done = collectCompletions(producer.get(), 1, Millis(15000));
      REQUIRE(done.size() == 1);
      CHECK(done[0].status == FL_OK);  // DELIVERED, since its consumer released it
      ++next_id;
    }
  }
  const auto churn_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - churn_start)
          .count();
  CHECK(pair.b().metric("framelink_link_failures_total") == failures_before);
  // Every attach and detach is logged, but at most 20 a second each (not 4300).
  const std::string log = pair.a().log();
  for (const char* what : {" attached: pid ", " detached (pid "}) {
    int64_t lines = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++lines;
    INFO("'" << what << "' lines: " << lines << " in " << churn_s << " s of churn");
    CHECK(lines >= 1);
    CHECK(lines <= 20 * (churn_s + 3));
  }
  CHECK(waitUntil([&] { return pair.a().metric("framelink_streams_forgotten_total") >= kNames; },
                  Millis(10000), Millis(50)));
  producer.reset();
  consumer.reset();
  CHECK(waitUntil([&] { return pair.a().idle() && pair.b().idle(); }, Millis(10000), Millis(100)));
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

TEST_CASE("hostile: a consumer with small slots does not block frames another consumer can take",
          "[integration][hostile]") {
  DaemonPair pair(pairOptions());
  Client small = attachConsumer(pair.b(), "mixed", 4, 64 * 1024);
  Client large = attachConsumer(pair.b(), "mixed", 4, 1 << 20);
  Client producer = attachProducer(pair.a(), "mixed", 4, 1 << 20);
  // Both consumers' credits must have reached A: a frame that fits none of
  // the credits A knows fails FL_ERR_TOO_LARGE at once, by design.
  const std::regex all_credits(R"re("stream":"mixed","id":[0-9]+,"next_sequence":[0-9]+,"credits":8,)re");
  REQUIRE(waitUntil([&] { return std::regex_search(pair.a().httpGet("/stats"), all_credits); }, Millis(10000),
                    Millis(20)));
  for (uint64_t id = 1; id <= 12; ++id) {
    submitFrame(producer.get(), id, 256 * 1024, true);
    fl_frame f = receiveFrame(large.get(), Millis(15000));
    checkSyntheticFrame(f, id, 256 * 1024);
    REQUIRE(fl_release(large.get(), f.slot) == FL_OK);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    INFO("frame " << id << ": " << statusName(done[0].status));
    CHECK(done[0].status == FL_OK);
  }
  fl_frame none;
  CHECK(fl_receive(small.get(), &none, 0) == FL_EAGAIN);  // nothing landed in a slot too small
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}

namespace {
// user + system CPU time of a process, in clock ticks.
uint64_t cpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return utime + stime;
}
}  // namespace

TEST_CASE("hostile: a user who attaches until the daemon runs out of descriptors stalls nothing",
          "[integration][hostile]") {
  DaemonProcess::Options bo;
  bo.id = "hostB";
  bo.token = "integ-secret";
  bo.transports = "tcp";
  bo.extra_args = kMetrics;
  DaemonProcess b(bo);
  DaemonProcess::Options ao = bo;
  ao.id = "hostA";
  ao.peers = {"hostB=" + b.grpcAddress()};
  ao.max_fds = 96;  // a few dozen clients' worth
  DaemonProcess a(ao);
  requireServing(a, b, "good", 1);
  // Attach (legitimately, each with its own stream) until the daemon cannot
  // take more; then more connections wait in its backlog.
  std::vector<Client> hogs;
  int refused = 0;
  for (int i = 0; i < 60 && refused == 0; ++i) {
    fl_client_options o;
    fl_client_options_init(&o);
    o.role = FL_PRODUCER;
    o.socket_path = a.socketPath().c_str();
    const std::string stream = "hog-" + std::to_string(i);
    o.stream = stream.c_str();
    o.slot_count = 1;
    o.slot_size = 4096;
    o.attach_timeout_ms = 500;
    fl_client* c = nullptr;
    if (fl_attach(&o, &c) == FL_OK) {
      hogs.emplace_back(c);
    } else {
      UNSCOPED_INFO("refused: " << fl_last_error());
      CHECK(std::string(fl_last_error()).find("out of file descriptors") != std::string::npos);
      ++refused;
    }
  }
  INFO(hogs.size() << " clients attached before the daemon ran out of descriptors");
  REQUIRE(refused == 1);
  REQUIRE(hogs.size() >= 5);
  std::vector<int> waiting;
  for (int i = 0; i < 8; ++i) waiting.push_back(connectSeqpacket(a.socketPath()));
  // Out of descriptors the daemon pauses accepting: no spinning, a bounded log.
  const size_t log_before = a.log().size();
  const uint64_t ticks_before = cpuTicks(a.pid());
  std::this_thread::sleep_for(Millis(2000));
  const uint64_t ticks = cpuTicks(a.pid()) - ticks_before;
  const long hz = ::sysconf(_SC_CLK_TCK);
  INFO("daemon CPU while out of descriptors: " << ticks << " ticks in 2 s (" << hz << " per s)");
  CHECK(ticks < static_cast<uint64_t>(hz) / 5);  // under 10 % of a core (it spun at 100 %)
  const size_t logged = a.log().size() - log_before;
  INFO("log grew by " << logged << " bytes in 2 s");
  CHECK(logged < 4096);  // a few rate-limited lines (it wrote 16 MB/s)
  for (int fd : waiting) ::close(fd);
  // When the hog lets go, everyone is served again.
  hogs.clear();
  CHECK(waitUntil(
      [&] {
        AttachResult r = tryAttach(a.socketPath(), FL_PRODUCER, "after", 1, 4096);
        return r.status == FL_OK;
      },
      Millis(5000), Millis(100)));
  requireServing(a, b, "good", 3);
  requireQuickCleanStop(a);
  requireQuickCleanStop(b);
}

namespace {

// Attaches a producer to `socket` and sends `frames` frames (ids 1..frames,
// the synthetic pattern); 0 when every one completed DELIVERED, else the
// first status that was not FL_OK (fits an exit code).  No Catch macros:
// this runs in a forked child.
int sendFrames(const std::string& socket, const std::string& stream, int frames) {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.socket_path = socket.c_str();
  o.stream = stream.c_str();
  o.slot_count = 2;
  o.slot_size = 64 * 1024;
  fl_client* c = nullptr;
  if (int rc = fl_attach(&o, &c); rc != FL_OK) return rc;
  int result = 0;
  for (int id = 1; id <= frames && result == 0; ++id) {
    fl_slot slot{};
    if (int rc = fl_acquire(c, 10000, &slot); rc != FL_OK) {
      result = rc;
      break;
    }
    std::memset(slot.data, id, 4096);
    fl_frame_meta meta{};
    meta.frame_id = static_cast<uint64_t>(id);
    if (int rc = fl_set_meta(c, slot.index, &meta); rc != FL_OK) result = rc;
    if (int rc = fl_submit(c, slot.index, 4096); rc != FL_OK) result = rc;
    fl_completion done{};
    size_t n = 0;
    for (int tries = 0; n == 0 && tries < 150 && result == 0; ++tries) {
      int rc = fl_wait_completions(c, &done, 1, &n, 100);
      if (rc != FL_OK && rc != FL_ETIMEDOUT && rc != FL_EAGAIN) result = rc;
    }
    if (result == 0) result = n == 0 ? 252 : done.status;
  }
  fl_detach(c);
  return result;
}

}  // namespace

TEST_CASE("hostile: one user attaching beyond limits.max_clients_per_uid is refused; others are served",
          "[integration][hostile]") {
  DaemonPair::Options o = pairOptions();
  o.extra_args_a = {"--max-clients-per-uid", "3", "--socket-mode", "0666"};
  DaemonPair pair(o);
  // A client of this user that was there first, and keeps sending.
  Client consumer = attachConsumer(pair.b(), "kept", 8, 64 * 1024);
  Client producer = attachProducer(pair.a(), "kept", 8, 64 * 1024);
  // The same user attaches until the cap...
  std::vector<AttachResult> hogs;
  for (int i = 0; i < 2; ++i) {
    hogs.push_back(tryAttach(pair.a().socketPath(), FL_PRODUCER, "hog-" + std::to_string(i), 1, 4096));
    REQUIRE(hogs.back().status == FL_OK);
  }
  // ...and beyond: refused at once, saying which limit and where to change it.
  for (int i = 0; i < 5; ++i) {
    AttachResult refused = tryAttach(pair.a().socketPath(), FL_CONSUMER, "hog-x", 1, 4096);
    INFO("fl_attach: " << statusName(refused.status) << ": " << refused.message);
    CHECK(refused.status == FL_ERR_QUOTA);
    CHECK(refused.message.find("limits.max_clients_per_uid = 3") != std::string::npos);
    CHECK(refused.message.find("--max-clients-per-uid") != std::string::npos);
  }
  CHECK(pair.a().metric("framelink_attach_rejected_total{reason=\"too_many_clients\"}") == 5);

  // Another user attaches to the same daemon meanwhile and is served.
  const std::string& sock = pair.a().socketPath();
  REQUIRE(::chmod(sock.substr(0, sock.rfind('/')).c_str(), 0711) == 0);  // let it reach the socket
  Client other_consumer = attachConsumer(pair.b(), "other-user", 4, 64 * 1024);
  std::vector<uint64_t> received;
  std::thread receiver([&] {
    for (int i = 0; i < 3; ++i) {
      fl_frame f{};
      if (fl_receive(other_consumer.get(), &f, 20000) != FL_OK) return;
      bool intact = f.length == 4096;
      for (uint64_t b = 0; intact && b < f.length; ++b)
        intact = f.data[b] == static_cast<uint8_t>(f.frame_id);
      received.push_back(intact ? f.frame_id : 0);
      fl_release(other_consumer.get(), f.slot);
    }
  });
  const int other = runAsNobody([&] { return sendFrames(pair.a().socketPath(), "other-user", 3); });
  receiver.join();
  INFO("the other user's producer: " << statusName(other));
  CHECK(other == 0);
  CHECK(received == std::vector<uint64_t>{1, 2, 3});

  // This user's clients already attached are served too, every frame verified.
  for (uint64_t id = 1; id <= 10; ++id) {
    submitFrame(producer.get(), id, 4096 + id);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(f, id, 4096 + id);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
  }
  // A detach frees a place; the refusals took none.
  hogs.pop_back();
  CHECK(waitUntil(
      [&] { return tryAttach(pair.a().socketPath(), FL_PRODUCER, "after", 1, 4096).status == FL_OK; },
      Millis(5000), Millis(50)));
  hogs.clear();
  producer.reset();
  consumer.reset();
  other_consumer.reset();
  requireServing(pair.a(), pair.b(), "good", 3);
  CHECK(waitUntil([&] { return pair.a().idle() && pair.b().idle(); }, Millis(10000), Millis(100)));
  requireQuickCleanStop(pair.a());
  requireQuickCleanStop(pair.b());
}
