// What the consumer's daemon remembers of each sender stream -- a peer
// instance's stream, kept across its links -- so that a frame replayed after
// a link broke is answered the way its first copy was and never delivered
// twice: the sequences answered (a watermark and those above it), the frames
// consumers hold, the recent releases and refusals, the copies asked for
// again.  Bounded per peer: a peer with thousands of streams cannot make this
// end keep gigabytes, and one that opens streams by the thousand finds the
// oldest unused ones forgotten.  Sends nothing: InboundStreams answers from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "agent/agent_clock.h"
#include "agent/agent_state.h"
#include "metrics/metrics.h"

namespace framelink {

struct InboundLimits;

class SenderMemory {
 public:
  // Released sequences remembered per sender stream (their ACKs are sent
  // again on every new link), and NACKs repeated to a replay.
  static constexpr size_t kMaxRemembered = 4096;
  static constexpr size_t kMinRemembered = 32;

  // A frame released by every reader it reached here: what its ACK says.
  struct ReleasedFrame {
    uint64_t sequence = 0;
    uint32_t readers = 1;  // it was meant for
    uint32_t skipped = 0;  // of those, skipped (a drop stream)
  };
  // One sender stream: per (peer, peer instance, sender's stream id).  What
  // was answered is kept as a contiguous watermark and the answered sequences
  // above it: a frame whose first copy never arrived (lost with a link, or
  // written into a withdrawn credit) is above the watermark and not among
  // them, so its replay is new -- however many later frames arrived meanwhile.
  struct Stream {
    PeerId peer = kNoPeer;
    uint64_t instance = 0;
    uint64_t stream_id = 0;
    uint64_t answered_to = 0;           // every sequence up to here was delivered or refused
    std::set<uint64_t> answered_above;  // answered sequences above answered_to (bounded)
    std::set<uint64_t> held;            // delivered, not yet released by the consumer
    std::map<uint64_t, int> refused;    // recent NACKs, repeated to a replay (bounded)
    std::set<uint64_t> resend;          // CRC mismatches: the sender sends these again (bounded)
    // Recently released sequences (bounded): their ACKs are sent again on
    // every new link from this peer instance, since an ACK can be lost with
    // the link that carried it, and the sender must learn of the release
    // even when it gets no credit to replay the frame before its deadline.
    std::deque<ReleasedFrame> released;
    size_t open_links = 0;  // links it is open on (one, but two while it moves)
    uint64_t used_ns = 0;   // last opened, closed, delivered into or released (agent clock)
  };
  using Streams = std::map<uint64_t, Stream>;  // by id, in the order they were first seen

  // `limits` (forget_idle_ns, max_in_states_per_peer, remembered_per_peer)
  // is read at each use: a reload applies from the next.
  SenderMemory(Metrics& metrics, const AgentClock& clock, const InboundLimits& limits)
      : metrics_(metrics), clock_(clock), limits_(limits) {}

  // The id of that sender stream, remembered from now on if it was not.
  uint64_t idOf(PeerId peer, uint64_t instance, uint64_t stream_id);
  Stream& at(uint64_t id) { return streams_.at(id); }
  // Null when it is not remembered.
  Stream* find(uint64_t id);
  Stream* find(PeerId peer, uint64_t instance, uint64_t stream_id);
  const Stream* find(PeerId peer, uint64_t instance, uint64_t stream_id) const;

  // Room for that sender stream: true when it is remembered already or the
  // peer is under max_in_states_per_peer, else its oldest stream open on no
  // link with no frame held is forgotten (counted); false when every one is in use.
  bool makeRoom(PeerId peer, uint64_t instance, uint64_t stream_id);
  // The stream opened on (+1) or left (-1) a link.
  void countOpen(PeerId peer, uint64_t instance, uint64_t stream_id, int change);
  // The sender closed the stream: it is forgotten unless a consumer still holds a frame of it.
  void closed(PeerId peer, uint64_t instance, uint64_t stream_id);
  // A new instance of the peer (a restarted daemon) linked: what is kept of
  // its other instances goes, but for streams with a frame still held.
  void forgetOtherInstances(PeerId peer, uint64_t instance);
  // Streams open on no link, with no frame held and unused for
  // forget_idle_ns go (counted): their sender gave up on every frame it
  // could still replay.
  void forgetIdle(uint64_t now_ns);

  // The sequence was delivered or refused for good: it moves the watermark
  // (a gap left open for as many answers as the stream keeps is passed, counted).
  void markAnswered(Stream& in, uint64_t sequence);
  static bool answered(const Stream& in, uint64_t sequence) {
    return sequence <= in.answered_to || in.answered_above.count(sequence) != 0;
  }
  // Whether the frame is a replay of one answered already and not asked for again.
  bool answeredBefore(PeerId peer, uint64_t instance, uint64_t stream_id, uint64_t sequence) const;
  // The consumer released the frame: remembered among the releases (bounded).
  void released(Stream& in, const ReleasedFrame& frame);
  // The frame was refused: a replay of it gets the same code (bounded).
  void refused(Stream& in, uint64_t sequence, int code);
  // The frame arrived damaged or into a withdrawn credit: its next copy is new (bounded).
  void askedAgain(Stream& in, uint64_t sequence);

  // How many answers of one kind a stream of `peer` keeps
  // (remembered_per_peer shared by its streams, within kMin/kMaxRemembered).
  size_t rememberCap(PeerId peer) const;
  // Whether anything is kept of `peer`'s streams.
  bool remembers(PeerId peer) const;
  // Answers kept of `peer`'s streams, every kind summed (walks its streams).
  size_t answersKept(PeerId peer) const;
  // Frames consumers hold, over every stream.
  size_t framesHeld() const;
  size_t size() const { return streams_.size(); }
  const Streams& streams() const { return streams_; }

 private:
  using Key = std::tuple<PeerId, uint64_t, uint64_t>;
  void forget(Streams::iterator it);

  Metrics& metrics_;
  const AgentClock& clock_;
  const InboundLimits& limits_;
  Streams streams_;
  std::map<Key, uint64_t> ids_;
  std::map<PeerId, size_t> per_peer_;  // how many of streams_ each peer has
  uint64_t next_id_ = 1;
};

}  // namespace framelink
