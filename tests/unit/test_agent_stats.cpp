// The data agent's stats detail as JSON.
#include <catch2/catch.hpp>

#include "agent/agent_stats.h"

using namespace framelink;

TEST_CASE("agent stats: every row and total, streams in peer then id order", "[agent_stats]") {
  AgentStats s;
  ClientStats c;
  c.id = 3;
  c.pid = 1234;
  c.uid = 1000;
  c.gid = 100;
  c.name = "acq\xc3\xa9";  // UTF-8 beyond ASCII: kept
  c.producer = true;
  c.stream = "cam";
  c.slots = 8;
  c.slot_size = 4096;
  c.slots_busy = 2;
  c.in_flight = 2;
  c.frames = 10;
  c.bytes = 4096;
  c.errors = 1;
  c.dropped = 3;
  s.clients.push_back(c);
  LinkStats l;
  l.id = 1;
  l.identity = {"hostb", "10.0.0.2:7700", 77, "tcp", "rdma: no \"device\""};
  l.up_since_ns = 5000;
  l.rtt_ns = 120;
  l.frames_in = 5;
  l.frames_out = 6;
  l.in_flight = 3;
  l.pending = 4;
  l.replayed = 2;
  l.in_streams = 1;
  s.links.push_back(l);
  s.streams.push_back(StreamStats{"zeta", "cam", 1, 11, 2, 3, 4});
  s.streams.push_back(StreamStats{"alpha", "cam", 9, 1, 0, 0, 0});
  s.streams.push_back(StreamStats{"alpha", "cam", 2, 1, 0, 0, 0});
  s.credits_outstanding = 7;
  s.frames_held_by_consumers = 2;
  const std::string json = toJson(s);
  CHECK(json ==
        "{\"clients\":[{\"id\":3,\"pid\":1234,\"uid\":1000,\"gid\":100,\"name\":\"acq\xc3\xa9\",\"role\":"
        "\"producer\",\"stream\":\"cam\",\"delivery\":\"-\",\"slots\":8,\"slot_size\":4096,\"slots_busy\":2,"
        "\"in_flight\":2,"
        "\"waiting\":0,"
        "\"frames\":10,\"bytes\":4096,\"errors\":1,\"dropped\":3,\"gone\":false}],"
        "\"links\":[{\"id\":1,\"peer\":\"hostb\",\"address\":\"10.0.0.2:7700\",\"state\":\"up\","
        "\"peer_instance\":77,\"transport\":\"tcp\",\"transport_reason\":\"rdma: no \\\"device\\\"\","
        "\"up_since_ns\":5000,\"rtt_ns\":120,\"frames_in\":5,\"frames_out\":6,\"in_flight\":3,"
        "\"pending\":4,\"replayed\":2,\"in_streams\":1,\"pulled_in\":0,\"pulled_out\":0}],"
        "\"streams\":[{\"peer\":\"alpha\",\"stream\":\"cam\",\"id\":2,\"next_sequence\":1,\"credits\":0,"
        "\"pending\":0,\"unacked\":0},{\"peer\":\"alpha\",\"stream\":\"cam\",\"id\":9,\"next_sequence\":1,"
        "\"credits\":0,\"pending\":0,\"unacked\":0},{\"peer\":\"zeta\",\"stream\":\"cam\",\"id\":1,"
        "\"next_sequence\":11,\"credits\":2,\"pending\":3,\"unacked\":4}],"
        "\"credits_outstanding\":7,\"frames_held_by_consumers\":2}");
}

TEST_CASE("agent stats: empty, and quotes, control characters or invalid UTF-8 do not break the JSON",
          "[agent_stats]") {
  CHECK(toJson(AgentStats{}) ==
        "{\"clients\":[],\"links\":[],\"streams\":[],\"credits_outstanding\":0,\"frames_held_by_consumers\":"
        "0}");
  AgentStats s;
  ClientStats c;
  c.name = "a\"b\\c\nd\xff\xfe";  // an application may call itself anything
  s.clients.push_back(c);
  const std::string json = toJson(s);
  CHECK(json.find("\"name\":\"a\\\"b\\\\c\\nd\xef\xbf\xbd\xef\xbf\xbd\"") != std::string::npos);
}
