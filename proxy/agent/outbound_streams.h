// The producer side of the frame protocol: each local producer's stream
// towards each peer it is routed to, numbered in sequence there, posted into the peer's credits in
// sequence order, settled by ACK or NACK (a frame refused undelivered is sent
// again, a few times), failed by its credit or ACK deadline, and replayed from
// the oldest unacknowledged frame when its link breaks or is replaced.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/agent_state.h"
#include "agent/client_table.h"
#include "agent/local_delivery.h"
#include "agent/peer_messages.h"
#include "agent/source_pins.h"
#include "common/log_limit.h"
#include "config/config.h"
#include "metrics/metrics.h"
#include "transport/transport.h"

namespace framelink {

struct StreamStats;

class OutboundStreams {
 public:
  OutboundStreams(const Config& config, Metrics& metrics, const AgentClock& clock, ClientTable& clients,
                  PeerTable& peers, LinkTable& links);

  // A producer attached: its route is resolved and its stream opened (and
  // announced, when its peer's link is up) once, here.
  void onProducerAttached(AgentClient& c);
  // A reload changed the routes: the producer's stream goes where it would
  // for a producer attaching now, and a stream to a peer it left is closed
  // once unused.  Only while no frame of it is in flight (every slot free):
  // false, and nothing changed, otherwise.  (outbound_routes.cpp)
  bool reroute(AgentClient& c);
  // With frames in flight, routes can still be added: the routes in `routes`
  // the producer does not have become routes of its next frame -- the frames
  // in flight keep the sides they have -- when every route it has is in
  // `routes` or went to a found daemon whose readers left (that one carries
  // no new frame, and once none of its frames is in flight an added route
  // takes its place).  False, and nothing changed, when none is added, when
  // a written peer's route left (reroute() once none is in flight), or for a
  // producer with no route or the implicit one.
  bool addRoutes(AgentClient& c, const std::vector<std::string>& routes);
  void onSubmit(AgentClient& c, const fl_submit_desc& desc);
  // Which of the producer's frames each of its routes carries, as the
  // configuration (the registry's readers) says now: from its next frame.
  void refreshRouteReaders(AgentClient& c);
  // Posts what each stream's credits allow; returns the work done.
  size_t pumpAll();
  // Readable when a retracted offer's slot is read no more (settleSources
  // has work): the agent waits on it with its other fds.
  int sourcesFd() const noexcept { return pins_->eventFd(); }
  // Lets go the posts of retracted offers that nothing reads any more (their
  // pins went): a frame that ended meanwhile (kSettling) ends now.  Returns
  // how many it let go.
  size_t settleSources();

  // Control messages of the peer at the other end of `link`.  A grant that
  // overflows the stream's bound returns the violation (the link is closed).
  std::string onCreditGrant(AgentLink& link, const peer::CreditGrant& grant);
  void onCreditRevoke(AgentLink& link, const peer::CreditRevoke& revoke);
  // `readers`: on the receiving host that the frame reached; `released`: of
  // those, that released it (the producer's completion says both).
  // `link_id`: the link the answer came on (0: not said).  A refusal to be
  // resent that came on another link than the frame's current post is about
  // an earlier post of it, and is not acted on: the current one is answered
  // on its own link.
  void onAck(PeerId peer, uint64_t stream_id, uint64_t sequence, int status, const std::string& why,
             uint32_t readers = 1, uint32_t released = 1, uint64_t link_id = 0);
  void onSendComplete(const transport::TransportEvent& event);
  // The link's transport was shut down and drained: a post it never reported
  // complete is let go as if it completed FL_ERR_LINK_LOST.
  void forgetPostsOf(uint64_t link_id);

  // A link to a peer is up: it becomes the peer's link (what a replaced one
  // carried unacknowledged goes first on it) and every stream is announced.
  void onLinkUp(AgentLink& link);
  // Before the link goes: its posts are replayed on the next link.
  void onLinkDown(const AgentLink& link, const std::string& reason);

  // Fails the frames whose credit or ACK deadline passed.
  void checkDeadlines();
  // Forgets a client that went away once it has nothing in progress (a
  // producer's frames are still sent after it went; a transport may still
  // read its slots), and its stream with its last producer.
  void maybeForget(AgentClient& c);
  // The daemon is stopping: frames end FAILED(shutdown) from here.
  void startShutdown() { shutting_down_ = true; }
  // The daemon is draining before it stops: new frames are refused
  // (FL_ERR_SHUTDOWN); those in progress go on.
  void startDraining() { draining_ = true; }
  bool refusingFrames() const { return shutting_down_ || draining_; }
  void failAllInProgress(const ClientSession& c, int status, const std::string& why);
  // Frames of a stream with no route go to the consumers attached here.
  void setLocalDelivery(LocalDelivery* local) { local_ = local; }
  // A frame LocalDelivery had ends (then a producer that went may be forgotten).
  void endLocalFrame(AgentClient& producer, uint32_t slot, int status, const std::string& why,
                     uint32_t readers, uint32_t released);

  void collectStats(std::vector<StreamStats>& out) const;
  // This daemon's frames to `peer`: posted or sent and not yet acknowledged,
  // waiting for a credit, and replayed so far.
  struct PeerTraffic {
    size_t in_flight = 0;
    size_t pending = 0;
    uint64_t replayed = 0;
    size_t pulled = 0;  // streams the peer pulls on its current link
  };
  PeerTraffic traffic(PeerId peer) const;
  // Whether a stream to `peer` is open here (a producer routed to it, or
  // frames of one that left still to settle).
  bool sendsTo(PeerId peer) const { return peer < out_.size() && !out_[peer].streams.empty(); }
  // `peer` is forgotten (PeerTable::forget): what was counted for it goes.
  void forgetPeer(PeerId peer) {
    if (peer < out_.size()) out_[peer] = PeerOut{};
  }

 private:
  // Which of a producer's routes a frame is on: 0 is AgentClient::route (its
  // frames are the session's slots), 1.. are AgentClient::more_routes.  Each
  // route runs the whole protocol of this class on its own; the frame ends
  // once every route (and the readers here) is done with it.
  using Leg = uint8_t;
  struct FrameRef {
    uint64_t client_id = 0;
    uint32_t slot = 0;
    Leg leg = 0;
  };
  struct OutStream {
    uint64_t id = 0;
    std::string name;
    uint64_t next_sequence = 1;
    // In the order granted (a frame takes the oldest it fits), and by id: a
    // peer may revoke as many ids as the stream holds, each found at once.
    // A peer granting an id held already is refused.
    std::list<transport::RemoteCredit> credits;
    std::unordered_map<uint64_t, std::list<transport::RemoteCredit>::iterator> by_credit_id;
    uint64_t largest_credit = 0;  // the largest credit granted on the current link
    // The shortest frame that no credit held fits: the credits are scanned
    // again only after a grant, not each round while such frames wait.
    uint64_t unfit_from = UINT64_MAX;
    // Submitted or to be sent again, waiting for a credit; by sequence, so a
    // stream always leaves in sequence order -- also when NACKed frames and
    // a broken link's unacknowledged ones go back into it, so replays go
    // before newer frames.
    std::map<uint64_t, FrameRef> pending;
    std::unordered_map<uint64_t, FrameRef> unacked;  // by sequence: posted or sent
    bool announced = false;                          // StreamOpen sent on the current link
    // The low-credit signal: the most credits held on the current link, and
    // whether CreditLow went since the credits were last above a quarter of it.
    size_t credit_peak = 0;
    bool said_low = false;
    // The receiver's latest grant on the current link said pull.  Each
    // credit keeps the kind of its own grant (a consumer asking for pull
    // changes the kind of the grants after it): a frame is offered into a
    // pull credit and written into any other.
    bool pull = false;
  };
  struct PeerOut {
    std::map<uint64_t, OutStream> streams;              // by stream id
    std::unordered_map<std::string, uint64_t> by_name;  // at attach only
    uint64_t replayed = 0;  // frames sent again on a new link after one to this peer broke
    // The stream pumpAll() starts with: one further each round, so that no
    // stream's frames always go first on the shared link.
    uint64_t first_pumped = 0;
  };
  // A post a transport holds: until it reports the send complete, it may
  // still read the producer's slot, so the frame cannot end before that.
  struct Posted {
    FrameRef frame;  // and its route
    PeerId peer = kNoPeer;
    uint64_t stream_id = 0;
    uint64_t sequence = 0;
    uint64_t link_id = 0;
    // An offer (pull): its source stays exposed until the frame's answer or
    // the link's end (endOffer), and the post out until its pin goes
    // (settleSources): no transport reports an offer.
    bool offered = false;
    bool retracted = false;
    std::weak_ptr<void> pin;  // the source's keepalive (SourcePins)
  };
  // The outcome of a frame that ended while a post of it was still out
  // (kSettling): it is said when the last post completes.
  struct Outcome {
    int status = FL_OK;
    std::string why;
  };
  // A frame that goes more than one way -- to several peers, or to a peer
  // and readers here -- completes once each side is done, with the first
  // failure and every side's readers counted.
  struct Sides {
    uint64_t waiting = 0;  // a bit per side not done yet: sideBit(leg), kLocalSide
    int status = FL_OK;    // the first failure
    std::string why;
    uint32_t readers = 0;  // of the sides done
    uint32_t released = 0;
  };
  static constexpr uint64_t kLocalSide = uint64_t{1} << 63;
  static uint64_t sideBit(Leg leg) { return uint64_t{1} << leg; }
  static_assert(kMaxRoutesPerStream < 64, "a bit of Sides::waiting per route, and one for the readers here");

  // How many routes the producer has (at most kMaxRoutesPerStream).
  static Leg legs(const AgentClient& ac) {
    return static_cast<Leg>(ac.route == kNoPeer ? 0 : 1 + ac.more_routes.size());
  }
  static PeerId legPeer(const AgentClient& ac, Leg leg) {
    return leg == 0 ? ac.route : ac.more_routes[leg - 1].peer;
  }
  static uint64_t& legStream(AgentClient& ac, Leg leg) {
    return leg == 0 ? ac.out_stream : ac.more_routes[leg - 1].out_stream;
  }
  static SlotEntry& legSlot(AgentClient& ac, Leg leg, uint32_t slot) {
    return leg == 0 ? ac.session->slots[slot] : ac.more_routes[leg - 1].slots[slot];
  }
  static transport::FrameHeader& legHeader(AgentClient& ac, Leg leg, uint32_t slot) {
    return leg == 0 ? ac.headers[slot] : ac.more_routes[leg - 1].headers[slot];
  }
  static RouteReaders legReaders(const AgentClient& ac, Leg leg) {
    return leg == 0 ? ac.route_readers : ac.more_routes[leg - 1].readers;
  }
  // Where one frame goes: a bit per route (sideBit) that carries it, a bit
  // per route that carries it for the subscribers there only, and whether
  // the readers here get it (all of them, or the subscribers only).
  struct Ways {
    uint64_t legs = 0;
    uint64_t subscribers_only = 0;
    bool here = false;
    bool here_members = true;
  };
  // A stream whose queue group spans hosts (routes kGroup or kBoth, and
  // members here) gives each frame to one host of the group: the one whose
  // route has the fewest frames waiting for a credit, round-robin among equals.
  Ways waysOf(AgentClient& ac);
  // How long the frames of route `leg` wait: its frames waiting for a credit,
  // and many more while its peer has no link.
  size_t backlog(const AgentClient& ac, Leg leg);

  // The producer's next frame goes to the consumers attached here: its stream
  // has no route, or only the implicit one, and a consumer of it is attached.
  bool deliversLocally(const AgentClient& ac) const;
  // Its stream goes to a peer it was routed to by name, and local readers of
  // it are attached here: its next frame goes to both.
  bool alsoLocally(const AgentClient& ac) const;
  // One side of a frame is done: true when it was the last (or the frame has
  // one side only), and then `status`, `why` and the slot's reader counts are
  // the frame's.
  bool sideDone(ClientSession& c, uint32_t slot, uint64_t side, int& status, std::string& why,
                uint32_t readers, uint32_t released);
  // Submits the frame in `slot` on one of the producer's routes.
  void submitOn(AgentClient& ac, Leg leg, uint32_t slot, const fl_slot_header& sh, uint64_t length,
                uint64_t now, bool subscribers_only);
  PeerOut& peerOut(PeerId peer);
  OutStream* stream(PeerId peer, uint64_t stream_id);
  uint64_t openStream(PeerId peer, const std::string& name);
  // `peer` is no route of the stream now (not in `routes`) and not a
  // written peer: a found daemon whose readers left, or one gone.
  bool routeLeft(const std::string& peer, const std::vector<std::string>& routes) const;
  // A further route of the producer, to `peer` (onProducerAttached, addRoutes).
  void appendLeg(AgentClient& c, const std::string& peer);
  void announce(AgentLink& link, OutStream& s);
  // After a credit was spent: tells the receiver when the stream's credits
  // fell to a quarter of what it held (CreditLow), once until they rise again.
  void maybeSayLow(AgentLink& link, OutStream& s);
  // The link's credits are gone (link up or down).
  static void dropCredits(OutStream& s);
  // The oldest of the stream's credits that `length` bytes fit, or end.
  static std::list<transport::RemoteCredit>::iterator fittingCredit(OutStream& s, uint64_t length);
  size_t pump(PeerId peer, OutStream& s);
  // Posts the frame in that slot of `c` into `credit` on the link, or, for a
  // pull credit, exposes its payload and offers it into `credit`.
  transport::PostResult post(AgentLink& link, AgentClient& c, Leg leg, uint32_t slot,
                             const transport::RemoteCredit& credit, uint64_t cookie);
  // The frame's offer (if its current post is one) is over: its source is
  // retracted, and the post let go once nothing reads the slot (at once,
  // unless an answer is still being written or a window invalidated).
  // Before the frame ends or goes again.
  void endOffer(SlotEntry& e);
  // Retracts the offer posted under `cookie`; whether it is let go already.
  bool retractOffer(Posted& posted, uint64_t cookie);
  // The frame is on the link now (kPosted): its SendComplete and ACK are awaited.
  void markPosted(const AgentLink& link, PeerId peer, OutStream& s, FrameRef frame, SlotEntry& e,
                  uint64_t cookie);
  // Back to kPending (posted or sent, not ACKed): it goes again on a link by `deadline_ns`.
  void unpost(SlotEntry& e, uint64_t deadline_ns);
  // Whether a submitted descriptor may be taken; copies the slot header into
  // `sh` (never read again from shared memory), else says what is wrong.
  bool checkSubmit(const AgentClient& c, const fl_submit_desc& desc, fl_slot_header* sh, int* status,
                   std::string* why) const;
  // A frame sent to a host for its subscribers only, refused there for want
  // of one (they left), was delivered to none there: FL_OK, counted.
  int subscribersAnswer(AgentClient& ac, FrameRef f, int status);
  void rejectSubmit(ClientSession& c, const fl_submit_desc& desc, int status, const std::string& why);
  // Ends the frame with `status`, or, while a transport still holds a post
  // of it, settles it (kSettling) and ends it when the last post completes.
  void finishFrame(AgentClient& ac, Leg leg, uint32_t slot, int status, const std::string& why);
  // The frame's route `leg` ended (and with it the frame, unless another
  // route or the readers here still have it).
  void endFrame(AgentClient& ac, Leg leg, uint32_t slot, int status, const std::string& why);
  // The frame ends: counted, and its completion pushed.
  void completeFrame(ClientSession& c, uint32_t slot, int status, const std::string& why);
  // Fails the frames of route `leg` of this producer whose deadline passed.
  void checkDeadlines(AgentClient& ac, Leg leg, uint64_t now);
  void forgetStreamIfUnused(PeerId peer, uint64_t stream_id);
  void requeueUnacked(uint64_t link_id, const std::string& reason);
  // When a frame waiting for a credit (credit_timeout_ms), or a frame sent
  // or offered and waiting for its ACK (ack_timeout_ms), fails.
  uint64_t creditDeadline(uint64_t now_ns) const;
  uint64_t ackDeadline(uint64_t now_ns) const;

  const Config& config_;
  Metrics& metrics_;
  const AgentClock& clock_;
  ClientTable& clients_;
  PeerTable& peers_;
  LinkTable& links_;
  std::vector<PeerOut> out_;                                         // by PeerId
  std::unordered_map<uint64_t, Posted> posted_;                      // by cookie
  std::map<std::tuple<uint64_t, uint32_t, Leg>, Outcome> settling_;  // by (client id, slot, leg)
  std::map<std::pair<uint64_t, uint32_t>, Sides> sides_;             // by (client id, slot)
  uint64_t next_stream_id_ = 1;
  uint64_t next_cookie_ = 1;
  std::string offer_refusal_;  // why the last offer could not be made
  std::shared_ptr<SourcePins> pins_ = std::make_shared<SourcePins>();
  std::weak_ptr<void> last_pin_;  // of the offer post() made last
  bool shutting_down_ = false;
  bool draining_ = false;
  LocalDelivery* local_ = nullptr;
  LogLimiter log_client_errors_, log_failed_, log_resent_;
};

}  // namespace framelink
