// DataAgent's stats snapshot: every period (Metrics::kPublishPeriodNs) the
// agent fills an AgentStats (agent_stats.h) and the metrics' gauges from its
// own tables and hands both to Metrics, which serves them.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "agent/agent_stats.h"
#include "agent/data_agent.h"
#include "framelink/framelink.h"
#include "metrics/metrics.h"

namespace framelink {

void DataAgent::publishStats() {
  AgentStats stats;
  Metrics::Gauges gauges;
  collectClientStats(stats, gauges);
  Metrics::StreamsHere& here = gauges.streams;
  for (auto* streams : {&here.readers, &here.producers, &here.subscribed, &here.grouped}) {
    std::sort(streams->begin(), streams->end());
    streams->erase(std::unique(streams->begin(), streams->end()), streams->end());
  }
  const transport::TransportCounters transport_totals = collectLinkStats(stats, gauges);
  gauges.pull_reads_in_flight = inbound_.readsInFlight();
  gauges.pull_reads_peak = inbound_.readsPeakPerLink();
  gauges.slots_fenced = inbound_.slotsFenced();
  metrics_.setGauges(std::move(gauges));
  metrics_.setTransportCounters(transport_totals);
  outbound_.collectStats(stats.streams);
  stats.credits_outstanding = inbound_.creditsOutstanding();
  stats.frames_held_by_consumers = inbound_.framesHeld();
  metrics_.setDetail(
      [snapshot = std::make_shared<const AgentStats>(std::move(stats))] { return toJson(*snapshot); });
}

void DataAgent::collectClientStats(AgentStats& stats, Metrics::Gauges& gauges) {
  for (const auto& [id, c] : clients_.all()) {
    const ClientSession& s = *c.session;
    ClientStats cs;
    cs.id = id;
    cs.pid = int64_t{s.pid};
    cs.uid = uint64_t{s.uid};
    cs.gid = uint64_t{s.gid};
    cs.name = s.name;
    cs.producer = s.role == FL_ROLE_PRODUCER;
    cs.subscriber = s.subscriber;
    cs.pull = !cs.producer && inbound_.pullsStream(s.stream);
    cs.stream = s.stream;
    cs.slots = s.slots.size();
    cs.slot_size = s.segments ? s.segments->slotSize() : 0;
    size_t held = 0;  // consumer: delivered, not yet released
    for (const auto& e : s.slots) {
      cs.slots_busy += e.state != SlotState::kFree ? 1 : 0;
      held += e.state == SlotState::kDelivered ? 1 : 0;
    }
    cs.in_flight = cs.producer ? cs.slots_busy : held;
    if (s.subscriber && !s.gone) cs.waiting = local_.waitingFor(s);
    (cs.producer ? gauges.frames_in_flight : gauges.frames_held) += cs.in_flight;
    if (!s.gone) {
      Metrics::RoleGauge& role = cs.producer ? gauges.producers : gauges.consumers;
      ++role.clients;
      role.slots += cs.slots;
      Metrics::StreamsHere& here = gauges.streams;
      (cs.producer ? here.producers : here.readers).push_back(s.stream);
      if (!cs.producer) {
        (s.subscriber ? here.subscribed : here.grouped).push_back(s.stream);
      }
    }
    cs.frames = s.frames;
    cs.bytes = s.bytes;
    cs.errors = s.errors;
    cs.dropped = s.dropped;
    cs.gone = s.gone;
    stats.clients.push_back(std::move(cs));
  }
}

transport::TransportCounters DataAgent::collectLinkStats(AgentStats& stats, Metrics::Gauges& gauges) {
  std::map<std::string, Metrics::LinkGauge>
      by_peer;  // one series per peer, also while a link replaces another
  transport::TransportCounters transport_totals = closed_links_transport_;
  for (const auto& [id, l] : links_) {
    if (l.transport) transport_totals += l.transport->counters();
    LinkStats ls;
    ls.id = id;
    ls.identity = l;
    ls.closing = l.closing;
    ls.up_since_ns = l.up_since_ns;
    ls.rtt_ns = l.rtt_ns;
    ls.frames_in = l.frames_in;
    ls.frames_out = l.frames_out;
    const OutboundStreams::PeerTraffic t = outbound_.traffic(l.peer);
    ls.replayed = t.replayed;
    if (l.peer != kNoPeer && peers_[l.peer].link_id == id) {
      ls.in_flight = t.in_flight;
      ls.pending = t.pending;
      ls.pulled_out = t.pulled;
    }
    ls.in_streams = l.in_streams.size();
    for (const auto& [sid, in] : l.in_streams) ls.pulled_in += inbound_.pulls(l, in.name) ? 1 : 0;
    Metrics::LinkGauge& g = by_peer[l.peer_name];
    g.peer = l.peer_name;
    if (!l.closing || g.transport.empty()) g.transport = l.transport_name;
    if (l.rtt_ns != 0) g.rtt_ns = l.rtt_ns;
    g.in_flight += ls.in_flight;
    g.replayed = t.replayed;
    stats.links.push_back(std::move(ls));
  }
  for (const auto& peer : config_.peers) {
    if (by_peer.count(peer.name) != 0) continue;
    Metrics::LinkGauge& g = by_peer[peer.name];
    g.peer = peer.name;
    g.replayed = outbound_.traffic(peers_.resolve(peer.name)).replayed;
  }
  for (auto& [name, g] : by_peer) gauges.links.push_back(std::move(g));
  return transport_totals;
}

}  // namespace framelink
