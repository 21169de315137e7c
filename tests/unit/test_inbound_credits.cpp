// The consumer side's credits (inbound_credits.cpp), through InboundStreams
// on a manual clock: a credit per free consumer slot in fair shares of each
// consumer, recalls of what a sender holds beyond its share, the deadline of
// a recall, regions and the credits that cannot name one, ACKs and credits
// held back to go together, and slots fenced while a window may be written.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "forwarding_transport.h"
#include "inbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

// What one round said on one link: its grants, the credit ids they carry
// (slot credits and whole ones), its recalls and the sequences it ACKed.
struct LinkRound {
  std::vector<v1::CreditGrant> grants;
  std::vector<uint64_t> granted;
  std::vector<uint64_t> revoked;
  std::vector<uint64_t> acked;
};

// The round ends (flushControl) and what it sent on `l` is taken off the link's batch.
LinkRound roundOn(InboundRig& rig, AgentLink& l) {
  rig.inbound.flushControl();
  LinkRound r;
  for (const auto& m : l.control.messages()) {
    if (m.has_credit_grant()) {
      r.grants.push_back(m.credit_grant());
      for (uint64_t id : m.credit_grant().slot_credits()) r.granted.push_back(id);
      for (const auto& c : m.credit_grant().credits()) r.granted.push_back(c.credit_id());
    }
    if (m.has_credit_revoke()) {
      for (uint64_t id : m.credit_revoke().credit_ids()) r.revoked.push_back(id);
    }
    const peer::Message decoded = peer::decode(m);
    if (const auto* ack = std::get_if<peer::Ack>(&decoded)) {
      r.acked.insert(r.acked.end(), ack->sequences.begin(), ack->sequences.end());
    }
  }
  l.control.Clear();
  return r;
}

// The slots of consumer `index` credited on link `link_id`.
size_t heldOn(const InboundRig& rig, size_t index, uint64_t link_id) {
  size_t n = 0;
  for (const SlotEntry& e : rig.consumers[index].session->slots) {
    n += e.state == SlotState::kCredited && e.link_id == link_id ? 1 : 0;
  }
  return n;
}

// A consumer whose slots are `slot_size` bytes (InboundRig::consumer makes 4 KiB ones).
AgentClient& attachConsumer(InboundRig& rig, uint64_t id, const std::string& stream, uint32_t slots,
                            uint64_t slot_size) {
  rig.consumers.push_back(makeClient(id, FL_ROLE_CONSUMER, stream, slots, slot_size));
  AgentClient& ac = rig.clients.add(rig.consumers.back().session);
  rig.inbound.onConsumerAttached(ac);
  return ac;
}

}  // namespace

TEST_CASE(
    "inbound credits: a slot one sender's frame freed goes to the sender below its share of that consumer",
    "[inbound_credits]") {
  // Two senders of "cam", two consumers: each sender holds half of each
  // consumer, and every grant says the largest slot of any of them.
  InboundRig rig;
  AgentLink& a = rig.linkUp(1, "p1");
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(rig.open(b, 43, "cam").empty());
  attachConsumer(rig, 1, "cam", 4, 64 * 1024);
  rig.consumer(2, "cam", 4);
  const uint64_t largest = rig.consumers[0].session->segments->slotSize();
  for (AgentLink* l : {&a, &b}) {
    const LinkRound r = roundOn(rig, *l);
    CHECK(r.granted.size() == 4);
    for (const v1::CreditGrant& g : r.grants) CHECK(g.largest_slot() == largest);
  }
  for (size_t c = 0; c < 2; ++c) {
    CHECK(heldOn(rig, c, a.id) == 2);
    CHECK(heldOn(rig, c, b.id) == 2);
  }
  // p2's two frames land in the first consumer, which releases them: p1 has
  // its share of that consumer, so both slots go back to p2.
  REQUIRE(rig.land(b, 43, 1));
  REQUIRE(rig.land(b, 43, 2));
  REQUIRE(rig.takeAndRelease(0) != 0);
  REQUIRE(rig.takeAndRelease(0) != 0);
  const LinkRound to_b = roundOn(rig, b);
  CHECK(to_b.acked.size() == 2);
  CHECK(to_b.granted.size() == 2);
  CHECK(roundOn(rig, a).granted.empty());
  CHECK(heldOn(rig, 0, a.id) == 2);
  CHECK(heldOn(rig, 0, b.id) == 2);
}

TEST_CASE(
    "inbound credits: a second sender recalls only what the first holds beyond its share of each consumer",
    "[inbound_credits]") {
  InboundRig rig;
  rig.consumer(1, "cam", 4);
  rig.consumer(2, "cam", 3);
  AgentLink& a = rig.linkUp(1, "p1");
  REQUIRE(rig.open(a, 42, "cam").empty());
  CHECK(roundOn(rig, a).granted.size() == 7);  // alone, it holds every slot
  // One of its frames is held by the first consumer: that slot is no credit any more.
  REQUIRE(rig.land(a, 42, 1));
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(b, 43, "cam").empty());
  // Shares are 2 of each consumer: p1 holds 3 of the first and 3 of the second.
  const LinkRound recall = roundOn(rig, a);
  REQUIRE(recall.revoked.size() == 2);
  CHECK(rig.metrics.counters.credits_recalled.load() == 2);
  CHECK(roundOn(rig, b).granted.empty());  // nothing is free until p1 gives them back

  rig.inbound.onCreditsReturned(a, peer::CreditRevoke{42, recall.revoked, true, {}});
  CHECK(roundOn(rig, b).granted.size() == 2);
  CHECK(heldOn(rig, 0, a.id) == 2);
  CHECK(heldOn(rig, 0, b.id) == 1);
  CHECK(heldOn(rig, 1, a.id) == 2);
  CHECK(heldOn(rig, 1, b.id) == 1);
  // The frame is released: its ACK goes to p1, its slot to p2, below its share.
  REQUIRE(rig.takeAndRelease(0) == 1);
  const LinkRound to_a = roundOn(rig, a);
  CHECK(to_a.acked == std::vector<uint64_t>{1});
  CHECK(to_a.granted.empty());
  CHECK(roundOn(rig, b).granted.size() == 1);
  CHECK(heldOn(rig, 0, b.id) == 2);
  CHECK(rig.inbound.creditsOutstanding() == 7);
}

TEST_CASE("inbound credits: a reload's shorter recall deadline applies to credits recalled before it",
          "[inbound_credits]") {
  InboundRig rig;  // recall_deadline_ns: 30 s
  rig.consumer(1, "cam", 4);
  AgentLink& a = rig.linkUp(1, "p1");
  REQUIRE(rig.open(a, 42, "cam").empty());
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(b, 43, "cam").empty());
  REQUIRE(roundOn(rig, a).revoked.size() == 2);
  rig.clock.advanceMs(999);
  InboundStreams::Limits limits = rig.inbound.limits();
  limits.recall_deadline_ns = 1'000'000'000;
  rig.inbound.setLimits(limits);
  CHECK(rig.inbound.checkDeadlines().empty());
  rig.clock.advanceMs(1);
  const auto failed = rig.inbound.checkDeadlines();
  REQUIRE(failed.size() == 1);  // one per link, however many credits it kept
  CHECK(failed[0].link_id == a.id);
  CHECK(failed[0].violation);
  CHECK(failed[0].why.find("1000 ms") != std::string::npos);
  // A link already being closed is not failed again.
  a.closing = true;
  CHECK(rig.inbound.checkDeadlines().empty());
}

TEST_CASE("inbound credits: credits given back on another link or stream than they were granted stay out",
          "[inbound_credits]") {
  // A peer cannot free another sender's slots by naming its credits.
  InboundRig rig;
  rig.consumer(1, "cam", 4);
  AgentLink& a = rig.linkUp(1, "p1");
  REQUIRE(rig.open(a, 42, "cam").empty());
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(b, 43, "cam").empty());
  const std::vector<uint64_t> recalled = roundOn(rig, a).revoked;
  REQUIRE(recalled.size() == 2);

  rig.inbound.onCreditsReturned(b, peer::CreditRevoke{43, recalled, true, {}});
  rig.inbound.onCreditsReturned(b, peer::CreditRevoke{42, recalled, true, {}});
  rig.inbound.onCreditsReturned(a, peer::CreditRevoke{43, recalled, true, {}});
  CHECK(roundOn(rig, b).granted.empty());
  CHECK(rig.inbound.creditsOutstanding() == 4);
  CHECK(heldOn(rig, 0, a.id) == 4);

  rig.inbound.onCreditsReturned(a, peer::CreditRevoke{42, recalled, true, {}});
  CHECK(roundOn(rig, b).granted.size() == 2);
  CHECK(heldOn(rig, 0, a.id) == 2);
  CHECK(heldOn(rig, 0, b.id) == 2);
}

TEST_CASE("inbound credits: a consumer is one region per link, announced with its first credit",
          "[inbound_credits]") {
  InboundRig rig;
  rig.consumer(1, "cam", 4);
  rig.consumer(2, "dog", 2);
  AgentLink& a = rig.linkUp(1, "p1");
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(rig.open(a, 43, "dog").empty());
  // Region ids are the lowest the link does not use: 1 and 2 on link 1.
  const LinkRound first = roundOn(rig, a);
  REQUIRE(first.grants.size() == 2);
  std::map<uint64_t, v1::SlotRegion> region_of;  // by stream
  for (const v1::CreditGrant& g : first.grants) {
    REQUIRE(g.regions_size() == 1);
    CHECK(g.credits_size() == 0);
    region_of[g.stream_id()] = g.regions(0);
    std::set<uint32_t> slots;
    for (uint64_t id : g.slot_credits()) {
      CHECK(peer::slotCreditRegion(id) == g.regions(0).region_id());
      slots.insert(peer::slotCreditSlot(id));
    }
    CHECK(slots.size() == g.regions(0).slot_count());
  }
  CHECK(region_of[42].region_id() == 1);
  CHECK(region_of[42].slot_count() == 4);
  CHECK(region_of[43].region_id() == 2);
  CHECK(region_of[43].slot_count() == 2);

  // Another link has ids of its own: "dog" is region 1 there.
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(b, 7, "dog").empty());
  const std::vector<uint64_t> recalled = roundOn(rig, a).revoked;
  REQUIRE(recalled.size() == 1);
  rig.inbound.onCreditsReturned(a, peer::CreditRevoke{43, recalled, true, {}});
  const LinkRound on_b = roundOn(rig, b);
  REQUIRE(on_b.grants.size() == 1);
  REQUIRE(on_b.grants[0].regions_size() == 1);
  CHECK(on_b.grants[0].regions(0).region_id() == 1);
  CHECK(on_b.grants[0].regions(0).slot_count() == 2);

  // A slot granted again on link 1 names its region without announcing it.
  REQUIRE(rig.land(a, 42, 1));
  REQUIRE(rig.takeAndRelease(0) == 1);
  const LinkRound again = roundOn(rig, a);
  REQUIRE(again.grants.size() == 1);
  CHECK(again.grants[0].regions_size() == 0);
  REQUIRE(again.grants[0].slot_credits_size() == 1);
  CHECK(peer::slotCreditRegion(again.grants[0].slot_credits(0)) == 1);
}

namespace {

// Forwards to a tcp transport and gives out addresses, as rdma does: each
// slot's own address and one key -- but `stray` under a key of its own, as
// a transport that registers slots one by one would.
class AddressingTransport final : public framelink::testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  static constexpr uint32_t kKey = 0x77;
  const uint8_t* stray = nullptr;

  const char* name() const noexcept override { return "addressing"; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit credit) override {
    const auto addr = reinterpret_cast<uint64_t>(credit.buffer);
    const bool own_key = credit.buffer == stray;
    Result<transport::RemoteCredit> remote = ForwardingTransport::exposeCredit(std::move(credit));
    if (remote) {
      remote->remote_addr = addr;
      remote->rkey = own_key ? kKey + 1 : kKey;
    }
    return remote;
  }
};

}  // namespace

TEST_CASE("inbound credits: a slot whose address does not follow its region is granted whole",
          "[inbound_credits]") {
  InboundRig rig;
  rig.consumer(1, "cam", 4);
  const ClientSegments& segments = *rig.consumers[0].session->segments;
  AgentLink& l = rig.linkUp(1, "p1", 9, [&](std::unique_ptr<transport::Transport> inner) {
    auto wrapped = std::make_unique<AddressingTransport>(std::move(inner));
    wrapped->stray = segments.slot(2);
    return std::unique_ptr<transport::Transport>(std::move(wrapped));
  });
  REQUIRE(rig.open(l, 42, "cam").empty());
  const LinkRound r = roundOn(rig, l);
  REQUIRE(r.grants.size() == 1);
  const v1::CreditGrant& g = r.grants[0];
  // The region is where the first slot is, its slots a stride apart.
  REQUIRE(g.regions_size() == 1);
  const v1::SlotRegion& region = g.regions(0);
  CHECK(region.base_addr() == reinterpret_cast<uint64_t>(segments.slot(0)));
  CHECK(region.slot_stride() == segments.geometry().slot_stride);
  CHECK(region.rkey() == AddressingTransport::kKey);
  CHECK(region.slot_bytes() == segments.slotSize());
  std::set<uint32_t> slots;
  for (uint64_t id : g.slot_credits()) slots.insert(peer::slotCreditSlot(id));
  CHECK(slots == std::set<uint32_t>{0, 1, 3});
  // The stray slot goes with its own address and key.
  REQUIRE(g.credits_size() == 1);
  CHECK(g.credits(0).remote_addr() == reinterpret_cast<uint64_t>(segments.slot(2)));
  CHECK(g.credits(0).rkey() == AddressingTransport::kKey + 1);
  CHECK(g.credits(0).length() == segments.slotSize());
  CHECK(rig.metrics.counters.credits_granted_whole.load() == 1);
  CHECK(rig.metrics.counters.credits_granted.load() == 4);
}

namespace {

// Forwards to a tcp transport gone down, its LinkDown not handled yet:
// every slot is refused FL_ERR_LINK_LOST.
class DownTransport final : public framelink::testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  size_t tried = 0;

  const char* name() const noexcept override { return "down"; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit) override {
    ++tried;
    return makeError(FL_ERR_LINK_LOST, "the test's link is down");
  }
};

}  // namespace

TEST_CASE(
    "inbound credits: a link refusing slots as it goes down is asked once a round; the other gets its share",
    "[inbound_credits]") {
  InboundRig rig;
  DownTransport* down = nullptr;
  AgentLink& a = rig.linkUp(1, "p1", 9, [&](std::unique_ptr<transport::Transport> inner) {
    auto wrapped = std::make_unique<DownTransport>(std::move(inner));
    down = wrapped.get();
    return std::unique_ptr<transport::Transport>(std::move(wrapped));
  });
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(rig.open(b, 43, "cam").empty());
  rig.consumer(1, "cam", 4);
  CHECK(down->tried == 1);
  CHECK(heldOn(rig, 0, b.id) == 2);  // its share; the rest waits for the next round
  CHECK(heldOn(rig, 0, a.id) == 0);
  CHECK(rig.credited(0) == 2);
  CHECK(roundOn(rig, b).revoked.empty());
  CHECK(rig.metrics.counters.credits_recalled.load() == 0);
  // Once the link is gone, the other sender is the only one: every slot is its.
  rig.linkDown(a.id);
  rig.inbound.onCreditLow(b, peer::CreditLow{43});
  rig.inbound.flushControl();
  CHECK(heldOn(rig, 0, b.id) == 4);
}

namespace {

constexpr uint64_t kAckDelayNs = 1'000'000;  // 1 ms of the manual clock

}  // namespace

TEST_CASE("inbound credits: ACKs wait for a quarter of the sender's window, its share of every consumer",
          "[inbound_credits]") {
  // Two senders, two consumers of 8 slots: each sender may hold 4 + 4, and
  // two releases are a quarter of that.
  InboundRig rig({}, kAckDelayNs);
  AgentLink& a = rig.linkUp(1, "p1");
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(rig.open(b, 43, "cam").empty());
  rig.consumer(1, "cam", 8);
  rig.consumer(2, "cam", 8);
  REQUIRE(roundOn(rig, a).granted.size() == 8);
  REQUIRE(roundOn(rig, b).granted.size() == 8);

  REQUIRE(rig.land(a, 42, 1));
  REQUIRE(rig.takeAndRelease(0) == 1);
  LinkRound r = roundOn(rig, a);
  CHECK(r.acked.empty());
  CHECK(r.granted.empty());  // the slot's credit waits with its ACK
  CHECK(rig.inbound.nextControlDeadlineNs() == rig.clock.nowNs() + kAckDelayNs);
  REQUIRE(rig.land(a, 42, 2));
  REQUIRE(rig.takeAndRelease(0) == 2);
  r = roundOn(rig, a);
  CHECK(r.acked == std::vector<uint64_t>{1, 2});
  CHECK(r.granted.size() == 2);
  CHECK(rig.inbound.nextControlDeadlineNs() == 0);
  // The other sender's window is its own: its one release waits the delay.
  REQUIRE(rig.land(b, 43, 1));
  REQUIRE(rig.takeAndRelease(0) == 1);
  CHECK(roundOn(rig, b).acked.empty());
  rig.clock.advanceNs(kAckDelayNs);
  CHECK(roundOn(rig, b).acked == std::vector<uint64_t>{1});
}

TEST_CASE(
    "inbound credits: a sender low on credits gets the slots another's releases freed; their ACKs still wait",
    "[inbound_credits]") {
  InboundRig rig({}, kAckDelayNs);
  AgentLink& a = rig.linkUp(1, "p1");
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(rig.open(b, 43, "cam").empty());
  rig.consumer(1, "cam", 16);  // a window of 8 each: a quarter is 2
  roundOn(rig, a);
  roundOn(rig, b);
  // p2's frame is held by the consumer; p1's is released, its ACK held back.
  REQUIRE(rig.land(a, 42, 1));
  REQUIRE(rig.land(b, 43, 7));
  REQUIRE(rig.takeAndRelease(0) == 1);
  CHECK(roundOn(rig, a).acked.empty());
  CHECK(rig.credited(0) == 14);

  rig.inbound.onCreditLow(b, peer::CreditLow{43});
  const LinkRound to_a = roundOn(rig, a);
  const LinkRound to_b = roundOn(rig, b);
  CHECK(to_a.acked.empty());  // p1's ACK is not hurried by p2
  CHECK(to_a.granted.size() + to_b.granted.size() == 1);
  CHECK(rig.credited(0) == 15);
  // It goes at its delay.
  rig.clock.advanceNs(kAckDelayNs);
  CHECK(roundOn(rig, a).acked == std::vector<uint64_t>{1});
}

TEST_CASE("inbound credits: a CreditLow finds no free slot in one fenced for a window, and starts no round",
          "[inbound_credits]") {
  // Two slots, two senders: a share is one.  p1's link keeps its windows
  // open once a credit ended (an rdma peer stalling this end's send queue).
  InboundRig rig;
  rig.consumer(1, "cam", 2);
  WindowKeeper* keeper = nullptr;
  AgentLink& a = rig.linkUp(1, "p1", 9, [&](std::unique_ptr<transport::Transport> inner) {
    auto wrapped = std::make_unique<WindowKeeper>(std::move(inner));
    keeper = wrapped.get();
    return std::unique_ptr<transport::Transport>(std::move(wrapped));
  });
  REQUIRE(rig.open(a, 42, "cam").empty());
  REQUIRE(roundOn(rig, a).granted.size() == 2);
  AgentLink& b = rig.linkUp(2, "p2");
  REQUIRE(rig.open(b, 43, "cam").empty());
  const std::vector<uint64_t> recalled = roundOn(rig, a).revoked;
  REQUIRE(recalled.size() == 1);
  rig.inbound.onCreditsReturned(a, peer::CreditRevoke{42, recalled, true, {}});
  CHECK(rig.inbound.slotsFenced() == 1);
  CHECK(rig.credited(0) == 1);

  // p2 says it is low, again and again: the slot p1's window may still be
  // written is not free, so no grant round is spent on it.
  const uint64_t rounds = rig.inbound.grantRoundsForTest();
  for (int i = 0; i < 3; ++i) {
    rig.inbound.onCreditLow(b, peer::CreditLow{43});
    CHECK(roundOn(rig, b).granted.empty());
  }
  CHECK(rig.inbound.grantRoundsForTest() == rounds);
  CHECK(rig.credited(0) == 1);
  // The window shuts: the slot goes to p2.
  keeper->shut = true;
  CHECK(roundOn(rig, b).granted.size() == 1);
  CHECK(heldOn(rig, 0, b.id) == 1);
  CHECK(rig.inbound.slotsFenced() == 0);
}
