// A link costs no thread of its own: a Session runs on gRPC's asynchronous
// API on either side (the daemon's one session queue), its keepalives on the
// daemon's one timer thread, and a dialer's thread ends once it handed its
// link over.  Counted on a hub that dials some peers and is dialed by others,
// before and after more links come, over tcp and over the grpc transport
// (its Data call on the same queue as the Session).  And gRPC's own timers
// run on the daemon's engine, not on gRPC's.
#include <sys/types.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "discovery_rig.h"
#include "harness.h"
#include "thread_census.h"

using namespace framelink::integ;

namespace {

int threadsOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

DaemonProcess::Options spoke(const std::string& id, const std::string& transports) {
  DaemonProcess::Options o;
  o.id = id;
  o.token = "integ-secret";
  o.transports = transports;
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  return o;
}

// How many threads of `pid` have the name `name`.
int threadsNamed(pid_t pid, const std::string& name) {
  return framelink::test::threadsNamed(pid, name).threads;
}

// Polls until the hub's thread count settles (a dialer's thread ends just
// after its hand-over); the last count read.
int settledThreads(pid_t pid) {
  int last = threadsOf(pid);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(Millis(100));
    const int now = threadsOf(pid);
    if (now == last && i >= 4) break;
    last = now;
  }
  return last;
}

// A daemon `id` that dials `listener`, linked and carrying frames.
std::unique_ptr<DaemonProcess> linkedDialer(const DaemonProcess& listener, const std::string& id) {
  DaemonProcess::Options o = spoke(id, "tcp");
  o.peers = {listener.id() + "=" + listener.grpcAddress()};
  auto dialer = std::make_unique<DaemonProcess>(o);
  REQUIRE(waitForMetric(listener, "framelink_links_up", 1) == 1);
  requireServing(*dialer, listener, id);
  return dialer;
}

}  // namespace

TEST_CASE("links: more links, dialed or accepted, take no more threads", "[transports]") {
  const std::string transports = GENERATE(as<std::string>(), "tcp", "grpc");
  CAPTURE(transports);
  // The hub dials four peers; two listen from the start, two come later at
  // ports the hub already knows.  Peers dial the hub: one at first, two later.
  std::vector<uint16_t> late_ports = {freePort(), freePort()};
  auto d1 = std::make_unique<DaemonProcess>(spoke("dialed-1", transports));
  auto d2 = std::make_unique<DaemonProcess>(spoke("dialed-2", transports));
  DaemonProcess::Options hub_options = spoke("hub", transports);
  hub_options.peers = {"dialed-1=" + d1->grpcAddress(), "dialed-2=" + d2->grpcAddress(),
                       "dialed-3=127.0.0.1:" + std::to_string(late_ports[0]),
                       "dialed-4=127.0.0.1:" + std::to_string(late_ports[1])};
  hub_options.extra_args.insert(hub_options.extra_args.end(), {"--reconnect-max-ms", "300"});
  DaemonProcess hub(hub_options);
  auto dialing = [&hub, &transports](const std::string& id) {
    DaemonProcess::Options o = spoke(id, transports);
    o.peers = {"hub=" + hub.grpcAddress()};
    return std::make_unique<DaemonProcess>(o);
  };
  auto a1 = dialing("accepted-1");
  REQUIRE(waitForMetric(hub, "framelink_links_up", 3) == 3);
  const int before = settledThreads(hub.pid());

  DaemonProcess::Options o3 = spoke("dialed-3", transports);
  o3.listen = "127.0.0.1:" + std::to_string(late_ports[0]);
  DaemonProcess d3(o3);
  DaemonProcess::Options o4 = spoke("dialed-4", transports);
  o4.listen = "127.0.0.1:" + std::to_string(late_ports[1]);
  DaemonProcess d4(o4);
  auto a2 = dialing("accepted-2");
  auto a3 = dialing("accepted-3");
  REQUIRE(waitForMetric(hub, "framelink_links_up", 7) == 7);
  const int after = settledThreads(hub.pid());
  INFO("hub threads: " << before << " with 3 links, " << after << " with 7");
  // Four more links: two the hub dialed (their dialers, which were retrying,
  // end), two it accepted.  Each cost two threads before (a Session reader
  // and a writer; a dialer's thread was its reader), and over grpc two more
  // (the Data call's reader and writer).
  CHECK(after <= before + 1);
  // And a link that came meanwhile carries frames (a peer with one
  // [[peer]] routes its streams there; the hub, with six, would need routes).
  requireServing(*a3, hub, "threads-accepted");
}

TEST_CASE("links: gRPC's timers run on the daemon's engine, which has no timer thread that wakes each second",
          "[transports]") {
  DaemonProcess listener(spoke("engine-listener", "tcp"));
  const auto dialer = linkedDialer(listener, "engine-dialer");
  for (const DaemonProcess* d : {&listener, dialer.get()}) {
    INFO("daemon pid " << d->pid());
    // gRPC 1.51's own engine: a "timer_manager" thread that wakes every
    // second and two "event_engine" threads.  None here.
    CHECK(threadsNamed(d->pid(), "timer_manager") == 0);
    CHECK(threadsNamed(d->pid(), "event_engine") == 0);
  }
  // gRPC set its timers (a connection's idle timer) on the listener's engine, which started its thread.
  CHECK(threadsNamed(listener.pid(), "fl-grpc-engine") >= 1);
}

// gRPC's iomgr timer thread sleeps until a timer is due (proxy/link/grpc_timers.h).  gRPC's own
// timing (GRPC_EXPERIMENTS set keeps it) wakes it at least once a second: this fails with it.
TEST_CASE("links: an idle daemon's gRPC timer thread does not wake, after a link came and went",
          "[transports]") {
  DaemonProcess listener(spoke("timers-listener", "tcp"));
  linkedDialer(listener, "timers-dialer");  // linked, then gone (the pointer is not kept)
  for (int i = 0; i < 100 && listener.metric("framelink_links_up") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(listener.metric("framelink_links_up") == 0);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // what the link's end armed runs out
  const auto before = framelink::test::threadsNamed(listener.pid(), "grpc_global_tim");
  REQUIRE(before.threads >= 1);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const uint64_t woke = framelink::test::threadsNamed(listener.pid(), "grpc_global_tim").runs - before.runs;
  INFO("in 3 s the idle listener's gRPC timer threads woke " << woke << " times");
  CHECK(woke <= 1);
}

// A configured peer that does not answer is retried with no thread of its own: its connect is
// watched from the session queue and its back-off is a timer (proxy/link/peer_connect.cpp).
// Before, each such peer held a dialer thread (unnamed: "framelinkd") while it was retried.
TEST_CASE("links: configured peers that do not answer hold no thread while they are retried",
          "[transports]") {
  DaemonProcess alone(spoke("retry-alone", "tcp"));
  DaemonProcess::Options o = spoke("retry-six", "tcp");
  for (int port = 1; port <= 6; ++port) {
    o.peers.push_back("nobody-" + std::to_string(port) + "=127.0.0.1:" + std::to_string(port));
  }
  DaemonProcess retrying(o);
  // Within the first connect (connect_timeout_ms 5000: connection refused until then), and after it.
  for (int second = 0; second < 7; ++second) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    INFO("after " << second + 1 << " s");
    CHECK(threadsNamed(retrying.pid(), "framelinkd") == threadsNamed(alone.pid(), "framelinkd"));
  }
  CHECK(retrying.log().find("nobody-3 at 127.0.0.1:3: no connection within 5000 ms") != std::string::npos);
}
