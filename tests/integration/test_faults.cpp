// Faults between processes: a peer with the wrong token, a consumer that dies
// while it holds frames.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"

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
    const bool about_auth = line.find("auth") != std::string::npos ||
                            line.find("token") != std::string::npos;
    const bool is_error = line.find("warn") != std::string::npos ||
                          line.find("error") != std::string::npos;
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
    CHECK((c.status == FL_ERR_NO_CONSUMER || c.status == FL_ERR_LINK_LOST || c.status == FL_ERR_AUTH));
  }
  fl_frame none{};
  CHECK(fl_receive(consumer.get(), &none, 0) == FL_EAGAIN);

  INFO("B must log the refused peer (a warn/error line about auth/token)");
  CHECK(waitUntil([&] { return hasAuthErrorLine(pair.b().log()); }, Millis(5000), Millis(50)));
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
  opt.extra_args = {"--credit-timeout-ms", "3000"};
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

  // Drain both ends until every submitted frame has its completion.
  std::map<uint64_t, int> received;  // frame id -> times received by the new consumer
  std::map<uint64_t, std::vector<int>> completions;
  size_t completion_count = 0;
  const auto deadline = Clock::now() + Millis(30000);
  while (completion_count < submitted.size() && Clock::now() < deadline) {
    fl_frame f{};
    int rc = fl_receive(consumer.get(), &f, 20);
    if (rc == FL_OK) {
      ++received[f.frame_id];
      checkSyntheticFrame(f, f.frame_id, kLen);
      REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    } else {
      REQUIRE((rc == FL_ETIMEDOUT || rc == FL_EAGAIN));
    }
    fl_completion buf[16];
    size_t n = 0;
    REQUIRE(fl_poll_completions(producer.get(), buf, 16, &n) == FL_OK);
    for (size_t i = 0; i < n; ++i) {
      completions[buf[i].frame_id].push_back(buf[i].status);
      ++completion_count;
    }
  }
  // Anything late would be a second completion for some frame.
  for (const auto& c : collectCompletions(producer.get(), 1, Millis(500))) {
    completions[c.frame_id].push_back(c.status);
    ++completion_count;
  }

  CHECK(completion_count == submitted.size());
  for (uint64_t id : submitted) {
    const auto& st = completions[id];
    std::string statuses;
    for (int s : st) statuses += statusName(s) + " ";
    INFO("frame " << id << ": completions [" << statuses << "], received by the new consumer "
                  << received[id] << " time(s)");
    CHECK(st.size() == 1);
    CHECK(received[id] <= 1);
    if (st.size() == 1) {
      // DELIVERED means a consumer released it: only frames the new consumer got.
      CHECK((st[0] == FL_OK) == (received[id] == 1));
    }
    if (id >= first_new) CHECK(received[id] == 1);
  }
  CHECK(pair.a().alive());
  CHECK(pair.b().alive());
  requireServing(pair.a(), pair.b(), "after-consumer-death");
}
