// How a producer's frame ends on its daemon (outbound_completions.cpp), on
// OutboundRig (OutboundStreams on its own, on simulated time): the ACK and
// the counts it carries, a final refusal and one the frame is sent again
// for, the transport's send completion, MAYBE_REDELIVERED when a copy went
// to another instance of the receiving daemon, and a frame whose outcome is
// known while posts of it are still out.  The deadlines: test_outbound_streams.cpp;
// the producer that leaves meanwhile: test_outbound_lifetime.cpp.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "agent/outbound_streams.h"
#include "agent_fixture.h"
#include "captured_log.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

// The peer's answer for `sequence` of the rig's stream (a NACK when `status`
// is not FL_OK), on the link `link_id` (0: not said).
void peerAnswers(OutboundRig& rig, uint64_t sequence, int status, const std::string& why = {},
                 uint32_t readers = 1, uint32_t released = 1, uint64_t link_id = 0) {
  rig.out.onAck(rig.link->peer, rig.stream_id, sequence, status, why, readers, released, link_id);
}

// The producer's slot `n` as its daemon keeps it.
const SlotEntry& entryOf(const OutboundRig& rig, uint32_t n) { return rig.producer.session->slots[n]; }

// Link `id` to the receiving daemon's instance `instance` replaces the
// current one, and its end grants credit `credit`: the frame the old link
// carried unacknowledged goes into it.  Returns the new link and the end
// played as the peer.
std::pair<AgentLink*, std::unique_ptr<transport::Transport>> replayOn(OutboundRig& rig, uint64_t id,
                                                                      uint64_t instance, uint64_t credit) {
  TcpPair pair = makeTcpPair();
  exposeLanding(*pair.b, credit, 4096);
  AgentLink& l = rig.addLink(id, std::move(pair.a));
  l.peer_instance = instance;  // read when the frame is posted
  rig.grantAndPump(l, credit);
  return {&l, std::move(pair.b)};
}

}  // namespace

TEST_CASE("outbound completions: an ACK completes the frame DELIVERED with the counts its receiver said",
          "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(1, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.completeSends(*rig.link, 1);
  REQUIRE(entryOf(rig, 1).state == SlotState::kSent);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));  // sent is not delivered

  // Three readers on the receiving host got it; two of them released it.
  peerAnswers(rig, 1, FL_OK, {}, 3, 2);
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 1);
  CHECK(d.status == FL_OK);
  CHECK(d.sequence == 1);
  CHECK(d.length == 10);
  CHECK(d.frame_id == 101);
  CHECK(d.readers == 3);
  CHECK(d.released == 2);
  CHECK(entryOf(rig, 1).state == SlotState::kFree);
  CHECK(rig.producer.session->in_progress == 0);
  CHECK(rig.producer.session->frames == 1);
  CHECK(rig.producer.session->bytes == 10);
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
  CHECK(rig.metrics.counters.bytes_sent.load() == 10);
  CHECK(rig.metrics.counters.frames_failed.load() == 0);

  // The same ACK again (repeated by the receiver) is about nothing outstanding.
  peerAnswers(rig, 1, FL_OK, {}, 3, 2);
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
}

TEST_CASE(
    "outbound completions: a final refusal fails the frame with the peer's code; the log says its reason",
    "[agent][outbound][outbound_completions]") {
  test::CapturedLog log;
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(2, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.completeSends(*rig.link, 1);
  // The frame reached one reader, which went away without releasing it.
  peerAnswers(rig, 1, FL_ERR_NO_CONSUMER, "peer remote refused it: the consumer left", 1, 0);

  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 2);
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(d.frame_id == 102);
  CHECK(d.readers == 1);
  CHECK(d.released == 0);
  CHECK(rig.producer.session->errors == 1);
  CHECK(rig.producer.session->frames == 0);
  CHECK(rig.metrics.counters.frames_failed.load() == 1);
  CHECK(rig.metrics.counters.frames_delivered.load() == 0);
  // The completion has a status only: the reason is in the daemon's log.
  CHECK(log.has("seq 1 frame 102] FAILED FL_ERR_NO_CONSUMER: peer remote refused it: the consumer left"));

  // Not sent again: a fresh credit finds nothing waiting.
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  grant.credits.push_back(transport::RemoteCredit{8, 4096, 0, 0});
  REQUIRE(rig.out.onCreditGrant(*rig.link, grant).empty());
  CHECK(rig.out.pumpAll() == 0);
  CHECK(rig.metrics.counters.frames_resent_credit.load() == 0);
  CHECK(rig.metrics.counters.frames_resent_crc.load() == 0);
}

TEST_CASE(
    "outbound completions: a frame that landed in a withdrawn credit goes again before newer frames, three "
    "times at most",
    "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  uint64_t credit = 1;
  exposeLanding(*rig.pair.b, credit, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, credit);
  rig.submit(1, 20);  // sequence 2, waiting for a credit
  fl_completion_desc d{};
  for (int post = 1; post <= 4; ++post) {
    INFO("post " << post << " of sequence 1");
    const transport::TransportEvent arrived =
        waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.sequence == 1);  // the refused frame, not the newer one
    CHECK(arrived.header.frame_id == 100);
    rig.completeSends(*rig.link, 1);
    peerAnswers(rig, 1, FL_ERR_UNKNOWN_CREDIT, "peer remote refused it: credit withdrawn", 0, 0);
    if (post == 4) break;
    CHECK_FALSE(rig.completed(&d));
    CHECK(rig.metrics.counters.frames_resent_credit.load() == static_cast<uint64_t>(post));
    CHECK(entryOf(rig, 0).state == SlotState::kPending);
    exposeLanding(*rig.pair.b, ++credit, 4096);
    rig.grantAndPump(*rig.link, credit);  // one credit: the resent frame takes it
  }
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 0);
  CHECK(d.status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(d.sequence == 1);
  CHECK(rig.metrics.counters.frames_resent_credit.load() == 3);
  CHECK(rig.metrics.counters.frames_resent_crc.load() == 0);

  // The frame behind it goes next.
  exposeLanding(*rig.pair.b, ++credit, 4096);
  rig.grantAndPump(*rig.link, credit);
  CHECK(waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived).header.sequence == 2);
}

TEST_CASE("outbound completions: a refusal from the link the frame was moved off is not acted on",
          "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.completeSends(*rig.link, 1);
  auto [l2, peer_end] = replayOn(rig, 2, 1, 8);
  REQUIRE(entryOf(rig, 0).link_id == 2);

  // Link 1's receiver refuses its copy (its credit went with that link):
  // the copy on link 2 is answered there.
  peerAnswers(rig, 1, FL_ERR_UNKNOWN_CREDIT, "peer remote refused it: credit withdrawn", 0, 0, rig.link->id);
  CHECK(rig.metrics.counters.frames_resent_credit.load() == 0);
  CHECK(entryOf(rig, 0).state == SlotState::kPosted);
  CHECK(rig.out.traffic(rig.link->peer).in_flight == 1);
  CHECK(rig.out.traffic(rig.link->peer).pending == 0);

  // The same refusal on link 2 is about the copy there: it goes again.
  peerAnswers(rig, 1, FL_ERR_UNKNOWN_CREDIT, "peer remote refused it: credit withdrawn", 0, 0, l2->id);
  CHECK(rig.metrics.counters.frames_resent_credit.load() == 1);
  CHECK(entryOf(rig, 0).state == SlotState::kPending);
  exposeLanding(*peer_end, 9, 4096);
  rig.grantAndPump(*l2, 9);
  rig.completeSends(*l2, 2);
  peerAnswers(rig, 1, FL_OK, {}, 1, 1, l2->id);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
}

TEST_CASE("outbound completions: the send completion of a frame's only post",
          "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  transport::TransportEvent done =
      waitEvent(*rig.link->transport, transport::TransportEvent::Kind::kSendComplete);
  fl_completion_desc d{};

  SECTION("a failure of the frame's only copy fails it with the transport's status: nothing was delivered") {
    done.status = FL_ERR_TRANSPORT;
    done.message = "remote access error";
    rig.out.onSendComplete(done);
    REQUIRE(rig.completed(&d));
    CHECK(d.status == FL_ERR_TRANSPORT);
    CHECK(entryOf(rig, 0).state == SlotState::kFree);
    CHECK(rig.out.traffic(rig.link->peer).in_flight == 0);
  }
  SECTION("LINK_LOST: the link broke, not the frame; it stays unacknowledged and goes on the next link") {
    done.status = FL_ERR_LINK_LOST;
    done.message = "link closed";
    rig.out.onSendComplete(done);
    CHECK_FALSE(rig.completed(&d));
    CHECK(entryOf(rig, 0).state == SlotState::kPosted);
    CHECK(rig.out.traffic(rig.link->peer).in_flight == 1);
    auto [l2, peer_end] = replayOn(rig, 2, 1, 8);
    CHECK(waitEvent(*peer_end, transport::TransportEvent::Kind::kFrameArrived).header.sequence == 1);
    rig.completeSends(*l2, 1);
    peerAnswers(rig, 1, FL_OK, {}, 1, 1, l2->id);
    REQUIRE(rig.completed(&d));
    CHECK(d.status == FL_OK);
  }
}

TEST_CASE("outbound completions: a failed copy the frame no longer waits for does not end it",
          "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  auto landing2 = exposeLanding(*rig.pair.b, 8, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  peerAnswers(rig, 1, FL_ERR_CRC_MISMATCH, "peer remote refused it: CRC32C mismatch", 0, 0);
  rig.grantAndPump(*rig.link, 8);  // the second copy
  REQUIRE(entryOf(rig, 0).state == SlotState::kPosted);

  // The first copy's send fails late: the frame waits for its second.
  transport::TransportEvent first =
      waitEvent(*rig.link->transport, transport::TransportEvent::Kind::kSendComplete);
  first.status = FL_ERR_TRANSPORT;
  first.message = "remote access error";
  rig.out.onSendComplete(first);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  CHECK(entryOf(rig, 0).state == SlotState::kPosted);
  CHECK(rig.out.traffic(rig.link->peer).in_flight == 1);

  rig.completeSends(*rig.link, 1);
  CHECK(entryOf(rig, 0).state == SlotState::kSent);
  peerAnswers(rig, 1, FL_OK);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
  CHECK(rig.metrics.counters.frames_resent_crc.load() == 1);
}

TEST_CASE("outbound completions: a frame ACKed with two posts out keeps its slot until both complete",
          "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  auto landing2 = exposeLanding(*rig.pair.b, 8, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  peerAnswers(rig, 1, FL_ERR_CRC_MISMATCH, "peer remote refused it: CRC32C mismatch", 0, 0);
  rig.grantAndPump(*rig.link, 8);
  // The second copy is delivered before the transport reported either send.
  peerAnswers(rig, 1, FL_OK, {}, 2, 1);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  CHECK(entryOf(rig, 0).state == SlotState::kSettling);
  CHECK(rig.producer.session->in_progress == 1);

  // The producer cannot have the slot back meanwhile: a submit into it is
  // refused, and the frame settling there is left as it was.
  rig.submit(0, 10);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_SLOT_NOT_OWNED);
  CHECK(entryOf(rig, 0).state == SlotState::kSettling);
  CHECK(entryOf(rig, 0).sequence == 1);

  rig.completeSends(*rig.link, 1);  // the first copy: the second may still be read
  CHECK_FALSE(rig.completed(&d));
  CHECK(entryOf(rig, 0).state == SlotState::kSettling);

  rig.completeSends(*rig.link, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 0);
  CHECK(d.status == FL_OK);  // as the ACK said, with its counts
  CHECK(d.sequence == 1);
  CHECK(d.readers == 2);
  CHECK(d.released == 1);
  CHECK(entryOf(rig, 0).state == SlotState::kFree);
  CHECK(rig.producer.session->in_progress == 0);
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
}

TEST_CASE(
    "outbound completions: a copy posted to another instance of the receiving daemon carries "
    "MAYBE_REDELIVERED",
    "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  CHECK(waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived).header.maybe_redelivered == 0);
  rig.completeSends(*rig.link, 1);

  // A new link to the same daemon (instance 1): it drops a copy it had already.
  auto [l2, end2] = replayOn(rig, 2, 1, 8);
  CHECK(waitEvent(*end2, transport::TransportEvent::Kind::kFrameArrived).header.maybe_redelivered == 0);
  CHECK(rig.metrics.counters.frames_maybe_redelivered.load() == 0);
  rig.completeSends(*l2, 1);

  // The receiving daemon restarted (instance 2): it cannot know whether the
  // one before delivered the frame, and tells its consumer so.
  auto [l3, end3] = replayOn(rig, 3, 2, 9);
  CHECK(waitEvent(*end3, transport::TransportEvent::Kind::kFrameArrived).header.maybe_redelivered == 1);
  CHECK(rig.metrics.counters.frames_maybe_redelivered.load() == 1);
  rig.completeSends(*l3, 1);

  // Yet another instance: flagged, and counted once for the frame.
  auto [l4, end4] = replayOn(rig, 4, 3, 10);
  CHECK(waitEvent(*end4, transport::TransportEvent::Kind::kFrameArrived).header.maybe_redelivered == 1);
  CHECK(rig.metrics.counters.frames_maybe_redelivered.load() == 1);
  rig.completeSends(*l4, 1);
  peerAnswers(rig, 1, FL_OK, {}, 1, 1, l4->id);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
}

TEST_CASE(
    "outbound completions: while the daemon stops, a frame ends at its answer, posts out or not, and is not "
    "sent again",
    "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  auto landing2 = exposeLanding(*rig.pair.b, 8, 4096);
  rig.submit(0, 10);
  rig.submit(1, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.grantAndPump(*rig.link, 8);
  REQUIRE(entryOf(rig, 1).state == SlotState::kPosted);
  rig.out.startShutdown();

  // Neither send has completed: a daemon that stops does not wait for them.
  peerAnswers(rig, 1, FL_ERR_CRC_MISMATCH, "peer remote refused it: CRC32C mismatch", 0, 0);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 0);
  CHECK(d.status == FL_ERR_CRC_MISMATCH);
  CHECK(rig.metrics.counters.frames_resent_crc.load() == 0);

  rig.out.failAllInProgress(*rig.producer.session, FL_ERR_SHUTDOWN, "the daemon is stopping");
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 1);
  CHECK(d.status == FL_ERR_SHUTDOWN);
  CHECK(rig.producer.session->in_progress == 0);

  // Their sends' completions, after, are about frames that ended.
  rig.completeSends(*rig.link, 2);
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.metrics.counters.frames_failed.load() == 2);
}

TEST_CASE(
    "outbound completions: a frame waiting for its replay ends at a final refusal repeated on the new link, "
    "not at one it is sent again for",
    "[agent][outbound][outbound_completions]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.completeSends(*rig.link, 1);
  TcpPair second = makeTcpPair();
  AgentLink& l2 = rig.addLink(2, std::move(second.a));  // no credit there yet
  REQUIRE(entryOf(rig, 0).state == SlotState::kPending);

  // A refusal to send it again: it is sent again anyway, once a credit comes.
  peerAnswers(rig, 1, FL_ERR_CRC_MISMATCH, "peer remote refused it: CRC32C mismatch", 0, 0, l2.id);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  CHECK(entryOf(rig, 0).state == SlotState::kPending);
  CHECK(rig.out.traffic(l2.peer).pending == 1);

  // The receiver says again that the consumer holding it went away: that
  // ends it, without a credit.
  peerAnswers(rig, 1, FL_ERR_NO_CONSUMER, "peer remote refused it: the consumer left", 1, 0, l2.id);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(d.readers == 1);
  CHECK(d.released == 0);
  CHECK(rig.metrics.counters.acks_for_replays.load() == 1);
  CHECK(rig.out.traffic(l2.peer).pending == 0);
}
