#include "attach/client_session.h"

#include <fcntl.h>
#include <sys/socket.h>
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
    case SlotState::kSettling:
      return "settling";
    case SlotState::kCredited:
      return "credited";
    case SlotState::kLent:
      return "lent";
    case SlotState::kDelivered:
      return "delivered";
  }
  return "?";
}

bool makeSubmitDoorbell(Doorbell* out) noexcept {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return false;
  out->daemon_end = UniqueFd(sv[0]);
  out->client_end = UniqueFd(sv[1]);
  return true;
}

bool makeCompletionDoorbell(Doorbell* out) noexcept {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  out->reader = UniqueFd(p[0]);
  out->daemon_end = UniqueFd(p[1]);
  out->client_end = UniqueFd(::fcntl(p[0], F_DUPFD_CLOEXEC, 0));
  if (!out->client_end.valid()) return false;
  // One page is plenty for "there is news" (a full pipe is one already
  // ringing), and it is what the pipe costs against the daemon user's limit.
  (void)::fcntl(p[1], F_SETPIPE_SZ, 4096);
  return true;
}

void ringDoorbell(int daemon_end) noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(daemon_end, &one, sizeof(one));
}

void drainDoorbell(int daemon_end, int max) noexcept {
  char buf[16];
  for (int i = 0; i < max; ++i) {
    if (::recv(daemon_end, buf, sizeof(buf), MSG_DONTWAIT) < 0) return;
  }
}

bool ClientSession::complete(uint32_t slot, int32_t status, uint64_t sequence, uint64_t length,
                             uint64_t frame_id, uint32_t readers, uint32_t released) noexcept {
  if (gone) return true;
  fl_completion_desc desc{};
  desc.slot = slot;
  desc.status = status;
  desc.sequence = sequence;
  desc.length = length;
  desc.frame_id = frame_id;
  desc.readers = readers;
  desc.released = released;
  fl_ring_header* ring = segments->completionRing();
  if (fl_ring_push(ring, ring_capacity, sizeof(fl_completion_desc), &desc) != FL_RING_OK) return false;
  completions_unannounced = true;
  return true;
}

void ClientSession::wakeIfAsleep() noexcept {
  if (!completions_unannounced) return;
  completions_unannounced = false;
  if (!gone && fl_ring_reader_needs_wake(segments->completionRing())) ringDoorbell(completion_doorbell.get());
}

}  // namespace framelink
