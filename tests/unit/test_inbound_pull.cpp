// Pull on the consumer side: reads of offers that stall or whose source the
// sender took back, and a slot a read is still landing in, which is granted
// to no other sender -- whatever its stream does meanwhile -- until the read
// has ended.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "inbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

// The pull credits granted on `l` so far, taken off its batch.
std::vector<uint64_t> pullCredits(InboundRig& rig, AgentLink& l) {
  rig.inbound.flushControl();
  std::vector<uint64_t> ids;
  for (const auto& m : l.control.messages()) {
    if (!m.has_credit_grant() || !m.credit_grant().pull()) continue;
    for (const auto& c : m.credit_grant().credits()) ids.push_back(c.credit_id());
  }
  l.control.Clear();
  return ids;
}

// Serves the sender's end and polls `l` until one read completes; hands it
// to the inbound side.
void completeOneRead(InboundRig& rig, AgentLink& l, transport::Transport& sender) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  transport::TransportEvent ev[8];
  while (std::chrono::steady_clock::now() < deadline) {
    l.transport->flush();
    sender.flush();
    sender.poll(ev, 8);
    // One event at a time: the next read's completion waits for the next call.
    if (l.transport->poll(ev, 1) == 1 && ev[0].kind == transport::TransportEvent::Kind::kReadComplete) {
      REQUIRE(ev[0].status == FL_OK);
      rig.inbound.onReadComplete(l, ev[0]);
      return;
    }
    std::this_thread::sleep_for(1ms);
  }
  FAIL("no read completed in 10 s");
}

// The sender's end exposes `payload` and offers it as sequence `seq` of
// stream 42 into `credit`.
void offer(InboundRig& rig, AgentLink& l, transport::Transport& sender, uint64_t credit, uint64_t seq,
           const std::vector<uint8_t>& payload) {
  transport::LocalSource source;
  source.source_id = seq;
  source.payload = payload.data();
  source.length = payload.size();
  auto remote = sender.exposeSource(source);
  REQUIRE(remote.ok());
  peer::Offer o;
  o.header.stream_id = 42;
  o.header.sequence = seq;
  o.header.credit_id = credit;
  o.header.length = payload.size();
  o.source = remote.value();
  REQUIRE(rig.inbound.onOffer(l, o).empty());
}

}  // namespace

// A consumer of "cam" on a link whose stream 42 is pulled, its pull credits
// granted; reads stall after `read_stall_ns` (0: never).
struct PullRig {
  explicit PullRig(uint64_t read_stall_ns) : rig(limits(read_stall_ns)) {
    rig.inbound.setPullStreams({"cam"});
    rig.consumer(1, "cam");
    l = &rig.linkUp(1);
    REQUIRE(rig.open(*l, 42, "cam").empty());
    credits = pullCredits(rig, *l);
    REQUIRE(credits.size() >= 2);
  }
  static InboundStreams::Limits limits(uint64_t read_stall_ns) {
    InboundStreams::Limits limits;
    limits.read_stall_ns = read_stall_ns;
    return limits;
  }
  transport::Transport& sender() { return *rig.peer_ends.back(); }

  InboundRig rig;
  AgentLink* l = nullptr;
  std::vector<uint64_t> credits;
};

TEST_CASE("inbound bounds: a link whose reads make no progress for read_stall_ns fails; a slow one does not",
          "[agent][inbound][pull]") {
  PullRig p(10'000'000'000ULL);
  InboundRig& rig = p.rig;
  AgentLink& l = *p.l;
  const std::vector<uint8_t> payload(1000, 0x5A);
  offer(rig, l, p.sender(), p.credits[0], 1, payload);
  offer(rig, l, p.sender(), p.credits[1], 2, payload);
  REQUIRE(rig.inbound.readsInFlight() == 2);

  SECTION("no read completes: the link fails once read_stall_ns passed, not a violation") {
    rig.clock.advanceMs(9'999);
    CHECK(rig.inbound.checkDeadlines().empty());
    rig.clock.advanceMs(1);
    const auto failed = rig.inbound.checkDeadlines();
    REQUIRE(failed.size() == 1);
    CHECK(failed[0].link_id == l.id);
    CHECK_FALSE(failed[0].violation);
    CHECK(failed[0].why.find("no read of an offered frame completed in 10000 ms") != std::string::npos);
    CHECK(rig.metrics.counters.links_stalled.load() == 1);
  }
  SECTION("each read slow but the link moving: nothing fails, however long they take in all") {
    rig.clock.advanceMs(9'000);
    completeOneRead(rig, l, p.sender());  // 9 s after both were posted
    CHECK(rig.inbound.readsInFlight() == 1);
    rig.clock.advanceMs(9'000);
    CHECK(rig.inbound.checkDeadlines().empty());  // the second was posted 18 s ago
    completeOneRead(rig, l, p.sender());
    CHECK(rig.inbound.readsInFlight() == 0);
    rig.clock.advanceMs(60'000);
    CHECK(rig.inbound.checkDeadlines().empty());  // none in flight: an idle link is no stalled one
    CHECK(rig.metrics.counters.links_stalled.load() == 0);
  }
}

TEST_CASE("inbound bounds: read_stall_ns 0 never fails a link for its reads", "[agent][inbound][pull]") {
  PullRig p(0);
  const std::vector<uint8_t> payload(100, 1);
  offer(p.rig, *p.l, p.sender(), p.credits[0], 1, payload);
  REQUIRE(p.rig.inbound.readsInFlight() == 1);
  p.rig.clock.advanceMs(3'600'000);
  CHECK(p.rig.inbound.checkDeadlines().empty());
}

TEST_CASE("inbound bounds: a read whose source the sender took back frees its slot and refuses nothing",
          "[agent][inbound][pull]") {
  // The sender retracts a source only once its frame was answered or moved
  // to a new offer: a refusal sent now would land on that new offer.
  PullRig p(0);
  InboundRig& rig = p.rig;
  AgentLink& l = *p.l;
  const std::vector<uint8_t> payload(1000, 0x5A);
  offer(rig, l, p.sender(), p.credits[0], 1, payload);
  p.sender().retractSource(1);  // before the read reaches it
  REQUIRE(rig.inbound.readsInFlight() == 1);

  const auto deadline = std::chrono::steady_clock::now() + 10s;
  transport::TransportEvent ev[8];
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    l.transport->flush();
    p.sender().flush();
    p.sender().poll(ev, 8);
    if (l.transport->poll(ev, 1) == 1 && ev[0].kind == transport::TransportEvent::Kind::kReadComplete) {
      CHECK(ev[0].status == FL_ERR_UNKNOWN_CREDIT);
      rig.inbound.onReadComplete(l, ev[0]);
      ended = true;
    }
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(ended);
  CHECK(rig.inbound.readsInFlight() == 0);
  CHECK(rig.metrics.counters.pull_reads_failed.load() == 1);
  CHECK(rig.metrics.counters.nacks_sent.load() == 0);
  // The slot is free: granted again, as a new pull credit.
  const std::vector<uint64_t> again = pullCredits(rig, l);
  REQUIRE(again.size() == 1);
  CHECK(std::find(p.credits.begin(), p.credits.end(), again[0]) == p.credits.end());
}

namespace {

// The slot of `consumer` that `credit` names; REQUIREs one.
uint32_t slotOf(const ClientSession& consumer, uint64_t credit) {
  for (uint32_t s = 0; s < consumer.slots.size(); ++s) {
    const SlotEntry& e = consumer.slots[s];
    if (e.state == SlotState::kCredited && e.consumer.credit_id == credit) return s;
  }
  FAIL("no slot holds credit " << credit);
  return 0;
}

// Offers `bytes` as the next frames of stream 42 (from `*seq` on) into every
// pull credit granted on `l` since they were last taken, and serves and
// completes each read.
void pullInto(InboundRig& rig, AgentLink& l, transport::Transport& sender, uint64_t* seq,
              const std::vector<uint8_t>& bytes) {
  for (uint64_t credit : pullCredits(rig, l)) {
    offer(rig, l, sender, credit, (*seq)++, bytes);
    completeOneRead(rig, l, sender);
  }
}

// The slots consumer `index` was delivered frames in since last asked.
std::vector<uint32_t> deliveredSlots(InboundRig& rig, size_t index = 0) {
  std::vector<uint32_t> slots;
  fl_completion_desc d{};
  TestClient& c = rig.consumers[index];
  while (fl_ring_pop(c.completion(), c.cap(), sizeof d, &d) == FL_RING_OK) slots.push_back(d.slot);
  return slots;
}

bool holds(const ClientSession& consumer, uint32_t slot, const std::vector<uint8_t>& bytes) {
  return std::equal(bytes.begin(), bytes.end(), consumer.segments->slot(slot));
}

}  // namespace

TEST_CASE("inbound pull: a slot a read is landing in goes to no other sender until the read ended",
          "[agent][inbound][pull]") {
  // P offers a frame and, before it answers the read, closes its stream (a
  // Session message any peer may send at any time), opens it on a newer
  // link, or loses its link.  Q sends the same stream.  The answer P still
  // owes lands in the slot whenever it comes: were the slot Q's by then,
  // P's bytes would replace a frame of Q's delivered and checked already.
  InboundRig rig;
  rig.inbound.setPullStreams({"cam"});
  AgentLink& p = rig.linkUp(1, "p");
  transport::Transport& p_end = *rig.peer_ends.back();
  AgentLink& q = rig.linkUp(2, "q");
  transport::Transport& q_end = *rig.peer_ends.back();
  REQUIRE(rig.open(p, 42, "cam").empty());
  REQUIRE(rig.open(q, 42, "cam").empty());
  rig.consumer(1, "cam");  // 4 slots: 2 to each
  const ClientSession& c = *rig.consumers[0].session;
  const std::vector<uint64_t> p_credits = pullCredits(rig, p);
  REQUIRE(p_credits.size() == 2);
  uint64_t q_seq = 1;
  const std::vector<uint8_t> late(1000, 0xBA), mine(1000, 0x51);
  pullInto(rig, q, q_end, &q_seq, mine);  // Q's first two frames, held by the consumer
  const uint32_t k = slotOf(c, p_credits[0]);
  offer(rig, p, p_end, p_credits[0], 1, late);  // P's end is not served: the read stays out
  REQUIRE(rig.inbound.readsInFlight() == 1);

  AgentLink* other = nullptr;  // a newer link of P's, when the stream moved there
  transport::Transport* other_end = nullptr;
  SECTION("P closes the stream") { rig.inbound.onStreamClose(p, 42); }
  SECTION("P opens the stream on a newer link") {
    other = &rig.linkUp(3, "p");
    other_end = rig.peer_ends.back().get();
    REQUIRE(rig.open(*other, 42, "cam").empty());
  }
  SECTION("P's link goes down: the slot comes back once the link is gone") {
    CHECK(c.slots[k].state == SlotState::kCredited);
    rig.linkDown(1);
    CHECK(rig.inbound.readsInFlight() == 0);
    rig.inbound.flushControl();
    CHECK(c.slots[k].state == SlotState::kCredited);
    CHECK(c.slots[k].link_id == q.id);
    return;
  }
  rig.inbound.flushControl();
  // While the read is out, the slot is still P's credit's: no grant names it.
  CHECK(rig.inbound.readsInFlight() == 1);
  CHECK(c.slots[k].state == SlotState::kCredited);
  CHECK(c.slots[k].link_id == p.id);
  CHECK(c.slots[k].consumer.credit_id == p_credits[0]);

  // Q (and P's newer link) fill every slot granted to them meanwhile.
  pullInto(rig, q, q_end, &q_seq, mine);
  uint64_t p_seq = 10;
  if (other != nullptr) pullInto(rig, *other, *other_end, &p_seq, mine);
  std::vector<uint32_t> delivered = deliveredSlots(rig);
  // P answers, late: its frame is refused, and every frame delivered holds its own bytes.
  completeOneRead(rig, p, p_end);
  CHECK(rig.inbound.readsInFlight() == 0);
  for (uint32_t s : delivered) {
    INFO("slot " << s << " (P's read went into slot " << k << ")");
    CHECK(holds(c, s, mine));
  }
  const auto said = rig.said(p);
  CHECK(std::count(said.nacked.begin(), said.nacked.end(),
                   std::make_pair(uint64_t{1}, int{FL_ERR_UNKNOWN_CREDIT})) == 1);
  CHECK(rig.metrics.counters.pull_reads_failed.load() == 1);
  // Only now is the slot granted again, and Q's frame lands in it whole.
  pullInto(rig, q, q_end, &q_seq, mine);
  if (other != nullptr) pullInto(rig, *other, *other_end, &p_seq, mine);
  const std::vector<uint32_t> after = deliveredSlots(rig);
  CHECK(std::find(after.begin(), after.end(), k) != after.end());
  CHECK(holds(c, k, mine));
}

TEST_CASE("inbound pull: a recalled credit the sender offered into is used, whatever its read waits for",
          "[agent][inbound][pull][fan-in]") {
  // A pulled link whose reads wait: the sender offered into credits this end
  // then recalled, and their reads are not done when the recall deadline
  // passes (behind pull_reads_per_link, or a slow link).  Used, not kept:
  // the link stays.
  InboundStreams::Limits limits;
  limits.recall_deadline_ns = 10'000'000'000ULL;
  limits.read_stall_ns = 0;
  InboundRig rig(limits);
  rig.inbound.setPullStreams({"cam"});
  rig.consumer(1, "cam");
  AgentLink& hog = rig.linkUp(1, "p1");
  transport::Transport& hog_end = *rig.peer_ends.back();
  REQUIRE(rig.open(hog, 42, "cam").empty());
  pullCredits(rig, hog);
  AgentLink& other = rig.linkUp(2, "p2");
  REQUIRE(rig.open(other, 7, "cam").empty());
  const std::vector<uint64_t> recalled = rig.revoked(hog);
  REQUIRE(recalled.size() == 2);
  const std::vector<uint8_t> payload(100, 0x5a);
  offer(rig, hog, hog_end, recalled[0], 1, payload);
  offer(rig, hog, hog_end, recalled[1], 2, payload);
  rig.clock.advanceNs(11'000'000'000ULL);
  CHECK(rig.inbound.checkDeadlines().empty());
}
