// The transport registry between two framelinkd processes: the in-memory
// `loopback` transport joins two daemons of one process only, and a daemon
// says so instead of failing silently; a link then runs on the next
// transport both allow.  And what a link's transport does reaches /metrics.
#include <catch2/catch.hpp>

#include <string>

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
