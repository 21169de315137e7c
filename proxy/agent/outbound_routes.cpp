// Where a producer's frames go: its routes, resolved when it attaches and
// again by a reload (OutboundStreams::reroute).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "agent/outbound_streams.h"

namespace framelink {

uint64_t OutboundStreams::openStream(PeerId peer, const std::string& name) {
  PeerOut& po = peerOut(peer);
  auto it = po.by_name.find(name);
  if (it != po.by_name.end()) return it->second;
  const uint64_t id = next_stream_id_++;
  OutStream& s = po.streams[id];
  s.id = id;
  s.name = name;
  po.by_name[name] = id;
  if (AgentLink* l = links_.find(peers_[peer].link_id)) announce(*l, s);
  return id;
}

void OutboundStreams::onProducerAttached(AgentClient& c) {
  const size_t slots = c.session->slots.size();
  c.headers.resize(slots);
  const std::vector<std::string> peers = config_.routesFor(c.session->stream);
  if (peers.empty()) return;  // its frames go to the consumers attached here (NO_ROUTE without one)
  c.route = peers_.resolve(peers.front());
  c.route_implicit = config_.routeIsImplicit(c.session->stream);
  c.out_stream = openStream(c.route, c.session->stream);
  for (size_t i = 1; i < peers.size(); ++i) appendLeg(c, peers[i]);
}

void OutboundStreams::appendLeg(AgentClient& c, const std::string& peer) {
  const size_t slots = c.session->slots.size();
  AgentClient::Leg& leg = c.more_routes.emplace_back();
  leg.peer = peers_.resolve(peer);
  leg.out_stream = openStream(leg.peer, c.session->stream);
  leg.headers.resize(slots);
  leg.slots.resize(slots);
}

bool OutboundStreams::addRoutes(AgentClient& c, const std::vector<std::string>& routes) {
  if (c.route == kNoPeer || c.route_implicit) return false;
  std::vector<PeerId> had;
  for (Leg leg = 0; leg < legs(c); ++leg) had.push_back(legPeer(c, leg));
  std::vector<std::string> added;
  for (const PeerId peer : had) {
    if (std::find(routes.begin(), routes.end(), peers_[peer].name) == routes.end()) return false;
  }
  for (const std::string& name : routes) {
    if (std::none_of(had.begin(), had.end(), [&](PeerId p) { return peers_[p].name == name; })) {
      added.push_back(name);
    }
  }
  if (added.empty() || had.size() + added.size() > kMaxRoutesPerStream) return false;
  for (const std::string& name : added) appendLeg(c, name);
  return true;
}

bool OutboundStreams::reroute(AgentClient& c) {
  for (Leg leg = 0; leg < legs(c); ++leg) {
    for (uint32_t slot = 0; slot < c.session->slots.size(); ++slot) {
      if (legSlot(c, leg, slot).state != SlotState::kFree) return false;
    }
  }
  std::vector<std::pair<PeerId, uint64_t>> before;
  for (Leg leg = 0; leg < legs(c); ++leg) before.emplace_back(legPeer(c, leg), legStream(c, leg));
  c.route = kNoPeer;
  c.route_implicit = false;
  c.out_stream = 0;
  c.more_routes.clear();
  onProducerAttached(c);
  // A stream to a peer it left goes once nothing else sends on it.
  for (const auto& [peer, stream_id] : before) forgetStreamIfUnused(peer, stream_id);
  return true;
}

}  // namespace framelink
