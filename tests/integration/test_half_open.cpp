// A half-open partition between two real daemons: every connection from A to
// B (the gRPC Session and, for transport tcp, the data channel) goes through
// a relay that stops carrying one direction while the connections stay up
// -- frames that never arrive, or ACKs that never come back -- and later
// carries it again.  Held longer than link_timeout_ms, the daemon that hears
// nothing gives the link up, and A relinks once healed; held shorter, the old
// link just resumes.
// Either way, once healed: every frame the consumer released is DELIVERED
// to the producer (none ends in a timeout), every frame ends exactly once,
// the consumer never sees one twice, and nothing leaks.
//
// B listens on 127.0.0.3 and the relay on 127.0.0.2 with the same port
// numbers: A dials its peer's host with the data port B advertises in
// Hello, so the data channel goes through the relay too.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "half_open_relay.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr uint32_t kHalfOpenSlots = 8;
constexpr uint64_t kLength = 16 * 1024;

// A producer on A and a consumer on B that releases everything, and what
// each frame went through.
struct Traffic {
  Client producer, consumer;
  uint64_t next = 0;                               // frame ids 0..next-1 were submitted
  uint64_t done = 0;                               // completions polled
  std::map<uint64_t, int> received;                // frame id -> times the consumer got it
  std::map<uint64_t, std::vector<int>> completed;  // frame id -> completion statuses

  uint64_t receivedCount() const { return received.size(); }

  // Keeps every producer slot busy (when `submit`), takes and releases
  // whatever arrives and polls completions, for `duration` or until `until`
  // says stop.
  void pump(bool submit, Millis duration, const std::function<bool()>& until = {}) {
    const auto end = Clock::now() + duration;
    while (Clock::now() < end && !(until && until())) {
      while (submit && next - done < kHalfOpenSlots) {
        submitFrame(producer.get(), next, kLength);
        ++next;
      }
      fl_frame f{};
      const int rc = fl_receive(consumer.get(), &f, 5);
      if (rc == FL_OK) {
        ++received[f.frame_id];
        checkSyntheticFrame(f, f.frame_id, kLength);
        REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
      } else {
        INFO("fl_receive: " << statusName(rc) << " " << fl_last_error());
        REQUIRE((rc == FL_ETIMEDOUT || rc == FL_EAGAIN));
      }
      fl_completion buf[16];
      size_t n = 0;
      REQUIRE(fl_poll_completions(producer.get(), buf, 16, &n) == FL_OK);
      for (size_t i = 0; i < n; ++i) completed[buf[i].frame_id].push_back(buf[i].status);
      done += n;
    }
  }

  // Once every frame completed: a second completion for any frame would
  // show up now.
  void collectLateCompletions() {
    for (const auto& c : collectCompletions(producer.get(), 1, Millis(300))) {
      completed[c.frame_id].push_back(c.status);
    }
  }
};

// The daemons' counters of link failures, replays and dropped duplicates, read once all frames ended.
struct LinkCounters {
  int64_t a_failures, b_failures, replayed, acks_for_replays, dup_dropped;
};

LinkCounters readCounters(const DaemonProcess& a, const DaemonProcess& b) {
  LinkCounters c;
  c.a_failures = a.metric("framelink_link_failures_total");
  c.b_failures = b.metric("framelink_link_failures_total");
  c.replayed = a.metric("framelink_frames_replayed_total");
  c.acks_for_replays = a.metric("framelink_acks_for_replays_total");
  c.dup_dropped = b.metric("framelink_duplicates_dropped_total");
  return c;
}

const char* name(HalfOpenRelay::Direction d) {
  return d == HalfOpenRelay::Direction::kForward ? "A->B blocked (frames held)"
                                                 : "B->A blocked (ACKs and credits held)";
}

// Daemon B, behind the relay: it listens on 127.0.0.3 with the relay's port
// numbers.  A daemon that hears nothing from its peer for link_timeout gives
// the link up (and ends its call, which the other side hears of when its
// direction still works).  The ACK and credit deadlines outlast that and
// the relink, so that only an ACK lost for good can time a frame out.
DaemonProcess::Options optionsForB(const std::string& transport, uint16_t grpc_port, uint16_t data_port) {
  const std::vector<std::string> common = {
      "--metrics",          "127.0.0.1:0", "--keepalive-ms",      "200",   "--link-timeout-ms",    "2000",
      "--ack-timeout-ms",   "10000",       "--credit-timeout-ms", "10000", "--connect-timeout-ms", "1000",
      "--reconnect-min-ms", "100",         "--reconnect-max-ms",  "400"};
  DaemonProcess::Options bo;
  bo.id = "hostB";
  bo.token = "integ-secret";
  bo.transports = transport;
  bo.listen = "127.0.0.3:" + std::to_string(grpc_port);
  bo.data_listen = "127.0.0.3:" + std::to_string(data_port);
  bo.extra_args = common;
  bo.log_level = "debug";  // printed only when the test fails
  return bo;
}

// Daemon A: B's settings, its own ports, and B as its peer through the relay.
DaemonProcess::Options optionsForA(const DaemonProcess::Options& bo, const HalfOpenRelay& relay) {
  DaemonProcess::Options ao = bo;
  ao.id = "hostA";
  ao.listen = "127.0.0.1:0";
  ao.data_listen = "127.0.0.1:0";
  ao.peers = {"hostB=" + relay.listenHost() + ":" + std::to_string(relay.port(0))};
  return ao;
}

// Keeps frames coming while the relay holds a direction: for a long block
// until A has given the link up and a little longer (A tries to relink into
// the partition), else for half of link_timeout_ms.
void pumpWhileBlocked(Traffic& t, const DaemonProcess& a, bool long_block, int64_t a_failures_before) {
  if (long_block) {
    t.pump(true, Millis(15000),
           [&] { return a.metric("framelink_link_failures_total") > a_failures_before; });
    INFO("A must give the half-open link up");
    CHECK(a.metric("framelink_link_failures_total") > a_failures_before);
    t.pump(true, Millis(500));  // and try to relink into the partition
  } else {
    t.pump(true, Millis(1000));
  }
}

// Every frame ended exactly once, the consumer got none twice, and DELIVERED
// is what ended exactly the frames it got; returns how many were delivered.
uint64_t checkEachFrameEndedOnce(Traffic& t) {
  uint64_t delivered = 0;
  for (uint64_t id = 0; id < t.next; ++id) {
    const auto& st = t.completed[id];
    std::string statuses;
    for (int s : st) statuses += statusName(s) + " ";
    INFO("frame " << id << ": completions [" << statuses << "], received " << t.received[id] << " time(s)");
    REQUIRE(st.size() == 1);
    CHECK(t.received[id] <= 1);
    // DELIVERED exactly for the frames the consumer got and released: a
    // released frame that ends in FL_ERR_TIMEOUT is an ACK lost for good.
    CHECK((st[0] == FL_OK) == (t.received[id] == 1));
    if (st[0] == FL_OK) ++delivered;
  }
  return delivered;
}

// Once the clients are gone: neither daemon leaked anything, both still run.
void checkIdleAndAlive(DaemonProcess& a, DaemonProcess& b) {
  CHECK(waitUntil([&] { return a.idle() && b.idle(); }, Millis(15000), Millis(100)));
  INFO("A /stats " << a.httpGet("/stats"));
  INFO("B /stats " << b.httpGet("/stats"));
  CHECK(a.idle());
  CHECK(b.idle());
  REQUIRE(a.alive());
  REQUIRE(b.alive());
}

// Runs the scenario; `long_block`: hold the direction until A has given
// the link up (the side that hears nothing does after link_timeout_ms and
// ends the call; B's end reaches A when B->A still works), else for half
// of link_timeout_ms.
void runPartition(const std::string& transport, HalfOpenRelay::Direction blocked, bool long_block) {
  INFO("transport " << transport << ", " << name(blocked) << (long_block ? ", past" : ", within")
                    << " the link's liveness check");
  HalfOpenRelay relay("127.0.0.2", "127.0.0.3", 2);
  const uint16_t grpc_port = relay.port(0), data_port = relay.port(1);

  const DaemonProcess::Options bo = optionsForB(transport, grpc_port, data_port);
  DaemonProcess b(bo);
  REQUIRE(b.grpcPort() == grpc_port);
  DaemonProcess a(optionsForA(bo, relay));

  const std::string stream = "half-open-" + transport;
  Traffic t;
  t.consumer = attachConsumer(b, stream, kHalfOpenSlots, 64 * 1024);
  t.producer = attachProducer(a, stream, kHalfOpenSlots, 64 * 1024);

  // Frames flow (and, for tcp, through the relay's second port).
  t.pump(true, Millis(15000), [&] { return t.receivedCount() >= 200; });
  REQUIRE(t.receivedCount() >= 200);
  if (transport == "tcp") CHECK(b.dataPort() == data_port);
  const uint64_t connections_before = relay.accepted();
  CHECK(connections_before >= (transport == "tcp" ? 2U : 1U));
  const int64_t a_failures_before = a.metric("framelink_link_failures_total");
  const int64_t b_failures_before = b.metric("framelink_link_failures_total");

  const auto block_start = Clock::now();
  relay.block(blocked);
  pumpWhileBlocked(t, a, long_block, a_failures_before);
  const auto blocked_for = std::chrono::duration_cast<Millis>(Clock::now() - block_start);
  const uint64_t received_in_block = t.receivedCount();
  relay.heal();

  // Traffic goes on after the heal.
  t.pump(true, Millis(2000));
  t.pump(false, Millis(40000), [&] { return t.done == t.next; });
  INFO("blocked for " << blocked_for.count() << " ms; " << t.next << " frames submitted, " << t.done
                      << " completed");
  REQUIRE(t.done == t.next);
  CHECK(t.receivedCount() > received_in_block);
  t.collectLateCompletions();

  const uint64_t delivered = checkEachFrameEndedOnce(t);
  // Both daemons stayed up and only the path failed: every frame gets through.
  CHECK(delivered == t.next);

  const LinkCounters after = readCounters(a, b);
  std::printf(
      "half-open %s, %s, %s: blocked %lld ms, %llu frames, delivered %llu; link failures A %lld B %lld, "
      "relay connections %llu, replayed %lld, ACKs for replays %lld, duplicates dropped %lld\n",
      transport.c_str(), name(blocked), long_block ? "long" : "short",
      static_cast<long long>(blocked_for.count()), static_cast<unsigned long long>(t.next),
      static_cast<unsigned long long>(delivered),
      static_cast<long long>(after.a_failures - a_failures_before),
      static_cast<long long>(after.b_failures - b_failures_before),
      static_cast<unsigned long long>(relay.accepted()), static_cast<long long>(after.replayed),
      static_cast<long long>(after.acks_for_replays), static_cast<long long>(after.dup_dropped));
  if (long_block) {
    // A relinked over new connections through the relay.
    CHECK(relay.accepted() > connections_before);
    CHECK(after.replayed > 0);
    if (blocked == HalfOpenRelay::Direction::kBack) {
      // B had delivered the frames whose ACKs the partition held: it sends
      // those ACKs again on the new link, where they settle the frames A
      // was about to replay -- no duplicate needed for an answer.
      CHECK(after.acks_for_replays > 0);
    }
  } else {
    // Nothing noticed: the old link carried on.
    CHECK(after.a_failures == a_failures_before);
    CHECK(after.b_failures == b_failures_before);
    CHECK(relay.accepted() == connections_before);
  }

  t.producer.reset();
  t.consumer.reset();
  checkIdleAndAlive(a, b);
}

}  // namespace

TEST_CASE("half-open: a partition past the link's liveness check loses no ACK once healed", "[half_open]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  const auto blocked = GENERATE(HalfOpenRelay::Direction::kForward, HalfOpenRelay::Direction::kBack);
  runPartition(transport, blocked, true);
}

TEST_CASE("half-open: after a short partition the old link resumes", "[half_open]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  const auto blocked = GENERATE(HalfOpenRelay::Direction::kForward, HalfOpenRelay::Direction::kBack);
  runPartition(transport, blocked, false);
}
