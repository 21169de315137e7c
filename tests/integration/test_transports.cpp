// The transport registry between two framelinkd processes: the in-memory
// `loopback` transport joins two daemons of one process only, and a daemon
// says so instead of failing silently; a link then runs on the next
// transport both allow.  And what a link's transport does reaches /metrics.
#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

struct Daemons {
  DaemonProcess b;
  DaemonProcess a;
  static DaemonProcess::Options options(const std::string& id, const std::string& transports) {
    DaemonProcess::Options o;
    o.id = id;
    o.token = "integ-secret";
    o.transports = transports;
    return o;
  }
  Daemons(const std::string& transports_a, const std::string& transports_b)
      : b(options("hostB", transports_b)), a(withPeer(options("hostA", transports_a), b)) {}
  static DaemonProcess::Options withPeer(DaemonProcess::Options o, const DaemonProcess& peer) {
    o.peers = {"hostB=" + peer.grpcAddress()};
    return o;
  }
};

}  // namespace

TEST_CASE("transports: loopback between two processes is refused, and the refusal says why", "[transports]") {
  Daemons d("loopback", "loopback");
  // B cannot run loopback with a daemon of another process: A's session is
  // refused with B's reason, in A's log.
  CHECK(d.a.waitForLog("the peer runs in another process", Millis(10000)));
  CHECK(d.a.waitForLog("no common transport", Millis(10000)));
  CHECK(d.b.waitForLog("loopback joins two daemons of one process only", Millis(10000)));
}

TEST_CASE("transports: a link that cannot use loopback runs on the next transport and says why",
          "[transports]") {
  Daemons d("loopback,tcp", "loopback,tcp");
  REQUIRE(d.a.waitForLog("transport tcp; not loopback: the peer runs in another process", Millis(10000)));
  CHECK(d.a.waitForLog("is up over tcp", Millis(10000)));  // logged just after the session's line
}

TEST_CASE("transports: the frames a link carries show in both daemons' transport counters", "[transports]") {
  DaemonPair::Options o;
  o.transport = GENERATE("tcp", "grpc");
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  DaemonPair pair(o);
  // The agent publishes its stats twice a second: wait for the first frame
  // to show before taking the counts the next frames add to.
  requireServing(pair.a(), pair.b(), "counted-warmup", 1);
  const int64_t sent = waitForMetric(pair.a(), "framelink_transport_frames_sent_total", 1);
  const int64_t received = waitForMetric(pair.b(), "framelink_transport_frames_received_total", 1);
  REQUIRE(sent >= 1);
  REQUIRE(received >= 1);
  constexpr int kFrames = 20;
  requireServing(pair.a(), pair.b(), "counted", kFrames);
  CHECK(waitForMetric(pair.a(), "framelink_transport_frames_sent_total", sent + kFrames) == sent + kFrames);
  CHECK(waitForMetric(pair.b(), "framelink_transport_frames_received_total", received + kFrames) ==
        received + kFrames);
  // Control records go the other way (credits, ACKs): B's transport sent
  // some, and A's received them.
  CHECK(pair.b().metric("framelink_transport_control_sent_total") > 0);
  CHECK(pair.a().metric("framelink_transport_control_received_total") > 0);
}

TEST_CASE("transports: small frames on grpc travel several to a message between daemons that both read that",
          "[transports]") {
  DaemonPair::Options o;
  o.transport = "grpc";
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  DaemonPair pair(o);
  requireServing(pair.a(), pair.b(), "batched-warmup", 1);
  Client consumer = attachConsumer(pair.b(), "batched", 64, 4096);
  Client producer = attachProducer(pair.a(), "batched", 64, 4096);
  constexpr uint64_t kFrames = 2000;
  constexpr uint64_t kLength = 1000;
  // The producer keeps its 64 slots full from a thread of its own, so that
  // frames queue behind the one A's grpc sender writes.
  std::string failed;
  std::thread sender([&] {
    for (uint64_t i = 0; i < kFrames && failed.empty(); ++i)
      failed = trySubmitFrame(producer.get(), i, kLength);
  });
  for (uint64_t i = 0; i < kFrames; ++i) {
    fl_frame f{};
    const int rc = fl_receive(consumer.get(), &f, 15000);
    if (rc != FL_OK) {
      sender.join();
      FAIL("frame " << i << ": fl_receive " << statusName(rc) << " " << fl_last_error()
                    << "; sender: " << failed);
    }
    checkSyntheticFrame(f, i, kLength);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  }
  sender.join();
  REQUIRE(failed.empty());
  const int64_t batches = waitForMetric(pair.a(), "framelink_transport_batched_sends_total", 1);
  const int64_t batched = pair.a().metric("framelink_transport_batched_frames_total");
  INFO("A sent " << batched << " frames in " << batches << " batches");
  CHECK(batches > 0);
  CHECK(batched >= 2 * batches);
  CHECK(batched <= static_cast<int64_t>(kFrames) + 1);
}
