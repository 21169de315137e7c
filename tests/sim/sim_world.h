// A deterministic simulation of the frame protocol, in the manner of
// FoundationDB's simulation testing: the real data agents of two or three daemons run
// in one process on this thread (DataAgent::runUntilIdle), joined by in-memory
// links (the loopback transport in manual mode, plus the control messages each
// agent writes to its session), and a seeded schedule decides everything that
// happens and when: frames submitted and released, control messages and data
// frames delivered, links broken and re-made (also replaced while the old one
// is up), clients attaching, dying and coming back, a daemon crashing and
// restarting with its memory lost, payloads damaged on the wire.  Windows
// are 32 slots and time also moves by less than the ACK delay, so ACKs and
// credits are held back for coalescing across rounds, go on their timer or
// on CreditLow, and are held when a link goes down.  A link the dialer
// replaces can stay half-open: the listener keeps it, its writes vanish,
// and it learns of the death only at a later step (its keepalive).  In
// every fifth schedule an adversary puts forged, duplicated and
// out-of-order control records on the links, and, in half of those, which
// pull the stream, answers reads late -- after the stream closed or moved
// to a newer link -- or twice (world_adversary.cpp).
//
// Most worlds have one receiving daemon, d1.  In a two-receiver world
// (SimOptions::receivers, a quarter of the seeds in framelink_sim) one more
// daemon receives, each sender routes the stream to both by name, and every
// frame goes to both from one producer slot (one completion, once each
// route is done): each (sender, receiver) link has its own faults, and the
// checks below hold per receiving daemon -- DELIVERED needs a release on
// each, its readers are the hosts' summed, a FAILED frame may be released
// on a receiver whose route did not fail it, the redelivery flag comes only
// from a receiver that restarted since the submit, and a frame is owed its
// completion only once released on every live receiver.
//
// After every step the world checks what the product promises:
//   * no frame gets two completions, and at the end every frame has one;
//   * DELIVERED => a consumer released that frame;
//   * FAILED => no consumer released it, unless the daemon it was released on
//     crashed before its ACK could reach the sender (the documented unknown
//     outcome); FL_ERR_DAEMON_GONE and FL_ERR_TIMEOUT say "unknown";
//   * but TIMEOUT only when the ACK had no way back: after a healthy period
//     (half-open links noticed, a link from every sender, every message
//     moved until the world is quiet) every frame a consumer of the live
//     receiving daemon released must have ended, and while the links are
//     healed such a frame may end TIMEOUT only once ack_timeout has passed
//     since it first landed (world_doubt.cpp);
//   * a consumer never sees a frame twice unless the second copy carries
//     FL_SLOT_MAYBE_REDELIVERED, and a daemon only flags frames replayed to a
//     new instance of the receiving daemon;
//   * frames without that flag reach each consumer in submission order;
//   * payloads arrive intact (a damaged one never reaches a consumer when it
//     carries a CRC32C), and stay so until the consumer releases them:
//     nothing lands in a slot whose frame a consumer holds;
//   * at the end, with the links healed and a consumer attached, the world
//     goes idle: every frame has ended, nothing is held, and fresh frames are
//     still delivered (no credit or slot leaked), with the agents idle.
// The same seed gives the same schedule, the same messages and the same
// outcome; a failing seed prints the trace of events that led to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace framelink::sim {

struct SimOptions {
  uint64_t seed = 1;
  size_t steps = 120;  // scheduled events before the world is healed
  int daemons = 2;     // 2: d0 sends to d1; 3: d0 and d2 both send to d1 on one stream
  // 1: one receiving daemon (d1); 2: one more (the last daemon, d2 or d3)
  // receives too, and every sender routes the stream to both.
  int receivers = 1;
  bool crash_receiver = true;  // the consumer's daemon may crash and restart
  bool crash_sender = true;    // the producer's daemon may crash and restart
  bool keep_trace = false;     // keep the event trace even when the run passes
  bool adversary = false;      // forged, duplicated and out-of-order control records on the links
};

struct SimResult {
  bool ok = true;
  std::string failure;             // the broken invariant
  std::vector<std::string> trace;  // events, in order (kept on failure or when asked)
  // What happened, for the totals.
  uint64_t frames = 0, delivered = 0, failed = 0, unknown = 0, redelivered = 0;
  uint64_t lent =
      0;  // receptions of a lent frame: a producer's on its own daemon, or a peer's landed in another reader
  uint64_t link_breaks = 0, crashes = 0, client_deaths = 0, damaged = 0;
  uint64_t released_then_lost = 0;  // released on a daemon that crashed before the ACK went out
  uint64_t owed_delivered = 0;      // released frames a healthy period had to see DELIVERED
  uint64_t forged = 0;              // records the adversary put on a link
  uint64_t skipped = 0;             // frames a subscriber of a drop stream was skipped for (told the gap)
  uint64_t two_receivers = 0;       // schedules of a world with two receiving daemons
  uint64_t pulled = 0;              // schedules of a world whose receivers pull the stream
  uint64_t pulled_adversary = 0;    // of those, with the adversary (late and repeated read answers)
};

SimResult runSchedule(const SimOptions& options);

}  // namespace framelink::sim
