// What InboundStreams remembers per sender stream (InState: a peer instance's
// stream, across its links): the answers it gave, so that a replayed frame is
// dropped and answered again (ACK, NACK or "unknown"), never delivered twice,
// and the bound on how many sender streams a peer may leave behind; and
// those answers sent again on a sender's new link, a bounded part a round.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include "agent/inbound_streams.h"
#include "framelink/framelink.h"
#include "transport/frame_header.h"

namespace framelink {

uint64_t InboundStreams::inStateId(const AgentLink& l, uint64_t stream_id) {
  const InStateKey key{l.peer, l.peer_instance, stream_id};
  auto it = in_state_ids_.find(key);
  if (it != in_state_ids_.end()) return it->second;
  const uint64_t id = next_in_state_id_++;
  in_state_ids_.emplace(key, id);
  InState& in = in_states_[id];
  ++in_states_of_peer_[l.peer];
  in.peer = l.peer;
  in.instance = l.peer_instance;
  in.stream_id = stream_id;
  in.used_ns = clock_.nowNs();
  return id;
}

bool InboundStreams::roomForInState(const AgentLink& l, uint64_t sid) {
  if (in_state_ids_.count(InStateKey{l.peer, l.peer_instance, sid}) != 0) return true;
  auto first = in_state_ids_.lower_bound(InStateKey{l.peer, 0, 0});
  auto last = in_state_ids_.lower_bound(InStateKey{l.peer + 1, 0, 0});
  if (static_cast<size_t>(std::distance(first, last)) < limits_.max_in_states_per_peer) return true;
  auto oldest = in_states_.end();
  for (auto it = first; it != last; ++it) {
    auto ist = in_states_.find(it->second);
    if (ist == in_states_.end() || ist->second.open_links != 0 || !ist->second.held.empty()) continue;
    if (oldest == in_states_.end() || ist->second.used_ns < oldest->second.used_ns) oldest = ist;
  }
  if (oldest == in_states_.end()) return false;
  metrics_.counters.sender_streams_forgotten.fetch_add(1, std::memory_order_relaxed);
  forgetInState(oldest);
  return true;
}

void InboundStreams::countOpen(const AgentLink& l, uint64_t sid, int change) {
  InState& in = in_states_[inStateId(l, sid)];
  if (change > 0) {
    ++in.open_links;
  } else if (in.open_links > 0) {
    --in.open_links;
  }
  in.used_ns = clock_.nowNs();
}

void InboundStreams::forgetInState(std::map<uint64_t, InState>::iterator it) {
  if (auto n = in_states_of_peer_.find(it->second.peer); n != in_states_of_peer_.end() && --n->second == 0) {
    in_states_of_peer_.erase(n);
  }
  in_state_ids_.erase(InStateKey{it->second.peer, it->second.instance, it->second.stream_id});
  in_states_.erase(it);
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
  auto released = std::find_if(in.released.begin(), in.released.end(),
                               [&](const ReleasedFrame& r) { return r.sequence == h.sequence; });
  if (released != in.released.end()) {
    ackAgain(l, h, *released);
    return true;
  }
  return false;
}

void InboundStreams::ackAgain(AgentLink& l, const transport::FrameHeader& h, const ReleasedFrame& answer) {
  metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("[peer {} stream {} seq {}] replay of a delivered frame: dropped, ACK sent again",
                l.peer_name, h.stream_id, h.sequence);
  // At once: the sender is replaying, and waits for this answer.
  HeldBack& held = held_back_[{l.id, h.stream_id}];
  held.acks.push_back(answer);
  held.this_round = true;
}

size_t InboundStreams::rememberCap(uint64_t peer) const {
  auto it = in_states_of_peer_.find(peer);
  const size_t streams = it != in_states_of_peer_.end() && it->second > 0 ? it->second : 1;
  return std::clamp(limits_.remembered_per_peer / streams, kMinRemembered, kMaxRemembered);
}

size_t InboundStreams::answersKept(uint64_t peer) const {
  size_t n = 0;
  for (const auto& [id, in] : in_states_) {
    if (in.peer != peer) continue;
    n += in.released.size() + in.refused.size() + in.resend.size() + in.answered_above.size();
  }
  return n;
}

void InboundStreams::markAnswered(InState& in, uint64_t sequence) {
  if (sequence <= in.answered_to) return;
  in.answered_above.insert(sequence);
  const size_t cap = rememberCap(in.peer);
  while (in.answered_above.size() > cap) {
    // A gap that stayed open for as many answers as the stream keeps: its sender gave up
    // on those frames (they ended TIMEOUT) or never sent them.  The
    // watermark passes it; a late replay of one is answered "unknown".
    metrics_.counters.answer_gaps_forgotten.fetch_add(*in.answered_above.begin() - in.answered_to - 1,
                                                      std::memory_order_relaxed);
    in.answered_to = *in.answered_above.begin();
    in.answered_above.erase(in.answered_above.begin());
  }
  while (!in.answered_above.empty() && *in.answered_above.begin() == in.answered_to + 1) {
    ++in.answered_to;
    in.answered_above.erase(in.answered_above.begin());
  }
}

bool InboundStreams::dropDuplicate(AgentLink& l, const transport::FrameHeader& h) {
  InState& in = in_states_[inStateId(l, h.stream_id)];
  if (in.resend.erase(h.sequence) != 0) return false;  // the copy asked for after a CRC mismatch
  if (!answered(in, h.sequence)) return false;         // new, or its first copy never arrived
  if (answerKnown(l, h, "refused before the link broke")) return true;
  // Answered once, but how is no longer remembered (released or refused
  // longer ago than the memory bounds reach): the sender is told the
  // outcome is unknown, never DELIVERED on a guess.
  metrics_.counters.duplicates_dropped.fetch_add(1, std::memory_order_relaxed);
  sendNack(l, h.stream_id, h.sequence, FL_ERR_TIMEOUT,
           "replay of a frame answered too long ago to remember how (it may have been delivered)");
  return true;
}

void InboundStreams::answerAgain(AgentLink& to) {
  uint64_t next = 0;
  bool done = false;
  answerSomeAgain(to, &next, &done);
  if (!done) answering_again_[to.id] = next;
}

size_t InboundStreams::answerSomeAgain(AgentLink& to, uint64_t* next, bool* done) {
  std::vector<std::tuple<uint64_t, uint64_t, int>> refusals;  // (stream, sequence, code)
  size_t answers = 0;
  *done = true;
  for (auto it = in_states_.lower_bound(*next); it != in_states_.end(); ++it) {
    if (answers >= kAnswersAgainPerRound) {
      *next = it->first;
      *done = false;
      break;
    }
    const InState& in = it->second;
    if (in.peer != to.peer || in.instance != to.peer_instance) continue;
    if (!in.released.empty()) {
      HeldBack& held = held_back_[{to.id, in.stream_id}];
      held.acks.insert(held.acks.end(), in.released.begin(), in.released.end());
      held.this_round = true;
    }
    for (const auto& [sequence, code] : in.refused) refusals.emplace_back(in.stream_id, sequence, code);
    answers += in.released.size() + in.refused.size();
  }
  for (const auto& [stream_id, sequence, code] : refusals) {
    sendNack(to, stream_id, sequence, code, "refused before the link broke");
  }
  return answers;
}

size_t InboundStreams::continueAnswersAgain() {
  size_t answers = 0;
  for (auto it = answering_again_.begin(); it != answering_again_.end();) {
    AgentLink* l = links_.find(it->first);
    if (l == nullptr || !l->usable()) {
      it = answering_again_.erase(it);
      continue;
    }
    // The peer reads what went before first: the records waiting for its
    // transport stay far below what fails the link.
    if (l->controlQueuedBytes() > kMaxControlQueueBytes / 4) {
      ++it;
      continue;
    }
    bool done = false;
    answers += answerSomeAgain(*l, &it->second, &done);
    it = done ? answering_again_.erase(it) : std::next(it);
  }
  return answers;
}

}  // namespace framelink
