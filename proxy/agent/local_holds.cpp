// LocalDelivery: how a local frame ends for a reader that does not release
// it: one that went (local_delivery.h).
#include <spdlog/spdlog.h>

#include "agent/local_delivery.h"
#include "common/log_fields.h"
#include "framelink/framelink.h"

namespace framelink {

bool LocalDelivery::tookCompletion(const ClientSession& c, const SlotEntry& e) {
  // The ring's head is the client's word: one that lies about it gets its
  // frame counted as read (it failed for it), or handed to another member.
  return __atomic_load_n(&c.segments->completionRing()->head, __ATOMIC_ACQUIRE) > e.completion_at;
}

void LocalDelivery::readerGone(ClientSession& consumer, uint32_t slot) {
  const SlotEntry& e = consumer.slots[slot];
  if (!tookCompletion(consumer, e) && handOn(consumer, slot)) return;
  readerDone(consumer, slot, FL_ERR_NO_CONSUMER, "a local consumer died before releasing the frame");
}

bool LocalDelivery::handOn(ClientSession& consumer, uint32_t slot) {
  const SlotEntry& e = consumer.slots[slot];
  const FrameKey key{e.local_from, e.local_slot};
  auto fit = frames_.find(key);
  if (fit == frames_.end() || fit->second.sequence != e.sequence || fit->second.readers_out == 0)
    return false;
  Frame& f = fit->second;
  // It was given the frame as it left (the agent heard of it after routing
  // the frame): not one of its readers.
  --f.readers_out;
  if (f.readers > 0) --f.readers;
  if (consumer.subscriber && f.readers > 0) {
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
