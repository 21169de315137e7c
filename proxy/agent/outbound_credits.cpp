// The producer side's credits: what a peer grants (whole or as slot credits
// of an announced region), what it recalls and retires, and CreditLow when a
// stream runs short.  The rest of OutboundStreams is in outbound_streams.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/outbound_streams.h"

namespace framelink {

std::string OutboundStreams::onCreditGrant(AgentLink& l, const peer::CreditGrant& g) {
  // The regions are the link's, whatever becomes of this grant's credits.
  for (const peer::SlotRegion& r : g.regions) {
    if (std::string why = l.peer_regions.add(r); !why.empty()) return why;
  }
  if (peers_[l.peer].link_id != l.id) return {};  // a replaced link: its credits are gone
  OutStream* sp = stream(l.peer, g.stream_id);
  if (sp == nullptr) {
    spdlog::debug("link {}: credits for unknown stream {} ignored", l.id, g.stream_id);
    return {};
  }
  OutStream& s = *sp;
  if (s.credits.size() + g.credits.size() + g.slot_credits.size() > peer::kMaxCreditsPerStream) {
    return "peer granted more than " + std::to_string(peer::kMaxCreditsPerStream) + " credits";
  }
  auto take = [&s, &g](transport::RemoteCredit rc) -> std::string {
    rc.pull = g.pull;  // a grant's credits are all of one kind; a later grant's may differ
    // Credit ids are unique on a link: one held twice would take two frames
    // into one slot.
    auto [at, fresh] = s.by_credit_id.try_emplace(rc.credit_id);
    if (!fresh) {
      return "peer granted credit " + std::to_string(rc.credit_id) + " of stream " +
             std::to_string(g.stream_id) + " while that credit was already granted";
    }
    at->second = s.credits.insert(s.credits.end(), rc);
    s.largest_credit = std::max(s.largest_credit, rc.length);
    s.unfit_from = UINT64_MAX;  // a frame that fitted none may fit this one
    return {};
  };
  for (const auto& rc : g.credits) {
    if (std::string why = take(rc); !why.empty()) return why;
  }
  for (uint64_t id : g.slot_credits) {
    transport::RemoteCredit rc;
    if (std::string why = l.peer_regions.resolve(id, &rc); !why.empty()) return why;
    if (std::string why = take(rc); !why.empty()) return why;
  }
  s.pull = g.pull;  // the receiver's latest choice for the stream on this link (stats)
  // Another sender of the stream may hold the large consumer's credits now.
  s.largest_credit = std::max(s.largest_credit, g.largest_slot);
  s.credit_peak = std::max(s.credit_peak, s.credits.size());
  if (s.credits.size() > s.credit_peak / 4) s.said_low = false;
  // Used by pumpAll() in this round: had each grant sent its stream's frames
  // at once, the stream the peer happens to grant first would always go first.
  return {};
}

std::list<transport::RemoteCredit>::iterator OutboundStreams::fittingCredit(OutStream& s, uint64_t length) {
  // The oldest credit the frame fits: consumers of one stream may have
  // slots of different sizes, and a small one must not block a frame that
  // a larger one can take.  A receiver may hold many credits none of which
  // fits (review N10d): a length that found none is not scanned for again
  // until a grant.
  if (length >= s.unfit_from) return s.credits.end();
  auto fit = std::find_if(s.credits.begin(), s.credits.end(),
                          [length](const transport::RemoteCredit& cr) { return cr.length >= length; });
  if (fit == s.credits.end()) s.unfit_from = length;
  return fit;
}

void OutboundStreams::dropCredits(OutStream& s) {
  s.credits.clear();
  s.by_credit_id.clear();
  s.largest_credit = 0;
  s.unfit_from = UINT64_MAX;
  s.credit_peak = 0;
  s.said_low = false;
  s.pull = false;
}

void OutboundStreams::maybeSayLow(AgentLink& l, OutStream& s) {
  // Below 8 credits a quarter is at most one frame, and the receiver sends
  // every release back at once anyway.
  constexpr size_t kLowSignalMinCredits = 8;
  if (s.said_low || s.credit_peak < kLowSignalMinCredits || s.credits.size() > s.credit_peak / 4) return;
  s.said_low = true;
  v1::PeerMessage low;
  low.mutable_credit_low()->set_stream_id(s.id);
  l.send(std::move(low));
}

void OutboundStreams::onCreditRevoke(AgentLink& l, const peer::CreditRevoke& r) {
  // The credits already taken from a retired region stay addressable: each
  // holds its own address.
  for (uint32_t id : r.retired_regions) l.peer_regions.retire(id);
  OutStream* s = stream(l.peer, r.stream_id);
  if (s == nullptr) return;
  // Those not used yet are given back, so the receiver may grant their slots
  // to another sender; one already used lands (or is refused) as it would have.
  v1::PeerMessage back;
  for (uint64_t id : r.credit_ids) {
    auto it = s->by_credit_id.find(id);
    if (it == s->by_credit_id.end()) continue;
    s->credits.erase(it->second);
    s->by_credit_id.erase(it);
    back.mutable_credit_revoke()->add_credit_ids(id);
  }
  if (back.has_credit_revoke()) {
    back.mutable_credit_revoke()->set_stream_id(r.stream_id);
    back.mutable_credit_revoke()->set_returned(true);
    l.send(std::move(back));
  }
}

}  // namespace framelink
