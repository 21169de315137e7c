// How InboundStreams answers from what it remembers per sender stream
// (SenderMemory): a replayed frame is dropped and answered again (ACK, NACK
// or "unknown"), never delivered twice; and those answers are sent again on
// a sender's new link, a bounded part a round.
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

bool InboundStreams::answerKnown(AgentLink& l, const transport::FrameHeader& h, const char* refused_note) {
  const InState* found = senders_.find(l.peer, l.peer_instance, h.stream_id);
  if (found == nullptr) return false;
  const InState& in = *found;
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

bool InboundStreams::dropDuplicate(AgentLink& l, const transport::FrameHeader& h) {
  InState& in = senders_.at(senders_.idOf(l.peer, l.peer_instance, h.stream_id));
  if (in.resend.erase(h.sequence) != 0) return false;         // the copy asked for after a CRC mismatch
  if (!SenderMemory::answered(in, h.sequence)) return false;  // new, or its first copy never arrived
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
  for (auto it = senders_.streams().lower_bound(*next); it != senders_.streams().end(); ++it) {
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
