// The transport registry between two framelinkd processes: the in-memory
// `loopback` transport joins two daemons of one process only, and a daemon
// says so instead of failing silently; a link then runs on the next
// transport both allow.
#include <catch2/catch.hpp>

#include <string>

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
