// DataAgent's stats snapshot (stats_snapshot.cpp): every publish period it
// fills the detail (agent_stats.h) and the gauges from its own tables --
// clients by role, producers' frames pending and in flight per stream and
// link, links and their state, consumers' credits and the frames they hold,
// the transports' totals.  Each test reads two or more snapshots and checks
// that they follow what changed in between.  The agent runs on the test's
// thread (AgentLinkRig) over loopback links: link 1 to peer "b", which is
// sent stream "cam", link 2 to peer "c"; a snapshot is taken when a publish
// period has passed on its clock.
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent_fixture.h"
#include "agent_link_rig.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using Json = nlohmann::json;

namespace {

struct StatsRig : TwoPeerRig {
  using TwoPeerRig::TwoPeerRig;
  // What the agent publishes once a period has passed: the whole of
  // Metrics::json(), the agent's snapshot under "detail".
  Json snapshot() {
    settle();
    clock.advanceNs(Metrics::kPublishPeriodNs);
    settle();
    return Json::parse(metrics.json());
  }
  // The value of the Prometheus sample `series` (name and labels); -1: none.
  double gauge(const std::string& series) const {
    const std::string text = metrics.prometheus();
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }
  // The ids of the credits of every grant link `id`'s peer end took off its
  // transport since the last call, for stream `sid`.
  std::vector<uint64_t> granted(uint64_t id, uint64_t sid) {
    std::vector<uint64_t> ids;
    transport::TransportEvent ev[16];
    for (size_t n; (n = peerEnd(id).poll(ev, 16)) > 0;) {
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind != transport::TransportEvent::Kind::kControl) continue;
        v1::ControlBatch batch;
        REQUIRE(batch.ParseFromString(ev[i].control));
        for (const auto& m : batch.messages()) {
          if (!m.has_credit_grant() || m.credit_grant().stream_id() != sid) continue;
          for (uint64_t c : m.credit_grant().slot_credits()) ids.push_back(c);
          for (const auto& c : m.credit_grant().credits()) ids.push_back(c.credit_id());
        }
      }
    }
    return ids;
  }
};

// The row of `rows` whose `key` is `value`; null when there is none.
Json row(const Json& rows, const std::string& key, const Json& value) {
  for (const Json& r : rows) {
    if (r.at(key) == value) return r;
  }
  return nullptr;
}

Json streamRow(const Json& detail, const std::string& peer, const std::string& stream) {
  for (const Json& r : detail.at("streams")) {
    if (r.at("peer") == peer && r.at("stream") == stream) return r;
  }
  return nullptr;
}

// Link `id`'s peer sends sequence `sequence` of its stream 42 into `credit_id`.
void sendFrame(StatsRig& rig, uint64_t id, uint64_t sequence, uint64_t credit_id, size_t length) {
  std::vector<uint8_t> payload(length, uint8_t(sequence));
  transport::SendRequest req;
  req.cookie = sequence;
  req.header.stream_id = 42;
  req.header.sequence = sequence;
  req.header.credit_id = credit_id;
  req.header.length = payload.size();
  req.payload = payload.data();
  req.credit.credit_id = credit_id;
  req.credit.length = 4096;
  REQUIRE(rig.peerEnd(id).post(req) == transport::PostResult::kOk);
  for (int i = 0; i < 4; ++i) rig.peerEnd(id).flush();
  rig.settle();
}

}  // namespace

TEST_CASE("stats snapshot: the clients by role follow attaches and detaches", "[stats_snapshot]") {
  StatsRig rig;
  Json s = rig.snapshot();
  CHECK(s.at("detail").at("clients").empty());
  CHECK(rig.gauge(R"(framelink_clients{role="producer"})") == 0);

  TestClient producer = rig.attach(1, FL_ROLE_PRODUCER, "cam", 4);
  TestClient consumer = rig.attach(2, FL_ROLE_CONSUMER, "dish", 2);
  s = rig.snapshot();
  const Json& clients = s.at("detail").at("clients");
  REQUIRE(clients.size() == 2);
  const Json p = row(clients, "id", 1);
  CHECK(p.at("role") == "producer");
  CHECK(p.at("stream") == "cam");
  CHECK(p.at("delivery") == "-");
  CHECK(p.at("slots") == 4);
  CHECK(p.at("slot_size") == 4096);
  CHECK(p.at("gone") == false);
  const Json c = row(clients, "id", 2);
  CHECK(c.at("role") == "consumer");
  CHECK(c.at("stream") == "dish");
  CHECK(c.at("delivery") == "push");
  CHECK(c.at("slots") == 2);
  CHECK(rig.gauge(R"(framelink_clients{role="producer"})") == 1);
  CHECK(rig.gauge(R"(framelink_clients{role="consumer"})") == 1);
  CHECK(rig.gauge(R"(framelink_client_slots{role="producer"})") == 4);
  CHECK(rig.gauge(R"(framelink_client_slots{role="consumer"})") == 2);

  TestClient second = makeClient(3, FL_ROLE_CONSUMER, "dish", 8, 4096);
  second.session->subscriber = true;
  rig.agent->post(CmdClientAttached{second.session});
  rig.agent->post(CmdClientGone{1});
  s = rig.snapshot();
  CHECK(row(s.at("detail").at("clients"), "id", 3).at("role") == "subscriber");
  const Json gone = row(s.at("detail").at("clients"), "id", 1);
  CHECK((gone.is_null() || gone.at("gone") == true));
  CHECK(rig.gauge(R"(framelink_clients{role="producer"})") == 0);
  CHECK(rig.gauge(R"(framelink_clients{role="consumer"})") == 2);
  CHECK(rig.gauge(R"(framelink_client_slots{role="producer"})") == 0);
  CHECK(rig.gauge(R"(framelink_client_slots{role="consumer"})") == 10);
}

TEST_CASE("stats snapshot: a producer's frames go from pending to in flight to done, per stream and link",
          "[stats_snapshot]") {
  StatsRig rig;
  TestClient producer = rig.attach(1, FL_ROLE_PRODUCER, "cam", 4);
  const uint64_t sid = rig.opened(1, "cam");
  producer.push(0, 100);
  producer.push(1, 100);
  Json d = rig.snapshot().at("detail");
  Json p = row(d.at("clients"), "id", 1);
  CHECK(p.at("slots_busy") == 2);
  CHECK(p.at("in_flight") == 2);
  Json st = streamRow(d, "b", "cam");
  REQUIRE_FALSE(st.is_null());
  CHECK(st.at("id") == sid);
  CHECK(st.at("pending") == 2);
  CHECK(st.at("credits") == 0);
  CHECK(st.at("unacked") == 0);
  CHECK(row(d.at("links"), "id", 1).at("pending") == 2);
  CHECK(row(d.at("links"), "id", 1).at("in_flight") == 0);
  CHECK(row(d.at("links"), "id", 2).at("pending") == 0);
  CHECK(rig.gauge("framelink_frames_in_flight") == 2);

  auto first = exposeLanding(rig.peerEnd(1), 500, 4096);
  auto second = exposeLanding(rig.peerEnd(1), 501, 4096);
  auto third = exposeLanding(rig.peerEnd(1), 502, 4096);
  rig.record(1, {creditGrant(sid, {{500, 4096}, {501, 4096}, {502, 4096}})});
  d = rig.snapshot().at("detail");
  st = streamRow(d, "b", "cam");
  CHECK(st.at("pending") == 0);
  CHECK(st.at("unacked") == 2);
  CHECK(st.at("credits") == 1);
  CHECK(st.at("next_sequence") == 3);
  Json l = row(d.at("links"), "id", 1);
  CHECK(l.at("pending") == 0);
  CHECK(l.at("in_flight") == 2);
  CHECK(l.at("frames_out") == 2);
  CHECK(rig.gauge(R"(framelink_link_frames_in_flight{peer="b"})") == 2);
  CHECK(rig.gauge(R"(framelink_link_frames_in_flight{peer="c"})") == 0);

  rig.record(1, {ackMessage(sid, 1)});
  d = rig.snapshot().at("detail");
  p = row(d.at("clients"), "id", 1);
  CHECK(p.at("in_flight") == 1);
  CHECK(p.at("frames") == 1);
  CHECK(streamRow(d, "b", "cam").at("unacked") == 1);
  CHECK(row(d.at("links"), "id", 1).at("in_flight") == 1);
  CHECK(rig.gauge("framelink_frames_in_flight") == 1);
}

TEST_CASE("stats snapshot: links, their state and their streams follow what the peers do",
          "[stats_snapshot]") {
  StatsRig rig;
  Json d = rig.snapshot().at("detail");
  REQUIRE(d.at("links").size() == 2);
  CHECK(row(d.at("links"), "id", 1).at("peer") == "b");
  CHECK(row(d.at("links"), "id", 1).at("state") == "up");
  CHECK(row(d.at("links"), "id", 2).at("peer") == "c");
  CHECK(row(d.at("links"), "id", 2).at("in_streams") == 0);
  CHECK(rig.gauge(R"(framelink_link_up{peer="b",transport="test"})") == 1);

  rig.session(2, streamOpenMessage(42, "x"));
  rig.session(2, streamOpenMessage(43, "y"));
  CHECK(row(rig.snapshot().at("detail").at("links"), "id", 2).at("in_streams") == 2);
  v1::PeerMessage close;
  close.mutable_stream_close()->set_stream_id(42);
  rig.session(2, close);
  d = rig.snapshot().at("detail");
  CHECK(row(d.at("links"), "id", 2).at("in_streams") == 1);
  CHECK(row(d.at("links"), "id", 1).at("in_streams") == 0);

  v1::PeerMessage fin;
  fin.mutable_fin()->set_code(v1::ERROR_CODE_SHUTDOWN);
  rig.session(1, fin);
  d = rig.snapshot().at("detail");
  CHECK(row(d.at("links"), "id", 1).at("state") == "closing");
  CHECK(row(d.at("links"), "id", 2).at("state") == "up");

  rig.agent->post(CmdLinkDown{1, "gone"});
  d = rig.snapshot().at("detail");
  REQUIRE(d.at("links").size() == 1);
  CHECK(d.at("links").at(0).at("id") == 2);
  // A configured peer with no link keeps its series, at 0.
  CHECK(rig.gauge(R"(framelink_link_up{peer="b",transport="none"})") == 0);
  CHECK(rig.gauge(R"(framelink_link_up{peer="b",transport="test"})") == -1);
}

TEST_CASE("stats snapshot: consumers' credits outstanding and frames held follow arrivals and releases",
          "[stats_snapshot]") {
  StatsRig rig;
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam", 4);
  Json s = rig.snapshot();
  CHECK(s.at("detail").at("credits_outstanding") == 0);
  rig.session(1, streamOpenMessage(42, "cam"));
  const std::vector<uint64_t> credits = rig.granted(1, 42);
  REQUIRE(credits.size() == 4);
  s = rig.snapshot();
  CHECK(s.at("detail").at("credits_outstanding") == 4);
  CHECK(s.at("detail").at("frames_held_by_consumers") == 0);
  CHECK(row(s.at("detail").at("clients"), "id", 1).at("slots_busy") == 4);
  CHECK(row(s.at("detail").at("clients"), "id", 1).at("in_flight") == 0);

  sendFrame(rig, 1, 1, credits[0], 100);
  sendFrame(rig, 1, 2, credits[1], 100);
  s = rig.snapshot();
  CHECK(s.at("detail").at("credits_outstanding") == 2);
  CHECK(s.at("detail").at("frames_held_by_consumers") == 2);
  CHECK(row(s.at("detail").at("clients"), "id", 1).at("in_flight") == 2);
  CHECK(row(s.at("detail").at("links"), "id", 1).at("frames_in") == 2);
  CHECK(rig.gauge("framelink_frames_held") == 2);

  const fl_completion_desc d = consumer.pop();
  REQUIRE(d.status == FL_OK);
  consumer.push(d.slot, 0);  // released: ACKed, and the slot granted again
  s = rig.snapshot();
  CHECK(s.at("detail").at("credits_outstanding") == 3);
  CHECK(s.at("detail").at("frames_held_by_consumers") == 1);
  CHECK(row(s.at("detail").at("clients"), "id", 1).at("in_flight") == 1);
  CHECK(row(s.at("detail").at("clients"), "id", 1).at("frames") == 2);
  CHECK(rig.gauge("framelink_frames_held") == 1);
}

TEST_CASE("stats snapshot: the transports' totals keep what a closed link's transport did",
          "[stats_snapshot]") {
  StatsRig rig;
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam", 4);
  rig.session(1, streamOpenMessage(42, "cam"));
  const std::vector<uint64_t> credits = rig.granted(1, 42);
  REQUIRE(credits.size() == 4);
  Json counters = rig.snapshot().at("counters");
  const uint64_t before = counters.at("transport_frames_received");
  sendFrame(rig, 1, 1, credits[0], 100);
  counters = rig.snapshot().at("counters");
  CHECK(counters.at("transport_frames_received") == before + 1);
  const uint64_t control = counters.at("transport_control_sent");
  CHECK(control > 0);  // the grant
  rig.agent->post(CmdLinkDown{1, "gone"});
  counters = rig.snapshot().at("counters");
  CHECK(counters.at("transport_frames_received") == before + 1);
  CHECK(counters.at("transport_control_sent") >= control);
}
