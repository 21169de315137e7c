// LocalDelivery: how a local frame ends for a reader that does not release
// it -- one that holds it past ack_timeout_ms, and one that went -- so that
// no reader pins a producer's slot for longer (local_delivery.h).
#include <spdlog/spdlog.h>

#include "agent/local_delivery.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"

namespace framelink {

void LocalDelivery::startHold(const FrameKey& key, Frame& f) {
  if (f.hold_deadline_ns != 0) holds_.erase({f.hold_deadline_ns, key});
  f.hold_deadline_ns = clock_.nowNs() + uint64_t{config_.ack_timeout_ms} * 1'000'000ULL;
  holds_.emplace(f.hold_deadline_ns, key);
}

void LocalDelivery::checkHolds() {
  const uint64_t now = clock_.nowNs();
  while (!holds_.empty() && holds_.begin()->first <= now) {
    const auto [deadline, key] = *holds_.begin();
    holds_.erase(holds_.begin());
    auto fit = frames_.find(key);
    // A frame that ended meanwhile, or a later one in the same slot.
    if (fit == frames_.end() || fit->second.hold_deadline_ns != deadline) continue;
    fit->second.hold_deadline_ns = 0;
    takeBack(key);
  }
}

void LocalDelivery::takeBack(const FrameKey& key) {
  Frame& f = frames_.at(key);
  auto rit = readers_.find(f.stream);
  if (rit == readers_.end()) return;
  // The frame ends for every reader still holding it, as for a reader that
  // died: it counts among the frame's readers, not its releases.  The slot
  // it holds the frame in stays its own until it releases it (a release
  // names no frame, only the slot); a lent segment stays mapped, read-only,
  // and may show it the producer's later frames from then on.  A frame that
  // landed here from a peer stays with the consumer it landed in: the
  // sender's own deadline covers that one.
  for (const uint64_t id : rit->second.consumers) {
    AgentClient* c = clients_.find(id);
    if (c == nullptr) continue;
    ClientSession& r = *c->session;
    for (uint32_t slot = 0; slot < r.slots.size(); ++slot) {
      SlotEntry& e = r.slots[slot];
      if (e.state != SlotState::kDelivered || e.consumer.taken_back || e.consumer.local_from != f.producer ||
          e.consumer.local_slot != f.slot || e.sequence != f.sequence || f.readers_out == 0) {
        continue;
      }
      e.consumer.taken_back = true;
      --f.readers_out;
      if (f.failure == FL_OK) {
        f.failure = FL_ERR_TIMEOUT;
        f.why = "a local consumer held the frame longer than ack_timeout_ms (" +
                std::to_string(config_.ack_timeout_ms) + " ms) without releasing it";
      }
      metrics_.counters.local_frames_taken_back.fetch_add(1, std::memory_order_relaxed);
      const LogScope scope(LogFields{.client = r.id, .stream = r.stream, .sequence = f.sequence});
      log_holds_.warn(
          "client {} stream '{}': held frame {} (slot {}) longer than ack_timeout_ms ({} ms) without "
          "releasing it; the frame ends for it (FL_ERR_TIMEOUT), the slot stays its own until it releases it",
          r.id, r.stream, f.sequence, slot, config_.ack_timeout_ms);
    }
  }
  endIfDone(key);
}

bool LocalDelivery::tookCompletion(const ClientSession& c, const SlotEntry& e) {
  // The ring's head is the client's word: one that lies about it gets its
  // frame counted as read (it failed for it), or handed to another member.
  return __atomic_load_n(&c.segments->completionRing()->head, __ATOMIC_ACQUIRE) > e.consumer.completion_at;
}

void LocalDelivery::readerGone(ClientSession& consumer, uint32_t slot) {
  const SlotEntry& e = consumer.slots[slot];
  if (!e.consumer.taken_back && !tookCompletion(consumer, e) && handOn(consumer, slot)) return;
  readerDone(consumer, slot, FL_ERR_NO_CONSUMER, "a local consumer died before releasing the frame");
}

bool LocalDelivery::otherMember(const std::string& stream, uint64_t except) {
  auto rit = readers_.find(stream);
  if (rit == readers_.end()) return false;
  for (const uint64_t id : rit->second.consumers) {
    const AgentClient* c = clients_.find(id);
    if (c != nullptr && id != except && !c->session->gone && !c->session->subscriber) return true;
  }
  return false;
}

bool LocalDelivery::handOn(ClientSession& consumer, uint32_t slot) {
  const SlotEntry& e = consumer.slots[slot];
  const FrameKey key{e.consumer.local_from, e.consumer.local_slot};
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.sequence != e.sequence || fit->second.readers_out == 0) {
    return false;
  }
  Frame& f = fit->second;
  // It was given the frame as it left (the agent heard of it after routing
  // the frame): not one of its readers.
  --f.readers_out;
  if (f.readers > 0) --f.readers;
  if (consumer.subscriber && f.readers > 0) {
    endIfDone(key);
    return true;
  }
  // A member's frame that the subscribers here have, and no other member
  // to take it: it ends with them, as one routed while the group was empty.
  if (f.readers > 0 && !otherMember(f.stream, consumer.id)) {
    endIfDone(key);
    return true;
  }
  // A member's frame goes to another member (the subscribers have it), and
  // one that reached nobody else waits for its readers again, in front of
  // the stream's later frames.
  f.member_only = !consumer.subscriber && f.readers > 0;
  if (!f.waiting) streams_[f.stream].waiting.push_front(key);
  f.waiting = true;
  metrics_.counters.local_frames_handed_on.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace framelink
