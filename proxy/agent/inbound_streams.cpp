#include "agent/inbound_streams.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "framelink/framelink.h"
#include "transport/frame_header.h"

namespace framelink {

namespace {

bool resendable(int code) { return code == FL_ERR_CRC_MISMATCH || code == FL_ERR_UNKNOWN_CREDIT; }

}  // namespace

InboundStreams::InboundStreams(Metrics& metrics, ClientTable& clients, LinkTable& links, NameTable& names,
                               const AgentClock& clock, uint64_t ack_delay_ns)
    : metrics_(metrics),
      clients_(clients),
      links_(links),
      names_(names),
      clock_(clock),
      ack_delay_ns_(ack_delay_ns) {}

void InboundStreams::onConsumerAttached(AgentClient& c) {
  c.stream = names_.acquire(c.session->stream);
  grantCredits(c.stream);
}

void InboundStreams::onConsumerGone(AgentClient& ac) {
  ClientSession& c = *ac.session;
  std::map<std::pair<uint64_t, uint64_t>, v1::PeerMessage> revokes;
  for (SlotEntry& e : c.slots) {
    if (e.state == SlotState::kCredited) {
      auto it = credits_.find(e.credit_id);
      if (it != credits_.end()) {
        if (AgentLink* l = links_.find(it->second.link_id)) {
          if (l->transport) l->transport->retractCredit(e.credit_id);
          auto& msg = revokes[{l->id, it->second.stream_id}];
          msg.mutable_credit_revoke()->set_stream_id(it->second.stream_id);
          msg.mutable_credit_revoke()->add_credit_ids(e.credit_id);
        }
        credits_.erase(it);
      }
    } else if (e.state == SlotState::kDelivered) {
      // Not held any more; a replay of it (the NACK may be lost with the
      // link) gets the same refusal instead of waiting for a release.
      auto ist = in_states_.find(e.in_state);
      AgentLink* to = links_.find(e.peer_key);
      if (ist != in_states_.end()) {
        InState& in = ist->second;
        in.held.erase(e.sequence);
        in.refused[e.sequence] = FL_ERR_NO_CONSUMER;
        // The link it came on may be gone; the sender hears it on the one
        // that replaced it (and on every later one: onLinkUp).
        if (to == nullptr || !to->usable()) to = linkOf(in.peer, in.instance);
      }
      if (to != nullptr) {
        sendNack(*to, e.stream_id, e.sequence, FL_ERR_NO_CONSUMER,
                 "the consumer died before releasing the frame");
      }
    }
    e = SlotEntry{};
  }
  // Its regions go too: the peer forgets them, and their ids are free again.
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->first.second != c.id) {
      ++it;
      continue;
    }
    const uint64_t link_id = it->first.first;
    if (it->second.announced) {
      auto msg = revokes.lower_bound({link_id, 0});
      if (msg == revokes.end() || msg->first.first != link_id) msg = revokes.try_emplace(msg, {link_id, 0});
      msg->second.mutable_credit_revoke()->add_retired_regions(it->second.id);
    }
    it = regions_.erase(it);
  }
  for (auto& [key, msg] : revokes) {
    if (AgentLink* l = links_.find(key.first)) l->send(std::move(msg));
  }
}

void InboundStreams::onRelease(AgentClient& ac, const fl_submit_desc& desc) {
  ClientSession& c = *ac.session;
  auto reject = [&](int status, const std::string& why) {
    metrics_.counters.bad_descriptors.fetch_add(1, std::memory_order_relaxed);
    ++c.errors;
    log_client_errors_.warn("client {} stream '{}': release of slot {} rejected: {}: {}", c.id, c.stream,
                            desc.slot, statusName(status), why);
    clients_.complete(c, desc.slot, status, 0, 0, 0);
  };
  if (desc.slot >= c.slots.size()) {
    reject(FL_ERR_BAD_SLOT,
           "slot index out of range (the client has " + std::to_string(c.slots.size()) + " slots)");
    return;
  }
  if (desc.flags != 0) {
    reject(FL_ERR_BAD_DESCRIPTOR, "reserved descriptor flags are set");
    return;
  }
  SlotEntry& e = c.slots[desc.slot];
  if (e.state != SlotState::kDelivered) {
    reject(FL_ERR_DOUBLE_RELEASE,
           std::string("the slot holds no delivered frame (it is ") + slotStateName(e.state) + ")");
    return;
  }
  metrics_.counters.frames_released.fetch_add(1, std::memory_order_relaxed);
  auto ist = in_states_.find(e.in_state);
  if (ist != in_states_.end()) {
    InState& in = ist->second;
    in.held.erase(e.sequence);
    in.released.push_back(e.sequence);
    if (in.released.size() > kMaxRemembered) in.released.pop_front();
    // The ACK goes over the sender's current link, which need not be the
    // one the frame came over.  With no link up it is not sent: the sender
    // replays the frame on its next link and gets the ACK then.
    if (const AgentLink* target = links_.usableTo(in.peer, in.instance)) {
      // Held back with the sender's other releases until enough of them
      // wait to be worth a control record, or not for long (flushControl).
      // The slot is granted again with the ACK.
      HeldBack& held = held_back_[{target->id, in.stream_id}];
      if (held.acks.empty()) held.since_ns = clock_.nowNs();
      held.acks.push_back(e.sequence);
      held.stream = ac.stream;
      e = SlotEntry{};
      return;
    }
    spdlog::debug("client {}: released seq {} while no link to its sender is up; ACK follows its replay",
                  c.id, e.sequence);
  }
  e = SlotEntry{};
  dirty_grants_.insert(ac.stream);
}

bool InboundStreams::due(const Target& target, const HeldBack& held, uint64_t now_ns) const {
  if (held.now || ack_delay_ns_ == 0) return true;
  if (held.acks.empty()) return false;
  if (held.low || now_ns - held.since_ns >= ack_delay_ns_) return true;
  // A quarter of what the sender may hold: it still has the other three
  // quarters to send while this goes back.
  auto window = windows_.find(target);
  const size_t quarter = window == windows_.end() ? 1 : std::max<size_t>(1, window->second / 4);
  return held.acks.size() >= quarter;
}

void InboundStreams::sendAcks(AgentLink& l, uint64_t stream_id, const std::vector<uint64_t>& sequences) {
  for (size_t i = 0; i < sequences.size(); i += peer::kMaxAcksPerMessage) {
    v1::PeerMessage msg;
    auto* ack = msg.mutable_ack();
    ack->set_stream_id(stream_id);
    const size_t end = std::min(sequences.size(), i + peer::kMaxAcksPerMessage);
    peer::encodeAck(sequences.data() + i, end - i, ack);
    l.send(std::move(msg));
  }
}

void InboundStreams::flushControl() {
  const uint64_t now = held_back_.empty() ? 0 : clock_.nowNs();
  for (auto it = held_back_.begin(); it != held_back_.end();) {
    HeldBack& held = it->second;
    if (!due(it->first, held, now)) {
      ++it;
      continue;
    }
    if (AgentLink* l = links_.find(it->first.first)) sendAcks(*l, it->first.second, held.acks);
    if (held.stream != kNoName) dirty_grants_.insert(held.stream);
    it = held_back_.erase(it);
  }
  // Granting a stream's slots hands out every free one, those held back for
  // another sender of the stream too: their ACKs still wait, their credits
  // need not.
  for (NameKey stream : dirty_grants_) grantCredits(stream);
  dirty_grants_.clear();
}

uint64_t InboundStreams::nextControlDeadlineNs() const {
  uint64_t next = 0;
  for (const auto& [target, held] : held_back_) {
    if (held.acks.empty()) continue;
    const uint64_t at = held.since_ns + ack_delay_ns_;
    if (next == 0 || at < next) next = at;
  }
  return next;
}

void InboundStreams::onCreditLow(AgentLink& l, const peer::CreditLow& low) {
  auto in = l.in_streams.find(low.stream_id);
  if (in == l.in_streams.end()) return;  // not open on this link: nothing waits for it
  HeldBack& held = held_back_[{l.id, low.stream_id}];
  if (held.acks.empty()) {
    held.low = true;
  } else {
    held.now = true;
  }
  // Slots released by the stream's other senders, still waiting, may go to this one now.
  dirty_grants_.insert(in->second.key);
}

void InboundStreams::dropHeldBack(uint64_t link_id) {
  for (auto it = held_back_.lower_bound({link_id, 0});
       it != held_back_.end() && it->first.first == link_id;) {
    // The ACKs go again on the sender's next link (onLinkUp).
    if (it->second.stream != kNoName) dirty_grants_.insert(it->second.stream);
    it = held_back_.erase(it);
  }
  windows_.erase(windows_.lower_bound({link_id, 0}), windows_.lower_bound({link_id + 1, 0}));
}

void InboundStreams::grantCredits(NameKey stream) {
  if (stream == kNoName) return;
  // Where can credits go: every usable link with an open in-stream of this name.
  std::vector<std::pair<uint64_t, uint64_t>> targets;  // (link, stream id)
  for (auto& [id, l] : links_) {
    if (!l.usable()) continue;
    for (auto& [sid, in] : l.in_streams) {
      if (in.key == stream) targets.emplace_back(id, sid);
    }
  }
  if (targets.empty()) return;
  size_t window = 0;  // what each sender may hold: its share of every consumer
  for (auto& [cid, ac] : clients_.all()) {
    const ClientSession& c = *ac.session;
    if (!c.gone && c.role == FL_ROLE_CONSUMER && ac.stream == stream) {
      window += (c.slots.size() + targets.size() - 1) / targets.size();
    }
  }
  for (const auto& target : targets) windows_[target] = window;
  // Fair shares: when several peers send this stream, none holds more than
  // its share of each consumer's slots, or one with nothing to send would sit
  // on them while another starves (and each sees every consumer's slot size).
  uint64_t largest_slot = 0;
  for (auto& [cid, ac] : clients_.all()) {
    const ClientSession& c = *ac.session;
    if (!c.gone && c.role == FL_ROLE_CONSUMER && ac.stream == stream) {
      largest_slot = std::max<uint64_t>(largest_slot, c.segments->slotSize());
    }
  }
  std::map<std::pair<Target, uint64_t>, size_t> held;  // credits out per (target, consumer)
  for (const auto& [credit_id, entry] : credits_) {
    if (!entry.recalled) ++held[{{entry.link_id, entry.stream_id}, entry.client_id}];
  }
  std::map<Target, v1::PeerMessage> grants;
  std::map<Target, v1::PeerMessage> recalls;
  // A link whose transport went down (its LinkDown not handled yet) refuses
  // to expose a slot: what was decided before that still goes out, or the
  // credits already entered would be held by no one and those marked
  // recalled would never be asked back.
  bool exposing = true;
  for (auto& [cid, ac] : clients_.all()) {
    if (!exposing) break;
    ClientSession& c = *ac.session;
    if (c.gone || c.role != FL_ROLE_CONSUMER || ac.stream != stream) continue;
    const size_t share = (c.slots.size() + targets.size() - 1) / targets.size();
    for (uint32_t s = 0; s < c.slots.size(); ++s) {
      SlotEntry& e = c.slots[s];
      if (e.state != SlotState::kFree) continue;
      Target target{0, 0};
      for (size_t tries = 0; tries < targets.size() && target.first == 0; ++tries) {
        const Target candidate = targets[grant_cursor_++ % targets.size()];
        if (held[{candidate, cid}] < share) target = candidate;
      }
      if (target.first == 0) break;  // every sender holds its share of this consumer
      AgentLink& l = *links_.find(target.first);
      Region* region = regionOf(l.id, cid, c);
      const uint32_t generation = nextGeneration();
      transport::LocalCredit local;
      local.credit_id = region != nullptr ? peer::slotCreditId(region->id, s, generation) : generation;
      local.buffer = c.segments->slot(s);
      local.capacity = c.segments->slotSize();
      local.keepalive = c.segments;
      auto remote = l.transport->exposeCredit(std::move(local));
      if (!remote) {
        spdlog::error("link {} (peer {}): cannot expose a receive slot: {}", l.id, l.peer_name,
                      remote.error().message);
        exposing = false;
        break;
      }
      ++held[{target, cid}];
      credits_[remote->credit_id] = CreditEntry{cid, s, l.id, target.second};
      e.state = SlotState::kCredited;
      e.credit_id = remote->credit_id;
      e.peer_key = l.id;
      e.stream_id = target.second;
      auto& msg = grants[target];
      auto* grant = msg.mutable_credit_grant();
      grant->set_stream_id(target.second);
      grant->set_largest_slot(largest_slot);
      if (region != nullptr && !region->announced) {
        // Slots lie slot_stride apart in the consumer's segment, and so do
        // the addresses a transport that has them gives out.
        region->slot_stride = remote->remote_addr != 0 ? c.segments->geometry().slot_stride : 0;
        region->base_addr = remote->remote_addr - uint64_t{s} * region->slot_stride;
        region->rkey = remote->rkey;
        region->slot_bytes = remote->length;
        region->announced = true;
        auto* r = grant->add_regions();
        r->set_region_id(region->id);
        r->set_base_addr(region->base_addr);
        r->set_rkey(region->rkey);
        r->set_slot_stride(region->slot_stride);
        r->set_slot_bytes(region->slot_bytes);
        r->set_slot_count(static_cast<uint32_t>(c.slots.size()));
      }
      if (region != nullptr && remote->remote_addr == region->base_addr + uint64_t{s} * region->slot_stride &&
          remote->rkey == region->rkey && remote->length == region->slot_bytes) {
        grant->add_slot_credits(remote->credit_id);
      } else {
        // Not where the region says (a transport that registers slots one
        // by one): the credit goes whole.
        auto* credit = grant->add_credits();
        credit->set_credit_id(remote->credit_id);
        credit->set_length(remote->length);
        credit->set_remote_addr(remote->remote_addr);
        credit->set_rkey(remote->rkey);
        metrics_.counters.credits_granted_whole.fetch_add(1, std::memory_order_relaxed);
      }
      metrics_.counters.credits_granted.fetch_add(1, std::memory_order_relaxed);
    }
    // A sender still below its share of this consumer with no free slot
    // left: recall what the others hold beyond theirs.  They give back what
    // they have not used (onCreditsReturned), and only then are those slots
    // granted again.
    if (!exposing) break;
    const uint64_t consumer = cid;  // a copy: clang 14 cannot capture a structured binding
    const bool starving = std::any_of(targets.begin(), targets.end(), [&](const Target& t) {
      return held[{t, consumer}] < share;
    });
    if (!starving) continue;
    for (auto& [credit_id, entry] : credits_) {
      const Target owner{entry.link_id, entry.stream_id};
      if (entry.client_id != cid || entry.recalled || held[{owner, cid}] <= share) continue;
      if (std::find(targets.begin(), targets.end(), owner) == targets.end()) continue;
      entry.recalled = true;
      --held[{owner, cid}];
      auto& msg = recalls[owner];
      msg.mutable_credit_revoke()->set_stream_id(owner.second);
      msg.mutable_credit_revoke()->add_credit_ids(credit_id);
    }
  }
  for (auto& [target, msg] : grants) {
    if (AgentLink* l = links_.find(target.first)) l->send(std::move(msg));
  }
  for (auto& [owner, msg] : recalls) {
    metrics_.counters.credits_recalled.fetch_add(msg.credit_revoke().credit_ids_size(),
                                                 std::memory_order_relaxed);
    if (AgentLink* l = links_.find(owner.first)) l->send(std::move(msg));
  }
}

InboundStreams::Region* InboundStreams::regionOf(uint64_t link_id, uint64_t client_id,
                                                 const ClientSession& consumer) {
  auto it = regions_.find({link_id, client_id});
  if (it != regions_.end()) return &it->second;
  if (consumer.slots.size() > peer::kMaxRegionSlots) return nullptr;
  // The lowest id the link does not use (regions are made once per
  // consumer and link, so this walk is rare).
  std::set<uint32_t> used;
  for (auto r = regions_.lower_bound({link_id, 0}); r != regions_.end() && r->first.first == link_id; ++r) {
    used.insert(r->second.id);
  }
  uint32_t id = 1;
  while (used.count(id) != 0) ++id;
  if (id > peer::kMaxRegionId) return nullptr;
  Region& region = regions_[{link_id, client_id}];
  region.id = id;
  return &region;
}

uint32_t InboundStreams::nextGeneration() {
  if (next_generation_ == 0) next_generation_ = 1;
  return next_generation_++;
}

void InboundStreams::onCreditsReturned(AgentLink& l, const peer::CreditRevoke& returned) {
  NameKey stream = kNoName;
  for (uint64_t id : returned.credit_ids) {
    auto it = credits_.find(id);
    // Only what this link held: a peer cannot give back another's credits.
    if (it == credits_.end() || it->second.link_id != l.id || it->second.stream_id != returned.stream_id) {
      continue;
    }
    if (l.transport) l.transport->retractCredit(id);
    if (AgentClient* ac = clients_.find(it->second.client_id)) {
      SlotEntry& e = ac->session->slots[it->second.slot];
      if (e.state == SlotState::kCredited && e.credit_id == id) e = SlotEntry{};
      stream = ac->stream;
    }
    credits_.erase(it);
  }
  if (stream != kNoName) grantCredits(stream);
}

void InboundStreams::sendNack(AgentLink& l, uint64_t stream_id, uint64_t sequence, int code,
                              const std::string& message) {
  metrics_.counters.nacks_sent.fetch_add(1, std::memory_order_relaxed);
  log_refused_.warn("[peer {} stream {} seq {}] refusing frame: {}: {}", l.peer_name, stream_id, sequence,
                    statusName(code), message);
  if (resendable(code) && l.in_streams.count(stream_id) != 0) {
    // Not delivered (damaged in transit, or its credit was withdrawn): the
    // sender sends it again, and that copy is not a duplicate even when
    // later frames arrived meanwhile.
    InState& in = in_states_[inStateId(l, stream_id)];
    in.resend.insert(sequence);
    if (in.resend.size() > kMaxRemembered) in.resend.erase(in.resend.begin());
  } else if (l.in_streams.count(stream_id) != 0) {
    // Remembered so that a replay of this frame gets the same answer.
    InState& in = in_states_[inStateId(l, stream_id)];
    in.refused[sequence] = code;
    if (in.refused.size() > kMaxRemembered) in.refused.erase(in.refused.begin());
    in.highest = std::max(in.highest, sequence);
  }
  v1::PeerMessage msg;
  auto* nack = msg.mutable_nack();
  nack->set_stream_id(stream_id);
  nack->set_sequence(sequence);
  nack->set_code(static_cast<v1::ErrorCode>(code));
  nack->set_message(message);
  l.send(std::move(msg));
}

void InboundStreams::onFrameArrived(AgentLink& l, const transport::TransportEvent& ev) {
  const transport::FrameHeader& h = ev.header;
  ++l.frames_in;
  // A replay of a frame this daemon already answered gets that answer again,
  // whatever credit it came in: refused stays refused, held stays held.  A
  // "send it again" would bring it to another consumer.
  auto answeredBefore = [&] {
    return l.in_streams.count(h.stream_id) != 0 && answerKnown(l, h, "refused before");
  };
  if (ev.status != FL_OK) {
    auto it = credits_.find(h.credit_id);
    if (it != credits_.end() && it->second.link_id == l.id) credits_.erase(it);
    if (ev.status == FL_ERR_UNKNOWN_CREDIT && answeredBefore()) return;
    sendNack(l, h.stream_id, h.sequence, ev.status,
             ev.message.empty() ? "frame for an unknown credit" : ev.message);
    return;
  }
  auto it = credits_.find(h.credit_id);
  if (it == credits_.end() || it->second.link_id != l.id) {
    if (answeredBefore()) return;
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "credit " + std::to_string(h.credit_id) + " was not granted to this link");
    return;
  }
  const CreditEntry credit = it->second;
  credits_.erase(it);
  AgentClient* ac = clients_.find(credit.client_id);
  if (ac == nullptr || ac->session->gone) {
    if (answeredBefore()) return;
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "its receive slot was withdrawn: the consumer detached");
    return;
  }
  ClientSession& c = *ac->session;
  SlotEntry& e = c.slots[credit.slot];
  auto regrant = [&] {
    e = SlotEntry{};
    grantCredits(ac->stream);
  };
  if (h.stream_id != credit.stream_id || l.in_streams.count(h.stream_id) == 0) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_STREAM,
             "frame names stream " + std::to_string(h.stream_id) + " but the credit belongs to stream " +
                 std::to_string(credit.stream_id));
    regrant();
    return;
  }
  if (h.length > c.segments->slotSize() || h.attr_length > FL_MAX_ATTR_BYTES) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_PROTOCOL, "frame header out of bounds");
    regrant();
    return;
  }
  if (dropDuplicate(l, h)) {
    regrant();
    return;
  }
  uint8_t* payload = c.segments->slot(credit.slot);
  if (h.has_crc32c) {
    const uint32_t crc = fl_crc32c(0, payload, h.length);
    if (crc != h.crc32c) {
      sendNack(l, h.stream_id, h.sequence, FL_ERR_CRC_MISMATCH,
               "payload CRC32C mismatch (expected " + std::to_string(h.crc32c) + ", got " +
                   std::to_string(crc) + ")");
      regrant();
      return;
    }
  }
  transport::toSlotHeader(h, c.segments->slotHeader(credit.slot));
  const uint64_t in_state = inStateId(l, h.stream_id);
  InState& in = in_states_[in_state];
  in.highest = std::max(in.highest, h.sequence);
  in.held.insert(h.sequence);
  e.state = SlotState::kDelivered;
  e.sequence = h.sequence;
  e.length = h.length;
  e.frame_id = h.frame_id;
  e.peer_key = l.id;
  e.stream_id = h.stream_id;
  e.in_state = in_state;
  ++c.frames;
  c.bytes += h.length;
  metrics_.counters.frames_received.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.bytes_received.fetch_add(h.length, std::memory_order_relaxed);
  // Release ordering of the ring publishes the slot header and payload.
  clients_.complete(c, credit.slot, FL_OK, h.sequence, h.length, h.frame_id);
}

uint64_t InboundStreams::inStateId(const AgentLink& l, uint64_t stream_id) {
  const InStateKey key{l.peer, l.peer_instance, stream_id};
  auto it = in_state_ids_.find(key);
  if (it != in_state_ids_.end()) return it->second;
  const uint64_t id = next_in_state_id_++;
  in_state_ids_.emplace(key, id);
  InState& in = in_states_[id];
  in.peer = l.peer;
  in.instance = l.peer_instance;
  in.stream_id = stream_id;
  return id;
}

bool InboundStreams::answerKnown(AgentLink& l, const transport::FrameHeader& h, const char* refused_note) {
  auto id = in_state_ids_.find(InStateKey{l.peer, l.peer_instance, h.stream_id});
  if (id == in_state_ids_.end()) return false;
  InState& in = in_states_[id->second];
  if (in.resend.count(h.sequence) != 0) return false;  // asked for again: not answered yet
  if (in.held.count(h.sequence) != 0) {
    metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("[peer {} stream {} seq {}] replay of a frame the consumer still holds: dropped",
                  l.peer_name, h.stream_id, h.sequence);
    return true;  // its consumer still holds it: the ACK or NACK comes with the release
  }
  if (auto refused = in.refused.find(h.sequence); refused != in.refused.end()) {
    metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
    sendNack(l, h.stream_id, h.sequence, refused->second, refused_note);
    return true;
  }
  if (std::find(in.released.begin(), in.released.end(), h.sequence) != in.released.end()) {
    ackAgain(l, h);
    return true;
  }
  return false;
}

void InboundStreams::ackAgain(AgentLink& l, const transport::FrameHeader& h) {
  metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("[peer {} stream {} seq {}] replay of a delivered frame: dropped, ACK sent again",
                l.peer_name, h.stream_id, h.sequence);
  // At once: the sender is replaying, and waits for this answer.
  HeldBack& held = held_back_[{l.id, h.stream_id}];
  held.acks.push_back(h.sequence);
  held.now = true;
}

bool InboundStreams::dropDuplicate(AgentLink& l, const transport::FrameHeader& h) {
  InState& in = in_states_[inStateId(l, h.stream_id)];
  if (in.resend.erase(h.sequence) != 0) return false;  // the copy asked for after a CRC mismatch
  if (h.sequence > in.highest) return false;
  if (answerKnown(l, h, "refused before the link broke")) return true;
  // At or below the highest sequence and no longer remembered: delivered and
  // released before, and the first ACK was lost with the old link.
  ackAgain(l, h);
  return true;
}

std::string InboundStreams::onStreamOpen(AgentLink& l, const peer::StreamOpen& so) {
  auto existing = l.in_streams.find(so.stream_id);
  if (existing == l.in_streams.end() && l.in_streams.size() >= peer::kMaxStreamsPerLink) {
    return "too many streams opened";
  }
  const NameKey key = names_.acquire(so.name);
  if (existing != l.in_streams.end()) {
    names_.release(existing->second.key);
    existing->second = InStream{so.name, key};
  } else {
    l.in_streams.emplace(so.stream_id, InStream{so.name, key});
  }
  spdlog::info("link {} to peer {}: stream '{}' opened (id {})", l.id, l.peer_name, so.name, so.stream_id);
  grantCredits(key);
  return {};
}

void InboundStreams::onStreamClose(AgentLink& l, uint64_t sid) {
  auto it = l.in_streams.find(sid);
  if (it == l.in_streams.end()) return;
  const NameKey key = it->second.key;  // still held: released after the regrant below
  l.in_streams.erase(it);
  // What was held back for the stream goes now; the sender may be gone.
  if (auto held = held_back_.find({l.id, sid}); held != held_back_.end()) held->second.now = true;
  windows_.erase({l.id, sid});
  // The stream's credits go back to their consumers, for other streams.
  for (auto cit = credits_.begin(); cit != credits_.end();) {
    if (cit->second.link_id != l.id || cit->second.stream_id != sid) {
      ++cit;
      continue;
    }
    if (AgentClient* ac = clients_.find(cit->second.client_id)) {
      SlotEntry& e = ac->session->slots[cit->second.slot];
      if (e.state == SlotState::kCredited && e.credit_id == cit->first) e = SlotEntry{};
    }
    if (l.transport) l.transport->retractCredit(cit->first);
    cit = credits_.erase(cit);
  }
  // The sender closes a stream with nothing in flight: what was kept to
  // answer its replays can go, unless a consumer still holds a frame.
  if (auto idit = in_state_ids_.find(InStateKey{l.peer, l.peer_instance, sid}); idit != in_state_ids_.end()) {
    auto ist = in_states_.find(idit->second);
    if (ist == in_states_.end() || ist->second.held.empty()) {
      if (ist != in_states_.end()) in_states_.erase(ist);
      in_state_ids_.erase(idit);
    }
  }
  grantCredits(key);
  names_.release(key);
}

void InboundStreams::onLinkUp(AgentLink& l) {
  // What was kept for an earlier instance of this peer (a restarted daemon)
  // is of no use any more, unless a consumer still holds such a frame.
  for (auto it = in_states_.begin(); it != in_states_.end();) {
    const InState& in = it->second;
    if (in.peer == l.peer && in.instance != l.peer_instance && in.held.empty()) {
      in_state_ids_.erase(InStateKey{in.peer, in.instance, in.stream_id});
      it = in_states_.erase(it);
    } else {
      ++it;
    }
  }
  // The ACKs of recently released frames go again, and so do the recent
  // refusals: the old link may have lost them.
  std::vector<std::tuple<uint64_t, uint64_t, int>> refusals;  // (stream, sequence, code)
  for (const auto& [id, in] : in_states_) {
    if (in.peer != l.peer || in.instance != l.peer_instance) continue;
    if (!in.released.empty()) {
      HeldBack& held = held_back_[{l.id, in.stream_id}];
      held.acks.insert(held.acks.end(), in.released.begin(), in.released.end());
      held.now = true;
    }
    for (const auto& [sequence, code] : in.refused) refusals.emplace_back(in.stream_id, sequence, code);
  }
  for (const auto& [stream_id, sequence, code] : refusals) {
    sendNack(l, stream_id, sequence, code, "refused before the link broke");
  }
}

AgentLink* InboundStreams::linkOf(PeerId peer, uint64_t instance) {
  for (auto& [id, l] : links_) {
    if (l.usable() && l.peer == peer && l.peer_instance == instance) return &l;
  }
  return nullptr;
}

void InboundStreams::onLinkDown(AgentLink& l) {
  dropHeldBack(l.id);
  for (auto& [sid, in] : l.in_streams) names_.release(in.key);
  l.in_streams.clear();
}

void InboundStreams::retractCreditsOfLink(uint64_t link_id) {
  // The link's regions die with it: a new link announces them again.
  regions_.erase(regions_.lower_bound({link_id, 0}), regions_.lower_bound({link_id + 1, 0}));
  std::set<NameKey> streams;
  for (auto it = credits_.begin(); it != credits_.end();) {
    if (it->second.link_id != link_id) {
      ++it;
      continue;
    }
    if (AgentClient* ac = clients_.find(it->second.client_id)) {
      SlotEntry& e = ac->session->slots[it->second.slot];
      if (e.state == SlotState::kCredited) e = SlotEntry{};
      streams.insert(ac->stream);
    }
    it = credits_.erase(it);
  }
  for (NameKey stream : streams) grantCredits(stream);
}

size_t InboundStreams::framesHeld() const {
  size_t held = 0;
  for (const auto& [id, in] : in_states_) held += in.held.size();
  return held;
}

}  // namespace framelink
