// The data agent: one thread that owns every client's slot table, every
// stream, credit and link, drains submit rings round-robin, posts frames to
// transports, polls their events and publishes completions.  Other threads
// talk to it only through its command queue.  Idle strategy: spin, yield,
// then sleep in epoll over the doorbells, the transports and the queue.
//
// This file is the loop and the wiring; the protocol lives in its parts:
// ClientTable (client rings), OutboundStreams (producer side),
// InboundStreams (consumer side), peer::decode (peer messages), AgentStats.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/agent_heartbeat.h"
#include "agent/agent_state.h"
#include "agent/agent_stats.h"
#include "agent/client_table.h"
#include "agent/command_queue.h"
#include "agent/inbound_streams.h"
#include "agent/local_delivery.h"
#include "agent/outbound_streams.h"
#include "agent/session_writer.h"
#include "attach/client_session.h"
#include "common/log_limit.h"
#include "common/unique_fd.h"
#include "config/config.h"
#include "framelink/v1/link.pb.h"
#include "metrics/metrics.h"
#include "transport/link_bookkeeping.h"
#include "transport/transport.h"

namespace framelink {

struct CmdClientAttached {
  std::shared_ptr<ClientSession> client;
};
struct CmdClientGone {
  uint64_t client_id = 0;
};
struct CmdLinkUp {
  uint64_t link_id = 0;
  LinkIdentity identity;
  std::shared_ptr<transport::Transport> transport;
  PeerSession session;
};
// What a link's keepalives said last, from its Session's reader to the
// agent: the round trip (a keepalive of ours came back) and what the peer
// took off the data transport so far (Keepalive.data_received).  The reader
// overwrites it and posts a CmdLinkKeepalive only while none waits, so a
// peer that floods keepalives queues one command, not one per keepalive.
class KeepaliveNews {
 public:
  // The reader's side: each returns whether to post a CmdLinkKeepalive.
  bool rtt(uint64_t ns) {
    rtt_ns_.store(ns);
    return !waiting_.exchange(true);
  }
  bool dataReceived(uint64_t units) {
    data_received_.store(units);
    has_data_.store(true);
    return !waiting_.exchange(true);
  }
  // The agent's side, for each CmdLinkKeepalive: what was said since the
  // last take (rtt_ns 0, has_data false: nothing of that kind).  What the
  // reader says from now on comes with a command of its own.
  struct Said {
    uint64_t rtt_ns = 0;
    bool has_data = false;
    uint64_t data_received = 0;
  };
  Said take() {
    waiting_.store(false);
    Said said;
    said.rtt_ns = rtt_ns_.exchange(0);
    said.has_data = has_data_.exchange(false);
    said.data_received = data_received_.load();
    return said;
  }

 private:
  std::atomic<uint64_t> rtt_ns_{0};
  std::atomic<uint64_t> data_received_{0};
  std::atomic<bool> has_data_{false};
  std::atomic<bool> waiting_{false};  // a CmdLinkKeepalive is posted and not yet taken
};
struct CmdLinkKeepalive {
  uint64_t link_id = 0;
  std::shared_ptr<KeepaliveNews> news;
};
struct CmdLinkDown {
  uint64_t link_id = 0;
  std::string reason;
};
// What one Session's reader handed the agent that the agent has not taken
// yet.  The reader ends a Session whose peer sends faster than the agent
// takes it (kMaxMessages, kMaxBytes): the queue between them stays bounded.
// Keepalives do not count here: they are KeepaliveNews, one command at most.
struct SessionBacklog {
  static constexpr uint64_t kMaxMessages = 1024;
  static constexpr uint64_t kMaxBytes = uint64_t{4} * 1024 * 1024;
  std::atomic<uint64_t> messages{0};
  std::atomic<uint64_t> bytes{0};
};
struct CmdPeerMessage {
  uint64_t link_id = 0;
  std::shared_ptr<v1::PeerMessage> message;
  // Read from the gRPC Session, where a per-frame message is a protocol
  // error (version 2 carries those on the transport).
  bool from_session = false;
  // The Session's backlog this message counts in, and its bytes there.
  std::shared_ptr<SessionBacklog> backlog;
  uint64_t bytes = 0;
};
// Stop; with drain_ms > 0, first drain: new frames are refused (FL_ERR_SHUTDOWN)
// and those in progress are given that long to end with their true status.
// `hand_over` (a hot restart): new frames are not refused but left in their
// producers' rings for the next daemon, and the clients stay attached
// (handOverClients).
struct CmdStop {
  uint64_t drain_ms = 0;
  bool hand_over = false;
};

// A reload: the routes, peers and frame timeouts of `config` apply from now
// (its other settings are the running ones).  An attached producer's stream
// follows the new routes from its next frame; one with frames in flight
// keeps its routes until it attaches again, and is named in the log.
struct CmdReconfigure {
  std::shared_ptr<const Config> config;
};

// Publish the stats now (Metrics::health asks an idle agent, which
// publishes only what changed, whether it still runs).
struct CmdPublishStats {};

using AgentCommand = std::variant<CmdClientAttached, CmdClientGone, CmdLinkUp, CmdLinkDown, CmdPeerMessage,
                                  CmdLinkKeepalive, CmdStop, CmdReconfigure, CmdPublishStats>;

class DataAgent {
 public:
  // `clock`: the time deadlines, the idle strategy and the stats period
  // follow (a ManualClock in tests); it must outlive the agent.
  // `heartbeat`: beaten from the agent's rounds (none by default).
  DataAgent(const Config& config, Metrics& metrics, const AgentClock& clock = steadyClock(),
            AgentHeartbeat heartbeat = {});
  ~DataAgent();
  DataAgent(const DataAgent&) = delete;
  DataAgent& operator=(const DataAgent&) = delete;

  // What one link's peer may make one round handle: its frames and events
  // count one each, a control record one for each message in it.  The rest
  // waits for the next round, after the other links had their turn.
  static constexpr size_t kMessagesPerLinkRound = 64;
  // A link whose turns its control records have filled for kThrottleAfterNs,
  // leaving more each time, waits this many times its last turn's length
  // before its next: at most an eighth of the agent's time goes to one
  // peer's backlog of them, and the rest to the other links and clients --
  // or, on a small host, to the CPU they need.
  static constexpr uint64_t kBusyTurnGap = 7;
  static constexpr uint64_t kThrottleAfterNs = 2'000'000;  // of such turns in a row

  void post(AgentCommand command) {
    // Counted before it is queued: the agent sees the count at least as soon
    // as the command (takeAttaches).
    if (std::holds_alternative<CmdClientAttached>(command)) {
      attaches_posted_.fetch_add(1, std::memory_order_release);
    }
    commands_.push(std::move(command));
  }
  void start();
  // Fails everything still in progress with FL_ERR_SHUTDOWN and stops.  With
  // `drain_ms`, first lets the frames in progress end (delivered, or failed for
  // what they failed of) for that long at most, refusing new ones meanwhile.
  void stop(uint64_t drain_ms = 0);
  // A stop for a hot restart: the frames in progress get `drain_ms` to end,
  // the frames producers submit meanwhile stay in their rings, and every
  // client stays attached -- its segment still says SERVING -- for the next
  // daemon to take over (hand_over.h).
  void stopForHandOver(uint64_t drain_ms);
  // After stopForHandOver: each client still attached, and of a consumer the
  // slots whose frame its application holds.
  struct HandedClient {
    std::shared_ptr<ClientSession> session;
    std::vector<uint32_t> held_slots;
  };
  std::vector<HandedClient> handOverClients() const;

  // Test hook, for an agent that was never start()ed (fuzzers): runs the
  // agent's rounds on the calling thread until one finds no work -- every
  // command posted before is handled, and what it set off (client rings,
  // transport events, ACKs and grants to send) too.  No thread, no sleep: the
  // same commands and events give the same rounds (deadlines aside, which
  // follow the clock).  False when there was still work after `max_rounds`
  // (the agent would spin); a throttled link's backlog is work left too.
  bool runUntilIdle(size_t max_rounds);
  // The inbound side's deadlines and bounds in force (tests).
  const InboundLimits& inboundLimitsForTest() const { return inbound_.limits(); }

 private:
  void run();
  // One round after the commands: client rings, transport events, control
  // messages, posts, deadlines, stats.  Returns the work it found.
  size_t doWork();
  size_t drainCommands();
  // Handles the client attaches queued so far, ahead of the other commands:
  // a producer's frame is routed only after every attach posted before it
  // was submitted (the attach reply goes out after the post, and the
  // consumer's fl_attach returns after the reply), so a reader whose
  // fl_attach returned is among the frame's readers.
  void takeAttaches();
  // Each link's events, within kMessagesPerLinkRound a link (peer_dispatch.cpp).
  size_t pollLinks();
  // One link's turn: what it left in earlier rounds, then new events.
  size_t pollLink(uint64_t link_id);
  // Handles events of the link in order (events[0..n)) while its turn
  // lasts; keeps those after it in the link's events_waiting.
  void handleEvents(uint64_t link_id, transport::TransportEvent* events, size_t n);
  // Handles the rest of the link's control record while its turn lasts.
  void continueRecord(AgentLink& link);
  // A link whose turn ended with some of its peer's messages left, round
  // after round for link_timeout_ms, is cut: its peer sends more than the
  // agent can handle while serving the others.
  void checkBusy(AgentLink& link, uint64_t now_ns);
  // The earliest turn a throttled link waits for (agent clock); 0: none waits.
  uint64_t nextBusyTurnNs() const;
  void sleep();
  // The stats snapshot and the gauges, to metrics_ (stats_snapshot.cpp).
  void publishStats();
  void collectClientStats(AgentStats& stats, Metrics::Gauges& gauges);
  // Also fills gauges.links; returns the transport counters of every link so far.
  transport::TransportCounters collectLinkStats(AgentStats& stats, Metrics::Gauges& gauges);
  void shutdown();

  void onClientAttached(std::shared_ptr<ClientSession> client);
  void onClientGone(uint64_t client_id);
  void onLinkUp(CmdLinkUp& command);
  void onLinkDown(uint64_t link_id, const std::string& reason);
  // What a peer sent, to the part that owns it (peer_dispatch.cpp).
  void onPeerMessage(AgentLink& link, const v1::PeerMessage& message);
  // A control record from the link's transport: a ControlBatch of per-frame messages.
  void onControlRecord(AgentLink& link, const std::string& record);
  // Every link's per-frame messages of this round, to its transport.
  size_t flushLinkControl();
  void onTransportEvent(AgentLink& link, transport::TransportEvent& event);
  // A descriptor from a client's submit ring: a producer's frame or a
  // consumer's release.
  void onDescriptor(AgentClient& client, const fl_submit_desc& desc);
  // Frames of local producers not yet ended (and, handing over, frames landed
  // here still lent to other readers).
  uint64_t framesInProgress();
  // CmdStop: stops at once, or starts the drain; ends a drain that is over.
  void beginStop(const CmdStop& stop);
  void checkDrain(uint64_t now_ns);
  // Closes the link with a Fin(PROTOCOL) saying why (logged once a link).
  void protocolError(AgentLink& link, const std::string& why);
  // Closes the link with a Fin(code) saying why; a cause other than the
  // peer's (a stall) is logged here as a warning.
  void closeLink(AgentLink& link, v1::ErrorCode code, const std::string& why);
  // Closes the links whose data path stopped delivering: the peer, by its
  // keepalives' word (Keepalive.data_received), is short of what was handed
  // to the transport and took nothing more for link_timeout_ms.
  void checkDataPaths(uint64_t now_ns);
  // Ends the Sessions whose peer did not read the Fin they were closed with
  // in time (AgentLink::cut_at_ns).
  void cutOverdueSessions(uint64_t now_ns);
  // Forgets the peers nothing refers to: not configured, no link, no stream
  // to them, nothing kept to answer their replays.  Returns how many.
  size_t forgetIdlePeers();
  // CmdReconfigure (agent_reload.cpp).
  void reconfigure(const Config& next);
  // A producer's stream onto the routes the configuration gives it now,
  // unless a frame of it is in flight (false); logged with `why`.
  bool rerouteProducer(AgentClient& c, const char* why);
  // `carrying`: only those that carry its next frame.
  std::vector<std::string> routesOf(const AgentClient& c, bool carrying = false) const;
  // The producers a reload could not reroute yet, tried again each deadline check.
  void retryReroutes();
  std::set<uint64_t> reroute_waiting_;
  // The inbound side's deadlines, from ack_timeout_ms and link_timeout_ms.
  static InboundLimits inboundLimits(const Config& config);

  // The agent's own copy, which only its thread reads: a reload
  // (CmdReconfigure) changes it between rounds.
  Config config_;
  Metrics& metrics_;
  const AgentClock& clock_;
  CommandQueue<AgentCommand> commands_;
  std::atomic<uint64_t> attaches_posted_{0};  // CmdClientAttached posted ...
  uint64_t attaches_taken_ = 0;               // ... and handled (the agent's thread)
  std::thread thread_;
  std::atomic<bool> running_{false};
  // Stopping with a drain (CmdStop::drain_ms): from when, and until when.
  uint64_t drain_from_ns_ = 0;
  uint64_t drain_until_ns_ = 0;
  bool hand_over_ = false;  // stopping for a hot restart (CmdStop::hand_over)
  UniqueFd epoll_fd_;

  // The parts, in the order they depend on each other.
  NameTable names_;
  PeerTable peers_;
  LinkTable links_;
  // What the transports of closed links did: the exported totals add the
  // open links' counters to it, so they never go down when a link goes.
  transport::TransportCounters closed_links_transport_;
  ClientTable clients_;
  OutboundStreams outbound_;
  InboundStreams inbound_;
  LocalDelivery local_;
  uint64_t next_deadline_check_ns_ = 0;
  uint64_t next_stats_ns_ = 0;
  bool stats_changed_ = true;  // by a command since the stats were published last
  AgentHeartbeat heartbeat_;
  uint64_t next_heartbeat_ns_ = 0;
  // What pollLinks() reuses each round: the event array (a few hundred bytes
  // an event, strings keep their capacity) and the ids of the links.
  static constexpr size_t kMaxEventsPerRound = 64;
  std::unique_ptr<transport::TransportEvent[]> events_{new transport::TransportEvent[kMaxEventsPerRound]};
  std::vector<uint64_t> link_ids_;
  size_t turn_left_ = 0;        // of kMessagesPerLinkRound, for the link being polled
  size_t turn_control_ = 0;     // of those, the messages of control records
  std::vector<uint64_t> rang_;  // sleep(): the clients whose submit doorbell rang
  // A holder of the peer token can open and close links as fast as
  // handshakes finish: the lines about links coming up, and going down or
  // being closed, are rate-limited (the next line says how many were left
  // out), as a client's attach and detach are.
  LogLimiter log_link_up_{std::chrono::seconds(1), transport::kLoggedLinkEventsPerSecond};
  LogLimiter log_link_down_{std::chrono::seconds(1), transport::kLoggedLinkEventsPerSecond};
  LogLimiter log_link_closing_{std::chrono::seconds(1), transport::kLoggedLinkEventsPerSecond};
};

}  // namespace framelink
