// [discovery]: daemons with no [[peer]] find each other in a real etcd
// (Debian's etcd-server, started here on ports of its own), link once per
// pair, route a stream to the daemons that announced readers of it, refuse an
// entry whose address answers with another id, and keep what runs while etcd
// is away.  The same through DNS SRV records: test_discovery_srv.cpp.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client_util.h"
#include "discovery_rig.h"
#include "framelink/framelink.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

// Three daemons of one fleet, and its etcd.
struct ThreeHosts {
  Etcd etcd;
  DaemonProcess a{fleetMember("disc-a", etcd)};
  DaemonProcess b{fleetMember("disc-b", etcd)};
  DaemonProcess c{fleetMember("disc-c", etcd)};

  // A consumer of `stream` on C, once A has seen it in the registry.
  Client readerOnC(const std::string& stream, uint32_t slots) {
    Client on_c = attachConsumer(c, stream, slots, 256 * 1024);
    REQUIRE(a.waitForLog("disc-c changed (not dialed from here; readers: " + stream + " [queue group])",
                         Millis(10000)));
    return on_c;
  }
};

}  // namespace

TEST_CASE(
    "discovery: daemons with no [[peer]] find each other in etcd; links and frames go where readers are",
    "[integration][discovery]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  DaemonProcess& b = fleet.b;
  DaemonProcess& c = fleet.c;
  // Each finds the other two, and links to none: no stream needs it.
  for (DaemonProcess* d : {&a, &b, &c}) {
    INFO(d->id());
    CHECK(waitForMetric(*d, "framelink_discovery_peers", 2) == 2);
    CHECK(d->metric("framelink_discovery_registry_up") == 1);
    CHECK(d->metric("framelink_links_up") == 0);
  }
  CHECK(a.waitForLog("discovery: disc-c found (not dialed from here; no readers)", Millis(1000)));

  // A reader on C, then a producer of its stream on A: A dials C and the frames go there.
  Client on_c = fleet.readerOnC("inspect", 4);
  Client producer = attachProducer(a, "inspect", 4, 256 * 1024);
  REQUIRE(a.waitForLog("disc-c changed (dialed at 127.0.0.1:" + std::to_string(c.grpcPort()) +
                           "; readers: inspect [queue group])",
                       Millis(10000)));
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_c.get(), id);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(b.metric("framelink_links_up") == 0);

  // A subscriber on a second host: A dials B as well, and each frame goes to both.
  Client on_b = attachWith(b, FL_ROLE_CONSUMER, "inspect", true, 4, 256 * 1024);
  REQUIRE(a.waitForLog("disc-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                           "; readers: inspect [subscribers])",
                       Millis(10000)));
  REQUIRE(a.waitForLog("is now routed to disc-b, disc-c", Millis(10000)));
  for (uint64_t id = 4; id <= 6; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    for (fl_client* reader : {on_b.get(), on_c.get()}) {
      fl_frame f = receiveFrame(reader, Millis(15000));
      checkSyntheticFrame(f, id, 4096);
      REQUIRE(fl_release(reader, f.slot) == FL_OK);
    }
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
  }
  CHECK(waitForMetric(a, "framelink_links_up", 2) == 2);
  CHECK(b.metric("framelink_links_up") == 1);  // the link A dialed, no second one B-C

  // The producer leaves: its links end link_idle_s (2 s) later.
  producer.reset();
  CHECK(a.waitForLog("disc-c changed (not dialed from here; readers: inspect [queue group])", Millis(15000)));
  CHECK(waitUntil([&] { return a.metric("framelink_links_up") == 0; }, Millis(10000), Millis(100)));
}

TEST_CASE(
    "discovery: a reader that attaches is published at once, not at the daemon's next keep-alive or poll",
    "[integration][discovery]") {
  // A lease of 60 s is kept alive every 20 s, and poll_ms is 30 s: neither
  // comes in the 5 s this waits, so only the agent's news of its streams
  // (Metrics' streams watcher) can tell A of B's reader in time.
  Etcd etcd;
  DaemonProcess a(fleetMember("disc-a", etcd, "60"));
  DaemonProcess b(fleetMember("disc-b", etcd, "60"));
  REQUIRE(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  REQUIRE(a.waitForLog("discovery: disc-b found (not dialed from here; no readers)", Millis(10000)));
  Client on_b = attachConsumer(b, "prompt", 4, 256 * 1024);
  CHECK(a.waitForLog("disc-b changed (not dialed from here; readers: prompt [queue group])", Millis(5000)));
  // ... and one that leaves, as soon.
  on_b.reset();
  CHECK(a.waitForLog("disc-b changed (not dialed from here; no readers)", Millis(5000)));
}

TEST_CASE(
    "discovery: a host whose reader comes while the producer's frames are in flight gets its next frame",
    "[integration][discovery]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  Client on_c = fleet.readerOnC("busy", 8);
  Client producer = attachProducer(a, "busy", 8, 256 * 1024);
  // C holds frames 1-3: they stay in flight (no ACK before C's release).
  std::vector<fl_frame> held;
  for (uint64_t id = 1; id <= 3; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    held.push_back(receiveFrame(on_c.get(), Millis(15000)));
    checkSyntheticFrame(held.back(), id, 4096);
  }
  // A subscriber on B: the producer's next frame goes to B too, its frames in flight notwithstanding.
  Client on_b = attachWith(fleet.b, FL_ROLE_CONSUMER, "busy", true, 8, 256 * 1024);
  REQUIRE(a.waitForLog("stream 'busy' is now routed to disc-b, disc-c (was disc-c)", Millis(10000)));
  CHECK(a.waitForLog("its frames in flight keep the routes they had", Millis(1000)));
  submitFrame(producer.get(), 4, 4096, true);
  for (fl_client* reader : {on_b.get(), on_c.get()}) {
    fl_frame f = receiveFrame(reader, Millis(15000));
    checkSyntheticFrame(f, 4, 4096);
    REQUIRE(fl_release(reader, f.slot) == FL_OK);
  }
  for (const fl_frame& f : held) REQUIRE(fl_release(on_c.get(), f.slot) == FL_OK);
  // Frames 1-3 went to C alone, and frame 4 to both: each is DELIVERED, with its readers.
  auto done = collectCompletions(producer.get(), 4, Millis(15000));
  REQUIRE(done.size() == 4);
  for (const fl_completion& d : done) {
    INFO("frame " << d.frame_id << ": " << statusName(d.status));
    CHECK(d.status == FL_OK);
    CHECK(d.readers == (d.frame_id == 4 ? 2U : 1U));
  }

  // B's subscriber leaves while C holds frame 5: the next frame goes to C alone, at once (not to B,
  // where it would wait credit_timeout_ms for a reader), though frame 5 is in flight.
  submitFrame(producer.get(), 5, 4096, true);
  fl_frame on_b_5 = receiveFrame(on_b.get(), Millis(15000));
  REQUIRE(fl_release(on_b.get(), on_b_5.slot) == FL_OK);
  fl_frame held_5 = receiveFrame(on_c.get(), Millis(15000));
  on_b.reset();
  REQUIRE(a.waitForLog(
      "disc-b changed (dialed at 127.0.0.1:" + std::to_string(fleet.b.grpcPort()) + "; no readers)",
      Millis(10000)));
  submitFrame(producer.get(), 6, 4096, true);
  fl_frame f6 = receiveFrame(on_c.get(), Millis(15000));
  checkSyntheticFrame(f6, 6, 4096);
  REQUIRE(fl_release(on_c.get(), held_5.slot) == FL_OK);
  REQUIRE(fl_release(on_c.get(), f6.slot) == FL_OK);
  done = collectCompletions(producer.get(), 2, Millis(10000));
  REQUIRE(done.size() == 2);
  for (const fl_completion& d : done) {
    INFO("frame " << d.frame_id << ": " << statusName(d.status));
    CHECK(d.status == FL_OK);
    CHECK(d.readers == (d.frame_id == 5 ? 2U : 1U));
  }
}

namespace {

// Takes the frame waiting for `reader`, if one comes within `wait`: checked, released, its flags.
std::optional<uint32_t> takeFrame(fl_client* reader, uint64_t id, Millis wait) {
  fl_frame f{};
  if (fl_receive(reader, &f, static_cast<int>(wait.count())) != FL_OK) return std::nullopt;
  checkSyntheticFrame(f, id, 4096);
  const uint32_t flags = f.flags;
  REQUIRE(fl_release(reader, f.slot) == FL_OK);
  return flags;
}

}  // namespace

TEST_CASE(
    "discovery: a queue group on three hosts gets each frame once, on one of them; a subscriber gets every "
    "frame",
    "[integration][discovery][groups]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  // The group "line": a member on each host, the producer's own included; a subscriber on A and on B.
  Client a_sub = attachWith(a, FL_ROLE_CONSUMER, "line", true, 8, 256 * 1024);
  Client b_sub = attachWith(fleet.b, FL_ROLE_CONSUMER, "line", true, 8, 256 * 1024);
  Client b_member = attachConsumer(fleet.b, "line", 8, 256 * 1024);
  Client c_member = attachConsumer(fleet.c, "line", 8, 256 * 1024);
  Client a_member = attachConsumer(a, "line", 8, 256 * 1024);
  REQUIRE(a.waitForLog("disc-b changed (not dialed from here; readers: line [subscribers, queue group])",
                       Millis(10000)));
  REQUIRE(a.waitForLog("disc-c changed (not dialed from here; readers: line [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "line", 8, 256 * 1024);
  CHECK(a.waitForLog("readers: line [subscribers, queue group])", Millis(10000)));
  // The producer's daemon dials B and C now; a frame sent before a link is
  // up goes to the members that are (each frame is one member's, not one
  // host's in turn), so the shares are checked once both links are up.
  REQUIRE(waitForMetric(a, "framelink_links_up", 2) == 2);

  constexpr uint64_t kFrames = 30;
  std::vector<fl_client*> members{a_member.get(), b_member.get(), c_member.get()};
  std::vector<uint64_t> got(members.size(), 0);
  // Frames each subscriber was told a member on another host had.
  uint64_t flagged_a = 0;
  uint64_t flagged_b = 0;
  for (uint64_t id = 1; id <= kFrames; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    for (auto [reader, flagged] : {std::pair{a_sub.get(), &flagged_a}, std::pair{b_sub.get(), &flagged_b}}) {
      auto flags = takeFrame(reader, id, Millis(15000));
      REQUIRE(flags.has_value());
      *flagged += (*flags & FL_SLOT_GROUP_ELSEWHERE) != 0 ? 1 : 0;
    }
    // One member has it: each is looked at in turn until one does.
    bool taken = false;
    for (int round = 0; round < 1500 && !taken; ++round) {
      for (size_t m = 0; m < members.size() && !taken; ++m) {
        if (takeFrame(members[m], id, Millis(0))) {
          ++got[m];
          taken = true;
        }
      }
      if (!taken) std::this_thread::sleep_for(Millis(10));
    }
    INFO("frame " << id);
    REQUIRE(taken);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].readers == 3);  // the two subscribers and one member
  }
  // No member got a frame twice, nor one another had.
  for (fl_client* m : members) {
    fl_frame extra{};
    CHECK(fl_receive(m, &extra, 300) != FL_OK);
  }
  INFO("frames on A, B, C: " << got[0] << ", " << got[1] << ", " << got[2]);
  CHECK(got[0] + got[1] + got[2] == kFrames);
  for (uint64_t n : got) CHECK(n > 0);
  // Each frame whose share went to another host's member went to each subscriber for it alone.
  CHECK(flagged_a == kFrames - got[0]);
  CHECK(flagged_b == kFrames - got[1]);
  CHECK(a.metric("framelink_frames_subscribers_only_total") == static_cast<int64_t>(kFrames - got[1]));
}

TEST_CASE(
    "discovery: an entry whose address answers with another id is refused and counted; a malformed one "
    "is left out",
    "[integration][discovery]") {
  Etcd etcd;
  DaemonProcess a(fleetMember("disc-a", etcd));
  DaemonProcess b(fleetMember("disc-b", etcd));
  REQUIRE(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  // "ghost" reads what a producer on A writes: A dials it -- at B's address, where disc-b answers.
  etcd.put("/framelink/daemons/ghost",
           R"({"id":"ghost","address":")" + b.grpcAddress() + R"(","readers":["to-ghost"],"instance":"1"})");
  Client to_ghost = attachProducer(a, "to-ghost", 4, 256 * 1024);
  etcd.put("/framelink/daemons/junk", "not json at all");
  CHECK(waitForMetric(a, "framelink_discovery_entries_refused_total", 1) >= 1);
  CHECK(a.waitForLog("the registry's entry for 'ghost' points at " + b.grpcAddress() +
                         ", where daemon 'disc-b' answers: not linked",
                     Millis(10000)));
  CHECK(a.waitForLog("registry entries left out: /framelink/daemons/junk: not a JSON object", Millis(10000)));
  CHECK(a.metric("framelink_links_up") == 0);  // none for "ghost"
  Client consumer = attachConsumer(b, "after-ghost", 4, 256 * 1024);
  REQUIRE(a.waitForLog("readers: after-ghost [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "after-ghost", 4, 256 * 1024);
  sendOne(producer.get(), consumer.get(), 1);
}

TEST_CASE("discovery: with etcd gone the links and routes stay; back, a daemon that crashed is forgotten",
          "[integration][discovery]") {
  Etcd etcd;
  DaemonProcess a(fleetMember("disc-a", etcd));
  DaemonProcess b(fleetMember("disc-b", etcd));
  auto c = std::make_unique<DaemonProcess>(fleetMember("disc-c", etcd));
  Client consumer = attachConsumer(b, "line", 4, 256 * 1024);
  REQUIRE(a.waitForLog("readers: line [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "line", 4, 256 * 1024);
  sendOne(producer.get(), consumer.get(), 1);

  CHECK(a.metric("framelink_discovery_watch_restarts_total") == 0);
  etcd.kill9();
  CHECK(a.waitForLog("failed: no etcd endpoint answered", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 0; }, Millis(10000)));
  for (uint64_t id = 2; id <= 4; ++id)
    sendOne(producer.get(), consumer.get(), id);  // nothing that runs changed
  CHECK(a.metric("framelink_discovery_peers") == 2);

  c->kill9();  // its entry outlives it by its lease (3 s), then goes
  etcd.start();
  CHECK(a.waitForLog("discovery: etcd answers again", Millis(15000)));
  CHECK(a.metric("framelink_discovery_watch_restarts_total") >= 1);  // the watch ended with etcd
  CHECK(a.waitForLog("discovery: disc-c gone from the registry", Millis(20000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_peers") == 1; }, Millis(5000)));
  sendOne(producer.get(), consumer.get(), 5);
}
