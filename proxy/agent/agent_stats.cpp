#include "agent/agent_stats.h"

#include <algorithm>
#include <sstream>
#include <tuple>

namespace framelink {

std::string jsonEscape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char ch : in) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
    } else if (static_cast<unsigned char>(ch) >= 0x80) {
      out += '?';  // names come from outside: the snapshot stays valid UTF-8 whatever they hold
    } else {
      out += ch;
    }
  }
  return out;
}

std::string toJson(AgentStats stats) {
  std::sort(stats.streams.begin(), stats.streams.end(), [](const StreamStats& a, const StreamStats& b) {
    return std::tie(a.peer, a.id) < std::tie(b.peer, b.id);
  });
  std::ostringstream out;
  out << "{\"clients\":[";
  bool first = true;
  for (const auto& c : stats.clients) {
    if (!first) out << ',';
    first = false;
    out << "{\"id\":" << c.id << ",\"pid\":" << c.pid << ",\"uid\":" << c.uid << ",\"gid\":" << c.gid
        << ",\"name\":\"" << jsonEscape(c.name) << "\",\"role\":\"" << (c.producer ? "producer" : "consumer")
        << "\",\"stream\":\"" << jsonEscape(c.stream) << "\",\"slots\":" << c.slots
        << ",\"slot_size\":" << c.slot_size << ",\"slots_busy\":" << c.slots_busy
        << ",\"in_flight\":" << c.in_flight << ",\"frames\":" << c.frames << ",\"bytes\":" << c.bytes
        << ",\"errors\":" << c.errors << ",\"gone\":" << (c.gone ? "true" : "false") << '}';
  }
  out << "],\"links\":[";
  first = true;
  for (const auto& l : stats.links) {
    if (!first) out << ',';
    first = false;
    out << "{\"id\":" << l.id << ",\"peer\":\"" << jsonEscape(l.identity.peer_name) << "\",\"address\":\""
        << jsonEscape(l.identity.address) << "\",\"state\":\"" << (l.closing ? "closing" : "up")
        << "\",\"peer_instance\":" << l.identity.peer_instance << ",\"transport\":\""
        << jsonEscape(l.identity.transport_name) << "\",\"transport_reason\":\""
        << jsonEscape(l.identity.transport_reason) << "\",\"up_since_ns\":" << l.up_since_ns
        << ",\"rtt_ns\":" << l.rtt_ns << ",\"frames_in\":" << l.frames_in
        << ",\"frames_out\":" << l.frames_out << ",\"in_flight\":" << l.in_flight
        << ",\"pending\":" << l.pending << ",\"replayed\":" << l.replayed
        << ",\"in_streams\":" << l.in_streams << '}';
  }
  out << "],\"streams\":[";
  first = true;
  for (const auto& s : stats.streams) {
    if (!first) out << ',';
    first = false;
    out << "{\"peer\":\"" << jsonEscape(s.peer) << "\",\"stream\":\"" << jsonEscape(s.stream)
        << "\",\"id\":" << s.id << ",\"next_sequence\":" << s.next_sequence << ",\"credits\":" << s.credits
        << ",\"pending\":" << s.pending << ",\"unacked\":" << s.unacked << '}';
  }
  out << "],\"credits_outstanding\":" << stats.credits_outstanding
      << ",\"frames_held_by_consumers\":" << stats.frames_held_by_consumers << '}';
  return out.str();
}

}  // namespace framelink
