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

void pushRaw(TestClient& c, uint32_t slot) {
  fl_submit_desc d{slot, 0, 0};
  REQUIRE(fl_ring_push(c.submit(), c.cap(), sizeof(d), &d) == FL_RING_OK);
}

}  // namespace

TEST_CASE("client table: rings are drained round-robin, a bounded number per client and round",
          "[client_table]") {
  Metrics metrics;
  NameTable names;
  ClientTable table(metrics, names);
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

TEST_CASE("client table: a corrupt submit ring detaches that client, the others are still served",
          "[client_table]") {
  Metrics metrics;
  NameTable names;
  ClientTable table(metrics, names);
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

TEST_CASE("client table: a full completion ring detaches its client", "[client_table]") {
  Metrics metrics;
  NameTable names;
  ClientTable table(metrics, names);
  TestClient c = makeClient(1, FL_ROLE_CONSUMER, "cam", 2, 4096);
  table.add(c.session);
  for (uint32_t i = 0; i < c.cap(); ++i) table.complete(*c.session, 0, FL_OK, i + 1, 10, 0);
  CHECK_FALSE(c.session->gone);
  table.complete(*c.session, 0, FL_OK, c.cap() + 1, 10, 0);
  CHECK(c.session->gone);
}

TEST_CASE("client table: sleep is announced on every ring, and refused when one has work", "[client_table]") {
  Metrics metrics;
  NameTable names;
  ClientTable table(metrics, names);
  TestClient a = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  TestClient b = makeClient(2, FL_ROLE_CONSUMER, "cam", 2, 4096);
  table.add(a.session);
  table.add(b.session);
  CHECK(table.prepareSleep());
  table.endSleep();
  pushRaw(b, 0);
  CHECK_FALSE(table.prepareSleep());
  table.endSleep();
  CHECK(table.drainRings([](AgentClient&, const fl_submit_desc&) {}) == 1);
  CHECK(table.prepareSleep());
  table.endSleep();
}

TEST_CASE("client table: a consumer's claim on its stream name goes with it", "[client_table]") {
  Metrics metrics;
  NameTable names;
  ClientTable table(metrics, names);
  TestClient c = makeClient(1, FL_ROLE_CONSUMER, "cam", 2, 4096);
  AgentClient& entry = table.add(c.session);
  entry.stream = names.acquire("cam");
  CHECK(names.size() == 1);
  table.erase(1);
  CHECK(table.find(1) == nullptr);
  CHECK(names.size() == 0);
}
