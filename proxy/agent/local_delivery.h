// Frames between a producer and consumers attached to this same daemon, for
// a stream with no peer route: no network, and no copy.  The consumer gets
// the producer's slot itself -- the daemon lends it the producer's data
// segment read-only (attach_proto.h, fl_lend_message) and writes a validated
// copy of the frame's header into one of the consumer's own slots, marked
// FL_SLOT_LENT -- and the producer's slot stays lent until every reader the
// frame went to released it.  Then the producer gets one completion:
// DELIVERED, or the first failure (a reader that died holding it).
//
// Every frame ends: a reader that holds one longer than ack_timeout_ms
// loses it as a dead reader does (the producer's completion says
// FL_ERR_TIMEOUT: it may have read it), so a reader that never releases, or
// never reads, pins none of the producer's slots for longer.  Its own slot
// stays its own until it releases it.
//
// Readers: every subscriber of the stream gets each frame; the queue group
// (the consumers that did not subscribe) shares them, each frame to one
// member, round-robin among those with a free slot.  A frame waits, in
// order, until each of its readers has a free slot (the producer feels it
// as backpressure), and fails FL_ERR_NO_CONSUMER when none comes within
// credit_timeout_ms.  Where a segment cannot be lent (the consumer holds
// FL_LEND_MAX others, or its socket is full), and for the streams in
// copy_streams, the payload is copied into the reader's slot instead.
//
// Frames from a peer are shared the same way: one copy per host.  While a
// stream has subscribers here, the peer is granted the slots of one of them
// alone (the lander: the one with the largest slots); a frame that lands there is
// delivered to it and lent to every other reader here, and its ACK goes back
// once each released it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/agent_state.h"
#include "agent/client_table.h"
#include "common/log_limit.h"
#include "config/config.h"
#include "framelink/shm_layout.h"
#include "metrics/metrics.h"

namespace framelink {

class LocalDelivery {
 public:
  // How a producer's frame ends (OutboundStreams::endLocalFrame).
  // `readers`: the readers it reached; `released`: of those, that released it.
  using EndFrame = std::function<void(AgentClient& producer, uint32_t slot, int status,
                                      const std::string& why, uint32_t readers, uint32_t released)>;
  // Where a frame from a peer came from: what its answer goes back to.
  struct Landed {
    uint64_t link_id = 0;
    uint64_t stream_id = 0;  // the sender's
    uint64_t in_state = 0;
    uint64_t sequence = 0;  // the sender's
  };
  // How a frame from a peer ends, once every reader here released it or
  // failed: `landing` and `slot` are the consumer it landed in (perhaps gone
  // by now); `readers`, the readers it reached here; `released`, how many of
  // them released it.
  using EndLanded = std::function<void(const Landed& from, uint64_t landing, uint32_t slot, int status,
                                       const std::string& why, uint32_t readers, uint32_t released)>;

  LocalDelivery(const Config& config, Metrics& metrics, const AgentClock& clock, ClientTable& clients,
                EndFrame end);

  void setEndLanded(EndLanded end) { end_landed_ = std::move(end); }

  // The stream's readers here, kept at attach and detach.
  void consumerAttached(const ClientSession& consumer);
  // A consumer of `stream` is attached here.
  bool hasReaders(const std::string& stream) const;
  bool hasSubscribers(const std::string& stream) const;
  // A member of the stream's queue group is attached here.
  bool hasMembers(const std::string& stream) const;
  // The stream's frames waiting here for their readers.
  size_t waitingOf(const std::string& stream) const;
  // Whether frames from peers may land in this consumer's slots: all of the
  // stream's consumers while it has no subscriber here, else the subscriber
  // with the largest slots (the oldest of those) alone.
  bool lands(const ClientSession& consumer) const;
  // Whether a frame that landed in this consumer goes to other readers here
  // too: the stream's other subscribers, and a member of its queue group
  // when the consumer is a subscriber.
  bool othersRead(const ClientSession& consumer) const;
  // The producer's frame in `slot` (its validated header, `length` bytes)
  // goes to the stream's local readers: the slot is kLent from here.
  // `beside`: the frame goes to a peer too (its stream is routed there), and
  // its slot is the outbound side's: only the readers here are this side's
  // part, ended through EndFrame like any other.
  // `members`: false when the queue group's share of the frame went to
  // another host (the subscribers here get it, no member).
  void submit(AgentClient& producer, uint32_t slot, const fl_slot_header& header, uint64_t length,
              bool beside = false, bool members = true);
  // A frame from a peer that landed in a consumer that is not the stream's
  // lander waits for its other readers.
  bool landedElsewhereWaits(const std::string& stream) const;
  // A frame from a peer landed in `slot` of `landing`, delivered to it
  // already (`header` as it was given it): it goes to the stream's other
  // readers here, and ends (EndLanded) once each of them and the landing
  // consumer released it (landedReleased) or failed.
  // A header with FL_SLOT_GROUP_ELSEWHERE (a frame sent for the subscribers
  // here only) goes to no member.
  void shareLanded(ClientSession& landing, uint32_t slot, const fl_slot_header& header, const Landed& from);
  void landedReleased(const ClientSession& landing, uint32_t slot);
  // The landing consumer died holding it.
  void landedGone(const ClientSession& landing, uint32_t slot);
  // Delivers waiting frames to readers with a free slot; returns the frames delivered.
  size_t pump();
  // A consumer released, or died holding, the local frame in its `slot`.
  void released(ClientSession& consumer, uint32_t slot);
  // A reader that went before it took the frame's completion off its ring
  // never saw it: it is not counted among the frame's readers, and a frame
  // meant for a member of the queue group goes to another member.
  void readerGone(ClientSession& consumer, uint32_t slot);
  // After a consumer's slots were let go: its lends are forgotten, its own
  // segment retired with the readers that hold nothing of it, and the frames
  // that landed in it and still wait for the other readers fail.
  void consumerGone(const ClientSession& consumer);
  // A producer went: its segment is retired with the consumers that hold
  // nothing of it (the others retire it when they release the last frame),
  // and its stream, when it was the last producer of it here.
  void producerGone(const ClientSession& producer);
  // Fails the frames that waited for a reader longer than credit_timeout_ms,
  // and ends the frames for the readers that held them longer than ack_timeout_ms.
  void checkDeadlines();

  size_t waitingFrames() const;
  // Frames of its stream that wait to be delivered, each of which this
  // subscriber will get (none landed in it).
  size_t waitingFor(const ClientSession& subscriber) const;

 private:
  struct Frame {
    uint64_t producer = 0;
    uint32_t slot = 0;
    std::string stream;
    fl_slot_header header{};  // FL_SLOT_GROUP_ELSEWHERE: for the subscribers here only
    uint64_t length = 0;
    uint64_t sequence = 0;
    uint64_t deadline_ns = 0;
    uint64_t hold_deadline_ns = 0;  // delivered: when it ends for the readers still holding it (0: none)
    uint32_t readers_out = 0;       // readers holding it
    uint32_t readers = 0;           // readers it went to, and subscribers skipped for it
    uint32_t released = 0;          // readers that released it
    bool copy = false;              // its stream is in copy_streams: copied into each reader's slot
    bool drop = false;              // its stream is in drop_streams: a subscriber far behind is skipped
    bool waiting = true;            // not yet delivered to its readers
    bool landed = false;            // from a peer: `producer` is the consumer it landed in
    bool beside = false;            // a producer's frame that goes to a peer too
    uint64_t slot_sequence = 0;     // the producer's slot entry's sequence while the frame is its
    bool source_member = false;     // landed in a member of the queue group (no other member gets it)
    bool member_only = false;       // waits again for a member: the one it went to left before reading it
    Landed from;
    int failure = FL_OK;  // the first reader's failure
    std::string why;
  };
  using FrameKey = std::pair<uint64_t, uint32_t>;  // producer, slot
  struct Stream {
    std::deque<FrameKey> waiting;  // in submit order
    uint64_t next_sequence = 1;
    size_t next_member = 0;  // the queue group's round-robin
  };
  struct Readers {
    std::map<uint64_t, uint64_t> subscribers;  // client id -> its slot size
    size_t members = 0;                        // of the queue group
    // Every consumer of the stream here, in attach order (ids ascend): what
    // a frame looks at to find its readers, whatever else is attached.
    std::vector<uint64_t> consumers;
  };
  struct Lends {
    std::map<uint64_t, uint32_t> holds;  // lent producer -> frames of it the consumer holds
    std::vector<uint64_t> to_retire;     // retirements not yet sent
  };

  // A frame of `s` in `slot` of `source` (a producer, or the consumer it
  // landed in), its sequence the stream's next: the rest is the caller's.
  Frame& newFrame(Stream& s, const ClientSession& source, uint32_t slot, const fl_slot_header& header,
                  uint64_t length);
  // Delivers the oldest waiting frame of `s` when each of its readers has a
  // free slot, or may be skipped (a subscriber of a drop stream, more than
  // drop_lag frames behind, or `at_deadline` and the frame is due); false
  // when it must wait.
  bool deliverOne(Stream& s, bool at_deadline = false);
  // The frame goes on without subscriber `r`: its next frame says the gap,
  // the frame's completion counts it among its readers but not its releases.
  void skip(Frame& f, AgentClient& source, ClientSession& r);
  void deliverTo(Frame& f, AgentClient& producer, ClientSession& reader, uint32_t reader_slot);
  // The producer's segment is known to `reader` (lent now if need be).
  bool lend(ClientSession& reader, const ClientSession& producer);
  bool sendRetirements(ClientSession& reader, Lends& lends);
  void endIfDone(const FrameKey& key);
  // The producer's slot still holds that frame (it did not end otherwise meanwhile).
  static bool producerHolds(const AgentClient& producer, const Frame& f);
  // The segment of a client that went is retired with the readers that hold
  // nothing of it (the others retire it when they release their last frame).
  void retireSegmentOf(uint64_t client_id);
  void forgetStreamIfIdle(const std::string& stream);
  void readerDone(ClientSession& consumer, uint32_t slot, int status, const std::string& why);
  // The frame's hold deadline starts (again) now.
  void startHold(const FrameKey& key, Frame& f);
  // Ends the frames whose readers held them past ack_timeout_ms for those readers.
  void checkHolds();
  void takeBack(const FrameKey& key);
  // A reader that went had been given the frame in `slot` and never took it:
  // false when that frame ended meanwhile.
  bool handOn(ClientSession& consumer, uint32_t slot);
  // A member of `stream`'s queue group here other than `except`, not gone.
  bool otherMember(const std::string& stream, uint64_t except);
  static bool tookCompletion(const ClientSession& consumer, const SlotEntry& e);
  static int freeSlot(const ClientSession& c);

  const Config& config_;
  Metrics& metrics_;
  const AgentClock& clock_;
  ClientTable& clients_;
  EndFrame end_;
  EndLanded end_landed_;
  std::map<FrameKey, Frame> frames_;
  std::unordered_map<std::string, Stream> streams_;
  std::unordered_map<uint64_t, Lends> lends_;         // by consumer
  std::unordered_map<std::string, Readers> readers_;  // by stream
  std::set<std::pair<uint64_t, FrameKey>> holds_;     // delivered frames by hold deadline
  LogLimiter log_{std::chrono::seconds(1), 5};
  LogLimiter log_skips_{std::chrono::seconds(1), 5};  // a slow subscriber of a drop stream
  LogLimiter log_holds_{std::chrono::seconds(1), 5};  // a reader that held a frame too long
};

}  // namespace framelink
