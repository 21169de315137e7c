// The client rings part: submit rings drained round-robin with a bound per
// client and round, a corrupt ring or a full completion ring detaching only
// its client, and the sleep handshake.
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <vector>

#include "agent/client_table.h"
#include "agent_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

// What every case starts from: an empty table.
struct TableFixture {
  Metrics metrics;
  NameTable names;
  ClientTable table{metrics, names};
};

void pushRaw(TestClient& c, uint32_t slot) {
  fl_submit_desc d{slot, 0, 0};
  REQUIRE(fl_ring_push(c.submit(), c.cap(), sizeof(d), &d) == FL_RING_OK);
}

}  // namespace

TEST_CASE_METHOD(TableFixture,
                 "client table: rings are drained round-robin, a bounded number per client and round",
                 "[client_table]") {
  TestClient busy = makeClient(1, FL_ROLE_PRODUCER, "cam", 128, 4096);  // a ring of 128
  TestClient quiet = makeClient(2, FL_ROLE_PRODUCER, "cam", 4, 4096);
  table.add(busy.session);
  table.add(quiet.session);
  const uint32_t n = std::min<uint32_t>(busy.cap(), ClientTable::kMaxSubmitsPerRound + 36);
  REQUIRE(n > ClientTable::kMaxSubmitsPerRound);
  for (uint32_t i = 0; i < n; ++i) pushRaw(busy, i);
  for (uint32_t i = 0; i < 3; ++i) pushRaw(quiet, 1000 + i);

  std::vector<std::pair<uint64_t, uint32_t>> seen;
  auto record = [&](AgentClient& c, const fl_submit_desc& d) { seen.emplace_back(c.session->id, d.slot); };
  CHECK(table.drainRings(record) == ClientTable::kMaxSubmitsPerRound + 3);
  REQUIRE(seen.size() == ClientTable::kMaxSubmitsPerRound + 3);
  for (uint32_t i = 0; i < ClientTable::kMaxSubmitsPerRound; ++i)
    CHECK(seen[i] == std::make_pair(uint64_t{1}, i));
  CHECK(seen.back() ==
        std::make_pair(uint64_t{2}, uint32_t{1002}));  // the quiet client is served in the same round
  seen.clear();
  CHECK(table.drainRings(record) == n - ClientTable::kMaxSubmitsPerRound);
  CHECK(seen.front().second == ClientTable::kMaxSubmitsPerRound);
  CHECK(table.drainRings(record) == 0);
}

TEST_CASE_METHOD(
    TableFixture,
    "client table: a handler that forgets a client ends the round; the others are served in the next",
    "[client_table]") {
  // A consumer's release can end a producer's last frame, and a producer
  // that went away is forgotten then: in the middle of a round.
  TestClient a = makeClient(1, FL_ROLE_CONSUMER, "cam", 4, 4096);
  TestClient b = makeClient(2, FL_ROLE_PRODUCER, "cam", 4, 4096);
  TestClient c = makeClient(3, FL_ROLE_PRODUCER, "cam", 4, 4096);
  table.add(a.session);
  table.add(b.session);
  table.add(c.session);
  pushRaw(a, 0);
  pushRaw(a, 1);
  pushRaw(b, 0);
  pushRaw(c, 0);
  b.session.reset();  // the table holds the last reference: forgetting it frees the session
  std::vector<std::pair<uint64_t, uint32_t>> seen;
  auto forgetB = [&](AgentClient& ac, const fl_submit_desc& d) {
    seen.emplace_back(ac.session->id, d.slot);
    if (ac.session->id == 1) table.erase(2);
  };
  CHECK(table.drainRings(forgetB) == 1);
  CHECK(seen == std::vector<std::pair<uint64_t, uint32_t>>{{1, 0}});
  CHECK(table.find(2) == nullptr);
  // The next round starts over without it: the rest of a's ring, then c's.
  CHECK(table.drainRings(forgetB) == 2);
  CHECK(seen == std::vector<std::pair<uint64_t, uint32_t>>{{1, 0}, {1, 1}, {3, 0}});
  // A client added later is polled too.
  TestClient d = makeClient(4, FL_ROLE_PRODUCER, "cam", 4, 4096);
  table.add(d.session);
  pushRaw(d, 2);
  CHECK(table.drainRings(forgetB) == 1);
  CHECK(seen.back() == std::make_pair(uint64_t{4}, uint32_t{2}));
}

TEST_CASE_METHOD(TableFixture,
                 "client table: a corrupt submit ring detaches that client, the others are still served",
                 "[client_table]") {
  TestClient bad = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  TestClient good = makeClient(2, FL_ROLE_PRODUCER, "cam", 2, 4096);
  table.add(bad.session);
  table.add(good.session);
  __atomic_store_n(&bad.submit()->tail, uint64_t{1000}, __ATOMIC_RELEASE);
  pushRaw(good, 1);
  size_t handled = 0;
  table.drainRings([&](AgentClient& c, const fl_submit_desc&) {
    CHECK(c.session->id == 2);
    ++handled;
  });
  CHECK(handled == 1);
  CHECK(bad.session->gone);
  CHECK_FALSE(good.session->gone);
  CHECK(metrics.counters.bad_descriptors.load() == 1);
  CHECK(__atomic_load_n(&bad.session->segments->header()->daemon_state, __ATOMIC_ACQUIRE) ==
        FL_DAEMON_DETACHED);
  char byte;
  CHECK(::recv(bad.peer_socket.get(), &byte, 1, MSG_DONTWAIT) == 0);  // its attach socket was shut down
  // A detached client's ring is not read again.
  pushRaw(good, 0);
  CHECK(table.drainRings([](AgentClient&, const fl_submit_desc&) {}) == 1);
}

TEST_CASE_METHOD(TableFixture, "client table: a full completion ring detaches its client", "[client_table]") {
  TestClient c = makeClient(1, FL_ROLE_CONSUMER, "cam", 2, 4096);
  table.add(c.session);
  for (uint32_t i = 0; i < c.cap(); ++i) table.complete(*c.session, 0, FL_OK, i + 1, 10, 0);
  CHECK_FALSE(c.session->gone);
  table.complete(*c.session, 0, FL_OK, c.cap() + 1, 10, 0);
  CHECK(c.session->gone);
}

namespace {

// Bytes waiting in a completion doorbell (a pipe): 8 for each time the daemon rang it.
int bellBytes(const TestClient& c) {
  char buf[256];
  const ssize_t n = ::read(c.completion_bell.get(), buf, sizeof buf);
  return n < 0 ? 0 : static_cast<int>(n);
}

}  // namespace

TEST_CASE_METHOD(TableFixture,
                 "client table: a round's completions ring a sleeping client's doorbell once, at wakeReaders",
                 "[client_table]") {
  TestClient asleep = makeClient(1, FL_ROLE_PRODUCER, "cam", 8, 4096);
  TestClient awake = makeClient(2, FL_ROLE_CONSUMER, "cam", 8, 4096);
  TestClient leaving = makeClient(3, FL_ROLE_PRODUCER, "cam2", 8, 4096);
  table.add(asleep.session);
  table.add(awake.session);
  table.add(leaving.session);
  REQUIRE(fl_ring_prepare_sleep(asleep.completion()) == 1);
  REQUIRE(fl_ring_prepare_sleep(leaving.completion()) == 1);
  for (uint32_t i = 0; i < 5; ++i) {
    table.complete(*asleep.session, i, FL_OK, i + 1, 10, 0);
    table.complete(*awake.session, i, FL_OK, i + 1, 10, 0);
  }
  table.complete(*leaving.session, 0, FL_OK, 1, 10, 0);
  table.erase(3);                 // forgotten before the round ended: still told, nothing dangles
  CHECK(bellBytes(asleep) == 0);  // nothing rung before the round's end
  table.wakeReaders();
  CHECK(bellBytes(asleep) == 8);  // once for five completions (was five times)
  CHECK(bellBytes(awake) == 0);   // a client that does not sleep is not rung
  CHECK(bellBytes(leaving) == 8);
  CHECK(fl_ring_readable(asleep.completion()) == 5);
  table.wakeReaders();  // nothing new: nothing rung
  CHECK(bellBytes(asleep) == 0);
  table.complete(*asleep.session, 5, FL_OK, 6, 10, 0);
  table.wakeReaders();
  CHECK(bellBytes(asleep) == 8);
}

TEST_CASE_METHOD(TableFixture,
                 "client table: sleep is announced on every ring, and refused when one has work",
                 "[client_table]") {
  TestClient a = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  TestClient b = makeClient(2, FL_ROLE_CONSUMER, "cam", 2, 4096);
  table.add(a.session);
  table.add(b.session);
  CHECK(table.prepareSleep());
  table.endSleep({});
  pushRaw(b, 0);
  CHECK_FALSE(table.prepareSleep());
  table.endSleep({});
  CHECK(table.drainRings([](AgentClient&, const fl_submit_desc&) {}) == 1);
  CHECK(table.prepareSleep());
  table.endSleep({});
}

TEST_CASE_METHOD(TableFixture, "client table: after a sleep only the doorbells that rang are read",
                 "[client_table]") {
  TestClient a = makeClient(1, FL_ROLE_PRODUCER, "cam", 4, 4096);
  TestClient b = makeClient(2, FL_ROLE_PRODUCER, "cam", 4, 4096);
  table.add(a.session);
  table.add(b.session);
  auto bellHolds = [](const TestClient& c) {
    char byte;
    return ::recv(c.session->submit_doorbell.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK) > 0;
  };
  REQUIRE(table.prepareSleep());
  a.push(0, 16);  // each rings its doorbell
  b.push(0, 16);
  REQUIRE(bellHolds(a));
  REQUIRE(bellHolds(b));
  const std::vector<uint64_t> rang{1};
  table.endSleep(rang);
  CHECK_FALSE(bellHolds(a));
  CHECK(bellHolds(b));  // left for the sleep that reports it
  // The sleep flags are cleared on every ring, rung or not.
  CHECK_FALSE(fl_ring_reader_needs_wake(a.submit()));
  CHECK_FALSE(fl_ring_reader_needs_wake(b.submit()));
  CHECK(table.drainRings([](AgentClient&, const fl_submit_desc&) {}) == 2);
  // A client forgotten before its doorbell is read is skipped.
  table.erase(2);
  const std::vector<uint64_t> gone{2};
  table.endSleep(gone);
  CHECK(bellHolds(b));
}

TEST_CASE_METHOD(TableFixture, "client table: a consumer's claim on its stream name goes with it",
                 "[client_table]") {
  TestClient c = makeClient(1, FL_ROLE_CONSUMER, "cam", 2, 4096);
  AgentClient& entry = table.add(c.session);
  entry.stream = names.acquire("cam");
  CHECK(names.size() == 1);
  table.erase(1);
  CHECK(table.find(1) == nullptr);
  CHECK(names.size() == 0);
}

TEST_CASE_METHOD(
    TableFixture,
    "client table: paused producers keep their frames in their rings; consumers are still drained",
    "[client_table][hand_over]") {
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 4, 4096);
  TestClient consumer = makeClient(2, FL_ROLE_CONSUMER, "cam", 4, 4096);
  table.add(producer.session);
  table.add(consumer.session);
  table.pauseProducers();  // a hot restart: the next daemon takes the producers' frames
  pushRaw(producer, 0);
  pushRaw(producer, 1);
  pushRaw(consumer, 3);  // a release
  std::vector<uint64_t> from;
  CHECK(table.drainRings([&](AgentClient& c, const fl_submit_desc&) { from.push_back(c.session->id); }) == 1);
  CHECK(from == std::vector<uint64_t>{2});
  CHECK(fl_ring_readable(producer.submit()) == 2);  // still there, for the next daemon
  // Their frames are not this daemon's work: it may sleep.
  CHECK(table.prepareSleep());
  table.endSleep({});
}
