// The consumer side's credits and the control records that carry them: a
// credit per free consumer slot, shared fairly among the stream's senders
// (recalled beyond a share), the regions slot credits name, and the ACKs and
// grants held back to go together (a quarter of the sender's window,
// ack_delay, or CreditLow).  The rest of InboundStreams -- arrival, release --
// is in inbound_streams.cpp, what is remembered per sender stream in
// inbound_answers.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/inbound_streams.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"

namespace framelink {

bool InboundStreams::due(const Target& target, const HeldBack& held, uint64_t now_ns) const {
  if (held.this_round || ack_delay_ns_ == 0) return true;
  if (held.acks.empty()) return false;
  if (held.sender_low || now_ns - held.since_ns >= ack_delay_ns_) return true;
  // A quarter of what the sender may hold: it still has the other three
  // quarters to send while this goes back.
  auto window = windows_.find(target);
  const size_t quarter = window == windows_.end() ? 1 : std::max<size_t>(1, window->second / 4);
  return held.acks.size() >= quarter;
}

void InboundStreams::sendAcks(AgentLink& l, uint64_t stream_id, const std::vector<ReleasedFrame>& released) {
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint64_t>> by_readers;  // (readers, skipped)
  for (const ReleasedFrame& r : released) by_readers[{r.readers, r.skipped}].push_back(r.sequence);
  for (const auto& [counts, sequences] : by_readers) {
    const auto [readers, skipped] = counts;
    for (size_t i = 0; i < sequences.size(); i += peer::kMaxAcksPerMessage) {
      v1::PeerMessage msg;
      auto* ack = msg.mutable_ack();
      ack->set_stream_id(stream_id);
      if (readers > 1) ack->set_readers(readers);
      if (skipped > 0) ack->set_skipped(skipped);
      const size_t end = std::min(sequences.size(), i + peer::kMaxAcksPerMessage);
      peer::encodeAck(sequences.data() + i, end - i, ack);
      l.send(std::move(msg));
    }
  }
}

size_t InboundStreams::flushControl() {
  settleFences();
  const size_t answered = continueAnswersAgain();
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
  low_checked_.clear();
  return answered;
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
  // Nothing held back: remembered apart, so that a sender saying so for
  // each of its streams adds nothing to what every round walks.
  auto held = held_back_.find({l.id, low.stream_id});
  if (held == held_back_.end() || held->second.acks.empty()) {
    senders_low_.insert({l.id, low.stream_id});
  } else {
    held->second.this_round = true;
  }
  // Slots released by the stream's other senders, still waiting, may go to
  // this one now.  With none free a grant round would give nothing, and a
  // peer could make every round walk the stream's credits for nothing.
  const NameKey key = in->second.key;
  if (dirty_grants_.count(key) != 0 || low_checked_.count(key) != 0) return;
  if (slotFree(key)) {
    dirty_grants_.insert(key);
  } else {
    low_checked_.insert(key);
  }
}

bool InboundStreams::slotFree(NameKey stream) {
  auto consumers = consumers_by_name_.find(stream);
  if (consumers == consumers_by_name_.end()) return false;
  for (uint64_t cid : consumers->second) {
    const AgentClient* ac = clients_.find(cid);
    if (ac == nullptr || ac->session->gone || !lands(*ac->session)) continue;
    const auto& slots = ac->session->slots;
    for (uint32_t s = 0; s < slots.size(); ++s) {
      if (slots[s].state == SlotState::kFree && !fenced(cid, s)) return true;
    }
  }
  return false;
}

// A peer on rdma that stops taking this end's sends holds every invalidation queued behind them:
// its old keys still write into the slots.  Granted to another sender, a slot would take that
// peer's writes over the other's frames; so it waits until the window has shut (or the link went,
// and its queue pair with it, or the link's send-queue watchdog failed it).
void InboundStreams::fenceSlot(AgentLink& l, uint64_t consumer, uint32_t slot, uint64_t credit_id,
                               NameKey stream) {
  if (!l.transport || !l.transport->windowOpen(credit_id)) return;
  fences_[{consumer, slot}] = WindowFence{l.id, credit_id, stream};
}

bool InboundStreams::fenced(uint64_t consumer, uint32_t slot) {
  auto it = fences_.find({consumer, slot});
  if (it == fences_.end()) return false;
  const AgentLink* l = links_.find(it->second.link_id);
  if (l != nullptr && l->transport && l->transport->windowOpen(it->second.credit_id)) return true;
  fences_.erase(it);
  return false;
}

void InboundStreams::settleFences() {
  for (auto it = fences_.begin(); it != fences_.end();) {
    const auto [consumer, slot] = it->first;
    const NameKey stream = it->second.stream;
    ++it;  // fenced() erases a fence whose window shut
    if (!fenced(consumer, slot) && stream != kNoName) dirty_grants_.insert(stream);
  }
}

void InboundStreams::indexTarget(NameKey stream, uint64_t link_id, uint64_t sid, bool open) {
  if (open) {
    targets_by_name_[stream].emplace(link_id, sid);
    return;
  }
  auto it = targets_by_name_.find(stream);
  if (it == targets_by_name_.end()) return;
  it->second.erase({link_id, sid});
  if (it->second.empty()) targets_by_name_.erase(it);
}

void InboundStreams::dropHeldBack(uint64_t link_id) {
  for (auto it = held_back_.lower_bound({link_id, 0});
       it != held_back_.end() && it->first.first == link_id;) {
    // The ACKs go again on the sender's next link (onLinkUp).
    if (it->second.stream != kNoName) dirty_grants_.insert(it->second.stream);
    it = held_back_.erase(it);
  }
  windows_.erase(windows_.lower_bound({link_id, 0}), windows_.lower_bound({link_id + 1, 0}));
  senders_low_.erase(senders_low_.lower_bound({link_id, 0}), senders_low_.lower_bound({link_id + 1, 0}));
  answering_again_.erase(link_id);
}

std::vector<InboundStreams::Target> InboundStreams::creditTargets(NameKey stream) {
  std::vector<Target> targets;
  auto open = targets_by_name_.find(stream);
  if (open == targets_by_name_.end()) return targets;
  for (const Target& target : open->second) {
    const AgentLink* l = links_.find(target.first);
    if (l != nullptr && l->usable()) targets.push_back(target);
  }
  return targets;
}

void InboundStreams::reckonShares(NameKey stream, GrantRound& round) {
  std::set<PeerId> peers;
  for (const Target& target : round.targets) {
    const PeerId peer = links_.find(target.first)->peer;
    round.sender[target] = peer;
    peers.insert(peer);
  }
  round.senders = peers.size();
  const size_t senders = round.senders;
  size_t window = 0;  // what each sender may hold: its share of every consumer
  for (uint64_t cid : consumers_by_name_[stream]) {
    const AgentClient* ac = clients_.find(cid);
    if (ac == nullptr) continue;
    const ClientSession& c = *ac->session;
    if (c.gone || !lands(c)) continue;
    window += (c.slots.size() + senders - 1) / senders;
    // Each sender sees every consumer's slot size.
    round.largest_slot = std::max<uint64_t>(round.largest_slot, c.segments->slotSize());
  }
  for (const auto& target : round.targets) windows_[target] = window;
  for (const auto& [generation, entry] : credits_) {
    const Target owner{entry.link_id, entry.stream_id};
    if (!entry.recalled && !entry.closing && round.sender.count(owner) != 0) {
      ++round.heldBy(owner, entry.client_id);
    }
  }
}

void InboundStreams::grantCredits(NameKey stream) {
  ++grant_rounds_;
  if (stream == kNoName) return;
  GrantRound round;
  round.targets = creditTargets(stream);
  if (round.targets.empty()) return;
  auto consumers = consumers_by_name_.find(stream);
  if (consumers == consumers_by_name_.end() || consumers->second.empty()) {
    // No consumer: nothing to grant or recall, and each sender may hold nothing.
    for (const Target& target : round.targets) windows_[target] = 0;
    return;
  }
  // Fair shares: when several peers send this stream, none holds more than
  // its share of each consumer's slots, or one with nothing to send would sit
  // on them while another starves.
  reckonShares(stream, round);
  const bool moving = landingMoves(stream);
  for (uint64_t cid : consumers->second) {
    AgentClient* ac = clients_.find(cid);
    if (ac == nullptr) continue;
    ClientSession& c = *ac->session;
    if (c.gone) continue;
    if (!lands(c)) {
      // A subscriber attached: frames land in it alone, and are lent to the
      // rest here.  What this one was granted before goes back.
      recallAll(round, cid);
      continue;
    }
    if (moving) continue;
    const size_t share = (c.slots.size() + round.senders - 1) / round.senders;
    grantFreeSlots(round, cid, c, share);
    recallBeyondShares(round, cid, share);
  }
  for (auto& [target, msg] : round.grants) {
    if (AgentLink* l = links_.find(target.first)) l->send(std::move(msg));
  }
  for (auto& [owner, msg] : round.recalls) {
    metrics_.counters.credits_recalled.fetch_add(msg.credit_revoke().credit_ids_size(),
                                                 std::memory_order_relaxed);
    if (AgentLink* l = links_.find(owner.first)) l->send(std::move(msg));
  }
}

void InboundStreams::grantFreeSlots(GrantRound& round, uint64_t cid, ClientSession& c, size_t share) {
  for (uint32_t s = 0; s < c.slots.size(); ++s) {
    if (c.slots[s].state != SlotState::kFree || fenced(cid, s)) continue;
    if (!grantSlot(round, cid, c, share, s)) return;  // every sender holds its share of this consumer
  }
}

bool InboundStreams::grantSlot(GrantRound& round, uint64_t cid, ClientSession& c, size_t share, uint32_t s) {
  for (;;) {
    Target target{0, 0};
    for (size_t tries = 0; tries < round.targets.size() && target.first == 0; ++tries) {
      const Target candidate = round.targets[grant_cursor_++ % round.targets.size()];
      if (round.heldBy(candidate, cid) < share && round.refusing.count(candidate.first) == 0) {
        target = candidate;
      }
    }
    if (target.first == 0) return false;
    AgentLink& l = *links_.find(target.first);
    const bool pull = pulls(l, c.stream);
    // A pull credit is exposed to no write: the slot is this end's to read
    // an offer into.  It goes whole, as an id and a capacity.
    Region* region = pull ? nullptr : regionOf(l.id, cid, c);
    const uint32_t generation = nextGeneration();
    Result<transport::RemoteCredit> remote =
        transport::RemoteCredit{generation, c.segments->slotSize(), 0, 0};
    if (!pull) {
      transport::LocalCredit local;
      local.credit_id = region != nullptr ? peer::slotCreditId(region->id, s, generation) : generation;
      local.buffer = c.segments->slot(s);
      local.capacity = c.segments->slotSize();
      local.keepalive = c.segments;
      remote = l.transport->exposeCredit(std::move(local));
    }
    if (!remote) {
      // A peer can make this repeat (a link going down refuses every slot).
      const LogScope scope(LogFields{.client = c.id, .peer = l.peer_name, .stream = c.stream});
      log_expose_.error("link {} (peer {}): cannot expose a receive slot: {}", l.id, l.peer_name,
                        remote.error().message);
      // A link whose transport went down (its LinkDown not handled yet)
      // refuses every slot: the stream's other senders get this one.  Any
      // other refusal is about this slot alone: it waits for a later round,
      // and the rest of the round goes on -- ending it could leave a stream
      // whose last trigger this was with no credit ever again.
      if (remote.error().code != FL_ERR_LINK_LOST) return true;
      round.refusing.insert(l.id);
      continue;
    }
    ++round.heldBy(target, cid);
    CreditEntry& entry = credits_[generation];
    entry = CreditEntry{cid, s, l.id, target.second, remote->credit_id};
    entry.pull = pull;
    SlotEntry& e = c.slots[s];
    e.state = SlotState::kCredited;
    e.consumer.credit_id = remote->credit_id;
    e.link_id = l.id;
    e.stream_id = target.second;
    auto* grant = round.grants[target].mutable_credit_grant();
    grant->set_stream_id(target.second);
    grant->set_largest_slot(round.largest_slot);
    if (pull) grant->set_pull(true);
    addCredit(grant, region, *remote, c, s);
    return true;
  }
}

void InboundStreams::addCredit(v1::CreditGrant* grant, Region* region, const transport::RemoteCredit& remote,
                               const ClientSession& c, uint32_t slot) {
  if (region != nullptr && !region->announced) {
    // Slots lie slot_stride apart in the consumer's segment, and so do
    // the addresses a transport that has them gives out.
    region->slot_stride = remote.remote_addr != 0 ? c.segments->geometry().slot_stride : 0;
    region->base_addr = remote.remote_addr - uint64_t{slot} * region->slot_stride;
    region->rkey = remote.rkey;
    region->slot_bytes = remote.length;
    region->announced = true;
    auto* r = grant->add_regions();
    r->set_region_id(region->id);
    r->set_base_addr(region->base_addr);
    r->set_rkey(region->rkey);
    r->set_slot_stride(region->slot_stride);
    r->set_slot_bytes(region->slot_bytes);
    r->set_slot_count(static_cast<uint32_t>(c.slots.size()));
  }
  if (region != nullptr && remote.remote_addr == region->base_addr + uint64_t{slot} * region->slot_stride &&
      remote.rkey == region->rkey && remote.length == region->slot_bytes) {
    grant->add_slot_credits(remote.credit_id);
  } else {
    // Not where the region says (a transport that registers slots one
    // by one): the credit goes whole.
    auto* credit = grant->add_credits();
    credit->set_credit_id(remote.credit_id);
    credit->set_length(remote.length);
    credit->set_remote_addr(remote.remote_addr);
    credit->set_rkey(remote.rkey);
    metrics_.counters.credits_granted_whole.fetch_add(1, std::memory_order_relaxed);
  }
  metrics_.counters.credits_granted.fetch_add(1, std::memory_order_relaxed);
}

void InboundStreams::recallBeyondShares(GrantRound& round, uint64_t cid, size_t share) {
  // A sender still below its share of this consumer with no free slot
  // left: recall what the others hold beyond theirs.  They give back what
  // they have not used (onCreditsReturned), and only then are those slots
  // granted again.
  const bool starving = std::any_of(round.targets.begin(), round.targets.end(), [&](const Target& t) {
    return round.heldBy(t, cid) < share && round.refusing.count(t.first) == 0;
  });
  if (!starving) return;
  const uint64_t now = clock_.nowNs();
  for (auto& [generation, entry] : credits_) {
    const Target owner{entry.link_id, entry.stream_id};
    // An offered credit is used (its read may wait behind others): not held.
    if (entry.client_id != cid || entry.recalled || entry.closing || entry.offered ||
        round.sender.count(owner) == 0) {
      continue;
    }
    if (round.heldBy(owner, cid) <= share) continue;
    entry.recalled = true;
    entry.recalled_ns = now;
    --round.heldBy(owner, cid);
    auto* revoke = round.recalls[owner].mutable_credit_revoke();
    revoke->set_stream_id(owner.second);
    revoke->add_credit_ids(entry.credit_id);
  }
}

bool InboundStreams::landingMoves(NameKey stream) const {
  if (local_ == nullptr) return false;
  for (const auto& [generation, entry] : credits_) {
    const AgentClient* ac = clients_.find(entry.client_id);
    if (ac != nullptr && !ac->session->gone && ac->stream == stream && !lands(*ac->session)) return true;
  }
  return local_->landedElsewhereWaits(names_.name(stream));
}

void InboundStreams::recallAll(GrantRound& round, uint64_t cid) {
  const uint64_t now = clock_.nowNs();
  for (auto& [generation, entry] : credits_) {
    if (entry.client_id != cid || entry.recalled || entry.closing) continue;
    const Target owner{entry.link_id, entry.stream_id};
    entry.recalled = true;
    entry.recalled_ns = now;
    auto* revoke = round.recalls[owner].mutable_credit_revoke();
    revoke->set_stream_id(owner.second);
    revoke->add_credit_ids(entry.credit_id);
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
  // Live credits are far fewer than 2^32, so this finds one soon.
  for (;;) {
    const uint32_t generation = next_generation_++;
    if (generation != 0 && credits_.count(generation) == 0) return generation;
  }
}

InboundStreams::Credits::iterator InboundStreams::findCredit(uint64_t credit_id) {
  auto it = credits_.find(static_cast<uint32_t>(credit_id));
  return it != credits_.end() && it->second.credit_id == credit_id ? it : credits_.end();
}

InboundStreams::Credits::iterator InboundStreams::releaseCredit(Credits::iterator credit, NameKey* stream) {
  if (AgentClient* ac = clients_.find(credit->second.client_id)) {
    SlotEntry& e = ac->session->slots[credit->second.slot];
    if (e.state == SlotState::kCredited && e.consumer.credit_id == credit->second.credit_id) e = SlotEntry{};
    if (stream != nullptr) *stream = ac->stream;
  }
  return credits_.erase(credit);
}

void InboundStreams::onCreditsReturned(AgentLink& l, const peer::CreditRevoke& returned) {
  NameKey stream = kNoName;
  for (uint64_t id : returned.credit_ids) {
    auto it = findCredit(id);
    // Only what this link held: a peer cannot give back another's credits.
    // Nor one it offered a frame into: that slot is being read.
    if (it == credits_.end() || it->second.link_id != l.id || it->second.stream_id != returned.stream_id ||
        it->second.offered) {
      continue;
    }
    if (l.transport) l.transport->retractCredit(id);
    const uint64_t consumer = it->second.client_id;
    const uint32_t slot = it->second.slot;
    NameKey of = kNoName;
    releaseCredit(it, &of);
    if (of != kNoName) stream = of;
    fenceSlot(l, consumer, slot, id, of);
  }
  if (stream != kNoName) grantCredits(stream);
}

std::vector<InboundStreams::FailedLink> InboundStreams::checkDeadlines() {
  const uint64_t now = clock_.nowNs();
  // A sender stream open on no link with no frame held, unused for long:
  // its sender forgot it (while no link was up, so no StreamClose came) or
  // gave up on every frame it could replay.
  senders_.forgetIdle(now);
  std::vector<FailedLink> failed;
  // A sender answers a recall at once, giving back what it has not used;
  // what it used lands within its frames' deadlines.  One that keeps them
  // holds slots the stream's other senders wait for: its link goes, and
  // the credits with it.
  std::set<uint64_t> late;
  for (const auto& [generation, entry] : credits_) {
    // One offered into is used: its read may wait behind the link's others.
    if (entry.recalled && !entry.offered && now - entry.recalled_ns >= limits_.recall_deadline_ns) {
      late.insert(entry.link_id);
    }
  }
  for (uint64_t link_id : late) {
    const AgentLink* l = links_.find(link_id);
    if (l == nullptr || l->closing) continue;
    failed.push_back({link_id,
                      "recalled credits neither given back nor used within " +
                          std::to_string(limits_.recall_deadline_ns / 1'000'000) + " ms",
                      true});
  }
  // Reads in flight and none done for read_stall_ns: the transport lost one
  // and will not say so.  Closing the link ends them all; the sender offers
  // the frames again on the next.
  for (const auto& [link_id, out] : pull_.stalled(now, limits_.read_stall_ns)) {
    const AgentLink* l = links_.find(link_id);
    if (l == nullptr || l->closing) continue;
    metrics_.counters.links_stalled.fetch_add(1, std::memory_order_relaxed);
    failed.push_back(
        {link_id,
         "no read of an offered frame completed in " + std::to_string(limits_.read_stall_ns / 1'000'000) +
             " ms (link_timeout_ms) with " + std::to_string(out) +
             " in flight: the transport stalled, and the sender offers those frames again on the next link",
         false});
  }
  return failed;
}

void InboundStreams::retractCreditsOfLink(uint64_t link_id) {
  // Its reads ended with it (the transport completed them FL_ERR_LINK_LOST);
  // the offers not read yet go: the sender offers them again on its next link.
  pull_.dropLink(link_id);
  // The link's regions die with it: a new link announces them again.
  regions_.erase(regions_.lower_bound({link_id, 0}), regions_.lower_bound({link_id + 1, 0}));
  std::set<NameKey> streams;
  for (auto it = credits_.begin(); it != credits_.end();) {
    if (it->second.link_id != link_id) {
      ++it;
      continue;
    }
    NameKey stream = kNoName;
    it = releaseCredit(it, &stream);
    if (stream != kNoName) streams.insert(stream);
  }
  for (NameKey stream : streams) grantCredits(stream);
}

}  // namespace framelink
