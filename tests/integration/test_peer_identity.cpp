// Who a dialing daemon is: the daemon_id of its Hello is believed only when
// its credentials prove it.  Three daemons on loopback: A listens; B, the real
// "b", dials A and sends to it; C dials A and claims to be "b" as well.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr const char* kShared = "shared-secret";
constexpr const char* kTokenB = "b-own-secret";
constexpr const char* kTokenC = "c-own-secret";

std::string configFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

std::string peerTable(const std::string& name, const std::string& token) {
  return "[[peer]]\nname = \"" + name + "\"\ntoken = \"" + token + "\"\n";
}

DaemonProcess::Options daemonOptions(const std::string& id, const std::string& transport,
                                     std::vector<std::string> extra_args) {
  DaemonProcess::Options o;
  o.id = id;
  o.transports = transport;
  o.extra_args = std::move(extra_args);
  return o;
}

const char* const kRefused = "framelink_peer_identity_refused_total";
const char* const kConflicts = "framelink_peer_instance_conflicts_total";

}  // namespace

TEST_CASE(
    "identity: a daemon that claims another peer's id is refused and counted; the real peer keeps sending",
    "[integration][security][identity]") {
  struct Case {
    const char* what;
    const char* transport;
    bool c_has_own_token;  // else C holds the shared token, which A accepts only from ids without their own
  };
  const Case k = GENERATE(values<Case>({
      {"C presents its own token", "tcp", true},
      {"C presents its own token", "grpc", true},
      {"C presents the shared token", "tcp", false},
  }));
  INFO(k.what << " over " << k.transport);
  TempDir dir("fl-ident");
  // A knows b and c by their own tokens; the shared one is for everybody else.
  DaemonProcess a(daemonOptions("a", k.transport,
                                {"--metrics", "127.0.0.1:0", "--config",
                                 configFile(dir, "a.toml",
                                            "[link]\ntoken = \"" + std::string(kShared) + "\"\n" +
                                                peerTable("b", kTokenB) + peerTable("c", kTokenC))}));
  auto b_options =
      daemonOptions("b", k.transport, {"--config", configFile(dir, "b.toml", peerTable("a", kTokenB))});
  b_options.peers = {"a=" + a.grpcAddress()};
  DaemonProcess b(b_options);
  requireServing(b, a, "ident-before");
  REQUIRE(a.metric(kRefused) == 0);

  auto c_options = daemonOptions("b", k.transport, {});
  c_options.peers = {"a=" + a.grpcAddress()};
  if (k.c_has_own_token) {
    c_options.extra_args = {"--config", configFile(dir, "c.toml", peerTable("a", kTokenC))};
  } else {
    c_options.token = kShared;
  }
  DaemonProcess c(c_options);
  INFO("A refuses C's Hello, says why, and counts it");
  CHECK(waitUntil([&] { return a.metric(kRefused) >= 1; }, Millis(10000), Millis(50)));
  CHECK(a.waitForLog("claims to be 'b'", Millis(5000)));
  CHECK(c.waitForLog("refused the session", Millis(5000)));

  // C keeps redialing; B's frames arrive all the same, over B's own link.
  requireServing(b, a, "ident-during", 20);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(a.metric(kConflicts) == 0);

  // An honest restart: b comes back as a new instance and links again.
  b.kill9();
  b.restart();
  requireServing(b, a, "ident-restarted");
  const int64_t refused = a.metric(kRefused);
  INFO("C keeps redialing, and is refused each time");
  CHECK(waitUntil([&] { return a.metric(kRefused) > refused; }, Millis(10000), Millis(50)));
}

namespace {

const char* const kInstanceRefused = "framelink_peer_instance_refused_total";

// A daemon of id `id` that listens on a port it keeps across restarts.
DaemonProcess::Options listening(const std::string& id, std::vector<std::string> extra_args) {
  auto o = daemonOptions(id, "tcp", std::move(extra_args));
  o.extra_args.insert(o.extra_args.end(), {"--metrics", "127.0.0.1:0"});
  return o;
}

// One frame from `producer` to `consumer`: it arrives whole and completes FL_OK.
void requireFrame(Client& producer, Client& consumer, uint64_t id) {
  const uint64_t length = 1000 + 131 * id;
  submitFrame(producer.get(), id, length, true);
  fl_frame f = receiveFrame(consumer.get(), Millis(15000));
  checkSyntheticFrame(f, id, length);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  INFO("completion status " << statusName(done[0].status));
  CHECK(done[0].status == FL_OK);
}

}  // namespace

TEST_CASE(
    "identity: with one shared token, a daemon claiming a linked peer's id is refused while that link is up; "
    "the real peer gets every frame, and its restart links again",
    "[integration][security][identity]") {
  // A dials B; C, holding the same shared token, dials A claiming to be "b".
  auto b_options = listening("b", {});
  b_options.token = kShared;
  DaemonProcess b(b_options);
  b_options.listen = b.grpcAddress();  // a restarted B comes back where A dials it
  auto a_options = listening("a", {});
  a_options.token = kShared;
  a_options.peers = {"b=" + b.grpcAddress()};
  DaemonProcess a(a_options);
  requireServing(a, b, "twin-before");
  Client consumer = attachConsumer(b, "twin-frames", 4, 256 * 1024);
  Client producer = attachProducer(a, "twin-frames", 4, 256 * 1024);
  requireFrame(producer, consumer, 1);

  auto c_options = daemonOptions("b", "tcp", {});
  c_options.token = kShared;
  c_options.peers = {"a=" + a.grpcAddress()};
  DaemonProcess c(c_options);
  INFO("A refuses C's Hello, says why, and counts it; C says it was refused");
  CHECK(waitUntil([&] { return a.metric(kInstanceRefused) >= 1; }, Millis(10000), Millis(50)));
  CHECK(a.waitForLog("while 'b' is linked from instance", Millis(5000)));
  CHECK(c.waitForLog("is linked from another daemon", Millis(5000)));

  // Every frame reaches the real B while C keeps redialing.
  for (uint64_t id = 2; id <= 101; ++id) requireFrame(producer, consumer, id);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(a.log().find("replaces link") == std::string::npos);  // the route never left B

  // A real restart: B's process goes, its link with it, and the new
  // instance is admitted.  C is stopped first: while no link of "b" is up,
  // nothing tells it from B (that takes a token or certificate of B's own).
  c.terminate();
  consumer.reset();
  b.kill9();
  b.restart(b_options);
  requireServing(a, b, "twin-restarted");
}

TEST_CASE(
    "identity: when the newer of two links of a peer id goes down, its frames go on the older one still up",
    "[integration][security][identity]") {
  // A dials B; C holds b's own token (a copy of B's credentials: a second
  // instance A cannot tell from a restart) and dials A as "b" too.
  TempDir dir("fl-ident");
  auto b_options = listening("b", {"--config", configFile(dir, "b.toml", peerTable("a", kTokenB))});
  DaemonProcess b(b_options);
  auto a_options = listening(
      "a", {"--config",
            configFile(dir, "a.toml", peerTable("b", kTokenB) + "address = \"" + b.grpcAddress() + "\"\n")});
  DaemonProcess a(a_options);
  Client consumer = attachConsumer(b, "newer-down", 4, 256 * 1024);
  Client producer = attachProducer(a, "newer-down", 4, 256 * 1024);
  requireFrame(producer, consumer, 1);

  auto c_options = daemonOptions(
      "b", "tcp",
      {"--config",
       configFile(dir, "c.toml", peerTable("a", kTokenB) + "address = \"" + a.grpcAddress() + "\"\n")});
  DaemonProcess c(c_options);
  CHECK(waitUntil([&] { return a.metric(kConflicts) >= 1; }, Millis(10000), Millis(50)));
  CHECK(a.waitForLog("replaces link", Millis(5000)));
  c.terminate();
  INFO("C's link is down; B's, older, is still up and takes the frames");
  CHECK(a.waitForLog("moves back to link", Millis(5000)));
  for (uint64_t id = 2; id <= 21; ++id) requireFrame(producer, consumer, id);
  CHECK(a.metric("framelink_links_up") == 1);
}
