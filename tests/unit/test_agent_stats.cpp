// The data agent's stats detail as JSON.
#include <catch2/catch.hpp>

#include "agent_stats.h"

using namespace framelink;

TEST_CASE("agent stats: every row and total, streams in peer then id order", "[agent_stats]") {
  AgentStats s;
  s.clients.push_back(ClientStats{3, 1234, 1000, true, "cam", 8, 2, 10, 4096, 1, false});
  s.links.push_back(LinkStats{1, "hostb", "tcp", "rdma: no \"device\"", 5, 6, 1});
  s.streams.push_back(StreamStats{"zeta", "cam", 1, 11, 2, 3, 4});
  s.streams.push_back(StreamStats{"alpha", "cam", 9, 1, 0, 0, 0});
  s.streams.push_back(StreamStats{"alpha", "cam", 2, 1, 0, 0, 0});
  s.credits_outstanding = 7;
  s.frames_held_by_consumers = 2;
  const std::string json = toJson(s);
  CHECK(json ==
        "{\"clients\":[{\"id\":3,\"pid\":1234,\"uid\":1000,\"role\":\"producer\",\"stream\":\"cam\","
        "\"slots\":8,"
        "\"slots_busy\":2,\"frames\":10,\"bytes\":4096,\"errors\":1,\"gone\":false}],"
        "\"links\":[{\"id\":1,\"peer\":\"hostb\",\"transport\":\"tcp\",\"transport_reason\":\"rdma: no "
        "\\\"device\\\"\",\"frames_in\":5,\"frames_out\":6,\"in_streams\":1}],"
        "\"streams\":[{\"peer\":\"alpha\",\"stream\":\"cam\",\"id\":2,\"next_sequence\":1,\"credits\":0,"
        "\"pending\":0,\"unacked\":0},{\"peer\":\"alpha\",\"stream\":\"cam\",\"id\":9,\"next_sequence\":1,"
        "\"credits\":0,\"pending\":0,\"unacked\":0},{\"peer\":\"zeta\",\"stream\":\"cam\",\"id\":1,"
        "\"next_sequence\":11,\"credits\":2,\"pending\":3,\"unacked\":4}],"
        "\"credits_outstanding\":7,\"frames_held_by_consumers\":2}");
}

TEST_CASE("agent stats: empty, and control characters do not break the JSON", "[agent_stats]") {
  CHECK(toJson(AgentStats{}) ==
        "{\"clients\":[],\"links\":[],\"streams\":[],\"credits_outstanding\":0,\"frames_held_by_consumers\":"
        "0}");
  CHECK(jsonEscape("a\"b\\c\nd") == "a\\\"b\\\\c d");
}
