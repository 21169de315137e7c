#include "agent/agent_stats.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>

namespace framelink {

std::string toJson(AgentStats stats) {
  std::sort(stats.streams.begin(), stats.streams.end(), [](const StreamStats& a, const StreamStats& b) {
    return std::tie(a.peer, a.id) < std::tie(b.peer, b.id);
  });
  using Json = nlohmann::ordered_json;
  Json clients = Json::array();
  for (const auto& c : stats.clients) {
    clients.push_back({{"id", c.id},
                       {"pid", c.pid},
                       {"uid", c.uid},
                       {"gid", c.gid},
                       {"name", c.name},
                       {"role", c.producer     ? "producer"
                                : c.subscriber ? "subscriber"
                                               : "consumer"},
                       {"stream", c.stream},
                       {"delivery", c.producer ? "-"
                                    : c.pull   ? "pull"
                                               : "push"},
                       {"slots", c.slots},
                       {"slot_size", c.slot_size},
                       {"slots_busy", c.slots_busy},
                       {"in_flight", c.in_flight},
                       {"waiting", c.waiting},
                       {"frames", c.frames},
                       {"bytes", c.bytes},
                       {"errors", c.errors},
                       {"dropped", c.dropped},
                       {"gone", c.gone}});
  }
  Json links = Json::array();
  for (const auto& l : stats.links) {
    links.push_back({{"id", l.id},
                     {"peer", l.identity.peer_name},
                     {"address", l.identity.address},
                     {"state", l.closing ? "closing" : "up"},
                     {"peer_instance", l.identity.peer_instance},
                     {"transport", l.identity.transport_name},
                     {"transport_reason", l.identity.transport_reason},
                     {"up_since_ns", l.up_since_ns},
                     {"rtt_ns", l.rtt_ns},
                     {"frames_in", l.frames_in},
                     {"frames_out", l.frames_out},
                     {"in_flight", l.in_flight},
                     {"pending", l.pending},
                     {"replayed", l.replayed},
                     {"in_streams", l.in_streams},
                     {"pulled_in", l.pulled_in},
                     {"pulled_out", l.pulled_out}});
  }
  Json streams = Json::array();
  for (const auto& s : stats.streams) {
    streams.push_back({{"peer", s.peer},
                       {"stream", s.stream},
                       {"id", s.id},
                       {"next_sequence", s.next_sequence},
                       {"credits", s.credits},
                       {"pending", s.pending},
                       {"unacked", s.unacked}});
  }
  const Json out = {{"clients", std::move(clients)},
                    {"links", std::move(links)},
                    {"streams", std::move(streams)},
                    {"credits_outstanding", stats.credits_outstanding},
                    {"frames_held_by_consumers", stats.frames_held_by_consumers}};
  // Names come from outside (applications, peers): valid UTF-8 stays as it
  // is, anything else becomes U+FFFD, and the snapshot always parses.
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace framelink
