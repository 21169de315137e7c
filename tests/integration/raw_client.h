// A deliberately minimal client that speaks the attach protocol and the ring
// ABI directly (attach_proto.h, shm_layout.h, shm_ring.h), bypassing
// libframelink, so that tests can write what a buggy or hostile client would:
// out-of-range slots, oversized lengths, bad metadata, corrupt ring indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "framelink/attach_proto.h"
#include "framelink/shm_layout.h"
#include "harness.h"

namespace framelink::integ {

fl_attach_request makeAttachRequest(uint32_t role, const std::string& stream, uint32_t slot_count,
                                    uint64_t slot_size);

// A SOCK_SEQPACKET connection to the attach socket at `path` (REQUIREs success);
// the caller closes it.
int connectSeqpacket(const std::string& path);

// Outcome of sending one message to the attach socket.
struct RawReply {
  bool closed = false;      // the daemon closed the socket without a reply
  bool timed_out = false;   // neither a reply nor a close within the deadline
  size_t bytes = 0;         // size of the reply message
  fl_attach_reply reply{};  // valid when bytes >= sizeof(fl_attach_reply)
  std::vector<int> fds;     // received with SCM_RIGHTS (owned by the caller)
};

// Connects to `socket`, sends `message` as one SOCK_SEQPACKET message and waits
// (bounded) for the reply.  The connection is returned in `*sock_out` when
// non-null (the caller closes it), else closed.
RawReply rawExchange(const std::string& socket, const void* message, size_t length, Millis timeout,
                     int* sock_out = nullptr);

class RawClient {
 public:
  // Attaches; REQUIREs status FL_OK and four fds, maps both segments
  // (consumer data segment read-only) and checks the header.
  RawClient(const std::string& socket, uint32_t role, const std::string& stream, uint32_t slot_count,
            uint64_t slot_size);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  fl_segment_header* header() const noexcept { return reinterpret_cast<fl_segment_header*>(control_); }
  fl_ring_header* submitRing() const noexcept;
  fl_ring_header* completionRing() const noexcept;
  fl_slot_header* slotHeader(uint32_t slot) const noexcept;  // producer: writable
  uint8_t* slot(uint32_t slot) const noexcept;
  uint32_t slotCount() const noexcept { return slot_count_; }
  uint64_t slotSize() const noexcept { return slot_size_; }
  uint32_t ringCapacity() const noexcept { return capacity_; }

  // Pushes one descriptor into the submit ring and rings the daemon's doorbell.
  // REQUIREs room in the ring.
  void submit(uint32_t slot, uint64_t length, uint32_t flags = 0);
  void doorbell();
  // The fds the daemon handed over: control, data, submit doorbell, completion doorbell.
  int fd(size_t i) const noexcept { return i < FL_ATTACH_FD_COUNT ? fds_[i] : -1; }
  // Writes a plausible slot header (the synthetic frame's metadata).
  void writeMeta(uint32_t slot, uint64_t frame_id);

  // Next completion within `timeout`, or nullopt.
  std::optional<fl_completion_desc> waitCompletion(Millis timeout);
  // True when the daemon dropped this attachment within `timeout`: the socket
  // reports hang-up/EOF or the header says FL_DAEMON_DETACHED.
  bool waitDetached(Millis timeout);
  bool socketClosed();

 private:
  int sock_ = -1;
  int fds_[FL_ATTACH_FD_COUNT] = {-1, -1, -1, -1};
  uint8_t* control_ = nullptr;
  size_t control_size_ = 0;
  uint8_t* data_ = nullptr;
  size_t data_size_ = 0;
  uint32_t role_ = 0;
  uint32_t slot_count_ = 0;
  uint64_t slot_size_ = 0;
  uint32_t capacity_ = 0;  // this side's trusted copy of the ring capacity
};

}  // namespace framelink::integ
