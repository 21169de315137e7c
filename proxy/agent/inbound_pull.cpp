// The consumer side of pull: a stream listed in pull_streams (or one a
// consumer attached with the pull option asks for) is granted
// credits that are exposed to no write; its sender offers each frame into
// one of them (peer::Offer: the header, and a source on the link that holds
// exactly the payload), and this end reads the payload straight into the
// credit's slot -- at most Limits::reads_per_link reads in flight per link,
// the rest of the offers waiting in order -- then treats the frame as one
// that arrived there (CRC32C, duplicates, delivery, ACK on release).  The
// rest of InboundStreams is in inbound_streams.cpp, inbound_answers.cpp and
// inbound_credits.cpp.
#include <spdlog/spdlog.h>

#include <optional>

#include "agent/inbound_streams.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"

namespace framelink {

bool InboundStreams::pullsStream(const std::string& stream) const {
  return pull_consumers_.count(stream) != 0 ||
         std::find(pull_streams_.begin(), pull_streams_.end(), stream) != pull_streams_.end();
}

bool InboundStreams::pulls(const AgentLink& l, const std::string& stream) const {
  return l.transport != nullptr && l.transport->readable() && pullsStream(stream);
}

bool InboundStreams::replayOfAnswered(const AgentLink& l, const transport::FrameHeader& h) const {
  return senders_.answeredBefore(l.peer, l.peer_instance, h.stream_id, h.sequence);
}

std::string InboundStreams::onOffer(AgentLink& l, const peer::Offer& offer) {
  const transport::FrameHeader& h = offer.header;
  const LogScope frame(LogFields{.sequence = h.sequence});
  auto it = findCredit(h.credit_id);
  if (it == credits_.end() || it->second.link_id != l.id || !it->second.pull) {
    // Answered as a frame written into a credit it does not hold would be:
    // a replay gets its answer again, anything else "send it again" (a
    // pushed credit is the sender's to write into, never to offer into).
    arrive(l, transport::TransportEvent::frameArrived(h), true);
    return {};
  }
  CreditEntry& credit = it->second;
  if (credit.offered) {
    return "an offer (stream " + std::to_string(h.stream_id) + " seq " + std::to_string(h.sequence) +
           ") into credit " + std::to_string(h.credit_id) + ", which an earlier offer has taken";
  }
  credit.offered = true;
  pull_.queue(l.id, h, offer.source);
  startReads(l);
  return {};
}

void InboundStreams::startReads(AgentLink& l) {
  for (auto rit = pull_.next(l.id, limits_.reads_per_link); rit != pull_.end();
       rit = pull_.next(l.id, limits_.reads_per_link)) {
    const uint64_t cookie = rit->first;
    PullRead& read = rit->second;
    const transport::FrameHeader& h = read.header;
    auto cit = findCredit(h.credit_id);
    AgentClient* ac = cit != credits_.end() ? clients_.find(cit->second.client_id) : nullptr;
    if (ac == nullptr || ac->session->gone || h.length > ac->session->segments->slotSize() ||
        replayOfAnswered(l, h)) {
      // Nothing to read: the credit is taken and the frame answered as it
      // would be had it landed (its consumer went, it does not fit, or it
      // is a replay of a frame answered already).
      pull_.leaveLine(l.id);
      const transport::FrameHeader header = h;
      pull_.erase(rit);
      arrive(l, transport::TransportEvent::frameArrived(header), true);
      continue;
    }
    ClientSession& consumer = *ac->session;
    transport::ReadRequest req;
    req.cookie = cookie;
    req.source = read.source;
    req.buffer = consumer.segments->slot(cit->second.slot);
    req.capacity = consumer.segments->slotSize();
    // No key: each of a consumer's slots has a registration of its own, and
    // the transport finds the one that holds this slot.
    const transport::PostResult r = l.transport->postRead(req);
    if (r == transport::PostResult::kBackpressure) break;  // tried again as reads complete
    pull_.leaveLine(l.id);
    if (r == transport::PostResult::kNotConnected) {
      pull_.erase(rit);  // the link is going: its credits go with it
      continue;
    }
    if (r == transport::PostResult::kInvalid) {
      const PullRead refused = read;
      pull_.erase(rit);
      refuseRead(l, refused, "the offer cannot be read: " + std::string(l.transport->lastRefusal()), true);
      continue;
    }
    pull_.posted(rit, consumer.segments, clock_.nowNs());
  }
}

void InboundStreams::onReadComplete(AgentLink& l, const transport::TransportEvent& ev) {
  const std::optional<PullRead> done = pull_.complete(l.id, ev.cookie, clock_.nowNs());
  if (!done) return;
  const PullRead& read = *done;
  auto cit = findCredit(read.header.credit_id);
  if (read.abandoned) {
    // Its consumer went and the frame was refused then; the bytes landed in
    // a segment kept for them, and go with it.
  } else if (cit != credits_.end() && cit->second.link_id == l.id && cit->second.closing) {
    // Its stream left the link while the read was out, and the slot waited
    // for it: now no byte of it can land any more, and the slot is free.
    // The frame is refused as one into a credit the link no longer holds.
    // FL_ERR_LINK_LOST: the slot goes with the link (retractCreditsOfLink).
    if (ev.status != FL_ERR_LINK_LOST) {
      refuseRead(l, read, "its stream closed on this link while its offer was read", ev.status == FL_OK);
    }
  } else if (ev.status == FL_OK) {
    metrics_.counters.frames_pulled.fetch_add(1, std::memory_order_relaxed);
    arrive(l, transport::TransportEvent::frameArrived(read.header), true);
  } else if (ev.status != FL_ERR_LINK_LOST) {
    // The source is gone: its sender retracted it, having answered the
    // frame or moved it (to a new offer, a new link) already.  A refusal now
    // would land on that new offer, a frame not refused: none is sent.
    refuseRead(l, read, "reading the offer failed: " + ev.message, false);
  }
  // FL_ERR_LINK_LOST: the link goes, and its credits with it; the sender
  // offers the frame again on its next link.
  startReads(l);
}

void InboundStreams::keepReadSlots(AgentLink& l, uint64_t sid) {
  for (auto it = pull_.reads().begin(); it != pull_.end();) {
    PullRead& read = it->second;
    auto cit = read.link_id == l.id && !read.abandoned ? findCredit(read.header.credit_id) : credits_.end();
    if (cit == credits_.end() || cit->second.link_id != l.id || cit->second.stream_id != sid) {
      ++it;
      continue;
    }
    if (read.posted) {
      // Whatever the peer says now, its answer may still come, and lands in
      // the slot: another sender's frame must not be there by then.
      cit->second.closing = true;
      log_pull_.info(
          "link {} (peer {}) stream {} seq {}: the stream left the link while its offer was read; "
          "the slot is granted again once the read ends",
          l.id, l.peer_name, read.header.stream_id, read.header.sequence);
      ++it;
      continue;
    }
    // Not read yet: nothing lands, and the credit goes with the stream's
    // others.  Its cookie in the link's line is skipped.
    const transport::FrameHeader h = read.header;
    it = pull_.erase(it);
    sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
             "its stream closed on this link before the offer was read");
  }
}

void InboundStreams::dropReadsInto(const ClientSession& consumer) {
  for (auto it = pull_.reads().begin(); it != pull_.end();) {
    PullRead& read = it->second;
    const transport::FrameHeader& h = read.header;
    auto cit = findCredit(h.credit_id);
    if (read.abandoned || cit == credits_.end() || cit->second.client_id != consumer.id) {
      ++it;
      continue;
    }
    credits_.erase(cit);
    if (AgentLink* l = links_.find(read.link_id)) {
      sendNack(*l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT,
               "its receive slot was withdrawn: the consumer detached");
    }
    if (read.posted) {
      read.abandoned = true;
      ++it;
    } else {
      it = pull_.erase(it);  // its cookie in the link's line is skipped
    }
  }
}

void InboundStreams::refuseRead(AgentLink& l, const PullRead& read, const std::string& why, bool nack) {
  const transport::FrameHeader& h = read.header;
  metrics_.counters.pull_reads_failed.fetch_add(1, std::memory_order_relaxed);
  log_pull_.warn("link {} (peer {}) stream {} seq {}: {}{}", l.id, l.peer_name, h.stream_id, h.sequence, why,
                 nack ? "; refused, for the sender to offer it again" : "");
  auto cit = findCredit(h.credit_id);
  if (cit != credits_.end() && cit->second.link_id == l.id) {
    NameKey stream = kNoName;
    releaseCredit(cit, &stream);
    if (stream != kNoName) dirty_grants_.insert(stream);
  }
  if (nack) sendNack(l, h.stream_id, h.sequence, FL_ERR_UNKNOWN_CREDIT, why);
}

}  // namespace framelink
