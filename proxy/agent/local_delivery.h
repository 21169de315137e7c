// Frames between a producer and consumers attached to this same daemon, for
// a stream with no peer route: no network, and no copy.  The consumer gets
// the producer's slot itself -- the daemon lends it the producer's data
// segment read-only (attach_proto.h, fl_lend_message) and writes a validated
// copy of the frame's header into one of the consumer's own slots, marked
// FL_SLOT_LENT -- and the producer's slot stays lent until every reader the
// frame went to released it.  Then the producer gets one completion:
// DELIVERED, or the first failure (a reader that died holding it).
//
// Readers: every subscriber of the stream gets each frame; the queue group
// (the consumers that did not subscribe) shares them, each frame to one
// member, round-robin among those with a free slot.  A frame waits, in
// order, until each of its readers has a free slot (the producer feels it
// as backpressure), and fails FL_ERR_NO_CONSUMER when none comes within
// credit_timeout_ms.  Where a segment cannot be lent (the consumer holds
// FL_LEND_MAX others, or its socket is full), and for the streams in
// copy_streams, the payload is copied into the reader's slot instead.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
  using EndFrame =
      std::function<void(AgentClient& producer, uint32_t slot, int status, const std::string& why)>;

  LocalDelivery(const Config& config, Metrics& metrics, const AgentClock& clock, ClientTable& clients,
                EndFrame end);

  // A consumer of `stream` is attached here.
  bool hasReaders(const std::string& stream) const;
  // The producer's frame in `slot` (its validated header, `length` bytes)
  // goes to the stream's local readers: the slot is kLent from here.
  void submit(AgentClient& producer, uint32_t slot, const fl_slot_header& header, uint64_t length);
  // Delivers waiting frames to readers with a free slot; returns the frames delivered.
  size_t pump();
  // A consumer released, or died holding, the local frame in its `slot`.
  void released(ClientSession& consumer, uint32_t slot);
  void readerGone(ClientSession& consumer, uint32_t slot);
  // After a consumer's slots were let go: its lends are forgotten.
  void consumerGone(const ClientSession& consumer);
  // A producer went: its segment is retired with the consumers that hold
  // nothing of it (the others retire it when they release the last frame),
  // and its stream, when it was the last producer of it here.
  void producerGone(const ClientSession& producer);
  // Fails the frames that waited for a reader longer than credit_timeout_ms.
  void checkDeadlines();

  size_t waitingFrames() const;

 private:
  struct Frame {
    uint64_t producer = 0;
    uint32_t slot = 0;
    std::string stream;
    fl_slot_header header{};
    uint64_t length = 0;
    uint64_t sequence = 0;
    uint64_t deadline_ns = 0;
    uint32_t readers_out = 0;  // readers holding it
    uint32_t readers = 0;      // readers it went to
    bool copy = false;         // its stream is in copy_streams: copied into each reader's slot
    int failure = FL_OK;       // the first reader's failure
    std::string why;
  };
  using FrameKey = std::pair<uint64_t, uint32_t>;  // producer, slot
  struct Stream {
    std::deque<FrameKey> waiting;  // in submit order
    uint64_t next_sequence = 1;
    size_t next_member = 0;  // the queue group's round-robin
  };
  struct Lends {
    std::map<uint64_t, uint32_t> holds;  // lent producer -> frames of it the consumer holds
    std::vector<uint64_t> to_retire;     // retirements not yet sent
  };

  // Delivers the oldest waiting frame of `s` when each of its readers has a
  // free slot; false when it must wait.
  bool deliverOne(Stream& s);
  void deliverTo(Frame& f, AgentClient& producer, ClientSession& reader, uint32_t reader_slot);
  // The producer's segment is known to `reader` (lent now if need be).
  bool lend(ClientSession& reader, const ClientSession& producer);
  bool sendRetirements(ClientSession& reader, Lends& lends);
  void endIfDone(const FrameKey& key);
  void readerDone(ClientSession& consumer, uint32_t slot, int status, const std::string& why);
  static int freeSlot(const ClientSession& c);

  const Config& config_;
  Metrics& metrics_;
  const AgentClock& clock_;
  ClientTable& clients_;
  EndFrame end_;
  std::map<FrameKey, Frame> frames_;
  std::unordered_map<std::string, Stream> streams_;
  std::unordered_map<uint64_t, Lends> lends_;  // by consumer
  LogLimiter log_{std::chrono::seconds(1), 5};
};

}  // namespace framelink
