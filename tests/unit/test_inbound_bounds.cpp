// What the consumer side keeps and hands out per peer, and its bounds: credit
// generations that never collide with a live credit (also past 2^32 grants,
// also across links), a slot a link refuses to expose skipped without ending
// the grant round, what is remembered of sender streams aged out and capped,
// one in-stream per (link, name), and recalled credits that must come back.
#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "forwarding_transport.h"
#include "inbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

// Forwards to a tcp transport; refuses to expose what the test says, and,
// like rdma (whose peer names a credit by the low 32 bits of its id, the
// immediate data), a credit whose low 32 bits a live one has.
class PickyTransport final : public framelink::testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  const uint8_t* refuse_buffer = nullptr;  // exposing this slot fails
  std::vector<uint64_t> retracted;         // credit ids, in order

  const char* name() const noexcept override { return "picky"; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit credit) override {
    if (credit.buffer == refuse_buffer) return makeError(FL_EINVAL, "the test refuses this slot");
    const auto immediate = static_cast<uint32_t>(credit.credit_id);
    if (live_.count(immediate) != 0) return makeError(FL_EINVAL, "same low 32 bits as a live credit");
    live_.insert(immediate);
    return ForwardingTransport::exposeCredit(std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override {
    retracted.push_back(credit_id);
    live_.erase(static_cast<uint32_t>(credit_id));
    ForwardingTransport::retractCredit(credit_id);
  }

 private:
  std::set<uint32_t> live_;
};

// A PickyTransport around a link's tcp transport, kept in `*out`.
InboundRig::WrapTransport pickyWrap(PickyTransport** out) {
  return [out](std::unique_ptr<transport::Transport> inner) -> std::unique_ptr<transport::Transport> {
    auto wrapped = std::make_unique<PickyTransport>(std::move(inner));
    *out = wrapped.get();
    return wrapped;
  };
}

}  // namespace

TEST_CASE("inbound bounds: after the generation wraps, credits on two links never share an id",
          "[agent][inbound][credits]") {
  // Region ids are per link: consumer "a" is region 1 on link 1, consumer "b"
  // region 1 on link 2.  With the generation set back to where "a"'s credits
  // began, "b"'s slot credits would have the same full ids.
  InboundRig rig;
  rig.consumer(1, "a");
  rig.consumer(2, "b");
  AgentLink& l1 = rig.linkUp(1, "p1");
  REQUIRE(rig.open(l1, 42, "a").empty());
  CHECK(rig.inbound.creditsOutstanding() == 4);
  rig.inbound.setNextGenerationForTest(1);
  AgentLink& l2 = rig.linkUp(2, "p2");
  REQUIRE(rig.open(l2, 43, "b").empty());
  CHECK(rig.inbound.creditsOutstanding() == 8);
  CHECK(rig.credited(0) == 4);
  CHECK(rig.credited(1) == 4);
  rig.revoked(l2);

  // "a" leaves: only its own credits on link 1 are withdrawn.
  rig.consumers[0].session->gone = true;
  rig.inbound.onConsumerGone(*rig.clients.find(1));
  CHECK(rig.revoked(l2).empty());
  const std::vector<uint64_t> withdrawn = rig.revoked(l1);
  CHECK(withdrawn.size() == 4);
  rig.inbound.onCreditsReturned(l1, peer::CreditRevoke{42, withdrawn, true, {}});
  CHECK(rig.inbound.creditsOutstanding() == 4);
  CHECK(rig.credited(1) == 4);
  // And "b"'s credits still take frames on link 2.
  REQUIRE(rig.land(l2, 43, 1));
  CHECK(rig.inbound.framesHeld() == 1);
}

TEST_CASE("inbound bounds: after the generation wraps, a live credit's generation is skipped on rdma",
          "[agent][inbound][credits]") {
  // rdma names a credit by its low 32 bits: a generation still live on the
  // link would be refused, and every slot after it went ungranted.
  InboundRig rig;
  rig.consumer(1, "a");
  rig.consumer(2, "b");
  PickyTransport* picky = nullptr;
  AgentLink& l = rig.linkUp(1, "p1", 9, pickyWrap(&picky));
  REQUIRE(rig.open(l, 42, "a").empty());
  rig.inbound.setNextGenerationForTest(2);
  REQUIRE(rig.open(l, 43, "b").empty());
  CHECK(rig.credited(1) == 4);
  CHECK(rig.inbound.creditsOutstanding() == 8);

  SECTION("the generation wraps past 2^32 - 1 to 1, skipping 0 and the live ones") {
    rig.inbound.onConsumerGone(*rig.clients.find(2));
    rig.inbound.setNextGenerationForTest(0xFFFFFFFFu);
    rig.consumer(3, "b");
    CHECK(rig.credited(2) == 4);
    for (const SlotEntry& e : rig.consumers[2].session->slots) {
      const auto generation = static_cast<uint32_t>(e.consumer.credit_id);
      CHECK(generation != 0);
      CHECK((generation == 0xFFFFFFFFu || generation > 4));  // 1..4 are "a"'s, still live
    }
  }
}

TEST_CASE("inbound bounds: a slot the link refuses to expose is skipped, the round goes on",
          "[agent][inbound][credits]") {
  InboundRig rig;
  rig.consumer(1, "a");
  rig.consumer(2, "a");
  PickyTransport* picky = nullptr;
  AgentLink& l = rig.linkUp(1, "p1", 9, pickyWrap(&picky));
  picky->refuse_buffer = rig.consumers[0].session->segments->slot(0);
  REQUIRE(rig.open(l, 42, "a").empty());
  CHECK(rig.credited(0) == 3);  // all but the refused slot
  CHECK(rig.credited(1) == 4);  // the next consumer is not starved by it
  // A later round grants it once the link takes it.
  picky->refuse_buffer = nullptr;
  rig.inbound.onCreditLow(l, peer::CreditLow{42});
  rig.inbound.flushControl();
  CHECK(rig.credited(0) == 4);
}

TEST_CASE("inbound bounds: one in-stream per (link, name)", "[agent][inbound][fan-in]") {
  InboundRig rig;
  rig.consumer(1, "cam");
  AgentLink& l = rig.linkUp(1, "p1");
  REQUIRE(rig.open(l, 42, "cam").empty());
  CHECK(rig.inbound.creditsOutstanding() == 4);

  SECTION("the same name under another stream id is a violation; the first stream keeps its credits") {
    const std::string why = rig.open(l, 43, "cam");
    CHECK(why.find("cam") != std::string::npos);
    CHECK(l.in_streams.count(43) == 0);
    CHECK(rig.inbound.creditsOutstanding() == 4);
    for (const SlotEntry& e : rig.consumers[0].session->slots) CHECK(e.stream_id == 42);
  }
  SECTION("a stream id re-opened under another name is a violation; the same name again is not") {
    CHECK_FALSE(rig.open(l, 42, "dog").empty());
    CHECK(l.in_streams.at(42).name == "cam");
    CHECK(rig.inbound.creditsOutstanding() == 4);
    CHECK(rig.open(l, 42, "cam").empty());
    CHECK(rig.inbound.creditsOutstanding() == 4);
  }
  SECTION("the name under another stream id on a newer link of the same sender takes it off the older link") {
    // The sender forgot stream 42 while this end had not noticed the older
    // link die, and opened the name anew on its newer link.
    AgentLink& l2 = rig.linkUp(2, "p1");
    REQUIRE(rig.open(l2, 50, "cam").empty());
    CHECK(l.in_streams.empty());
    for (const SlotEntry& e : rig.consumers[0].session->slots) {
      CHECK(e.link_id == 2);
      CHECK(e.stream_id == 50);
    }
  }
  SECTION("a late StreamOpen on the older link, of the name under an id the sender closed, is stale") {
    // The sender opened 41 on the older link before it replaced it, closed
    // it, and opened the name as 50 on the newer link; the older link's
    // StreamOpen for 41 comes last.  Found by the simulator's two-receiver
    // world (seed 246953, framelink_sim --receivers 2).
    AgentLink& l2 = rig.linkUp(2, "p1");
    REQUIRE(rig.open(l2, 50, "cam").empty());
    REQUIRE(l.in_streams.empty());
    CHECK(rig.open(l, 41, "cam").empty());
    CHECK(l.in_streams.empty());
    CHECK(l2.in_streams.count(50) == 1);
    for (const SlotEntry& e : rig.consumers[0].session->slots) {
      CHECK(e.link_id == 2);
      CHECK(e.stream_id == 50);
    }
  }
}

TEST_CASE("inbound bounds: a peer's links hold one share of a consumer together, however many they are",
          "[agent][inbound][fan-in]") {
  InboundRig rig;
  rig.consumer(1, "cam");
  // Three links of one peer id (instances of its choosing), each opening the name.
  std::vector<AgentLink*> many;
  for (uint64_t i = 1; i <= 3; ++i) {
    many.push_back(&rig.linkUp(i, "many", 100 + i));
    REQUIRE(rig.open(*many.back(), 1, "cam").empty());
  }
  CHECK(rig.inbound.creditsOutstanding() == 4);
  AgentLink& honest = rig.linkUp(9, "honest");
  REQUIRE(rig.open(honest, 7, "cam").empty());
  // Two senders: half of the slots are asked back from the three links together.
  std::vector<uint64_t> recalled;
  for (AgentLink* l : many) {
    for (uint64_t id : rig.revoked(*l)) {
      rig.inbound.onCreditsReturned(*l, peer::CreditRevoke{1, {id}, true, {}});
      recalled.push_back(id);
    }
  }
  CHECK(recalled.size() == 2);
  size_t honest_holds = 0;
  for (const SlotEntry& e : rig.consumers[0].session->slots) honest_holds += e.link_id == 9 ? 1 : 0;
  CHECK(honest_holds == 2);
}

TEST_CASE("inbound bounds: a recalled credit neither returned nor used by its deadline fails the link",
          "[agent][inbound][fan-in]") {
  InboundStreams::Limits limits;
  limits.recall_deadline_ns = 10'000'000'000ULL;
  InboundRig rig(limits);
  rig.consumer(1, "cam");
  AgentLink& hog = rig.linkUp(1, "p1");
  REQUIRE(rig.open(hog, 42, "cam").empty());
  rig.revoked(hog);
  // A second sender: half of the slots are asked back from the first.
  AgentLink& other = rig.linkUp(2, "p2");
  REQUIRE(rig.open(other, 7, "cam").empty());
  const std::vector<uint64_t> recalled = rig.revoked(hog);
  REQUIRE(recalled.size() == 2);
  CHECK(rig.inbound.checkDeadlines().empty());

  SECTION("kept past the deadline: the link fails, saying why") {
    rig.clock.advanceNs(9'000'000'000ULL);
    CHECK(rig.inbound.checkDeadlines().empty());
    rig.clock.advanceNs(2'000'000'000ULL);
    const auto failed = rig.inbound.checkDeadlines();
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].link_id == 1);
    CHECK(failed[0].violation);
    CHECK(failed[0].why.find("recall") != std::string::npos);
  }
  SECTION("returned or used in time: nothing fails") {
    rig.inbound.onCreditsReturned(hog, peer::CreditRevoke{42, {recalled[0]}, true, {}});
    transport::TransportEvent ev;
    ev.kind = transport::TransportEvent::Kind::kFrameArrived;
    ev.header.stream_id = 42;
    ev.header.sequence = 1;
    ev.header.credit_id = recalled[1];
    ev.header.length = 10;
    rig.inbound.onFrameArrived(hog, ev);
    CHECK(rig.inbound.framesHeld() == 1);
    rig.clock.advanceNs(11'000'000'000ULL);
    CHECK(rig.inbound.checkDeadlines().empty());
  }
}

TEST_CASE("inbound bounds: a sender stream forgotten while no link was up is forgotten here too",
          "[agent][inbound][memory]") {
  InboundStreams::Limits limits;
  limits.forget_idle_ns = 100'000'000'000ULL;
  InboundRig rig(limits);
  rig.consumer(1, "cam");
  AgentLink& l = rig.linkUp(1, "p1");
  REQUIRE(rig.open(l, 42, "cam").empty());
  REQUIRE(rig.land(l, 42, 1));
  REQUIRE(rig.land(l, 42, 2));
  fl_completion_desc d{};
  REQUIRE(fl_ring_pop(rig.consumers[0].completion(), rig.consumers[0].cap(), sizeof d, &d) == FL_RING_OK);
  rig.inbound.onRelease(*rig.clients.find(1), fl_submit_desc{d.slot, 0, 0});
  // The link breaks; the sender forgets the stream and never says so.
  rig.linkDown(1);
  CHECK(rig.inbound.senderStreamsKept() == 1);
  rig.clock.advanceNs(99'000'000'000ULL);
  rig.inbound.checkDeadlines();
  CHECK(rig.inbound.senderStreamsKept() == 1);

  SECTION("with nothing held, it goes once unused for the bound") {
    REQUIRE(fl_ring_pop(rig.consumers[0].completion(), rig.consumers[0].cap(), sizeof d, &d) == FL_RING_OK);
    rig.inbound.onRelease(*rig.clients.find(1), fl_submit_desc{d.slot, 0, 0});
    rig.clock.advanceNs(99'000'000'000ULL);
    rig.inbound.checkDeadlines();
    CHECK(rig.inbound.senderStreamsKept() == 1);  // the release used it
    rig.clock.advanceNs(2'000'000'000ULL);
    rig.inbound.checkDeadlines();
    CHECK(rig.inbound.senderStreamsKept() == 0);
    CHECK(rig.metrics.counters.sender_streams_forgotten.load() == 1);
  }
  SECTION("while a consumer holds one of its frames, it stays") {
    rig.clock.advanceNs(200'000'000'000ULL);
    rig.inbound.checkDeadlines();
    CHECK(rig.inbound.senderStreamsKept() == 1);
  }
}

TEST_CASE("inbound bounds: sender streams remembered per peer are capped", "[agent][inbound][memory]") {
  InboundStreams::Limits limits;
  limits.max_in_states_per_peer = 3;
  InboundRig rig(limits);
  AgentLink& l = rig.linkUp(1, "p1");
  for (uint64_t sid = 1; sid <= 3; ++sid) REQUIRE(rig.open(l, sid, "s" + std::to_string(sid)).empty());
  CHECK(rig.inbound.senderStreamsKept() == 3);
  // All three are open: none may go, the fourth is refused.
  CHECK_FALSE(rig.open(l, 4, "s4").empty());
  CHECK(l.in_streams.count(4) == 0);
  // Another peer has its own.
  AgentLink& other = rig.linkUp(2, "p2");
  CHECK(rig.open(other, 4, "s4").empty());

  // Once they are open on no link, the oldest goes to make room.
  rig.linkDown(1);
  AgentLink& l3 = rig.linkUp(3, "p1");
  rig.clock.advanceNs(1'000'000'000ULL);
  CHECK(rig.open(l3, 5, "s5").empty());
  CHECK(rig.inbound.senderStreamsKept() == 4);  // three of p1, one of p2
  CHECK(rig.metrics.counters.sender_streams_forgotten.load() == 1);
}

TEST_CASE("inbound bounds: what is kept to answer a peer's replays is bounded per peer, not per stream",
          "[agent][inbound][memory]") {
  InboundStreams::Limits limits;
  limits.remembered_per_peer = 1024;
  InboundRig rig(limits);
  // Frames naming credits this end never granted: each is refused "send it again" and remembered
  // (a copy sent again is no duplicate) -- with no credit spent, as often as the peer likes.
  auto flood = [&](AgentLink& l, uint64_t sid, uint64_t frames) {
    transport::TransportEvent ev;
    ev.kind = transport::TransportEvent::Kind::kFrameArrived;
    ev.status = FL_ERR_UNKNOWN_CREDIT;
    ev.header.stream_id = sid;
    ev.header.length = 10;
    for (uint64_t seq = 1; seq <= frames; ++seq) {
      ev.header.sequence = seq;
      ev.header.credit_id = 1'000'000 + seq;
      rig.inbound.onFrameArrived(l, ev);
    }
  };
  AgentLink& many = rig.linkUp(1, "many");
  constexpr uint64_t kStreams = 64;
  for (uint64_t sid = 1; sid <= kStreams; ++sid)
    REQUIRE(rig.open(many, sid, "s" + std::to_string(sid)).empty());
  for (uint64_t sid = 1; sid <= kStreams; ++sid) flood(many, sid, 100);
  // 64 streams share 1024: each keeps the least, kMinRemembered, not its 100.
  CHECK(rig.inbound.answersKept(many.peer) == kStreams * InboundStreams::kMinRemembered);
  // A peer with one stream keeps what the peer may: all 200 of them.
  AgentLink& one = rig.linkUp(2, "one");
  REQUIRE(rig.open(one, 1, "s1").empty());
  flood(one, 1, 200);
  CHECK(rig.inbound.answersKept(one.peer) == 200);
  CHECK(rig.metrics.counters.nacks_sent.load() == kStreams * 100 + 200);  // each was answered all the same
}

TEST_CASE("inbound bounds: a consumer that leaves has its credits recalled, retracted only when given back",
          "[agent][inbound][credits]") {
  // The sender may have posted a write into a credit before it hears the
  // consumer left; over rdma a write into a window already ended fails the
  // whole link (every stream on it).  So the credits are recalled: what the
  // sender gives back is retracted then, what it used lands and is refused.
  InboundRig rig;
  rig.consumer(1, "a");
  PickyTransport* picky = nullptr;
  AgentLink& l = rig.linkUp(1, "p1", 9, pickyWrap(&picky));
  REQUIRE(rig.open(l, 42, "a").empty());
  const std::vector<uint64_t> granted = [&] {
    std::vector<uint64_t> ids;
    for (const SlotEntry& e : rig.consumers[0].session->slots) ids.push_back(e.consumer.credit_id);
    return ids;
  }();
  rig.consumers[0].session->gone = true;
  rig.inbound.onConsumerGone(*rig.clients.find(1));
  CHECK(picky->retracted.empty());
  REQUIRE(rig.revoked(l).size() == 4);
  CHECK(rig.inbound.creditsOutstanding() == 4);

  // The sender used the first before it heard: the frame lands, is refused
  // (the sender sends it again elsewhere), and its credit is gone.
  transport::TransportEvent ev;
  ev.kind = transport::TransportEvent::Kind::kFrameArrived;
  ev.header.stream_id = 42;
  ev.header.sequence = 1;
  ev.header.credit_id = granted[0];
  ev.header.length = 10;
  rig.inbound.onFrameArrived(l, ev);
  const InboundRig::Said said = rig.said(l);
  REQUIRE(said.nacked.size() == 1);
  CHECK(said.nacked[0] == std::make_pair(uint64_t{1}, static_cast<int>(FL_ERR_UNKNOWN_CREDIT)));
  CHECK(rig.inbound.creditsOutstanding() == 3);

  // It gives back the other three: retracted now, and nothing is left.
  rig.inbound.onCreditsReturned(l, peer::CreditRevoke{42, {granted[1], granted[2], granted[3]}, true, {}});
  CHECK(picky->retracted == std::vector<uint64_t>{granted[1], granted[2], granted[3]});
  CHECK(rig.inbound.creditsOutstanding() == 0);
  CHECK(rig.inbound.checkDeadlines().empty());
}

TEST_CASE("inbound bounds: a sender that keeps a departed consumer's credits loses its link at the deadline",
          "[agent][inbound][credits]") {
  InboundStreams::Limits limits;
  limits.recall_deadline_ns = 1'000'000'000;
  InboundRig rig(limits);
  rig.consumer(1, "a");
  AgentLink& l = rig.linkUp(1, "p1");
  REQUIRE(rig.open(l, 42, "a").empty());
  rig.consumers[0].session->gone = true;
  rig.inbound.onConsumerGone(*rig.clients.find(1));
  REQUIRE(rig.revoked(l).size() == 4);
  rig.clock.advanceMs(999);
  CHECK(rig.inbound.checkDeadlines().empty());
  rig.clock.advanceMs(1);
  const auto failed = rig.inbound.checkDeadlines();
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].link_id == l.id);
}

TEST_CASE("inbound bounds: a slot whose window the peer may still write is granted on no link until it shuts",
          "[agent][inbound][credits][hostile]") {
  // One slot, two senders of "cam": p1's link keeps its windows open after a credit ends (an
  // rdma peer that stalls this end's send queue), p2's is honest.
  InboundRig rig;
  rig.consumer(1, "cam", 1);
  WindowKeeper* keeper = nullptr;
  AgentLink& l1 = rig.linkUp(1, "p1", 9, [&](std::unique_ptr<transport::Transport> inner) {
    auto k = std::make_unique<WindowKeeper>(std::move(inner));
    keeper = k.get();
    return std::unique_ptr<transport::Transport>(std::move(k));
  });
  REQUIRE(rig.open(l1, 42, "cam").empty());
  const SlotEntry& slot = rig.consumers[0].session->slots[0];
  REQUIRE(slot.state == SlotState::kCredited);
  REQUIRE(slot.link_id == 1);
  AgentLink& l2 = rig.linkUp(2, "p2");
  REQUIRE(rig.open(l2, 43, "cam").empty());

  SECTION("retracted: p1 gives the credit back") {
    rig.inbound.onCreditsReturned(l1, peer::CreditRevoke{42, {slot.consumer.credit_id}, true, {}});
  }
  SECTION("consumed: p1's frame lands and the consumer releases it") {
    REQUIRE(rig.land(l1, 42, 1));
    REQUIRE(rig.takeAndRelease() == 1);
  }
  rig.inbound.flushControl();
  CHECK(rig.credited(0) == 0);  // the window is open: p1's old key still writes there
  rig.inbound.flushControl();
  CHECK(rig.credited(0) == 0);
  CHECK(rig.inbound.slotsFenced() == 1);  // framelink_slots_fenced
  keeper->shut = true;                    // its invalidation executed
  rig.inbound.flushControl();
  CHECK(rig.credited(0) == 1);
  CHECK(rig.inbound.slotsFenced() == 0);
}

TEST_CASE("inbound bounds: a slot held for a window goes on when the link that had it goes",
          "[agent][inbound][credits]") {
  InboundRig rig;
  rig.consumer(1, "cam", 1);
  AgentLink& l1 = rig.linkUp(1, "p1", 9, [](std::unique_ptr<transport::Transport> inner) {
    return std::unique_ptr<transport::Transport>(std::make_unique<WindowKeeper>(std::move(inner)));
  });
  REQUIRE(rig.open(l1, 42, "cam").empty());
  AgentLink& l2 = rig.linkUp(2, "p2");
  REQUIRE(rig.open(l2, 43, "cam").empty());
  rig.inbound.onCreditsReturned(
      l1, peer::CreditRevoke{42, {rig.consumers[0].session->slots[0].consumer.credit_id}, true, {}});
  rig.inbound.flushControl();
  CHECK(rig.credited(0) == 0);
  rig.linkDown(1);  // its queue pair goes, and every window on it
  rig.inbound.flushControl();
  REQUIRE(rig.credited(0) == 1);
  CHECK(rig.consumers[0].session->slots[0].link_id == 2);
}
