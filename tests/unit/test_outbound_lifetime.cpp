// The producer side lets go of a frame only when no transport reads its
// payload any more: an ACK, a NACK or a deadline that comes while a post is
// still outstanding ends the frame when that post completes, so the slot is
// not reused and a producer that left keeps its segment mapped until then.
#include <memory>
#include <utility>
#include <vector>

#include "agent/outbound_streams.h"
#include "agent_fixture.h"
#include "forwarding_transport.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

// The producer leaves as the data agent says it (CmdClientGone).
void producerLeaves(OutboundRig& rig) {
  rig.client->session->gone = true;
  rig.out.maybeForget(*rig.client);
}

}  // namespace

TEST_CASE("outbound streams: an ACK for a frame whose send has not completed ends it at the completion",
          "[agent][outbound][lifetime]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  REQUIRE(rig.producer.session->slots[0].state == SlotState::kPosted);
  const uint64_t client_id = rig.client->session->id;

  // The peer acknowledges before the transport reported the send done (a
  // peer that guesses sequences, or an rdma CQE that comes after the ACK).
  rig.out.onAck(rig.link->peer, rig.stream_id, 1, FL_OK, {});
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.producer.session->in_progress == 1);

  // The producer leaves meanwhile: it stays (and so does its segment) while
  // the transport may still read the slot.
  producerLeaves(rig);
  REQUIRE(rig.clients.find(client_id) != nullptr);

  // Nobody reads the completion ring of a producer that left; the counters
  // still count the frame.
  rig.completeSends(*rig.link, 1);
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
  CHECK(rig.clients.find(client_id) == nullptr);
}

TEST_CASE("outbound streams: a final NACK before the send completed fails the frame at the completion",
          "[agent][outbound][lifetime]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(2, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.out.onAck(rig.link->peer, rig.stream_id, 1, FL_ERR_NO_CONSUMER, "the consumer left");
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.producer.session->slots[2].state != SlotState::kFree);  // the producer cannot reuse it yet
  rig.completeSends(*rig.link, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(rig.producer.session->slots[2].state == SlotState::kFree);
}

TEST_CASE("outbound streams: a frame replayed on a new link waits for the old link's post too",
          "[agent][outbound][lifetime]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  const uint64_t client_id = rig.client->session->id;

  // Link 2 replaces link 1 before link 1 reported the send: the frame goes
  // again on link 2, while link 1's transport may still be reading it.
  TcpPair second = makeTcpPair();
  auto landing2 = exposeLanding(*second.b, 8, 4096);
  AgentLink& l2 = rig.addLink(2, std::move(second.a));
  rig.grantAndPump(l2, 8);
  rig.completeSends(l2, 1);
  rig.out.onAck(l2.peer, rig.stream_id, 1, FL_OK, {});
  producerLeaves(rig);

  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  REQUIRE(rig.clients.find(client_id) != nullptr);

  // Link 1's transport lets go of the payload (it completes, here LINK_LOST
  // on shutdown): only now does the frame end, DELIVERED as its ACK said.
  rig.link->transport->shutdown();
  CHECK(rig.metrics.counters.frames_delivered.load() == 0);
  rig.completeSends(*rig.link, 1);
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
  CHECK(rig.metrics.counters.frames_failed.load() == 0);
  CHECK(rig.clients.find(client_id) == nullptr);
}

TEST_CASE(
    "outbound streams: a deadline that passes while a post is outstanding ends the frame at the completion",
    "[agent][outbound][lifetime][timeout]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(3, 10);
  rig.grantAndPump(*rig.link, 7);
  // The link is replaced: the frame waits for a credit on the new link and
  // its credit deadline passes, with link 1's post still outstanding.
  TcpPair second = makeTcpPair();
  rig.addLink(2, std::move(second.a));
  rig.clock.advanceMs(rig.config.credit_timeout_ms);
  rig.out.checkDeadlines();
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  rig.completeSends(*rig.link, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_TIMEOUT);  // sent once: it may have been delivered
  CHECK(d.slot == 3);
}

TEST_CASE("outbound streams: a replay whose send fails ends TIMEOUT, not FAILED: the first copy may be there",
          "[agent][outbound][timeout]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(0, 10);
  rig.grantAndPump(*rig.link, 7);
  rig.completeSends(*rig.link, 1);  // sent: it may be at the consumer
  TcpPair second = makeTcpPair();
  auto landing2 = exposeLanding(*second.b, 8, 4096);
  AgentLink& l2 = rig.addLink(2, std::move(second.a));  // the frame goes again on link 2
  rig.grantAndPump(l2, 8);
  // The replay's send fails for the frame (rdma: the remote key was refused).
  transport::TransportEvent failed = waitEvent(*l2.transport, transport::TransportEvent::Kind::kSendComplete);
  failed.status = FL_ERR_TRANSPORT;
  failed.message = "remote access error";
  rig.out.onSendComplete(failed);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_TIMEOUT);
}

TEST_CASE(
    "outbound streams: when the link that replaced another goes down, the route moves back to the older one, "
    "still up",
    "[agent][outbound][lifetime]") {
  OutboundRig rig;
  // Link 2 replaces link 1, which stays up (another daemon of the peer's
  // id, or the other direction of a pair of links).
  TcpPair second = makeTcpPair();
  auto landing2 = exposeLanding(*second.b, 8, 4096);
  AgentLink& l2 = rig.addLink(2, std::move(second.a));
  rig.capture.next([](auto& m) { return m.has_stream_open(); });  // on link 2
  rig.submit(0, 10);
  rig.grantAndPump(l2, 8);
  rig.completeSends(l2, 1);  // sent, not acknowledged
  rig.out.onLinkDown(l2, "the newer link went down");

  CHECK(rig.peers[rig.link->peer].link_id == 1);
  INFO("the stream is announced again on link 1, and its frame goes there");
  CHECK(rig.capture.next([](auto& m) { return m.has_stream_open(); }).stream_open().stream_id() ==
        rig.stream_id);
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.grantAndPump(*rig.link, 7);
  waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived);
  rig.completeSends(*rig.link, 1);
  rig.out.onAck(rig.link->peer, rig.stream_id, 1, FL_OK, {});
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
}

namespace {

// Keeps a copy of each exposed source's keepalive, as a transport does
// while it writes an answer from the source (tcp's queue, a gRPC slice) or
// while a window over it is not yet invalidated (rdma).
class AnsweringTransport : public testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Result<transport::RemoteSource> exposeSource(transport::LocalSource source) override {
    answering.push_back(source.keepalive);
    return ForwardingTransport::exposeSource(std::move(source));
  }
  std::vector<std::shared_ptr<void>> answering;
};

// An offer of slot 0 into pull credit 9 on a link over `t`; the link.
AgentLink& offerOnLink(OutboundRig& rig, std::shared_ptr<AnsweringTransport> t) {
  AgentLink& l = rig.addLink(2, std::move(t));
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  grant.pull = true;
  grant.credits.push_back(transport::RemoteCredit{9, 4096, 0, 0});
  REQUIRE(rig.out.onCreditGrant(l, grant).empty());
  rig.submit(0, 1000);
  REQUIRE(rig.out.pumpAll() > 0);
  REQUIRE(rig.producer.session->slots[0].state == SlotState::kSent);
  return l;
}

}  // namespace

TEST_CASE(
    "outbound streams: an offer whose ACK deadline passes while its answer is written gives its slot back "
    "only once the answer is out",
    "[agent][outbound][lifetime][pull]") {
  OutboundRig rig;
  auto t = std::make_shared<AnsweringTransport>(std::move(rig.pair.b));
  offerOnLink(rig, t);
  REQUIRE(t->answering.size() == 1);

  rig.clock.advanceMs(rig.config.ack_timeout_ms + 1);
  rig.out.checkDeadlines();
  fl_completion_desc d{};
  // The source is retracted, but the answer still reads the slot.
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.producer.session->slots[0].state == SlotState::kSettling);
  CHECK(rig.out.settleSources() == 0);
  CHECK_FALSE(rig.completed(&d));

  t->answering.clear();  // the answer is out
  CHECK(rig.out.settleSources() == 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_TIMEOUT);
  CHECK(rig.producer.session->slots[0].state == SlotState::kFree);
}

TEST_CASE("outbound streams: an offer answered and ACKed ends at the ACK, its source let go at once",
          "[agent][outbound][lifetime][pull]") {
  OutboundRig rig;
  auto t = std::make_shared<AnsweringTransport>(std::move(rig.pair.b));
  AgentLink& l = offerOnLink(rig, t);
  t->answering.clear();  // answered: only the transport's sources table holds it
  rig.out.onAck(l.peer, rig.stream_id, 1, FL_OK, {}, 1, 1, l.id);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
  CHECK(rig.out.settleSources() == 0);  // nothing was waiting
}
