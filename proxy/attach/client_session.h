// One attached application as the data agent sees it: its segments, its
// doorbells, and the daemon's private slot table (authoritative: the segment
// is never trusted).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attach/segment.h"
#include "common/unique_fd.h"
#include "framelink/shm_layout.h"

namespace framelink {

enum class SlotState : uint8_t {
  kFree,       // producer: held by the app or free; consumer: free, not yet credited
  kPending,    // producer: submitted, waiting for a credit (or a link)
  kPosted,     // producer: posted to the transport, send not yet complete
  kSent,       // producer: sent, waiting for the remote consumer's ACK
  kSettling,   // producer: its outcome is known, a transport still holds a post of its payload
  kCredited,   // consumer: exposed to a peer as a credit
  kDelivered,  // consumer: frame delivered to the app, waiting for release
  kLent,       // producer: its frame is with local consumers until each released it; consumer: a frame
               // that landed here, released, still held by the stream's other readers on this host
};

const char* slotStateName(SlotState state) noexcept;

// A doorbell: one end the daemon's and one the client's, two open files, so
// nothing a client does to its end -- clearing O_NONBLOCK, never reading it,
// flooding it, closing it -- can make the daemon block or fail: the daemon's
// end is non-blocking and its own, and a full doorbell is one already
// ringing.  (An eventfd handed over by SCM_RIGHTS would share its file status
// flags and its counter with the client.)
//
// The submit doorbell (the client rings, the daemon sleeps on it) is a
// datagram socket pair: a client that rings a daemon that died gets
// ECONNREFUSED, where a pipe would raise SIGPIPE in the application.
//
// The completion doorbell (the daemon rings, the client sleeps on it) is a
// pipe of one page, its write end the daemon's: the daemon rings it for every
// frame and completion a sleeping client gets, and a pipe write costs about a
// third of a datagram's (no socket buffer to allocate and charge per ring).
// The daemon keeps the read end open as well (`reader`), so a ring never fails
// EPIPE, nor raises SIGPIPE, when a client closes its end.
struct Doorbell {
  UniqueFd daemon_end;
  UniqueFd client_end;
  UniqueFd reader;  // completion doorbell: the read end, also the client's
};
// False (errno set) when the socket pair cannot be made.
bool makeSubmitDoorbell(Doorbell* out) noexcept;
// False (errno set) when the pipe cannot be made.
bool makeCompletionDoorbell(Doorbell* out) noexcept;
// Rings (the completion doorbell): never blocks.
void ringDoorbell(int daemon_end) noexcept;
// Clears what is queued on the daemon's end of the submit doorbell, at most
// `max` rings (a client that floods its doorbell gets no more attention than
// one that rings once).
void drainDoorbell(int daemon_end, int max = 64) noexcept;

// What a producer's daemon keeps of a frame in one of its slots, from its
// submit to its completion.
struct ProducerSlot {
  uint64_t post_cookie = 0;        // the cookie of its post (SendComplete names it)
  uint64_t deadline_ns = 0;        // credit or ACK deadline (the agent's clock)
  uint64_t sent_to_instance = 0;   // the receiving daemon's instance it was last posted to
  uint32_t resends = 0;            // times the peer refused the frame undelivered and it was sent again
  uint32_t posts_out = 0;          // posts of it a transport has not reported complete (any link)
  uint32_t posts = 0;              // times it was posted (any link)
  uint32_t readers = 0;            // readers its frame reached, as its end said (completion)
  uint32_t released = 0;           // of those, that released it
  bool was_posted = false;         // posted to a link at least once (an ACK may come for it)
  bool maybe_redelivered = false;  // posted to more than one instance of the receiving daemon
};

// What a consumer's daemon keeps of one of its slots: the credit it is
// exposed under, and the frame delivered into it until its release.
struct ConsumerSlot {
  uint64_t credit_id = 0;   // the credit this slot is exposed under
  uint64_t in_state = 0;    // id of the (peer, instance, stream) the frame came from
  uint64_t local_from = 0;  // the local producer whose frame it holds (0: from a link)
  uint32_t local_slot = 0;  // that producer's slot
  bool shared = false;      // a frame from a peer that landed here, lent to the other readers here too
  // A local frame: it ended for this reader (held past ack_timeout_ms); its
  // release only frees the slot.
  bool taken_back = false;
  // A local frame: the completion ring's tail before its completion was
  // pushed (the reader took it once the ring's head is past).
  uint64_t completion_at = 0;
};

// One slot of a client: its state and frame, and what its client's role
// keeps of it (a session has one role: the other part stays empty).
struct SlotEntry {
  SlotState state = SlotState::kFree;
  uint64_t sequence = 0;
  uint64_t length = 0;
  uint64_t frame_id = 0;
  uint64_t link_id = 0;    // producer: link it was posted on; consumer: link its credit went to
  uint64_t stream_id = 0;  // producer: out-stream id; consumer: the sender's stream id
  uint64_t submitted_ns = 0;
  ProducerSlot producer;
  ConsumerSlot consumer;
};

struct ClientSession {
  uint64_t id = 0;
  uint32_t role = 0;
  std::string stream;
  bool subscriber = false;  // consumer: every frame of the stream (else a queue group member)
  bool pull = false;        // consumer: asked that peers' frames of its stream be pulled here
  std::string name;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::shared_ptr<ClientSegments> segments;
  UniqueFd submit_doorbell;      // daemon's end: the client rings it, the daemon sleeps on it
  UniqueFd completion_doorbell;  // daemon's end: the daemon rings it when the client sleeps
  UniqueFd completion_reader;    // the completion doorbell's read end, kept open (Doorbell)
  UniqueFd socket;               // a dup of the attach socket: shutdown() kicks the client
  // Set by the attach server once its reply is on the socket.  The agent
  // knows the client before that (so frames that come the next moment reach
  // it) and sends nothing of its own on the socket until then: the reply
  // must be the first message the client reads there.
  std::atomic<bool> replied{false};
  uint32_t ring_capacity = 0;  // trusted copies, never re-read from the segment
  std::vector<SlotEntry> slots;
  bool gone = false;         // socket closed: no more submits, completions dropped
  uint64_t in_progress = 0;  // producer: slots not kFree

  // Counters.
  uint64_t frames = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  // Drop streams (design §4a).  Subscriber: frames it was skipped for;
  // producer: subscribers its frames skipped.
  uint64_t dropped = 0;
  uint32_t gap = 0;  // subscriber: frames skipped since the last one it was given

  // Completions pushed since the doorbell was last looked at (wakeIfAsleep).
  bool completions_unannounced = false;

  // Push one completion; the doorbell is wakeIfAsleep's, once for all the
  // completions of a round.  Returns false when the ring is full or corrupt
  // (the client misbehaves).  A producer's says how many readers the frame
  // reached and released it.
  bool complete(uint32_t slot, int32_t status, uint64_t sequence, uint64_t length, uint64_t frame_id,
                uint32_t readers = 0, uint32_t released = 0) noexcept;
  // After one or more complete(): rings the completion doorbell when the
  // client sleeps on it.  One write for a round's completions, where a write
  // per completion woke a client waiting for one slot again for every frame.
  void wakeIfAsleep() noexcept;
};

}  // namespace framelink
