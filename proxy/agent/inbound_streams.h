// The consumer side of the frame protocol: the streams peers open towards
// local consumers, a credit per free consumer slot granted to them, frames
// arriving into those credits (checked, CRC32C included, then delivered),
// replays dropped by sequence and answered from what SenderMemory keeps of
// their sender stream (never delivered twice), releases ACKed, and pulled
// frames read from their offers (PullReads books the reads).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/agent_state.h"
#include "agent/client_table.h"
#include "agent/local_delivery.h"
#include "agent/peer_messages.h"
#include "agent/pull_reads.h"
#include "agent/sender_memory.h"
#include "common/log_limit.h"
#include "metrics/metrics.h"
#include "transport/transport.h"

namespace framelink {

// What one peer may make this end keep, and for how long (agent clock).
struct InboundLimits {
  // What is remembered of a sender stream that is open on no link and has
  // no frame held goes after this long without use: its sender has given
  // up on every frame it could still replay by then (a few ack timeouts).
  uint64_t forget_idle_ns = 4 * 30'000'000'000ULL;
  // Sender streams remembered per peer (all its instances): room for a
  // full link of open streams twice over, the rest idle.
  size_t max_in_states_per_peer = 2 * peer::kMaxStreamsPerLink;
  // Answers remembered per peer, of each kind (released, refused, to be
  // sent again, answered above the watermark), over all its sender streams:
  // each stream keeps InboundStreams::kMaxRemembered while the peer has few,
  // fewer (never under kMinRemembered) when it has many -- a peer with
  // thousands of streams cannot make this end keep gigabytes.
  size_t remembered_per_peer = size_t{1} << 18;
  // A recalled credit neither given back nor used by then fails its link:
  // the sender would sit on a slot another sender of the stream waits for.
  uint64_t recall_deadline_ns = 30'000'000'000ULL;
  // Pull: reads this end has in flight on one link at most.  The offers
  // past it wait (each holds a credit this end granted, so they are bounded
  // by the credits the link holds): the receiving daemon, not the senders,
  // decides how much comes in at once.
  size_t reads_per_link = 32;
  // Pull: a link with reads in flight none of which completes for this
  // long is stalled -- its transport lost a read and will not say so, the
  // reader's side of the silent data path DataAgent::checkDataPaths catches
  // on the sender's -- and is closed, for its sender to offer again on the next.  link_timeout_ms;
  // 0: never.
  uint64_t read_stall_ns = 10'000'000'000ULL;
};

class InboundStreams {
 public:
  using Limits = InboundLimits;

  // Released sequences remembered per sender stream, and NACKs repeated to a replay (SenderMemory).
  static constexpr size_t kMaxRemembered = SenderMemory::kMaxRemembered;
  static constexpr size_t kMinRemembered = SenderMemory::kMinRemembered;
  // What is sent again on a new link in one round (answerAgain): the ACKs
  // and NACKs of sender streams until this many went, the rest in later
  // rounds, once the link's control records left (a sender stream's go
  // together: at most 2 * kMaxRemembered more).
  static constexpr size_t kAnswersAgainPerRound = 4096;

  // `ack_delay_ns`: the longest a release's ACK and its slot's credit wait
  // to go back to the sender with others (0: at the end of the round); the
  // wait follows `clock`.
  InboundStreams(Metrics& metrics, ClientTable& clients, LinkTable& links, NameTable& names,
                 const AgentClock& clock = steadyClock(), uint64_t ack_delay_ns = 0, Limits limits = {});

  // Frames of producers attached here (their releases and their readers' deaths).
  void setLocalDelivery(LocalDelivery* local);
  // A consumer attached: its slots are granted to every stream of its name.
  void onConsumerAttached(AgentClient& c);
  // A consumer went: its credits are revoked, the frames it held refused.
  void onConsumerGone(AgentClient& c);
  void onRelease(AgentClient& c, const fl_submit_desc& desc);
  // Sends the ACKs and credit grants that are due: per (link, stream), once
  // the releases waiting reach a quarter of that sender's window, once the
  // oldest has waited ack_delay, or at once when the sender is low on
  // credits (and whatever must not wait: answers to replays, link up).
  // Returns the answers it sent again on new links (answerAgain): while
  // some are left, the agent has work.
  size_t flushControl();
  // When the oldest ACK still held back is due (on the agent's clock); 0:
  // none waits.  The agent does not sleep past it.
  uint64_t nextControlDeadlineNs() const;
  // The sender says its credits on the stream are low: what is held back
  // for it goes at once, or else its next release does.
  void onCreditLow(AgentLink& link, const peer::CreditLow& low);

  void onFrameArrived(AgentLink& link, const transport::TransportEvent& event);

  // Pull.  These streams' frames are read by this end from the sender's
  // offers, on links whose transport can read (their credits are exposed to
  // no write), and so are those of a stream while a consumer attached with
  // the pull option is here; the others are pushed.
  void setPullStreams(std::vector<std::string> names) { pull_streams_ = std::move(names); }
  // Whether this end asks for that stream's frames by pull (on a link that can read).
  bool pullsStream(const std::string& stream) const;
  // Whether frames of that stream come by pull on that link.
  bool pulls(const AgentLink& link, const std::string& stream) const;
  // A peer offers a frame into one of the link's pull credits: it is read
  // into that credit's slot, now or once fewer reads are in flight.  A peer
  // offering twice into one credit gets the violation back.
  std::string onOffer(AgentLink& link, const peer::Offer& offer);
  // A read of an offer ended: the frame arrived (and is checked and
  // delivered as any), or it is refused for the sender to offer again.
  void onReadComplete(AgentLink& link, const transport::TransportEvent& event);
  // Whether anything is kept to answer `peer`'s replays (a sender stream of it).
  bool remembers(PeerId peer) const { return senders_.remembers(peer); }
  // Reads posted and not completed, on every link.
  size_t readsInFlight() const { return pull_.inFlight(); }
  // The most reads one link had in flight at once.
  size_t readsPeakPerLink() const { return pull_.peakPerLink(); }
  // Consumers' slots granted to no sender while a peer's rdma window into them may still be written.
  size_t slotsFenced() const { return fences_.size(); }
  // A stream opened on `link`; a peer over its stream bound gets the violation back.
  std::string onStreamOpen(AgentLink& link, const peer::StreamOpen& open);
  void onStreamClose(AgentLink& link, uint64_t stream_id);

  // A new link: what was kept for an earlier instance of its peer goes, and
  // the ACKs of frames released recently are sent again on it.
  void onLinkUp(AgentLink& link);
  // The link's streams close; call retractCreditsOfLink once it is gone.
  void onLinkDown(AgentLink& link);
  void retractCreditsOfLink(uint64_t link_id);
  // The sender gave back credits it did not use (after a recall): their
  // slots are free for any sender of the stream.
  void onCreditsReturned(AgentLink& link, const peer::CreditRevoke& returned);

  // Once in a while (the agent's deadline check): what is remembered of
  // sender streams long unused goes, and a link that kept recalled credits
  // past their deadline is returned with why, for the caller to fail.
  struct FailedLink {
    uint64_t link_id = 0;
    std::string why;
    bool violation = true;  // the peer broke the protocol; otherwise the link stalled
  };
  std::vector<FailedLink> checkDeadlines();

  size_t creditsOutstanding() const { return credits_.size(); }
  size_t framesHeld() const { return senders_.framesHeld(); }
  // Sender streams remembered (open or not).
  size_t senderStreamsKept() const { return senders_.size(); }
  // Answers kept for replays of `peer`'s frames, every kind summed (walks its streams).
  size_t answersKept(PeerId peer) const { return senders_.answersKept(peer); }

  // A reload: the deadlines derived from ack_timeout_ms apply from the next
  // check on (what is remembered or recalled already included).
  void setLimits(const Limits& limits) { limits_ = limits; }
  const Limits& limits() const { return limits_; }
  // Rounds of granting a stream's slots so far (what a peer's messages cost).
  uint64_t grantRoundsForTest() const { return grant_rounds_; }
  // Tests reach the 32-bit generation's wrap through this.
  void setNextGenerationForTest(uint32_t generation) { next_generation_ = generation; }

 private:
  LocalDelivery* local_ = nullptr;
  struct CreditEntry {
    uint64_t client_id = 0;
    uint32_t slot = 0;
    uint64_t link_id = 0;
    uint64_t stream_id = 0;
    uint64_t credit_id = 0;
    bool recalled = false;     // revoked to share the stream's slots again; the sender returns it or uses it
    uint64_t recalled_ns = 0;  // when (agent clock): past recall_deadline_ns the link fails
    bool pull = false;         // exposed to no write: the sender offers into it, this end reads
    bool offered = false;      // pull: an offer into it is being read, or waits to be
    // Pull: its stream left the link while the read of its offer was out.
    // The answer may still land in the slot (tcp and grpc copy it into the
    // read's buffer, rdma reads into the slot's own registration), so the
    // slot stays this credit's until the read ends or the link is gone.
    bool closing = false;
  };
  // By generation, the low 32 bits of the credit id: no two live credits
  // share one (nextGeneration), so that no two links' credits have the same
  // id and rdma, which names a credit by those 32 bits alone, never finds
  // one taken.
  using Credits = std::unordered_map<uint32_t, CreditEntry>;
  // The live credit with that id, or end.
  Credits::iterator findCredit(uint64_t credit_id);
  // The credit ends unused: its slot is free again (if it still holds it)
  // and the credit is forgotten.  `stream`, when given, is set to the slot's
  // stream (to grant again) unless its consumer went.  Returns the credit
  // after it.
  Credits::iterator releaseCredit(Credits::iterator credit, NameKey* stream = nullptr);
  // The credit of `consumer`'s `slot` ended on `l` (retracted, or consumed by a frame) and
  // its transport may still let the peer write there (Transport::windowOpen: rdma, until
  // the window's invalidation executed): the slot is granted on no link until then.
  void fenceSlot(AgentLink& l, uint64_t consumer, uint32_t slot, uint64_t credit_id, NameKey stream);
  // Whether the slot waits on such a window (a fence whose window has shut goes).
  bool fenced(uint64_t consumer, uint32_t slot);
  // Fences whose window shut go; their streams get a grant round.
  void settleFences();
  using ReleasedFrame = SenderMemory::ReleasedFrame;
  using InState = SenderMemory::Stream;

  // A consumer's slots as one region announced on one link (link.proto
  // SlotRegion); its addressing is known once its first credit is exposed.
  struct Region {
    uint32_t id = 0;
    bool announced = false;
    uint64_t base_addr = 0;
    uint32_t rkey = 0;
    uint64_t slot_stride = 0;
    uint64_t slot_bytes = 0;
  };

  using Target = std::pair<uint64_t, uint64_t>;  // (link, the sender's stream id)
  // What waits to go back to one sender's stream: the ACKs of released
  // frames, whose slots are granted again with them.
  struct HeldBack {
    std::vector<ReleasedFrame> acks;
    NameKey stream = kNoName;  // the consumers' stream whose slots were released
    uint64_t since_ns = 0;     // when the oldest of `acks` was released
    bool this_round = false;   // goes at the end of this round (answers to replays, a new link)
    bool sender_low = false;   // the sender is low on credits: the next release goes at once
  };
  // Whether what is held back for that sender stream goes now.
  bool due(const Target& target, const HeldBack& held, uint64_t now_ns) const;
  // One Ack per count of readers and skips (nearly always one: 1 reader, 0 skipped).
  void sendAcks(AgentLink& link, uint64_t stream_id, const std::vector<ReleasedFrame>& released);
  // The frame was released by every reader it went to (`skipped` of its
  // `readers` were skipped, on a drop stream): its ACK is held back for its
  // sender, and the slots of `stream` (kNoName: none freed) are granted
  // again with it.
  void answerRelease(const LocalDelivery::Landed& from, NameKey stream, uint64_t client_id,
                     uint32_t readers = 1, uint32_t skipped = 0);
  // A frame shared with the other readers here ended (LocalDelivery::EndLanded).
  void endShared(const LocalDelivery::Landed& from, uint64_t landing, uint32_t slot, int status,
                 const std::string& why, uint32_t readers, uint32_t released);
  // A frame delivered here that no reader holds any more failed: its sender
  // gets a NACK, and a replay of it the same answer.
  void refuseDelivered(const LocalDelivery::Landed& from, int status, const std::string& why,
                       uint32_t readers, uint32_t released);
  // Nothing waits for a link that is going: its releases' slots are granted again now.
  void dropHeldBack(uint64_t link_id);
  // One round of granting a stream's free consumer slots.
  // Shares are a sending peer's, whatever number of links it has: one with
  // many links (or many instances claiming its id) is one sender.
  struct GrantRound {
    std::vector<Target> targets;      // every usable (link, sender stream) of the stream's name
    std::map<Target, PeerId> sender;  // each target's peer
    size_t senders = 0;               // the peers among the targets
    uint64_t largest_slot = 0;        // of any consumer of the stream: each sender sees it
    std::map<std::pair<PeerId, uint64_t>, size_t> held;  // credits out per (sending peer, consumer)
    size_t& heldBy(const Target& target, uint64_t client_id) { return held[{sender[target], client_id}]; }
    std::map<Target, v1::PeerMessage> grants;
    std::map<Target, v1::PeerMessage> recalls;
    std::set<uint64_t> refusing;  // links that refused a slot as they went down: none of theirs gets more
  };
  // Grants every free slot of the stream's consumers, a fair share to each
  // sender, and recalls credits held beyond a share.
  void grantCredits(NameKey stream);
  // The usable (link, sender stream) pairs with the stream open, from targets_by_name_.
  std::vector<Target> creditTargets(NameKey stream);
  // The stream is open on the link as the sender's `sid` (`open`), or not any more.
  void indexTarget(NameKey stream, uint64_t link_id, uint64_t sid, bool open);
  // Whether a consumer of the stream has a slot free that frames may land
  // in: only then can a grant round give a sender more (CreditLow).
  bool slotFree(NameKey stream);
  // Each sender's window (windows_), the largest slot, and the credits out.
  void reckonShares(NameKey stream, GrantRound& round);
  void grantFreeSlots(GrantRound& round, uint64_t client_id, ClientSession& consumer, size_t share);
  // Grants that slot to the next sender below its share; false when none is.
  // A slot the link refuses to expose is left free for a later round.
  bool grantSlot(GrantRound& round, uint64_t client_id, ClientSession& consumer, size_t share, uint32_t slot);
  // One exposed slot into the grant: a slot credit of its region (announced
  // with the first), or whole when its address does not follow the region.
  void addCredit(v1::CreditGrant* grant, Region* region, const transport::RemoteCredit& remote,
                 const ClientSession& consumer, uint32_t slot);
  void recallBeyondShares(GrantRound& round, uint64_t client_id, size_t share);
  // Frames of the stream still land, or wait to be lent, outside the
  // consumer they land in now (it changed: a subscriber came or went).  Its
  // lander gets no credit until they are through: each of them needs one of
  // its slots free.
  bool landingMoves(NameKey stream) const;
  // Recalls every credit of that consumer: frames of its stream land elsewhere now.
  void recallAll(GrantRound& round, uint64_t client_id);
  // Whether peers' frames of its stream may land in this consumer's slots.
  bool lands(const ClientSession& consumer) const { return local_ == nullptr || local_->lands(consumer); }
  // The region of that consumer's slots on that link, made when first
  // needed; null when it cannot have one (more slots than a region holds,
  // or every region id of the link in use): its credits then go whole.
  Region* regionOf(uint64_t link_id, uint64_t client_id, const ClientSession& consumer);
  // The next credit generation: never 0, never one a live credit has (after
  // 2^32 grants the counter comes round to credits still out).
  uint32_t nextGeneration();
  // The credit a frame arrived in, taken; null when the frame was answered
  // instead (a refusal, an unknown credit, a consumer gone, or a replay).
  // `pulled`: the frame was read from an offer (only a pull credit takes
  // it), not written by the sender (only a pushed one does).
  AgentClient* takeCredit(AgentLink& link, const transport::TransportEvent& event, CreditEntry* credit,
                          bool pulled);
  // A frame landed in its credit, written by the sender or read from its offer.
  void arrive(AgentLink& link, const transport::TransportEvent& event, bool pulled);
  using PullRead = PullReads::Read;
  // The consumer went: the offers into its slots are refused now, before any
  // credit of the consumer that takes its place is granted, so that the
  // sender offers them again ahead of its later frames (reads in flight
  // land unused).
  void dropReadsInto(const ClientSession& consumer);
  // Stream `stream_id` leaves the link: the credits whose offers are being
  // read are kept, closing (onReadComplete or retractCreditsOfLink frees
  // their slots); the offers not read yet are refused.
  void keepReadSlots(AgentLink& link, uint64_t stream_id);
  // Posts the reads waiting on the link while it has room for them.
  void startReads(AgentLink& link);
  // The read of that offer did not land: its credit's slot is free again,
  // and with `nack` the sender is told to offer the frame again.
  void refuseRead(AgentLink& link, const PullRead& read, const std::string& why, bool nack);
  // Whether the frame is a replay of one answered already (no need to read it).
  bool replayOfAnswered(const AgentLink& link, const transport::FrameHeader& header) const;
  // Whether the frame in that credit may be delivered; NACKs it (or drops a
  // duplicate) when not.
  bool acceptFrame(AgentLink& link, ClientSession& consumer, const CreditEntry& credit,
                   const transport::FrameHeader& header);
  // A frame for the subscribers here only (a queue group member on another
  // host has it) that landed in a member is refused: sent again (into a
  // subscriber's slot), or, with no subscriber here, answered
  // FL_ERR_NO_CONSUMER, which its sender takes as delivered to none here.
  bool forSubscribers(AgentLink& link, const ClientSession& consumer, const transport::FrameHeader& header);
  void deliver(AgentLink& link, ClientSession& consumer, const CreditEntry& credit,
               const transport::FrameHeader& header);
  // The stream leaves the link: its held-back answers go this round and its
  // credits are retracted.  Returns its name key, still acquired (kNoName:
  // not open there); what is remembered of the sender stream stays.
  NameKey closeOnLink(AgentLink& link, uint64_t stream_id);
  // Stream `sid` leaves the older link `from`: the sender opened it, or its
  // name (stream `key`) under another id, on the newer link `to`.
  void moveOff(AgentLink& from, uint64_t sid, AgentLink& to, NameKey key);
  // `readers`, `released`: the readers here it reached, and that released it.
  void sendNack(AgentLink& link, uint64_t stream_id, uint64_t sequence, int code, const std::string& message,
                uint32_t readers = 0, uint32_t released = 0);
  // The newest usable link from that instance of a peer (the one its sender
  // uses), or null.
  AgentLink* linkOf(PeerId peer, uint64_t instance);
  // Where an answer about a frame that came on link `came_on` goes: that
  // link while usable, else the newest usable one from the same sender.
  AgentLink* answerLink(uint64_t came_on, PeerId peer, uint64_t instance);
  // The ACKs of recently released frames and the recent refusals of that
  // sender instance go (again) on `to`: the link that carried them may have
  // lost them.  kAnswersAgainPerRound go now, the rest in later rounds
  // (answering_again_).
  void answerAgain(AgentLink& to);
  // Sends again the answers of the sender streams from `*next` (a SenderMemory
  // id) on, until kAnswersAgainPerRound went; `*next` is where the next
  // round goes on.  Returns the answers sent; `*done` when none is left.
  size_t answerSomeAgain(AgentLink& to, uint64_t* next, bool* done);
  // Goes on with the answers left for new links, on each whose control
  // records left; returns the answers sent.
  size_t continueAnswersAgain();
  // Whether the frame is one this daemon answered and still remembers (held,
  // refused, released recently); answers it again.  Assumes nothing from the
  // order of sequences, so it may answer a frame that came in no credit.
  // `refused_note` is the message of the NACK that answers a refused frame.
  bool answerKnown(AgentLink& link, const transport::FrameHeader& header, const char* refused_note);
  // Whether the frame is a replay this daemon already had; answers it.
  bool dropDuplicate(AgentLink& link, const transport::FrameHeader& header);
  // Answers a replay of a frame delivered and released before: its ACK again.
  void ackAgain(AgentLink& link, const transport::FrameHeader& header, const ReleasedFrame& answer);

  Metrics& metrics_;
  ClientTable& clients_;
  LinkTable& links_;
  NameTable& names_;
  const AgentClock& clock_;
  const uint64_t ack_delay_ns_;
  Limits limits_;
  Credits credits_;
  SenderMemory senders_{metrics_, clock_, limits_};
  uint32_t next_generation_ = 1;
  std::map<std::pair<uint64_t, uint64_t>, Region> regions_;  // by (link, consumer)
  size_t grant_cursor_ = 0;
  uint64_t grant_rounds_ = 0;
  std::map<Target, HeldBack> held_back_;
  // Credits each sender may hold (its share of every consumer of the
  // stream), as the last grant reckoned it: a quarter of it is what is worth
  // a control record.
  std::map<Target, size_t> windows_;
  std::set<NameKey> dirty_grants_;  // streams with slots to grant again this round
  struct WindowFence {
    uint64_t link_id = 0;
    uint64_t credit_id = 0;
    NameKey stream = kNoName;
  };
  std::map<std::pair<uint64_t, uint32_t>, WindowFence> fences_;  // by (consumer, slot)
  std::set<NameKey> low_checked_;  // streams a CreditLow this round found no free slot of
  std::set<Target> senders_low_;   // said CreditLow with nothing held back: their next release goes at once
  std::map<uint64_t, uint64_t> answering_again_;  // link -> the sender stream id its answers go on from
  // What a grant round of a stream walks, by its name: the (link, sender
  // stream) pairs with it open, and the consumers attached to it.  A round
  // costs what its name has, not what the daemon has.
  std::map<NameKey, std::set<Target>> targets_by_name_;
  std::map<NameKey, std::set<uint64_t>> consumers_by_name_;
  std::vector<std::string> pull_streams_;
  std::unordered_map<std::string, size_t> pull_consumers_;  // stream -> consumers attached with pull
  PullReads pull_;                                          // the offers taken, read or to be read
  LogLimiter log_pull_;
  LogLimiter log_client_errors_, log_refused_, log_expose_;
  // Streams a peer opens, closes and moves: a peer can send these as fast as
  // it likes, so a burst of 20 a second is said and the rest counted.
  LogLimiter log_streams_{std::chrono::seconds(1), 20};
};

}  // namespace framelink
