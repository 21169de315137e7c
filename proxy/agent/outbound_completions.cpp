// How a producer's frame ends: the peer's ACK or NACK (a refusal that can be
// sent again goes back to pending), the transport's send completion, and a
// frame whose outcome is known while a transport still holds a post of it
// (kSettling: it ends when the last post completes, so neither its slot nor
// its producer's segment is let go while a transport may read them).  The
// rest of OutboundStreams is in outbound_streams.cpp and outbound_credits.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agent/outbound_streams.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"
#include "framelink/status_name.hpp"

namespace framelink {

namespace {

// A frame the receiver refused without delivering it -- its CRC32C was wrong,
// or it landed in a credit withdrawn meanwhile (its consumer went away) -- is
// sent this many more times before it fails with that code (a CRC mismatch is
// then in the producer's slot).
constexpr uint32_t kMaxResends = 3;

uint32_t saturatingAdd(uint32_t a, uint32_t b) { return b > UINT32_MAX - a ? UINT32_MAX : a + b; }

}  // namespace

void OutboundStreams::finishFrame(AgentClient& ac, Leg leg, uint32_t slot, int status,
                                  const std::string& why) {
  SlotEntry& e = legSlot(ac, leg, slot);
  if (e.state == SlotState::kFree || e.state == SlotState::kSettling) return;
  endOffer(e);  // answered, failed or timed out: its source is read no more
  if (e.producer.posts_out > 0 && !shutting_down_) {
    // A transport still holds a post of the payload (an ACK came before the
    // send's completion, or the frame went again on a new link while the old
    // one still has it): the slot stays the frame's, and the producer's
    // segment stays mapped, until the last post completes.
    e.state = SlotState::kSettling;
    e.producer.deadline_ns = 0;
    settling_[{ac.session->id, slot, leg}] = Outcome{status, why};
    return;
  }
  endFrame(ac, leg, slot, status, why);
}

bool OutboundStreams::sideDone(ClientSession& c, uint32_t slot, uint64_t side, int& status, std::string& why,
                               uint32_t readers, uint32_t released) {
  SlotEntry& e = c.slots[slot];
  auto it = sides_.find({c.id, slot});
  if (it == sides_.end()) {  // its only side
    e.producer.readers = readers;
    e.producer.released = released;
    return true;
  }
  Sides& sides = it->second;
  // A side that ends twice is the daemon stopping (failAllInProgress): the
  // frame ends now, with what the sides done so far said.
  const bool again = (sides.waiting & side) == 0;
  if (!again) {
    sides.waiting &= ~side;
    if (sides.status == FL_OK && status != FL_OK) {
      sides.status = status;
      sides.why = why;
    }
    // Saturated: one route's peer may claim any count, and must neither
    // wrap the frame's to 0 nor push released past readers.
    sides.readers = saturatingAdd(sides.readers, readers);
    sides.released = std::min(saturatingAdd(sides.released, released), sides.readers);
    if (sides.waiting != 0) return false;
  }
  if (sides.status != FL_OK || !again) {
    status = sides.status;
    why = sides.why;
  }
  e.producer.readers = sides.readers;
  e.producer.released = sides.released;
  sides_.erase(it);
  return true;
}

void OutboundStreams::endFrame(AgentClient& ac, Leg leg, uint32_t slot, int status, const std::string& why) {
  ClientSession& c = *ac.session;
  SlotEntry& e = legSlot(ac, leg, slot);
  const uint32_t readers = e.producer.readers;
  const uint32_t released = e.producer.released;
  if (leg != 0) {
    // This route's part is over; the frame itself is the session slot's.
    e = SlotEntry{};
    if (sides_.count({c.id, slot}) == 0) return;  // it ended already: the daemon is stopping
  }
  std::string reason = why;
  if (!sideDone(c, slot, sideBit(leg), status, reason, readers, released)) {
    // Another side still has the frame: the slot stays lent to it.
    if (leg == 0) e.state = SlotState::kLent;
    return;
  }
  completeFrame(c, slot, status, reason);
}

void OutboundStreams::completeFrame(ClientSession& c, uint32_t slot, int status, const std::string& why) {
  SlotEntry& e = c.slots[slot];
  if (status == FL_OK) {
    metrics_.counters.frames_delivered.fetch_add(1, std::memory_order_relaxed);
    metrics_.counters.bytes_sent.fetch_add(e.length, std::memory_order_relaxed);
    metrics_.recordDeliveryLatency((clock_.nowNs() - e.submitted_ns) / 1000);
    ++c.frames;
    c.bytes += e.length;
  } else {
    metrics_.counters.frames_failed.fetch_add(1, std::memory_order_relaxed);
    metrics_.recordFailure(status);
    ++c.errors;
    const LogScope scope(LogFields{.client = c.id, .stream = c.stream, .sequence = e.sequence});
    log_failed_.warn("[client {} stream '{}' seq {} frame {}] FAILED {}: {}", c.id, c.stream, e.sequence,
                     e.frame_id, statusName(status), why);
  }
  const SlotEntry ended = e;
  e = SlotEntry{};
  if (c.in_progress > 0) --c.in_progress;
  clients_.complete(c, slot, status, ended.sequence, ended.length, ended.frame_id, ended.producer.readers,
                    ended.producer.released);
}

void OutboundStreams::endLocalFrame(AgentClient& producer, uint32_t slot, int status, const std::string& why,
                                    uint32_t readers, uint32_t released) {
  std::string reason = why;
  if (!sideDone(*producer.session, slot, kLocalSide, status, reason, readers, released)) return;
  completeFrame(*producer.session, slot, status, reason);
  maybeForget(producer);  // may forget the producer
}

void OutboundStreams::failAllInProgress(const ClientSession& c, int status, const std::string& why) {
  AgentClient* ac = clients_.find(c.id);
  if (ac == nullptr) return;
  for (uint32_t slot = 0; slot < c.slots.size(); ++slot) {
    // The further routes first: the frame ends with its first route (the
    // session's slot), which may be done already and wait for another side.
    for (Leg leg = legs(*ac); leg-- > 0;) {
      if (legSlot(*ac, leg, slot).state != SlotState::kFree) finishFrame(*ac, leg, slot, status, why);
    }
    if (legs(*ac) == 0 && c.slots[slot].state != SlotState::kFree) finishFrame(*ac, 0, slot, status, why);
  }
}

int OutboundStreams::subscribersAnswer(AgentClient& ac, FrameRef f, int status) {
  if (status != FL_ERR_NO_CONSUMER || legHeader(ac, f.leg, f.slot).subscribers_only == 0) return status;
  metrics_.counters.frames_no_subscriber.fetch_add(1, std::memory_order_relaxed);
  return FL_OK;
}

void OutboundStreams::onAck(PeerId peer, uint64_t stream_id, uint64_t sequence, int status,
                            const std::string& why, uint32_t readers, uint32_t released, uint64_t link_id) {
  OutStream* sp = stream(peer, stream_id);
  if (sp == nullptr) {
    spdlog::debug("peer {}: ACK for unknown stream {} seq {} ignored", peers_[peer].name, stream_id,
                  sequence);
    return;
  }
  OutStream& s = *sp;
  auto it = s.unacked.find(sequence);
  if (it == s.unacked.end()) {
    // A frame waiting to be replayed (its link broke before the ACK came) is
    // settled by the ACK its receiver sends again on the new link -- or by
    // its refusal (the consumer died holding it): it needs no credit for
    // that, and must not fail for the want of one.
    auto pit = s.pending.find(sequence);
    if ((status == FL_OK || !peer::resendable(status)) && pit != s.pending.end()) {
      FrameRef f = pit->second;
      AgentClient* ac = clients_.find(f.client_id);
      if (ac != nullptr) {
        status = subscribersAnswer(*ac, f, status);
        SlotEntry& e = legSlot(*ac, f.leg, f.slot);
        if (e.state == SlotState::kPending && e.sequence == sequence && e.producer.was_posted) {
          s.pending.erase(pit);
          metrics_.counters.acks_for_replays.fetch_add(1, std::memory_order_relaxed);
          e.producer.readers = readers;
          e.producer.released = released;
          finishFrame(*ac, f.leg, f.slot, status, status == FL_OK ? std::string() : why);
          maybeForget(*ac);
          return;
        }
      }
    }
    spdlog::debug("peer {} stream '{}': ACK for seq {} that is not outstanding (late or duplicate)",
                  peers_[peer].name, s.name, sequence);
    return;
  }
  FrameRef f = it->second;
  AgentClient* ac = clients_.find(f.client_id);
  if (ac == nullptr) {
    s.unacked.erase(it);
    return;
  }
  status = subscribersAnswer(*ac, f, status);
  ClientSession& c = *ac->session;
  SlotEntry& e = legSlot(*ac, f.leg, f.slot);
  if (peer::resendable(status) && link_id != 0 && e.link_id != 0 && e.link_id != link_id) {
    // A link that was replaced refused its copy (a pull offer whose source
    // went with the move); the copy on the new link is answered there.
    spdlog::debug("peer {} stream '{}': refusal of seq {} on link {} ignored: it is posted on link {} now",
                  peers_[peer].name, s.name, sequence, link_id, e.link_id);
    return;
  }
  s.unacked.erase(it);
  if (peer::resendable(status) && e.producer.resends < kMaxResends && !shutting_down_ &&
      (e.state == SlotState::kPosted || e.state == SlotState::kSent)) {
    // Not delivered (damaged on the way, or its credit was withdrawn): the
    // payload is still in the producer's slot, so send it again, ahead of
    // the frames that never left.
    ++e.producer.resends;
    unpost(e, creditDeadline(clock_.nowNs()));
    s.pending.emplace(e.sequence, f);
    (status == FL_ERR_CRC_MISMATCH ? metrics_.counters.frames_resent_crc
                                   : metrics_.counters.frames_resent_credit)
        .fetch_add(1, std::memory_order_relaxed);
    const LogScope scope(LogFields{.client = c.id, .stream = c.stream, .sequence = e.sequence});
    log_resent_.warn("[client {} stream '{}' seq {} frame {}] {}; sending it again (attempt {} of {})", c.id,
                     c.stream, e.sequence, e.frame_id, why, e.producer.resends + 1, kMaxResends + 1);
    return;
  }
  e.producer.readers = readers;
  e.producer.released = released;
  finishFrame(*ac, f.leg, f.slot, status, why);
  maybeForget(*ac);
}

void OutboundStreams::onSendComplete(const transport::TransportEvent& ev) {
  auto it = posted_.find(ev.cookie);
  if (it == posted_.end()) return;
  const Posted posted = it->second;
  posted_.erase(it);
  AgentClient* ac = clients_.find(posted.frame.client_id);
  if (ac == nullptr) return;
  const FrameRef f = posted.frame;
  SlotEntry& e = legSlot(*ac, f.leg, f.slot);
  if (e.producer.posts_out > 0) --e.producer.posts_out;
  if (e.state == SlotState::kSettling) {
    if (e.producer.posts_out == 0) {
      auto oit = settling_.find({f.client_id, f.slot, f.leg});
      Outcome outcome = oit != settling_.end() ? std::move(oit->second) : Outcome{FL_ERR_TIMEOUT, {}};
      if (oit != settling_.end()) settling_.erase(oit);
      endFrame(*ac, f.leg, f.slot, outcome.status, outcome.why);
    }
    maybeForget(*ac);
    return;
  }
  // A post the frame no longer waits for (it went again on another link).
  if (e.state != SlotState::kPosted || e.producer.post_cookie != ev.cookie) return;
  if (ev.status == FL_OK) {
    e.state = SlotState::kSent;
    e.producer.deadline_ns = ackDeadline(clock_.nowNs());
  } else if (ev.status == FL_ERR_LINK_LOST || ev.status == FL_ERR_DEVICE) {
    // The link broke, not the frame: it stays unacknowledged and is
    // replayed on the next link (requeueUnacked, when the link is down).
  } else {
    if (OutStream* s = stream(posted.peer, posted.stream_id)) s->unacked.erase(posted.sequence);
    // This copy failed; one posted before (on a link that broke, or before
    // a NACK) may be at the consumer, so the frame's fate is unknown.
    const bool earlier = e.producer.posts > 1;
    finishFrame(*ac, f.leg, f.slot, earlier ? FL_ERR_TIMEOUT : ev.status,
                "send failed: " + ev.message + (earlier ? " (an earlier copy may have been delivered)" : ""));
  }
  maybeForget(*ac);
}

void OutboundStreams::forgetPostsOf(uint64_t link_id) {
  std::vector<uint64_t> cookies;
  for (const auto& [cookie, p] : posted_) {
    if (p.link_id == link_id) cookies.push_back(cookie);
  }
  for (uint64_t cookie : cookies) {
    // An offer's source is retracted, not only let go.  The transport was
    // shut down: nothing it holds reads the slot any more, so the post goes
    // now, whatever copies of its pin the transport keeps until its end.
    auto it = posted_.find(cookie);
    if (it == posted_.end()) continue;
    if (it->second.offered) retractOffer(it->second, cookie);
    onSendComplete(transport::TransportEvent::sendComplete(cookie, FL_ERR_LINK_LOST, "link closed"));
  }
}

void OutboundStreams::endOffer(SlotEntry& e) {
  auto it = posted_.find(e.producer.post_cookie);
  if (e.producer.post_cookie == 0 || it == posted_.end() || !it->second.offered || it->second.retracted) {
    return;
  }
  if (!retractOffer(it->second, e.producer.post_cookie)) return;  // settleSources lets it go
  posted_.erase(it);
  if (e.producer.posts_out > 0) --e.producer.posts_out;
}

bool OutboundStreams::retractOffer(Posted& posted, uint64_t cookie) {
  if (!posted.retracted) {
    posted.retracted = true;
    if (AgentLink* l = links_.find(posted.link_id); l != nullptr && l->transport) {
      l->transport->retractSource(cookie);
    }
  }
  return posted.pin.expired();
}

size_t OutboundStreams::settleSources() {
  size_t settled = 0;
  for (uint64_t cookie : pins_->take()) {
    auto it = posted_.find(cookie);
    // Let go already (endOffer saw its pin gone), or never posted.
    if (it == posted_.end() || !it->second.offered || !it->second.retracted) continue;
    // As a post's completion: the frame settling on it ends with its last.
    onSendComplete(transport::TransportEvent::sendComplete(cookie, FL_OK, {}));
    ++settled;
  }
  return settled;
}

}  // namespace framelink
