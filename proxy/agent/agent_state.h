// What the data agent's parts share: the links, the peers and the attached
// clients, each resolved to an integer id once -- a peer when a link comes up
// or a producer attaches (its route), a stream name when a consumer attaches
// or a peer opens a stream -- so that the per-frame path compares integers
// and builds no string.  All of it is owned by the agent thread.  A link
// (AgentLink) also batches the control records the parts send on it
// (send/flushControl): a round's per-frame messages leave together, as control
// records on the transport.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/link_identity.h"
#include "agent/peer_messages.h"
#include "agent/session_writer.h"
#include "attach/client_session.h"
#include "config/config.h"
#include "framelink/v1/link.pb.h"
#include "transport/transport.h"

namespace framelink {

using PeerId = uint32_t;
constexpr PeerId kNoPeer = ~PeerId{0};
using NameKey = uint32_t;  // an interned stream name
constexpr NameKey kNoName = ~NameKey{0};

// Stream names interned to small integers, counted by their users and
// forgotten with the last one: a peer churning through stream names must
// not grow the table for ever.
class NameTable {
 public:
  NameKey acquire(const std::string& name);
  void release(NameKey key);
  const std::string& name(NameKey key) const { return entries_[key].name; }
  size_t size() const { return by_name_.size(); }

 private:
  struct Entry {
    std::string name;
    uint32_t users = 0;
  };
  std::vector<Entry> entries_;
  std::vector<NameKey> free_;
  std::unordered_map<std::string, NameKey> by_name_;
};

// Peers by name, each given an id the first time it is named (a configured
// route, or the peer of a link).  A peer nothing refers to any more is
// forgotten (DataAgent::forgetIdlePeers) and its id given to the next new
// name: a holder of a shared token presenting daemon id after daemon id must
// not grow the table, or the rounds that walk it, for ever.
struct PeerEntry {
  std::string name;
  uint64_t link_id = 0;      // its current link; 0 while none is up
  bool ever_linked = false;  // a link to it came up since this daemon started
};
class PeerTable {
 public:
  PeerId resolve(const std::string& name);
  // `id` names no peer any more; resolve() may give it to another name.
  void forget(PeerId id);
  PeerEntry& operator[](PeerId id) { return peers_[id]; }
  const PeerEntry& operator[](PeerId id) const { return peers_[id]; }
  // The peers known now, each with its id.
  const std::unordered_map<std::string, PeerId>& byName() const { return by_name_; }
  size_t size() const { return by_name_.size(); }

 private:
  std::vector<PeerEntry> peers_;
  std::vector<PeerId> free_;
  std::unordered_map<std::string, PeerId> by_name_;
};

// A stream a peer opened towards us, on one link.
struct InStream {
  std::string name;
  NameKey key = kNoName;
};

struct AgentLink : LinkIdentity {
  uint64_t id = 0;
  PeerId peer = kNoPeer;
  std::shared_ptr<transport::Transport> transport;
  PeerSession session;
  std::map<uint64_t, InStream> in_streams;  // by the sender's stream id
  bool closing = false;
  // Closed because the peer broke the protocol: nothing it says is taken any
  // more.  A link closing for another reason (the peer's Fin, a transport
  // error) still takes the ACKs and NACKs that were on their way.
  bool violated = false;
  // When the agent ends the Session of a link it closed with a Fin, if the
  // peer has not read the Fin by then (0: no such deadline).
  uint64_t cut_at_ns = 0;
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t up_since_ns = 0;  // CLOCK_REALTIME
  uint64_t rtt_ns = 0;       // last keepalive round trip; 0: none measured yet
  // Whether the data path still delivers, checked end to end
  // (DataAgent::checkDataPaths): frames and control records handed to the
  // transport here, and taken off it here (told to the peer in keepalives);
  // what the peer's keepalives say it took, and since when the peer, short
  // of what was handed over (unconfirmed_to), took nothing more.
  uint64_t data_sent = 0;
  uint64_t data_received = 0;
  bool peer_counts_data = false;  // its keepalives carry data_received
  uint64_t peer_data_received = 0;
  uint64_t unconfirmed_to = 0;
  uint64_t unconfirmed_since_ns = 0;  // agent clock; 0: nothing waits for the peer's word
  // The slot regions the peer announced on this link (it receives, we send).
  peer::SlotRegions peer_regions;
  // What the peer sent and the agent has not handled yet: a round handles a
  // bounded part of each link's messages (DataAgent::kMessagesPerLinkRound),
  // so one peer's records never keep the others waiting.  The rest of a
  // control record begun (from message `record_next`), then the events
  // taken off the transport after it, in order.
  std::shared_ptr<const v1::ControlBatch> record_rest;
  int record_next = 0;
  std::deque<transport::TransportEvent> events_waiting;
  bool busy = false;           // the last round left some of what the peer sent for the next
  uint64_t busy_since_ns = 0;  // agent clock: the first of those rounds in a row
  uint64_t next_turn_ns = 0;   // agent clock: throttled, no turn before it (DataAgent::kBusyTurnGap)

  // Per-frame messages (credit grants and revokes, ACKs, NACKs) gathered in
  // this round.
  v1::ControlBatch control;
  size_t control_bytes = 0;
  uint64_t control_ack_frames = 0;  // what the ACKs in `control` name (peer::kMaxAckFramesPerRecord)

  // Takes posts and credits: up, and not being closed.
  bool usable() const { return !closing && transport != nullptr; }
  // To the peer: a per-frame message waits for the end of the round and goes
  // in a control record on the transport (flushControl); anything else goes
  // on the Session now.
  void send(v1::PeerMessage message);
  // Hands the round's per-frame messages to the transport as control
  // records, one per kMaxControlRecordBytes.  Returns the records handed
  // over.  Sets `failed` to why the link must fail: the transport called a
  // record malformed (a bug), or the records waiting for the peer passed
  // kMaxControlQueueBytes (it stopped reading); they are dropped then.
  size_t flushControl(std::string* failed);
  // Records the transport had no room for yet, oldest first, and their bytes.
  const std::deque<std::string>& controlQueued() const { return control_out_; }
  size_t controlQueuedBytes() const { return control_out_bytes_; }

 private:
  // `control` becomes a record of its own in `control_out_`.
  void cutRecord();

  std::deque<std::string> control_out_;
  size_t control_out_bytes_ = 0;
};

// True for the messages that travel in control records on the transport
// (protocol 2), never on the Session.
bool isPerFrameMessage(const v1::PeerMessage& message);

// What one control record holds before another is started.  A record may
// end one message beyond it; the largest message (kMaxCreditsPerGrant
// credits of at most 41 bytes, or kMaxAcksPerMessage ACKs of at most 11) is
// below 90 KiB, so a record stays below transport::kMaxControlBytes.  A
// record is also cut before its ACKs would name more than
// peer::kMaxAckFramesPerRecord frames, which the receiver refuses.
inline constexpr size_t kMaxControlRecordBytes = size_t{64} * 1024;
// Control records a link keeps for its peer while the transport turns them
// away (its own backlog, transport::kMaxControlBacklogBytes, is full).  Past
// this the peer has stopped reading, and the link fails (Fin(PROTOCOL))
// rather than keep in memory an ACK or NACK for every frame that peer
// sends.  A peer that reads never comes near it: a record leaves as soon
// as the transport has room.
inline constexpr size_t kMaxControlQueueBytes = size_t{8} * 1024 * 1024;
// Credits in one CreditGrant on the wire (larger grants are split).
inline constexpr size_t kMaxCreditsPerGrant = 2048;

class LinkTable {
 public:
  AgentLink* find(uint64_t id) {
    auto it = links_.find(id);
    return it == links_.end() ? nullptr : &it->second;
  }
  AgentLink& add(uint64_t id) {
    AgentLink& l = links_[id];
    l.id = id;
    return l;
  }
  void erase(uint64_t id) { links_.erase(id); }
  // The newest usable link to this instance of a peer, if any: a peer that
  // dialed again uses its new link, while this end may not have noticed
  // that the old one is dead.
  AgentLink* usableTo(PeerId peer, uint64_t instance) {
    auto it = std::find_if(links_.rbegin(), links_.rend(), [&](const auto& entry) {
      const AgentLink& l = entry.second;
      return l.usable() && l.peer == peer && l.peer_instance == instance;
    });
    return it == links_.rend() ? nullptr : &it->second;
  }
  // The newest usable link to a peer, of any instance, other than `except`.
  AgentLink* usableToPeer(PeerId peer, uint64_t except) {
    auto it = std::find_if(links_.rbegin(), links_.rend(), [&](const auto& entry) {
      const AgentLink& l = entry.second;
      return l.id != except && l.usable() && l.peer == peer;
    });
    return it == links_.rend() ? nullptr : &it->second;
  }
  std::map<uint64_t, AgentLink>::iterator begin() { return links_.begin(); }
  std::map<uint64_t, AgentLink>::iterator end() { return links_.end(); }
  std::map<uint64_t, AgentLink>::const_iterator begin() const { return links_.begin(); }
  std::map<uint64_t, AgentLink>::const_iterator end() const { return links_.end(); }
  size_t size() const { return links_.size(); }

 private:
  std::map<uint64_t, AgentLink> links_;
};

// One attached client and what the agent resolved for it at attach.
struct AgentClient {
  std::shared_ptr<ClientSession> session;
  PeerId route = kNoPeer;       // producer: the peer its stream goes to (kNoPeer: no route)
  bool route_implicit = false;  // producer: route is the single unrouted peer: local consumers come first
  uint64_t out_stream = 0;      // producer: its stream's id towards that peer
  // Producer: which of its frames `route` carries (each leg its own, below).
  RouteReaders route_readers = RouteReaders::kEvery;
  // Producer: where the next frame of a queue group that spans hosts starts
  // looking for its host (round-robin among those that wait least).
  uint32_t next_group = 0;
  NameKey stream = kNoName;  // consumer: its stream name
  // Producer: each slot's frame header, copied out of the segment at submit.
  std::vector<transport::FrameHeader> headers;
  // Producer: a further peer its stream goes to (it is routed to several),
  // with its own stream id and sequence there and each slot's frame towards
  // it.  `route` above is the first; the session's slots are its frames.
  struct Leg {
    PeerId peer = kNoPeer;
    uint64_t out_stream = 0;
    RouteReaders readers = RouteReaders::kEvery;
    std::vector<transport::FrameHeader> headers;
    std::vector<SlotEntry> slots;
  };
  std::vector<Leg> more_routes;
};

}  // namespace framelink
