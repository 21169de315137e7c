#include "agent/inbound_streams.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log_fields.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"
#include "transport/frame_header.h"

namespace framelink {

InboundStreams::InboundStreams(Metrics& metrics, ClientTable& clients, LinkTable& links, NameTable& names,
                               const AgentClock& clock, uint64_t ack_delay_ns, Limits limits)
    : metrics_(metrics),
      clients_(clients),
      links_(links),
      names_(names),
      clock_(clock),
      ack_delay_ns_(ack_delay_ns),
      limits_(limits) {}

void InboundStreams::setLocalDelivery(LocalDelivery* local) {
  local_ = local;
  if (local_ == nullptr) return;
  local_->setEndLanded([this](const LocalDelivery::Landed& from, uint64_t landing, uint32_t slot, int status,
                              const std::string& why, uint32_t readers, uint32_t released) {
    endShared(from, landing, slot, status, why, readers, released);
  });
}

void InboundStreams::onConsumerAttached(AgentClient& c) {
  c.stream = names_.acquire(c.session->stream);
  consumers_by_name_[c.stream].insert(c.session->id);
  // Asked before its slots are granted: they, and the stream's later grants, are pull credits.
  if (c.session->pull) ++pull_consumers_[c.session->stream];
  if (local_ != nullptr) {
    local_->consumerAttached(*c.session);
    local_->pump();  // frames of producers here first
  }
  grantCredits(c.stream);
}

void InboundStreams::onConsumerGone(AgentClient& ac) {
  ClientSession& c = *ac.session;
  if (auto named = consumers_by_name_.find(ac.stream); named != consumers_by_name_.end()) {
    named->second.erase(c.id);
    if (named->second.empty()) consumers_by_name_.erase(named);
  }
  if (c.pull) {
    // The stream's later grants are pushed again, unless another consumer asked or the configuration says.
    auto asked = pull_consumers_.find(c.stream);
    if (asked != pull_consumers_.end() && --asked->second == 0) pull_consumers_.erase(asked);
  }
  dropReadsInto(c);
  std::map<std::pair<uint64_t, uint64_t>, v1::PeerMessage> revokes;
  const uint64_t now = clock_.nowNs();
  for (uint32_t slot = 0; slot < c.slots.size(); ++slot) {
    SlotEntry& e = c.slots[slot];
    if (e.consumer.shared) {
      // Its frame is the other readers' here too: it ends when they are done.
      if (e.state == SlotState::kDelivered && local_ != nullptr) local_->landedGone(c, slot);
    } else if (e.state == SlotState::kDelivered && e.consumer.local_from != 0) {
      if (local_ != nullptr) local_->readerGone(c, slot);
    } else if (e.state == SlotState::kCredited) {
      auto it = findCredit(e.consumer.credit_id);
      if (it != credits_.end()) {
        if (AgentLink* l = links_.find(it->second.link_id)) {
          // Recalled, not retracted: the sender may have posted a write into
          // it before it hears of this (on rdma a write into an ended window
          // fails the whole link).  It gives back what it has not used
          // (onCreditsReturned retracts them then); what it used lands before
          // that answer and is refused (takeCredit).  The transport keeps the
          // slot's memory until then; past the recall deadline the link fails.
          it->second.recalled = true;
          it->second.recalled_ns = now;
          auto& msg = revokes[{l->id, it->second.stream_id}];
          msg.mutable_credit_revoke()->set_stream_id(it->second.stream_id);
          msg.mutable_credit_revoke()->add_credit_ids(e.consumer.credit_id);
        } else {
          credits_.erase(it);
        }
      }
    } else if (e.state == SlotState::kDelivered) {
      refuseDelivered({e.link_id, e.stream_id, e.consumer.in_state, e.sequence}, FL_ERR_NO_CONSUMER,
                      "the consumer died before releasing the frame", 1, 0);
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
  if (local_ != nullptr) {
    local_->consumerGone(c);
    local_->pump();                   // a frame that waited for this subscriber's slot goes to the others
    dirty_grants_.insert(ac.stream);  // frames may land in another consumer now
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
  if (e.consumer.shared) {  // landed here from a peer, and lent to the other readers here
    e.state = SlotState::kLent;
    if (local_ != nullptr) local_->landedReleased(c, desc.slot);  // the last one answers the sender
    return;
  }
  if (e.consumer.local_from != 0) {  // a frame of a producer here
    if (local_ != nullptr) local_->released(c, desc.slot);
    e = SlotEntry{};
    if (local_ != nullptr) local_->pump();
    grantCredits(ac.stream);
    return;
  }
  const LocalDelivery::Landed from{e.link_id, e.stream_id, e.consumer.in_state, e.sequence};
  e = SlotEntry{};
  answerRelease(from, ac.stream, c.id);
}

void InboundStreams::answerRelease(const LocalDelivery::Landed& from, NameKey stream, uint64_t client_id,
                                   uint32_t readers, uint32_t skipped) {
  if (InState* found = senders_.find(from.in_state)) {
    InState& in = *found;
    senders_.released(in, ReleasedFrame{from.sequence, readers, skipped});
    // The ACK goes on the link the frame came on, else on the newest link
    // from its sender (the one it sends on).  With no link up it is not
    // sent: the sender replays the frame on its next link and gets the ACK
    // then.
    if (const AgentLink* target = answerLink(from.link_id, in.peer, in.instance)) {
      // Held back with the sender's other releases until enough of them
      // wait to be worth a control record, or not for long (flushControl).
      // The slot is granted again with the ACK.
      HeldBack& held = held_back_[{target->id, in.stream_id}];
      if (held.acks.empty()) held.since_ns = clock_.nowNs();
      if (senders_low_.erase({target->id, in.stream_id}) != 0) held.sender_low = true;
      held.acks.push_back(ReleasedFrame{from.sequence, readers, skipped});
      if (stream != kNoName) held.stream = stream;
      return;
    }
    spdlog::debug("client {}: released seq {} while no link to its sender is up; ACK follows its replay",
                  client_id, from.sequence);
  }
  if (stream != kNoName) dirty_grants_.insert(stream);
}

void InboundStreams::endShared(const LocalDelivery::Landed& from, uint64_t landing, uint32_t slot, int status,
                               const std::string& why, uint32_t readers, uint32_t released) {
  // The landing consumer's slot is free again, unless it went meanwhile.
  NameKey stream = kNoName;
  AgentClient* ac = clients_.find(landing);
  if (ac != nullptr && !ac->session->gone && slot < ac->session->slots.size()) {
    SlotEntry& e = ac->session->slots[slot];
    if (e.consumer.shared && e.state == SlotState::kLent && e.sequence == from.sequence &&
        e.consumer.in_state == from.in_state) {
      e = SlotEntry{};
      stream = ac->stream;
    }
  }
  if (status == FL_OK) {
    // Every reader it went to released it; the others were skipped.
    answerRelease(from, stream, landing, readers, readers - released);
    return;
  }
  refuseDelivered(from, status, why, readers, released);
  if (stream != kNoName) dirty_grants_.insert(stream);
}

void InboundStreams::refuseDelivered(const LocalDelivery::Landed& from, int status, const std::string& why,
                                     uint32_t readers, uint32_t released) {
  // Not held any more; a replay of it (the NACK may be lost with the link)
  // gets the same refusal instead of waiting for a release.
  AgentLink* to = links_.find(from.link_id);
  if (InState* found = senders_.find(from.in_state)) {
    InState& in = *found;
    in.held.erase(from.sequence);
    senders_.refused(in, from.sequence, status);
    // The link it came on may be gone; the sender hears it on the one that
    // replaced it (and on every later one: onLinkUp).
    to = answerLink(from.link_id, in.peer, in.instance);
  }
  if (to != nullptr) sendNack(*to, from.stream_id, from.sequence, status, why, readers, released);
}

void InboundStreams::sendNack(AgentLink& l, uint64_t stream_id, uint64_t sequence, int code,
                              const std::string& message, uint32_t readers, uint32_t released) {
  metrics_.counters.nacks_sent.fetch_add(1, std::memory_order_relaxed);
  const LogScope scope(LogFields{.peer = l.peer_name, .sequence = sequence});
  log_refused_.warn("[peer {} stream {} seq {}] refusing frame: {}: {}", l.peer_name, stream_id, sequence,
                    statusName(code), message);
  if (peer::resendable(code) && l.in_streams.count(stream_id) != 0) {
    // Not delivered (damaged in transit, or its credit was withdrawn): the
    // sender sends it again, and that copy is not a duplicate even when
    // later frames arrived meanwhile.
    senders_.askedAgain(senders_.at(senders_.idOf(l.peer, l.peer_instance, stream_id)), sequence);
  } else if (l.in_streams.count(stream_id) != 0) {
    // Remembered so that a replay of this frame gets the same answer.
    InState& in = senders_.at(senders_.idOf(l.peer, l.peer_instance, stream_id));
    senders_.refused(in, sequence, code);
    senders_.markAnswered(in, sequence);
  }
  v1::PeerMessage msg;
  auto* nack = msg.mutable_nack();
  nack->set_stream_id(stream_id);
  nack->set_sequence(sequence);
  nack->set_code(static_cast<v1::ErrorCode>(code));
  nack->set_message(message);
  nack->set_readers(readers);
  nack->set_released(released);
  l.send(std::move(msg));
}

void InboundStreams::onFrameArrived(AgentLink& l, const transport::TransportEvent& ev) {
  arrive(l, ev, false);
}

void InboundStreams::arrive(AgentLink& l, const transport::TransportEvent& ev, bool pulled) {
  const transport::FrameHeader& h = ev.header;
  const LogScope frame(LogFields{.sequence = h.sequence});
  ++l.frames_in;
  CreditEntry credit;
  AgentClient* ac = takeCredit(l, ev, &credit, pulled);
  if (ac == nullptr) return;  // answered already
  // Consumed: on rdma the credit's window shuts when its invalidation has executed.
  fenceSlot(l, credit.client_id, credit.slot, credit.credit_id, ac->stream);
  ClientSession& c = *ac->session;
  const LogScope consumer(LogFields{.client = c.id, .stream = c.stream});
  if (!acceptFrame(l, c, credit, h) || !forSubscribers(l, c, h)) {
    // Refused or a duplicate: the slot is free for another frame.
    c.slots[credit.slot] = SlotEntry{};
    grantCredits(ac->stream);
    return;
  }
  deliver(l, c, credit, h);
}

AgentClient* InboundStreams::takeCredit(AgentLink& l, const transport::TransportEvent& ev, CreditEntry* out,
                                        bool pulled) {
  const transport::FrameHeader& h = ev.header;
  // A replay of a frame this daemon already answered gets that answer again,
  // whatever credit it came in: refused stays refused, held stays held.  A
  // "send it again" would bring it to another consumer.
  auto answeredBefore = [&] {
    return l.in_streams.count(h.stream_id) != 0 && answerKnown(l, h, "refused before");
  };
  if (ev.status != FL_OK) {
    // A pull credit is not the transport's: a frame pushed into one is
    // refused without touching it (a read may be landing in its slot).
    auto it = findCredit(h.credit_id);
    if (it != credits_.end() && it->second.link_id == l.id && !it->second.pull) credits_.erase(it);
    if (ev.status == FL_ERR_UNKNOWN_CREDIT && answeredBefore()) return nullptr;
    sendNack(l, h.stream_id, h.sequence, ev.status,
             ev.message.empty() ? "frame for an unknown credit" : ev.message);
    return nullptr;
  }
  auto it = findCredit(h.credit_id);
  if (it == credits_.end() || it->second.link_id != l.id || it->second.pull != pulled) {
    if (answeredBefore()) return nullptr;
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "credit " + std::to_string(h.credit_id) + " was not granted to this link" +
                 (it == credits_.end() || it->second.link_id != l.id ? ""
                  : pulled                                           ? " for pull"
                                                                     : " for writes (its stream is pulled)"));
    return nullptr;
  }
  *out = it->second;
  credits_.erase(it);
  AgentClient* ac = clients_.find(out->client_id);
  if (ac == nullptr || ac->session->gone) {
    if (answeredBefore()) return nullptr;
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "its receive slot was withdrawn: the consumer detached");
    return nullptr;
  }
  return ac;
}

bool InboundStreams::acceptFrame(AgentLink& l, ClientSession& c, const CreditEntry& credit,
                                 const transport::FrameHeader& h) {
  if (h.stream_id != credit.stream_id || l.in_streams.count(h.stream_id) == 0) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_STREAM,
             "frame names stream " + std::to_string(h.stream_id) + " but the credit belongs to stream " +
                 std::to_string(credit.stream_id));
    return false;
  }
  if (h.length > c.segments->slotSize() || h.attr_length > FL_MAX_ATTR_BYTES) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_PROTOCOL, "frame header out of bounds");
    return false;
  }
  if (dropDuplicate(l, h)) return false;
  if (h.has_crc32c) {
    const uint32_t crc = fl_crc32c(0, c.segments->slot(credit.slot), h.length);
    if (crc != h.crc32c) {
      sendNack(l, h.stream_id, h.sequence, FL_ERR_CRC_MISMATCH,
               "payload CRC32C mismatch (expected " + std::to_string(h.crc32c) + ", got " +
                   std::to_string(crc) + ")");
      return false;
    }
  }
  return true;
}

bool InboundStreams::forSubscribers(AgentLink& l, const ClientSession& c, const transport::FrameHeader& h) {
  if (!h.subscribers_only || c.subscriber) return true;
  // It landed in a member of the queue group (a credit granted before a
  // subscriber came), but another host's member has it.
  if (local_ != nullptr && local_->hasSubscribers(c.stream)) {
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "a frame for the subscribers here landed in a queue group member's slot");
  } else {
    sendNack(
        l, h.stream_id, h.sequence, FL_ERR_NO_CONSUMER,
        "a frame for the subscribers here, and none is attached (a queue group member elsewhere has it)");
  }
  return false;
}

void InboundStreams::deliver(AgentLink& l, ClientSession& c, const CreditEntry& credit,
                             const transport::FrameHeader& h) {
  transport::toSlotHeader(h, c.segments->slotHeader(credit.slot));
  const uint64_t in_state = senders_.idOf(l.peer, l.peer_instance, h.stream_id);
  InState& in = senders_.at(in_state);
  senders_.markAnswered(in, h.sequence);
  in.held.insert(h.sequence);
  in.used_ns = clock_.nowNs();
  SlotEntry& e = c.slots[credit.slot];
  e.state = SlotState::kDelivered;
  e.sequence = h.sequence;
  e.length = h.length;
  e.frame_id = h.frame_id;
  e.link_id = l.id;
  e.stream_id = h.stream_id;
  e.consumer.in_state = in_state;
  ++c.frames;
  c.bytes += h.length;
  metrics_.counters.frames_received.fetch_add(1, std::memory_order_relaxed);
  metrics_.counters.bytes_received.fetch_add(h.length, std::memory_order_relaxed);
  // Release ordering of the ring publishes the slot header and payload.
  clients_.complete(c, credit.slot, FL_OK, h.sequence, h.length, h.frame_id);
  if (local_ != nullptr && local_->othersRead(c)) {
    // One copy per host: the stream's other readers here are lent this one.
    e.consumer.shared = true;
    fl_slot_header header{};
    transport::toSlotHeader(h, &header);
    local_->shareLanded(c, credit.slot, header,
                        LocalDelivery::Landed{l.id, h.stream_id, in_state, h.sequence});
  }
}

std::string InboundStreams::onStreamOpen(AgentLink& l, const peer::StreamOpen& so) {
  // Links are numbered as they come up, so a newer link from the same
  // instance that has the stream open means this StreamOpen was written
  // before the sender left this link and arrives late.  Taking the stream
  // back would leave it where the sender no longer sends, without credits
  // on the link it does send on, until the sender dials again.  So does a
  // newer link with the name open under another id: the sender closed this
  // id and opened the name anew there, and opening it here would take the
  // name's stream off the link the sender sends on (below).
  for (const auto& [id, other] : links_) {
    if (id <= l.id || other.peer != l.peer || other.peer_instance != l.peer_instance) continue;
    const bool open_there = other.in_streams.count(so.stream_id) != 0 ||
                            std::any_of(other.in_streams.begin(), other.in_streams.end(),
                                        [&](const auto& in) { return in.second.name == so.name; });
    if (!open_there) continue;
    log_streams_.info(
        "link {} to peer {}: stale StreamOpen for stream {} ('{}') ignored, the stream is open on newer link "
        "{}",
        l.id, l.peer_name, so.stream_id, so.name, id);
    return {};
  }
  auto existing = l.in_streams.find(so.stream_id);
  if (existing != l.in_streams.end() && existing->second.name != so.name) {
    // Its credits were granted for the other name's consumers.
    return "stream " + std::to_string(so.stream_id) + " re-opened as '" + so.name + "' while open as '" +
           existing->second.name + "'";
  }
  if (existing != l.in_streams.end()) {
    // Announced again on this link: the sender's route left it and came
    // back (the link that replaced it went down), dropping the credits it
    // held here.  They go back to the consumers, to be granted anew.
    names_.release(closeOnLink(l, so.stream_id));
    existing = l.in_streams.end();
  }
  if (existing == l.in_streams.end()) {
    if (l.in_streams.size() >= peer::kMaxStreamsPerLink) return "too many streams opened";
    // A sender sends a name as one stream: a name under many ids would
    // take a share of every consumer's slots for each.
    for (const auto& [sid, in] : l.in_streams) {
      if (in.name == so.name) {
        return "stream '" + so.name + "' opened as " + std::to_string(so.stream_id) + " while open as " +
               std::to_string(sid);
      }
    }
    if (!senders_.makeRoom(l.peer, l.peer_instance, so.stream_id)) {
      return "too many streams of this peer remembered, none unused";
    }
    l.in_streams.emplace(so.stream_id, InStream{so.name, names_.acquire(so.name)});
    senders_.countOpen(l.peer, l.peer_instance, so.stream_id, +1);
  }
  const NameKey key = l.in_streams.at(so.stream_id).key;
  indexTarget(key, l.id, so.stream_id, true);
  log_streams_.info("link {} to peer {}: stream '{}' opened (id {})", l.id, l.peer_name, so.name,
                    so.stream_id);
  // A sender has a stream open on one link at a time, its newest: on an
  // older link from the same instance the stream has moved (that link may
  // be dead without this end knowing), or was forgotten there and opened
  // anew under another id.  Its credits there are of no use to the sender
  // any more, and what was held back there goes on this link.
  for (auto& [id, other] : links_) {
    if (id == l.id || other.peer != l.peer || other.peer_instance != l.peer_instance) continue;
    std::vector<uint64_t> moved_sids;
    for (const auto& [sid, in] : other.in_streams) {
      if (sid == so.stream_id || in.key == key) moved_sids.push_back(sid);
    }
    for (uint64_t sid : moved_sids) moveOff(other, sid, l, key);
  }
  grantCredits(key);
  return {};
}

void InboundStreams::moveOff(AgentLink& from, uint64_t sid, AgentLink& to, NameKey key) {
  if (auto held = held_back_.find({from.id, sid}); held != held_back_.end()) {
    HeldBack& here = held_back_[{to.id, sid}];
    here.acks.insert(here.acks.end(), held->second.acks.begin(), held->second.acks.end());
    here.stream = held->second.stream;
    here.this_round = true;
    held_back_.erase(held);
  }
  log_streams_.info("link {} to peer {}: stream {} moved to link {}", from.id, from.peer_name, sid, to.id);
  const NameKey moved = closeOnLink(from, sid);
  if (moved != key) grantCredits(moved);
  names_.release(moved);
}

NameKey InboundStreams::closeOnLink(AgentLink& l, uint64_t sid) {
  auto it = l.in_streams.find(sid);
  if (it == l.in_streams.end()) return kNoName;
  const NameKey key = it->second.key;  // still held: the caller releases it
  l.in_streams.erase(it);
  indexTarget(key, l.id, sid, false);
  senders_.countOpen(l.peer, l.peer_instance, sid, -1);
  // What was held back for the stream goes now; the sender may be gone.
  if (auto held = held_back_.find({l.id, sid}); held != held_back_.end()) held->second.this_round = true;
  windows_.erase({l.id, sid});
  senders_low_.erase({l.id, sid});
  // The stream's credits go back to their consumers, for other streams --
  // but for those whose reads are out: their slots wait for the answers.
  keepReadSlots(l, sid);
  for (auto cit = credits_.begin(); cit != credits_.end();) {
    if (cit->second.link_id != l.id || cit->second.stream_id != sid || cit->second.closing) {
      ++cit;
      continue;
    }
    if (l.transport) l.transport->retractCredit(cit->second.credit_id);
    fenceSlot(l, cit->second.client_id, cit->second.slot, cit->second.credit_id, key);
    cit = releaseCredit(cit);
  }
  return key;
}

void InboundStreams::onStreamClose(AgentLink& l, uint64_t sid) {
  const NameKey key = closeOnLink(l, sid);
  if (key == kNoName) return;
  // The sender closes a stream with nothing in flight: what was kept to
  // answer its replays can go, unless a consumer still holds a frame.
  senders_.closed(l.peer, l.peer_instance, sid);
  grantCredits(key);
  names_.release(key);
}

void InboundStreams::onLinkUp(AgentLink& l) {
  // What was kept for an earlier instance of this peer (a restarted daemon)
  // is of no use any more, unless a consumer still holds such a frame.
  senders_.forgetOtherInstances(l.peer, l.peer_instance);
  answerAgain(l);
}

AgentLink* InboundStreams::linkOf(PeerId peer, uint64_t instance) { return links_.usableTo(peer, instance); }

AgentLink* InboundStreams::answerLink(uint64_t came_on, PeerId peer, uint64_t instance) {
  AgentLink* l = links_.find(came_on);
  if (l != nullptr && l->usable()) return l;
  return linkOf(peer, instance);
}

void InboundStreams::onLinkDown(AgentLink& l) {
  dropHeldBack(l.id);
  for (auto& [sid, in] : l.in_streams) {
    indexTarget(in.key, l.id, sid, false);
    names_.release(in.key);
    senders_.countOpen(l.peer, l.peer_instance, sid, -1);
  }
  l.in_streams.clear();
  // Another link from the same sender is up (the sender replaced this one
  // and this end had not noticed): what this one held back, or carried and
  // may have lost, goes on that one now -- no later link-up may come to
  // carry it.
  for (auto it = links_.end(); it != links_.begin();) {
    --it;
    AgentLink& other = it->second;
    if (other.id != l.id && other.usable() && other.peer == l.peer &&
        other.peer_instance == l.peer_instance) {
      answerAgain(other);
      break;
    }
  }
}

}  // namespace framelink
