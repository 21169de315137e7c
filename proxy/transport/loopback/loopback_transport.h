// The in-memory transport: two ends of one link inside one process, with no
// thread and no socket of its own.  A posted frame waits in the link until it
// is delivered; delivery copies the payload into the peer's credited buffer,
// exactly as an RDMA write or a tcp `recv` would land it, and reports
// FrameArrived there and SendComplete here.  A posted read waits the same
// way; delivering it copies the peer's exposed source into the reader's
// buffer, as an RDMA READ would, and reports ReadComplete here.
//
// Two ways to drive delivery:
//   * automatic (the default): every flush() and poll() of the sending end
//     delivers up to `deliveries_per_call` of its waiting frames, and the
//     sending end's event fd stays readable while frames wait, so an agent
//     that sleeps in epoll comes back to move them.  This is how the
//     conformance suite and the agent's unit tests use it.
//   * manual: nothing moves until the owner of the LoopbackLink says so
//     (deliver, breakLink).  A simulator uses this to decide, from a seed,
//     when each frame lands, when a link breaks and which payload is damaged.
//
// Like tcp and RC queue pairs, a link is reliable and ordered while it is up:
// frames and control records are delivered in the order they were posted,
// never twice.
//
// Threading: every call takes the link's one mutex, so the two ends may be
// driven from two threads (two data agents in one test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "transport/transport.h"

namespace framelink::transport::loopback {

struct LoopbackOptions {
  bool manual = false;             // deliveries only through LoopbackLink
  size_t send_queue_depth = 256;   // post() reports kBackpressure beyond it
  size_t deliveries_per_call = 4;  // automatic mode: frames moved per flush()/poll()
};

class LoopbackLink;

// What makePair returns: both ends and the link that joins them.
struct LoopbackPair {
  std::shared_ptr<Transport> a;
  std::shared_ptr<Transport> b;
  std::shared_ptr<LoopbackLink> link;
};

// Both ends of a new, connected link.  Fails only when an eventfd cannot be
// made (out of descriptors).
Result<LoopbackPair> makePair(const LoopbackOptions& options = {});

// The link's controls, for whoever schedules it.  `end` is 0 for `a`, 1 for `b`.
class LoopbackLink {
 public:
  enum class Damage {
    kNone,
    kFlipPayloadByte,  // the payload lands with one byte changed (a CRC32C check must catch it)
  };

  virtual ~LoopbackLink() = default;

  // Frames, control records and reads posted by `end` and not yet delivered.
  virtual size_t waiting(int end) const noexcept = 0;
  // The header of the oldest frame posted by `end` when a frame is what
  // deliverOne would land next; false when nothing waits or a control
  // record is next.
  virtual bool peekNext(int end, FrameHeader* header) const noexcept = 0;
  // The oldest control record posted by `end` when one is what deliverOne
  // would hand over next (into `record`); false otherwise.
  virtual bool peekControl(int end, std::string* record) const = 0;
  // Delivers what `end` posted first (a frame, a control record or a read:
  // damage applies to frames and read bytes); false when nothing waits or
  // the link is down.
  virtual bool deliverOne(int end, Damage damage = Damage::kNone) noexcept = 0;
  // The link breaks (cable pulled): both ends report LinkError(status)
  // once, and every waiting frame completes with FL_ERR_LINK_LOST.
  virtual void breakLink(int status, const std::string& why) noexcept = 0;
  // The frames `end` posted and not yet delivered land from a copy of their
  // payloads taken now, as bytes a sender's kernel already holds do: the
  // sender may let its memory go (a tcp link its dialer gave up on, whose
  // last bytes still reach the listener).
  virtual void keepPayloads(int end) = 0;
  // The reads `end` posted and not yet delivered are answered from a copy of
  // their sources taken now, as answers a peer has begun to write are,
  // whatever the peer retracts meanwhile: in their turn, or with `late` only
  // when deliverLate says, after whatever else the link carries (a peer
  // that holds its answers back; reads on one link otherwise complete in
  // order).  Returns how many were taken.
  virtual size_t keepReads(int end, bool late) = 0;
  // The oldest of those late answers lands in its read's buffer; false when
  // none waits or the link is down (its reads then ended FL_ERR_LINK_LOST).
  virtual bool deliverLate(int end) noexcept = 0;
  virtual size_t lateWaiting(int end) const noexcept = 0;
  // The peer answers the read `end` was answered last once more (behind
  // what `end` posted so far): when delivered, that answer is for a read not
  // outstanding, and the link fails with FL_ERR_PROTOCOL before a byte of it
  // lands, as it does on tcp and grpc.  False when no read was answered yet
  // or the link is down.
  virtual bool answerAgain(int end) = 0;
  virtual bool up() const noexcept = 0;
};

}  // namespace framelink::transport::loopback
