// Who is at the other end of a link and what carries it: set once when the
// link comes up (link/session_reader.cpp), held by the agent (AgentLink) and
// shown as it is in the stats snapshot (LinkStats).
#pragma once

#include <cstdint>
#include <string>

namespace framelink {

struct LinkIdentity {
  std::string peer_name;         // the configured peer name (dialer) or the peer's daemon id (listener)
  std::string address;           // the peer's address as this daemon sees it
  uint64_t peer_instance = 0;    // the peer daemon's instance id (from its Hello / HelloAck)
  std::string transport_name;    // the data transport of the link
  std::string transport_reason;  // why this transport and not one the dialer preferred
};

}  // namespace framelink
