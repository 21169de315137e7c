#include "agent/outbound_streams.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "agent/agent_stats.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"
#include "transport/frame_header.h"
#include "transport/frame_header_proto.h"

namespace framelink {

namespace {

// The id of the frame `desc` submits, from the slot header the producer
// wrote: a completion echoes it whatever its status, refusals at submit
// included.  Only echoed, so read unvalidated; 0 when the descriptor names
// no slot of the client (no header to read it from).
uint64_t submittedFrameId(const ClientSession& c, const fl_submit_desc& desc) {
  return desc.slot < c.slots.size() ? c.segments->slotHeader(desc.slot)->frame_id : 0;
}

}  // namespace

OutboundStreams::OutboundStreams(const Config& config, Metrics& metrics, const AgentClock& clock,
                                 ClientTable& clients, PeerTable& peers, LinkTable& links)
    : config_(config), metrics_(metrics), clock_(clock), clients_(clients), peers_(peers), links_(links) {}

uint64_t OutboundStreams::creditDeadline(uint64_t now_ns) const {
  return now_ns + uint64_t{config_.credit_timeout_ms} * 1'000'000ULL;
}

uint64_t OutboundStreams::ackDeadline(uint64_t now_ns) const {
  return now_ns + uint64_t{config_.ack_timeout_ms} * 1'000'000ULL;
}

OutboundStreams::PeerOut& OutboundStreams::peerOut(PeerId peer) {
  if (peer >= out_.size()) out_.resize(size_t{peer} + 1);
  return out_[peer];
}

OutboundStreams::OutStream* OutboundStreams::stream(PeerId peer, uint64_t stream_id) {
  if (peer >= out_.size()) return nullptr;
  auto it = out_[peer].streams.find(stream_id);
  return it == out_[peer].streams.end() ? nullptr : &it->second;
}

void OutboundStreams::announce(AgentLink& l, OutStream& s) {
  v1::PeerMessage msg;
  msg.mutable_stream_open()->set_stream_id(s.id);
  msg.mutable_stream_open()->set_name(s.name);
  l.send(std::move(msg));
  s.announced = true;
}

void OutboundStreams::rejectSubmit(ClientSession& c, const fl_submit_desc& desc, int status,
                                   const std::string& why) {
  metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
  metrics_.recordFailure(status);
  ++c.errors;
  const uint64_t frame_id = submittedFrameId(c, desc);
  log_client_errors_.warn("client {} stream '{}' slot {} frame {}: {}: {}", c.id, c.stream, desc.slot,
                          frame_id, statusName(status), why);
  clients_.complete(c, desc.slot, status, 0, desc.length, frame_id);
}

bool OutboundStreams::deliversLocally(const AgentClient& ac) const {
  if (local_ == nullptr || (ac.route != kNoPeer && !ac.route_implicit)) return false;
  return local_->hasReaders(ac.session->stream);
}

bool OutboundStreams::alsoLocally(const AgentClient& ac) const {
  if (local_ == nullptr || ac.route == kNoPeer || ac.route_implicit) return false;
  return local_->hasReaders(ac.session->stream);
}

bool OutboundStreams::checkSubmit(const AgentClient& ac, const fl_submit_desc& desc, fl_slot_header* sh,
                                  int* status, std::string* why) const {
  const ClientSession& c = *ac.session;
  auto refuse = [&](int code, std::string text) {
    *status = code;
    *why = std::move(text);
    return false;
  };
  if (desc.slot >= c.slots.size()) {
    return refuse(FL_ERR_BAD_SLOT,
                  "slot index out of range (the client has " + std::to_string(c.slots.size()) + " slots)");
  }
  const SlotEntry& e = c.slots[desc.slot];
  if (desc.flags != 0) return refuse(FL_ERR_BAD_DESCRIPTOR, "reserved descriptor flags are set");
  if (e.state != SlotState::kFree) {
    return refuse(FL_ERR_SLOT_NOT_OWNED, std::string("the slot is already in flight (") +
                                             slotStateName(e.state) + "), submitted twice?");
  }
  if (desc.length > c.segments->slotSize()) {
    return refuse(FL_ERR_TOO_LARGE, "length " + std::to_string(desc.length) + " exceeds the slot size " +
                                        std::to_string(c.segments->slotSize()));
  }
  std::memcpy(sh, c.segments->slotHeader(desc.slot), sizeof(*sh));  // private copy
  if (sh->attr_length > FL_MAX_ATTR_BYTES || (sh->flags & ~uint32_t{FL_SLOT_HAS_CRC32C}) != 0) {
    return refuse(FL_ERR_BAD_METADATA, "slot header invalid (attr_length " + std::to_string(sh->attr_length) +
                                           " > " + std::to_string(FL_MAX_ATTR_BYTES) + " or unknown flags)");
  }
  if (ac.route == kNoPeer && !deliversLocally(ac)) {
    return refuse(FL_ERR_NO_ROUTE, config_.whyNoRoute(c.stream) +
                                       " and no consumer of it is attached to this daemon (add --route " +
                                       c.stream + "=PEER, or attach a consumer here)");
  }
  return true;
}

void OutboundStreams::onSubmit(AgentClient& ac, const fl_submit_desc& desc) {
  ClientSession& c = *ac.session;
  if (refusingFrames() && desc.slot < c.slots.size() && c.slots[desc.slot].state == SlotState::kFree) {
    metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.recordFailure(FL_ERR_SHUTDOWN);
    clients_.complete(c, desc.slot, FL_ERR_SHUTDOWN, 0, desc.length, submittedFrameId(c, desc));
    return;
  }
  fl_slot_header sh;
  int status = FL_OK;
  std::string why;
  if (!checkSubmit(ac, desc, &sh, &status, &why)) {
    rejectSubmit(c, desc, status, why);
    return;
  }
  if (deliversLocally(ac)) {  // a stream of this host: its consumers are attached here
    metrics_.counters.frames_submitted.fetch_add(1, std::memory_order_relaxed);
    local_->submit(ac, desc.slot, sh, desc.length);
    return;
  }
  const Ways ways = waysOf(ac);
  metrics_.counters.frames_submitted.fetch_add(1, std::memory_order_relaxed);
  if (ways.legs == 0) {
    // The queue group's share is here and no other host has a subscriber,
    // or no host has readers now: the readers here, or the first to come.
    if (local_ != nullptr) {
      local_->submit(ac, desc.slot, sh, desc.length);
    } else {
      metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
      metrics_.recordFailure(FL_ERR_NO_CONSUMER);
      clients_.complete(c, desc.slot, FL_ERR_NO_CONSUMER, 0, desc.length, sh.frame_id);
    }
    return;
  }
  const uint64_t now = clock_.nowNs();
  Leg first = static_cast<Leg>(kMaxRoutesPerStream);
  for (Leg leg = 0; leg < legs(ac); ++leg) {
    if ((ways.legs & sideBit(leg)) == 0) continue;
    submitOn(ac, leg, desc.slot, sh, desc.length, now, (ways.subscribers_only & sideBit(leg)) != 0);
    first = std::min(first, leg);
  }
  if (first != 0) {
    // The frame is the session slot's, though its first route does not
    // carry it: the slot is lent to the routes that do until they are done.
    SlotEntry& e = c.slots[desc.slot];
    e = SlotEntry{};
    e.state = SlotState::kLent;
    e.sequence = legSlot(ac, first, desc.slot).sequence;
    e.length = desc.length;
    e.frame_id = sh.frame_id;
    e.submitted_ns = now;
  }
  ++c.in_progress;
  // Posted by pumpAll() at the end of this round, with every other stream's.
  if (ways.here || ways.legs != sideBit(0)) {
    Sides& sides = sides_[{c.id, desc.slot}];
    sides = Sides{};
    sides.waiting = ways.legs | (ways.here ? kLocalSide : 0);
  }
  // The readers here read the same slot meanwhile (lent, no copy).
  if (ways.here) local_->submit(ac, desc.slot, sh, desc.length, true, ways.here_members);
}

void OutboundStreams::submitOn(AgentClient& ac, Leg leg, uint32_t slot, const fl_slot_header& sh,
                               uint64_t length, uint64_t now, bool subscribers_only) {
  ClientSession& c = *ac.session;
  const PeerId peer = legPeer(ac, leg);
  // Opened at attach, and kept while a producer of it is attached.
  uint64_t& stream_id = legStream(ac, leg);
  OutStream* sp = stream(peer, stream_id);
  if (sp == nullptr) {
    stream_id = openStream(peer, c.stream);
    sp = stream(peer, stream_id);
  }
  OutStream& s = *sp;

  transport::FrameHeader& h = legHeader(ac, leg, slot);
  h = transport::FrameHeader{};
  transport::fromSlotHeader(sh, &h);
  // A producer's slot header has no say in these.
  h.stream_id = s.id;
  h.sequence = s.next_sequence++;
  h.length = length;
  h.subscribers_only = subscribers_only ? 1 : 0;
  if (subscribers_only) metrics_.counters.frames_subscribers_only.fetch_add(1, std::memory_order_relaxed);

  SlotEntry& e = legSlot(ac, leg, slot);
  e = SlotEntry{};
  e.state = SlotState::kPending;
  e.sequence = h.sequence;
  e.length = length;
  e.frame_id = sh.frame_id;
  e.stream_id = s.id;
  e.submitted_ns = now;
  e.producer.deadline_ns = creditDeadline(now);
  s.pending.emplace(h.sequence, FrameRef{c.id, slot, leg});
}

transport::PostResult OutboundStreams::post(AgentLink& l, AgentClient& ac, Leg leg, uint32_t slot,
                                            const transport::RemoteCredit& credit, uint64_t cookie) {
  ClientSession& c = *ac.session;
  SlotEntry& e = legSlot(ac, leg, slot);
  // The receiving daemon restarted since this frame was last sent: the one
  // before may have delivered it, and the new one cannot know.
  if (e.producer.sent_to_instance != 0 && e.producer.sent_to_instance != l.peer_instance &&
      !e.producer.maybe_redelivered) {
    e.producer.maybe_redelivered = true;
    metrics_.counters.frames_maybe_redelivered.fetch_add(1, std::memory_order_relaxed);
  }
  transport::SendRequest req;
  req.cookie = cookie;
  req.header = legHeader(ac, leg, slot);
  req.header.credit_id = credit.credit_id;
  req.header.maybe_redelivered = e.producer.maybe_redelivered ? 1 : 0;
  req.payload = c.segments->slot(slot);
  req.local_key = c.segments->localKey();  // from the registration made at attach
  req.credit = credit;
  if (!credit.pull) {
    const transport::PostResult r = l.transport->post(req);
    if (r == transport::PostResult::kOk) ++l.data_sent;
    return r;
  }
  // Pull: the payload is exposed to this link's reads, exactly this frame's
  // bytes, and named in an offer into the credit.  On rdma the window's bind
  // is on the send queue ahead of the control record that carries the offer.
  std::shared_ptr<void> pin = SourcePins::pin(pins_, cookie, c.segments);
  last_pin_ = pin;
  auto remote =
      l.transport->exposeSource(transport::LocalSource{cookie, req.payload, req.header.length, pin});
  if (!remote) {
    offer_refusal_ = remote.error().message;
    switch (remote.error().code) {
      case FL_ERR_RESOURCES:
        return transport::PostResult::kBackpressure;
      case FL_ERR_LINK_LOST:
        return transport::PostResult::kNotConnected;
      default:
        return transport::PostResult::kInvalid;
    }
  }
  v1::PeerMessage msg;
  auto* offer = msg.mutable_offer();
  transport::toProto(req.header, offer->mutable_header());
  offer->set_source_id(remote->source_id);
  offer->set_remote_addr(remote->remote_addr);
  offer->set_rkey(remote->rkey);
  l.send(std::move(msg));
  metrics_.counters.frames_offered.fetch_add(1, std::memory_order_relaxed);
  return transport::PostResult::kOk;
}

void OutboundStreams::markPosted(const AgentLink& l, PeerId peer, OutStream& s, FrameRef f, SlotEntry& e,
                                 uint64_t cookie) {
  e.state = SlotState::kPosted;
  e.producer.post_cookie = cookie;
  e.link_id = l.id;
  e.producer.sent_to_instance = l.peer_instance;
  e.producer.was_posted = true;
  ++e.producer.posts_out;
  ++e.producer.posts;
  s.unacked[e.sequence] = f;
  posted_[cookie] = Posted{f, peer, s.id, e.sequence, l.id};
}

void OutboundStreams::unpost(SlotEntry& e, uint64_t deadline_ns) {
  // The post stays in posted_ (and in posts_out) until its transport reports
  // it: that transport may still be reading the slot.  An offer's source is
  // retracted now: a frame goes again as a new offer.
  endOffer(e);
  e.state = SlotState::kPending;
  e.producer.post_cookie = 0;
  e.link_id = 0;
  e.producer.deadline_ns = deadline_ns;
}

size_t OutboundStreams::pump(PeerId peer, OutStream& s) {
  AgentLink* l = links_.find(peers_[peer].link_id);
  if (l == nullptr || !l->usable()) return 0;
  size_t posted = 0;
  size_t work = 0;
  struct FlushAtEnd {
    transport::Transport* t;
    const size_t& n;
    ~FlushAtEnd() {
      if (n > 0) t->flush();
    }
  } flush_at_end{l->transport.get(), posted};
  while (!s.pending.empty() && !s.credits.empty()) {
    auto first = s.pending.begin();
    const uint64_t sequence = first->first;
    FrameRef f = first->second;
    AgentClient* ac = clients_.find(f.client_id);
    if (ac == nullptr || legSlot(*ac, f.leg, f.slot).state != SlotState::kPending ||
        legSlot(*ac, f.leg, f.slot).sequence != sequence) {
      s.pending.erase(first);
      ++work;
      continue;
    }
    SlotEntry& e = legSlot(*ac, f.leg, f.slot);
    auto fit = fittingCredit(s, e.length);
    if (fit == s.credits.end()) {
      // A consumer with such slots exists: wait for its credit.  So does a
      // frame sent before (a replay): it fitted a credit of this stream, and
      // it may already be at that consumer, so it is never refused here.
      if (e.length <= s.largest_credit || e.producer.was_posted) break;
      s.pending.erase(first);
      ++work;
      finishFrame(*ac, f.leg, f.slot, FL_ERR_TOO_LARGE,
                  "frame of " + std::to_string(e.length) +
                      " bytes does not fit any consumer's slots on peer " + peers_[peer].name +
                      " (the largest are " + std::to_string(s.largest_credit) +
                      " bytes; attach a consumer with a larger slot size)");
      continue;
    }
    const transport::RemoteCredit credit = *fit;
    const uint64_t cookie = next_cookie_++;
    transport::PostResult r = post(*l, *ac, f.leg, f.slot, credit, cookie);
    if (r == transport::PostResult::kBackpressure || r == transport::PostResult::kNotConnected) {
      return work + 1;  // the transport takes it later: still work
    }
    s.pending.erase(first);
    s.by_credit_id.erase(fit->credit_id);
    s.credits.erase(fit);
    maybeSayLow(*l, s);
    ++work;
    if (r == transport::PostResult::kInvalid) {
      // A copy posted before may be at the consumer: its fate is unknown.
      finishFrame(*ac, f.leg, f.slot, e.producer.was_posted ? FL_ERR_TIMEOUT : FL_ERR_TRANSPORT,
                  "the transport refused the frame: " +
                      (credit.pull ? offer_refusal_ : std::string(l->transport->lastRefusal())) +
                      (e.producer.was_posted ? " (an earlier copy may have been delivered)" : ""));
      continue;
    }
    markPosted(*l, peer, s, f, e, cookie);
    if (credit.pull) {
      // Offered: nothing more of it goes out, and no send completes it; the
      // source stays until the answer (endOffer).
      posted_[cookie].offered = true;
      posted_[cookie].pin = last_pin_;
      e.state = SlotState::kSent;
      e.producer.deadline_ns = ackDeadline(clock_.nowNs());
    }
    ++l->frames_out;
    ++posted;
  }
  return work;
}

size_t OutboundStreams::pumpAll() {
  size_t work = settleSources();
  for (PeerId peer = 0; peer < out_.size(); ++peer) {
    // A link that is closing takes no posts until it is down: frames and
    // credits waiting for it are no work (counting them would spin the agent).
    const AgentLink* l = links_.find(peers_[peer].link_id);
    if (l == nullptr || !l->usable()) continue;
    PeerOut& po = out_[peer];
    if (po.streams.empty()) continue;
    // Every stream once, starting one further than the round before.
    auto start = po.streams.lower_bound(po.first_pumped);
    if (start == po.streams.end()) start = po.streams.begin();
    auto it = start;
    do {
      OutStream& s = it->second;
      // Frames waiting for a credit they fit are no work either.
      if (!s.pending.empty() && !s.credits.empty()) work += pump(peer, s);
      if (++it == po.streams.end()) it = po.streams.begin();
    } while (it != start);
    po.first_pumped = start->first + 1;
  }
  return work;
}

void OutboundStreams::onLinkUp(AgentLink& l) {
  PeerEntry& p = peers_[l.peer];
  if (p.link_id != 0 && p.link_id != l.id) {
    spdlog::info("peer {}: link {} replaces link {}", p.name, l.id, p.link_id);
    // The old link is not down yet (its end is noticed later, or never, when
    // the peer restarted).  What it carried without an ACK goes first on the
    // new link, before any newer frame.
    requeueUnacked(p.link_id, "link " + std::to_string(l.id) + " replaces it");
  }
  p.link_id = l.id;
  p.ever_linked = true;
  for (auto& [id, s] : peerOut(l.peer).streams) {
    dropCredits(s);
    announce(l, s);
  }
}

void OutboundStreams::onLinkDown(const AgentLink& l, const std::string& reason) {
  PeerEntry& p = peers_[l.peer];
  const bool was_route = p.link_id == l.id;
  if (was_route) {
    p.link_id = 0;
    for (auto& [id, s] : peerOut(l.peer).streams) {
      dropCredits(s);
      s.announced = false;
    }
  }
  // Nothing sent on this link is lost: what the peer did not acknowledge
  // goes again on the next link, and the peer drops what it already had.
  requeueUnacked(l.id, reason);
  // This link had replaced another that is still up: the route goes back
  // to that one, as to a new link, rather than wait for a link that may
  // never come.
  AgentLink* older = was_route ? links_.usableToPeer(l.peer, l.id) : nullptr;
  if (older == nullptr) return;
  spdlog::info("peer {}: link {} is down; the route moves back to link {}, still up", p.name, l.id,
               older->id);
  onLinkUp(*older);
}

void OutboundStreams::requeueUnacked(uint64_t link_id, const std::string& reason) {
  const uint64_t deadline = creditDeadline(clock_.nowNs());
  for (PeerId peer = 0; peer < out_.size(); ++peer) {
    for (auto& [id, s] : out_[peer].streams) {
      std::vector<std::pair<uint64_t, FrameRef>> replay;
      for (auto it = s.unacked.begin(); it != s.unacked.end();) {
        AgentClient* ac = clients_.find(it->second.client_id);
        if (ac == nullptr) {
          it = s.unacked.erase(it);
          continue;
        }
        SlotEntry& e = legSlot(*ac, it->second.leg, it->second.slot);
        if (e.link_id != link_id || (e.state != SlotState::kPosted && e.state != SlotState::kSent)) {
          ++it;
          continue;
        }
        unpost(e, deadline);  // FAILED(LINK_LOST) when no link takes it in time
        replay.emplace_back(it->first, it->second);
        it = s.unacked.erase(it);
      }
      if (replay.empty()) continue;
      // In sequence order with the frames that never left (and those a NACK
      // sent back): the next link carries the stream in order.
      std::sort(replay.begin(), replay.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [sequence, frame] : replay) s.pending.emplace(sequence, frame);
      metrics_.counters.frames_replayed.fetch_add(replay.size(), std::memory_order_relaxed);
      out_[peer].replayed += replay.size();
      spdlog::info(
          "peer {} stream '{}': {} unacknowledged frames (seq {}..{}) will be sent again on the next "
          "link ({})",
          peers_[peer].name, s.name, replay.size(), replay.front().first, replay.back().first, reason);
    }
  }
}

void OutboundStreams::checkDeadlines() {
  const uint64_t now = clock_.nowNs();
  std::vector<uint64_t> ids;
  for (auto& [id, c] : clients_.all()) {
    if (c.session->role == FL_ROLE_PRODUCER && c.session->in_progress > 0) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    AgentClient* ac = clients_.find(id);
    if (ac == nullptr) continue;
    for (Leg leg = 0; leg < legs(*ac); ++leg) checkDeadlines(*ac, leg, now);
    maybeForget(*ac);
  }
}

void OutboundStreams::checkDeadlines(AgentClient& ac, Leg leg, uint64_t now) {
  static const std::string kNoPeerName;
  ClientSession& c = *ac.session;
  const PeerId route = legPeer(ac, leg);
  for (uint32_t slot = 0; slot < c.slots.size(); ++slot) {
    SlotEntry& e = legSlot(ac, leg, slot);
    if (e.producer.deadline_ns == 0 || now < e.producer.deadline_ns) continue;
    OutStream* s = route != kNoPeer ? stream(route, e.stream_id) : nullptr;
    const std::string& peer_name = route != kNoPeer ? peers_[route].name : kNoPeerName;
    if (e.state == SlotState::kPending) {
      const bool link_up = route != kNoPeer && peers_[route].link_id != 0;
      if (s != nullptr) {
        auto f = s->pending.find(e.sequence);
        if (f != s->pending.end() && f->second.client_id == c.id && f->second.slot == slot &&
            f->second.leg == leg) {
          s->pending.erase(f);
        }
      }
      if (e.producer.was_posted) {
        // Sent before and waiting to be sent again: the consumer may have
        // it, so its fate is unknown -- never a FAILED that says nobody did.
        finishFrame(ac, leg, slot, FL_ERR_TIMEOUT,
                    "frame sent to peer " + peer_name +
                        " was neither acknowledged nor sent again within its deadline (it may have been "
                        "delivered)");
      } else if (link_up) {
        finishFrame(ac, leg, slot, FL_ERR_NO_CONSUMER,
                    "no consumer of stream '" + c.stream + "' on peer " + peer_name +
                        " took the frame within " + std::to_string(config_.credit_timeout_ms) + " ms");
      } else if (route != kNoPeer && !peers_[route].ever_linked) {
        // Not a link that broke: one that never was.  What is wrong is
        // in `framelink links` (its last error) and this daemon's log.
        finishFrame(ac, leg, slot, FL_ERR_NO_LINK,
                    "peer " + peer_name + " has not linked with this daemon since it started (" +
                        std::to_string(config_.credit_timeout_ms) +
                        " ms waited); `framelink links` shows its last error");
      } else {
        finishFrame(
            ac, leg, slot, FL_ERR_LINK_LOST,
            "no link to peer " + peer_name + " within " + std::to_string(config_.credit_timeout_ms) + " ms");
      }
    } else if (e.state == SlotState::kSent) {
      if (s != nullptr) s->unacked.erase(e.sequence);
      finishFrame(ac, leg, slot, FL_ERR_TIMEOUT,
                  "no acknowledgement from peer " + peer_name + " within " +
                      std::to_string(config_.ack_timeout_ms) + " ms");
    }
  }
}

void OutboundStreams::maybeForget(AgentClient& c) {
  // A producer that went away stays until each frame it submitted has ended
  // (delivered, or failed by a NACK, the link or a deadline): the frames are
  // still sent, and a transport may still be reading its slots.  Nobody
  // reads the completions any more; the counters still count them.
  const ClientSession& s = *c.session;
  if (!s.gone) return;
  const bool producer = s.role == FL_ROLE_PRODUCER;
  if (producer && s.in_progress > 0) return;
  std::vector<std::pair<PeerId, uint64_t>> streams;
  if (producer) {
    for (Leg leg = 0; leg < legs(c); ++leg) streams.emplace_back(legPeer(c, leg), legStream(c, leg));
  }
  clients_.erase(s.id);  // c is gone now
  for (const auto& [peer, stream_id] : streams) forgetStreamIfUnused(peer, stream_id);
}

void OutboundStreams::forgetStreamIfUnused(PeerId peer, uint64_t stream_id) {
  for (auto& [id, c] : clients_.all()) {
    // Attached, or gone with frames in flight.
    if (c.session->role != FL_ROLE_PRODUCER) continue;
    for (Leg leg = 0; leg < legs(c); ++leg) {
      if (legPeer(c, leg) == peer && legStream(c, leg) == stream_id) return;
    }
  }
  PeerOut& po = peerOut(peer);
  auto sit = po.streams.find(stream_id);
  if (sit == po.streams.end()) return;
  const OutStream& s = sit->second;
  if (!s.pending.empty() || !s.unacked.empty()) return;
  metrics_.counters.streams_forgotten.fetch_add(1, std::memory_order_relaxed);  // counted before it is said
  if (AgentLink* l = links_.find(peers_[peer].link_id); l != nullptr && s.announced) {
    v1::PeerMessage msg;
    msg.mutable_stream_close()->set_stream_id(s.id);
    l->send(std::move(msg));
  }
  po.by_name.erase(s.name);
  po.streams.erase(sit);
}

OutboundStreams::PeerTraffic OutboundStreams::traffic(PeerId peer) const {
  PeerTraffic t;
  if (peer >= out_.size()) return t;
  t.replayed = out_[peer].replayed;
  for (const auto& [id, s] : out_[peer].streams) {
    t.in_flight += s.unacked.size();
    t.pending += s.pending.size();
    t.pulled += s.pull ? 1 : 0;
  }
  return t;
}

void OutboundStreams::collectStats(std::vector<StreamStats>& out) const {
  for (PeerId peer = 0; peer < out_.size(); ++peer) {
    for (const auto& [id, s] : out_[peer].streams) {
      out.push_back(StreamStats{peers_[peer].name, s.name, id, s.next_sequence, s.credits.size(),
                                s.pending.size(), s.unacked.size()});
    }
  }
}

}  // namespace framelink
