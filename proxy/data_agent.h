// The data agent: one thread that owns every client's slot table, every
// stream, credit and link, drains submit rings round-robin, posts frames to
// transports, polls their events and publishes completions.  Other threads
// talk to it only through its command queue.  Idle strategy: spin, yield,
// then sleep in epoll over the doorbells, the transports and the queue.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include "client_session.h"
#include "command_queue.h"
#include "common/log_limit.h"
#include "common/unique_fd.h"
#include "config.h"
#include "framelink/v1/link.pb.h"
#include "peer_session.h"
#include "transport/transport.h"

namespace framelink {

class Metrics;

struct CmdClientAttached {
  std::shared_ptr<ClientSession> client;
};
struct CmdClientGone {
  uint64_t client_id = 0;
};
struct CmdLinkUp {
  uint64_t link_id = 0;
  std::string peer;            // configured peer name (dialer) or the peer's daemon id (listener)
  uint64_t peer_instance = 0;  // the peer daemon's instance id (from its Hello / HelloAck)
  std::string transport_name;
  std::string transport_reason;  // why this transport (e.g. why not rdma)
  std::shared_ptr<transport::Transport> transport;
  PeerSession session;
};
struct CmdLinkDown {
  uint64_t link_id = 0;
  std::string reason;
};
struct CmdPeerMessage {
  uint64_t link_id = 0;
  std::shared_ptr<v1::PeerMessage> message;
};
struct CmdStop {};

using AgentCommand =
    std::variant<CmdClientAttached, CmdClientGone, CmdLinkUp, CmdLinkDown, CmdPeerMessage, CmdStop>;

class DataAgent {
 public:
  DataAgent(const Config& config, Metrics& metrics);
  ~DataAgent();
  DataAgent(const DataAgent&) = delete;
  DataAgent& operator=(const DataAgent&) = delete;

  void post(AgentCommand command) { commands_.push(std::move(command)); }
  void start();
  // Fails everything still in progress with FL_ERR_SHUTDOWN and stops.
  void stop();

  // Test hook, for an agent that was never start()ed (fuzzers): runs the
  // agent's rounds on the calling thread until one finds no work -- every
  // command posted before is handled, and what it set off (client rings,
  // transport events, ACKs and grants to send) too.  No thread, no sleep: the
  // same commands and events give the same rounds (deadlines aside, which
  // follow the clock).  False when there was still work after `max_rounds`
  // (the agent would spin).
  bool runUntilIdle(size_t max_rounds);

 private:
  struct FrameRef {
    uint64_t client_id = 0;
    uint32_t slot = 0;
  };
  struct OutStream {
    uint64_t id = 0;
    std::string name;
    uint64_t next_sequence = 1;
    std::deque<transport::RemoteCredit> credits;
    uint64_t largest_credit = 0;  // the largest credit granted on the current link
    // Submitted or to be sent again, waiting for a credit; by sequence, so a
    // stream always leaves in sequence order -- also when NACKed frames and
    // a broken link's unacknowledged ones go back into it.  The receiver
    // relies on that: on a stream, a sequence at or below the highest it has
    // seen is one it has had (dropDuplicate).
    std::map<uint64_t, FrameRef> pending;
    std::unordered_map<uint64_t, FrameRef> unacked;  // by sequence: posted or sent
    bool announced = false;                          // StreamOpen sent on the current link
  };
  struct Peer {
    std::string name;
    uint64_t link_id = 0;  // 0 while no link is up
    std::map<uint64_t, OutStream> out_streams;
    std::unordered_map<std::string, uint64_t> out_by_name;
  };
  struct InStream {
    std::string name;
  };
  struct Link {
    uint64_t id = 0;
    std::string peer;
    uint64_t peer_instance = 0;
    std::string transport_name;
    std::string transport_reason;
    std::shared_ptr<transport::Transport> transport;
    PeerSession session;
    std::map<uint64_t, InStream> in_streams;  // by the sender's stream id
    bool closing = false;
    uint64_t frames_in = 0;
    uint64_t frames_out = 0;
  };
  // Receive side of one sender stream, kept across links so that frames
  // replayed after a link broke are recognised: per (peer, peer instance,
  // sender's stream id).  The sender numbers frames in order and replays
  // from its oldest unacknowledged one, so every sequence up to `highest`
  // arrived before.
  struct InState {
    std::string peer;
    uint64_t instance = 0;
    uint64_t stream_id = 0;
    uint64_t highest = 0;             // highest sequence that arrived intact
    std::set<uint64_t> held;          // delivered, not yet released by the consumer
    std::map<uint64_t, int> refused;  // recent NACKs, repeated to a replay (bounded)
    std::set<uint64_t> resend;        // CRC mismatches: the sender sends these again (bounded)
    // Recently released sequences (bounded): their ACKs are sent again on
    // every new link from this peer instance, since an ACK can be lost with
    // the link that carried it, and the sender must learn of the release
    // even when it gets no credit to replay the frame before its deadline.
    std::deque<uint64_t> released;
  };
  struct CreditEntry {
    uint64_t client_id = 0;
    uint32_t slot = 0;
    uint64_t link_id = 0;
    uint64_t stream_id = 0;
  };
  struct Posted {
    FrameRef frame;
    std::string peer;
    uint64_t stream_id = 0;
    uint64_t sequence = 0;
  };

  void run();
  // One round after the commands: client rings, transport events, control
  // messages, posts, deadlines, stats.  Returns the work it found.
  size_t doWork();
  size_t drainCommands();
  size_t pollClients();
  size_t pollLinks();
  size_t pumpAll();
  void checkDeadlines();
  void sleep();
  void publishStats();

  void onClientAttached(std::shared_ptr<ClientSession> client);
  void onClientGone(uint64_t client_id);
  void onLinkUp(CmdLinkUp& command);
  void onLinkDown(uint64_t link_id, const std::string& reason);
  void onPeerMessage(Link& link, const v1::PeerMessage& message);
  void onTransportEvent(Link& link, transport::TransportEvent& event);

  // Producer side.
  void onSubmit(ClientSession& client, const fl_submit_desc& desc);
  // Posts what the stream's credits allow, in sequence order; returns the work done.
  size_t pump(Peer& peer, OutStream& stream);
  void finishFrame(ClientSession& client, uint32_t slot, int status, const std::string& why);
  void onAck(Peer& peer, uint64_t stream_id, uint64_t sequence, int status, const std::string& why);
  OutStream& outStream(Peer& peer, const std::string& name);
  // Forgets the out-stream `name` once no producer of it is left and none of
  // its frames is in flight, and closes it on the link (a producer churning
  // through stream names must not leave them all announced forever).
  void maybeForgetStream(const std::string& name);

  // Consumer side.
  void onRelease(ClientSession& client, const fl_submit_desc& desc);
  // Sends the ACKs and credit grants collected during this round.
  void flushControl();
  void onFrameArrived(Link& link, transport::TransportEvent& event);
  void grantCredits(const std::string& stream_name);
  void sendNack(Link& link, uint64_t stream_id, uint64_t sequence, int code, const std::string& message);
  void retractCreditsOfLink(uint64_t link_id);
  uint64_t inStateId(const Link& link, uint64_t stream_id);
  // Whether the frame is a replay this daemon already had; answers it.
  bool dropDuplicate(Link& link, const transport::FrameHeader& header);
  // Sends the ACKs of recently released frames of this link's peer instance
  // again (a new link: the old one may have lost them).
  void resendReleasedAcks(Link& link);
  // Producer side: frames posted on a broken link go back to the front of
  // their stream's queue, to be sent again on the next link.
  void requeueUnacked(uint64_t link_id, const std::string& reason);

  void detachClient(ClientSession& client, int status, const std::string& why);
  void maybeForget(ClientSession& client);
  ClientSession* client(uint64_t id);
  Link* link(uint64_t id);
  uint64_t nowNs() const;

  const Config& config_;
  Metrics& metrics_;
  CommandQueue<AgentCommand> commands_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool shutting_down_ = false;
  UniqueFd epoll_fd_;

  std::map<uint64_t, std::shared_ptr<ClientSession>> clients_;
  std::map<std::string, Peer> peers_;
  std::map<uint64_t, Link> links_;
  std::unordered_map<uint64_t, CreditEntry> credits_;
  std::unordered_map<uint64_t, Posted> posted_;  // by cookie
  std::map<uint64_t, InState> in_states_;        // by id
  std::map<std::tuple<std::string, uint64_t, uint64_t>, uint64_t> in_state_ids_;
  uint64_t next_in_state_id_ = 1;
  std::vector<transport::FrameHeader> frame_headers_scratch_;
  uint64_t next_stream_id_ = 1;
  uint64_t next_credit_id_ = 1;
  uint64_t next_cookie_ = 1;
  uint64_t next_deadline_check_ns_ = 0;
  uint64_t next_stats_ns_ = 0;
  size_t grant_cursor_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>>
      pending_acks_;                    // (link, stream) -> sequences
  std::set<std::string> dirty_grants_;  // streams with slots to grant again
  // What clients and peers can make the agent log, per frame: at most a line
  // a second per cause, with the number suppressed.
  LogLimiter log_client_errors_, log_failed_, log_resent_, log_refused_;
  // Detaches (see AttachServer::kLoggedAttachesPerSecond).
  LogLimiter log_detached_{std::chrono::seconds(1), 20};
  // Producer frame headers copied out of the segment at submit, by (client, slot).
  std::unordered_map<uint64_t, std::vector<transport::FrameHeader>> headers_;
};

}  // namespace framelink
