// A reload on the data agent's thread (agent_reload.cpp, CmdReconfigure): an attached producer's
// stream goes where the new routes send it from its next frame, unless a frame of it is in
// flight -- then it keeps the routes it had until it attaches again -- and a stream the new
// routes send nowhere fails its next frame FL_ERR_NO_ROUTE.  The agent runs on the test's thread
// (AgentLinkRig), its two links to peers "b" and "c".
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "agent_fixture.h"
#include "agent_link_rig.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

struct ReloadRig : AgentLinkRig {
  // Streams routed to b and to c at start.
  ReloadRig(std::vector<std::string> to_b, std::vector<std::string> to_c) {
    config.peers = {PeerConfig{"b", "127.0.0.1:1", std::move(to_b)},
                    PeerConfig{"c", "127.0.0.1:2", std::move(to_c)}};
    config.credit_timeout_ms = 60000;
    agent = std::make_unique<DataAgent>(config, metrics, clock);
    linkUp(1, "b");
    linkUp(2, "c");
  }
  // The configuration again, with these routes, applied as a reload does.
  void reload(std::vector<std::string> to_b, std::vector<std::string> to_c) {
    auto next = std::make_shared<Config>(config);
    next->peers[0].streams = std::move(to_b);
    next->peers[1].streams = std::move(to_c);
    agent->post(CmdReconfigure{next});
    REQUIRE(agent->runUntilIdle(50));
  }
  TestClient attach(uint64_t id, const std::string& stream) {
    TestClient c = makeClient(id, FL_ROLE_PRODUCER, stream, 4, 4096);
    agent->post(CmdClientAttached{c.session});
    REQUIRE(agent->runUntilIdle(50));
    return c;
  }
  void send(TestClient& c, uint32_t slot) {
    c.push(slot, 100);
    REQUIRE(agent->runUntilIdle(50));
  }
  // The names of the streams the agent opened on link `id` so far.
  std::vector<std::string> opened(uint64_t id) const {
    std::vector<std::string> names;
    for (const auto& m : *sessions[id - 1]) {
      if (m.has_stream_open()) names.push_back(m.stream_open().name());
    }
    return names;
  }
  static bool has(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  }
};

}  // namespace

TEST_CASE("reload: an idle producer's stream goes to its new route at once", "[agent][reload]") {
  ReloadRig rig({"cam"}, {"dish"});
  TestClient producer = rig.attach(1, "cam");
  REQUIRE(ReloadRig::has(rig.opened(1), "cam"));  // opened on b when it attached
  REQUIRE_FALSE(ReloadRig::has(rig.opened(2), "cam"));
  rig.reload({"dish"}, {"cam"});
  CHECK(ReloadRig::has(rig.opened(2), "cam"));
  // Its next frame waits for c's credit, not failed.
  rig.send(producer, 0);
  CHECK(producer.idleFor(std::chrono::milliseconds(0)));
}

TEST_CASE("reload: a producer with a frame in flight keeps its routes until it attaches again",
          "[agent][reload]") {
  ReloadRig rig({"cam"}, {"dish"});
  TestClient producer = rig.attach(1, "cam");
  rig.send(producer, 0);  // waits for a credit from b: in flight
  rig.reload({"dish"}, {"cam"});
  rig.send(producer, 1);
  // Nothing towards c: both frames wait on b's stream, in order, neither failed.
  CHECK_FALSE(ReloadRig::has(rig.opened(2), "cam"));
  CHECK(producer.idleFor(std::chrono::milliseconds(0)));

  // Attached again (the application restarts, or reattaches): the new routes.
  rig.agent->post(CmdClientGone{1});
  REQUIRE(rig.agent->runUntilIdle(50));
  TestClient again = rig.attach(2, "cam");
  CHECK(ReloadRig::has(rig.opened(2), "cam"));
}

TEST_CASE("reload: a stream the new routes send nowhere fails its next frame NO_ROUTE", "[agent][reload]") {
  ReloadRig rig({"cam"}, {"dish"});
  TestClient producer = rig.attach(1, "cam");
  rig.reload({"dish"}, {"dish"});
  rig.send(producer, 0);
  const fl_completion_desc done = producer.pop();
  CHECK(done.slot == 0);
  CHECK(done.status == FL_ERR_NO_ROUTE);

  // Routed again: the next frame waits for b's credit instead of failing.
  rig.reload({"cam"}, {"dish"});
  rig.send(producer, 1);
  CHECK(producer.idleFor(std::chrono::milliseconds(0)));
}
