#include "agent/sender_memory.h"

#include <algorithm>
#include <iterator>

#include "agent/inbound_streams.h"

namespace framelink {

uint64_t SenderMemory::idOf(PeerId peer, uint64_t instance, uint64_t stream_id) {
  const Key key{peer, instance, stream_id};
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  const uint64_t id = next_id_++;
  ids_.emplace(key, id);
  Stream& in = streams_[id];
  ++per_peer_[peer];
  in.peer = peer;
  in.instance = instance;
  in.stream_id = stream_id;
  in.used_ns = clock_.nowNs();
  return id;
}

SenderMemory::Stream* SenderMemory::find(uint64_t id) {
  auto it = streams_.find(id);
  return it != streams_.end() ? &it->second : nullptr;
}

SenderMemory::Stream* SenderMemory::find(PeerId peer, uint64_t instance, uint64_t stream_id) {
  auto id = ids_.find(Key{peer, instance, stream_id});
  return id != ids_.end() ? find(id->second) : nullptr;
}

const SenderMemory::Stream* SenderMemory::find(PeerId peer, uint64_t instance, uint64_t stream_id) const {
  auto id = ids_.find(Key{peer, instance, stream_id});
  if (id == ids_.end()) return nullptr;
  auto it = streams_.find(id->second);
  return it != streams_.end() ? &it->second : nullptr;
}

bool SenderMemory::makeRoom(PeerId peer, uint64_t instance, uint64_t stream_id) {
  if (ids_.count(Key{peer, instance, stream_id}) != 0) return true;
  auto first = ids_.lower_bound(Key{peer, 0, 0});
  auto last = ids_.lower_bound(Key{peer + 1, 0, 0});
  if (static_cast<size_t>(std::distance(first, last)) < limits_.max_in_states_per_peer) return true;
  auto oldest = streams_.end();
  for (auto it = first; it != last; ++it) {
    auto in = streams_.find(it->second);
    if (in == streams_.end() || in->second.open_links != 0 || !in->second.held.empty()) continue;
    if (oldest == streams_.end() || in->second.used_ns < oldest->second.used_ns) oldest = in;
  }
  if (oldest == streams_.end()) return false;
  metrics_.counters.sender_streams_forgotten.fetch_add(1, std::memory_order_relaxed);
  forget(oldest);
  return true;
}

void SenderMemory::countOpen(PeerId peer, uint64_t instance, uint64_t stream_id, int change) {
  Stream& in = streams_[idOf(peer, instance, stream_id)];
  if (change > 0) {
    ++in.open_links;
  } else if (in.open_links > 0) {
    --in.open_links;
  }
  in.used_ns = clock_.nowNs();
}

void SenderMemory::closed(PeerId peer, uint64_t instance, uint64_t stream_id) {
  auto id = ids_.find(Key{peer, instance, stream_id});
  if (id == ids_.end()) return;
  auto in = streams_.find(id->second);
  if (in == streams_.end()) {
    ids_.erase(id);
  } else if (in->second.held.empty()) {
    forget(in);
  }
}

void SenderMemory::forgetOtherInstances(PeerId peer, uint64_t instance) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    const Stream& in = it->second;
    if (in.peer == peer && in.instance != instance && in.held.empty()) {
      forget(it++);
    } else {
      ++it;
    }
  }
}

void SenderMemory::forgetIdle(uint64_t now_ns) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    const Stream& in = it->second;
    if (in.open_links == 0 && in.held.empty() && now_ns - in.used_ns >= limits_.forget_idle_ns) {
      metrics_.counters.sender_streams_forgotten.fetch_add(1, std::memory_order_relaxed);
      forget(it++);
    } else {
      ++it;
    }
  }
}

void SenderMemory::forget(Streams::iterator it) {
  if (auto n = per_peer_.find(it->second.peer); n != per_peer_.end() && --n->second == 0) per_peer_.erase(n);
  ids_.erase(Key{it->second.peer, it->second.instance, it->second.stream_id});
  streams_.erase(it);
}

void SenderMemory::markAnswered(Stream& in, uint64_t sequence) {
  if (sequence <= in.answered_to) return;
  in.answered_above.insert(sequence);
  const size_t cap = rememberCap(in.peer);
  while (in.answered_above.size() > cap) {
    // A gap that stayed open for as many answers as the stream keeps: its
    // sender gave up on those frames (they ended TIMEOUT) or never sent
    // them.  The watermark passes it; a late replay of one is answered "unknown".
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

bool SenderMemory::answeredBefore(PeerId peer, uint64_t instance, uint64_t stream_id,
                                  uint64_t sequence) const {
  const Stream* in = find(peer, instance, stream_id);
  return in != nullptr && in->resend.count(sequence) == 0 && answered(*in, sequence);
}

void SenderMemory::released(Stream& in, const ReleasedFrame& frame) {
  in.held.erase(frame.sequence);
  in.released.push_back(frame);
  for (const size_t cap = rememberCap(in.peer); in.released.size() > cap;) in.released.pop_front();
  in.used_ns = clock_.nowNs();
}

void SenderMemory::refused(Stream& in, uint64_t sequence, int code) {
  in.refused[sequence] = code;
  for (const size_t cap = rememberCap(in.peer); in.refused.size() > cap;) {
    in.refused.erase(in.refused.begin());
  }
}

void SenderMemory::askedAgain(Stream& in, uint64_t sequence) {
  in.resend.insert(sequence);
  for (const size_t cap = rememberCap(in.peer); in.resend.size() > cap;) in.resend.erase(in.resend.begin());
}

size_t SenderMemory::rememberCap(PeerId peer) const {
  auto it = per_peer_.find(peer);
  const size_t streams = it != per_peer_.end() && it->second > 0 ? it->second : 1;
  return std::clamp(limits_.remembered_per_peer / streams, kMinRemembered, kMaxRemembered);
}

bool SenderMemory::remembers(PeerId peer) const {
  auto first = ids_.lower_bound(Key{peer, 0, 0});
  return first != ids_.end() && std::get<0>(first->first) == peer;
}

size_t SenderMemory::answersKept(PeerId peer) const {
  size_t n = 0;
  for (const auto& [id, in] : streams_) {
    if (in.peer != peer) continue;
    n += in.released.size() + in.refused.size() + in.resend.size() + in.answered_above.size();
  }
  return n;
}

size_t SenderMemory::framesHeld() const {
  size_t held = 0;
  for (const auto& [id, in] : streams_) held += in.held.size();
  return held;
}

}  // namespace framelink
