// Where a producer's frames go: its routes, resolved when it attaches and
// again by a reload (OutboundStreams::reroute), and which of them each frame
// takes (a queue group that spans hosts gets it on one: waysOf).
#include <algorithm>
#include <cstdint>
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
  refreshRouteReaders(c);
}

bool OutboundStreams::routeLeft(const std::string& peer, const std::vector<std::string>& routes) const {
  if (std::find(routes.begin(), routes.end(), peer) != routes.end()) return false;
  // A written peer a reload took the stream from keeps its frames until none is in flight.
  return std::none_of(config_.peers.begin(), config_.peers.end(),
                      [&](const PeerConfig& p) { return p.name == peer && !p.discovered; });
}

void OutboundStreams::refreshRouteReaders(AgentClient& c) {
  if (c.route == kNoPeer) return;
  const std::string& stream = c.session->stream;
  const std::vector<std::string> routes = config_.routesFor(stream);
  auto readers = [&](PeerId peer) {
    const std::string& name = peers_[peer].name;
    return routeLeft(name, routes) ? RouteReaders::kNone : config_.routeReaders(name, stream);
  };
  c.route_readers = readers(c.route);
  for (auto& leg : c.more_routes) leg.readers = readers(leg.peer);
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
  // A route that is no longer one: a found daemon whose readers left carries
  // no new frame (kNone), and its place, once none of its frames is in
  // flight, takes a route added now; a written peer's waits for reroute().
  std::vector<Leg> free_places;
  for (Leg leg = 0; leg < legs(c); ++leg) {
    if (std::find(routes.begin(), routes.end(), peers_[had[leg]].name) != routes.end()) continue;
    if (!routeLeft(peers_[had[leg]].name, routes)) return false;
    bool idle = leg != 0;  // the first route's slots are the frames'
    for (uint32_t slot = 0; idle && slot < c.session->slots.size(); ++slot) {
      idle = legSlot(c, leg, slot).state == SlotState::kFree;
    }
    if (idle) free_places.push_back(leg);
  }
  std::vector<std::string> added;
  for (const std::string& name : routes) {
    if (std::none_of(had.begin(), had.end(), [&](PeerId p) { return peers_[p].name == name; })) {
      added.push_back(name);
    }
  }
  if (added.empty() ||
      had.size() + added.size() - std::min(added.size(), free_places.size()) > kMaxRoutesPerStream) {
    return false;
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (i >= free_places.size()) {
      appendLeg(c, added[i]);
      continue;
    }
    AgentClient::Leg& place = c.more_routes[free_places[i] - 1];
    const std::pair<PeerId, uint64_t> left{place.peer, place.out_stream};
    place.peer = peers_.resolve(added[i]);
    place.out_stream = openStream(place.peer, c.session->stream);
    forgetStreamIfUnused(left.first, left.second);
  }
  refreshRouteReaders(c);
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

OutboundStreams::Ways OutboundStreams::waysOf(AgentClient& ac) {
  const Leg n = legs(ac);
  const std::string& name = ac.session->stream;
  const bool here = alsoLocally(ac);
  const bool members_here = here && local_->hasMembers(name);
  // Candidates for the queue group's share: its routes that carry it, and
  // this host (index n) when members of it are here.
  uint32_t best = UINT32_MAX;
  size_t least = SIZE_MAX;
  for (uint32_t i = 0; i <= n; ++i) {
    const uint32_t k = (ac.next_group + i) % (n + 1u);
    size_t waiting = 0;
    if (k == n) {
      if (!members_here) continue;
      waiting = local_->waitingOf(name);
    } else {
      const RouteReaders r = legReaders(ac, static_cast<Leg>(k));
      if (r != RouteReaders::kGroup && r != RouteReaders::kBoth) continue;
      waiting = backlog(ac, static_cast<Leg>(k));
    }
    if (waiting < least) {
      best = k;
      least = waiting;
    }
  }
  if (best != UINT32_MAX) ac.next_group = (best + 1) % (n + 1u);
  Ways w;
  for (Leg leg = 0; leg < n; ++leg) {
    const uint64_t bit = sideBit(leg);
    switch (legReaders(ac, leg)) {
      case RouteReaders::kEvery:
        w.legs |= bit;
        break;
      case RouteReaders::kSubscribers:
        w.legs |= bit;
        w.subscribers_only |= bit;
        break;
      case RouteReaders::kGroup:
        if (leg == best) w.legs |= bit;
        break;
      case RouteReaders::kBoth:
        w.legs |= bit;
        if (leg != best) w.subscribers_only |= bit;
        break;
      case RouteReaders::kNone:
        break;
    }
  }
  // No group across hosts (best is n or none): the readers here as ever.
  w.here_members = best == UINT32_MAX || best == n;
  w.here = here && (w.here_members || local_->hasSubscribers(name));
  return w;
}

size_t OutboundStreams::backlog(const AgentClient& ac, Leg leg) {
  const PeerId peer = legPeer(ac, leg);
  const uint64_t stream_id = leg == 0 ? ac.out_stream : ac.more_routes[leg - 1].out_stream;
  const OutStream* s = stream(peer, stream_id);
  const size_t waiting = s == nullptr ? 0 : s->pending.size();
  return peers_[peer].link_id == 0 ? waiting + (size_t{1} << 20) : waiting;
}

}  // namespace framelink
