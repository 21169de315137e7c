#include "client_session.h"

#include <unistd.h>

#include "framelink/shm_ring.h"

namespace framelink {

const char* slotStateName(SlotState state) noexcept {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kPending:
      return "pending";
    case SlotState::kPosted:
      return "posted";
    case SlotState::kSent:
      return "sent";
    case SlotState::kCredited:
      return "credited";
    case SlotState::kDelivered:
      return "delivered";
  }
  return "?";
}

bool ClientSession::complete(uint32_t slot, int32_t status, uint64_t sequence, uint64_t length,
                             uint64_t frame_id) noexcept {
  if (gone) return true;
  fl_completion_desc desc{};
  desc.slot = slot;
  desc.status = status;
  desc.sequence = sequence;
  desc.length = length;
  desc.frame_id = frame_id;
  fl_ring_header* ring = segments->completionRing();
  if (fl_ring_push(ring, ring_capacity, sizeof(fl_completion_desc), &desc) != FL_RING_OK) return false;
  if (fl_ring_reader_needs_wake(ring)) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(completion_doorbell.get(), &one, sizeof(one));
  }
  return true;
}

}  // namespace framelink
