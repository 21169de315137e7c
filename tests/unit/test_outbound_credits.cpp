// The producer side's credits, on OutboundRig (OutboundStreams on its own):
// grants of whole credits and of slot credits in regions the peer announced,
// the grants that break the protocol, and CreditLow when a stream runs short.
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_stats.h"
#include "agent/outbound_streams.h"
#include "agent/peer_messages.h"
#include "agent_fixture.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

TEST_CASE("outbound streams: a grant of a credit already held is refused", "[agent][outbound]") {
  // Two copies of one credit would take two frames into one slot; the
  // fuzzer found a peer that grants a credit twice and revokes it once.
  OutboundRig rig;
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  grant.credits.push_back(transport::RemoteCredit{102, 4096, 0, 0});
  CHECK(rig.out.onCreditGrant(*rig.link, grant).empty());
  const std::string again = rig.out.onCreditGrant(*rig.link, grant);
  CHECK_THAT(again, Catch::Matchers::Contains("credit 102") && Catch::Matchers::Contains("already granted"));
  peer::CreditGrant twice;
  twice.stream_id = rig.stream_id;
  twice.credits.push_back(transport::RemoteCredit{103, 4096, 0, 0});
  twice.credits.push_back(transport::RemoteCredit{103, 4096, 0, 0});
  CHECK_THAT(rig.out.onCreditGrant(*rig.link, twice), Catch::Matchers::Contains("credit 103"));
  // Once used, an id is free again as far as the sender can tell.
  auto landing = exposeLanding(*rig.pair.b, 102, 4096);
  rig.submit(0, 10);
  CHECK(rig.out.pumpAll() > 0);
  CHECK(rig.producer.session->slots[0].state == SlotState::kPosted);
  peer::CreditGrant fresh;
  fresh.stream_id = rig.stream_id;
  fresh.credits.push_back(transport::RemoteCredit{104, 4096, 0, 0});
  CHECK(rig.out.onCreditGrant(*rig.link, fresh).empty());
}

TEST_CASE("outbound streams: slot credits name a region the peer announced on the link",
          "[agent][outbound]") {
  OutboundRig rig;
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  grant.regions.push_back(peer::SlotRegion{3, 0, 0, 0, 4096, 4});
  grant.slot_credits.push_back(peer::slotCreditId(3, 2, 41));
  CHECK(rig.out.onCreditGrant(*rig.link, grant).empty());
  // The frame goes to that credit: the receiver exposed it under the slot
  // credit's id.
  auto landing = exposeLanding(*rig.pair.b, peer::slotCreditId(3, 2, 41), 4096);
  rig.submit(0, 10);
  CHECK(rig.out.pumpAll() > 0);
  CHECK(rig.producer.session->slots[0].state == SlotState::kPosted);

  SECTION("a region announced again before it was retired breaks the protocol") {
    CHECK_THAT(rig.out.onCreditGrant(*rig.link, grant), Catch::Matchers::Contains("region 3 announced"));
  }
  SECTION("a slot credit of a region never announced, or retired, breaks the protocol") {
    peer::CreditGrant stray;
    stray.stream_id = rig.stream_id;
    stray.slot_credits.push_back(peer::slotCreditId(4, 0, 42));
    CHECK_THAT(rig.out.onCreditGrant(*rig.link, stray), Catch::Matchers::Contains("region 4, which was not"));
    peer::CreditRevoke retire;
    retire.retired_regions.push_back(3);  // stream 0: a revoke that only retires
    rig.out.onCreditRevoke(*rig.link, retire);
    stray.slot_credits[0] = peer::slotCreditId(3, 1, 43);
    CHECK_THAT(rig.out.onCreditGrant(*rig.link, stray), Catch::Matchers::Contains("region 3, which was not"));
  }
  SECTION("regions are announced for the link: one for a stream the sender does not know still counts") {
    peer::CreditGrant other;
    other.stream_id = 999;
    other.regions.push_back(peer::SlotRegion{8, 0, 0, 0, 1024, 2});
    CHECK(rig.out.onCreditGrant(*rig.link, other).empty());
    peer::CreditGrant later;
    later.stream_id = rig.stream_id;
    later.slot_credits.push_back(peer::slotCreditId(8, 1, 44));
    CHECK(rig.out.onCreditGrant(*rig.link, later).empty());
  }
}

TEST_CASE("outbound streams: CreditLow goes once when the credits fall to a quarter of what was held",
          "[agent][outbound][coalesce]") {
  OutboundRig rig(16);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> landings;
  // Grants `n` fresh credits; the peer's end takes frames into them.
  uint64_t next_credit = 1000;
  auto grant = [&](size_t n) {
    peer::CreditGrant g;
    g.stream_id = rig.stream_id;
    for (size_t i = 0; i < n; ++i, ++next_credit) {
      landings.push_back(exposeLanding(*rig.pair.b, next_credit, 4096));
      g.credits.push_back(transport::RemoteCredit{next_credit, 4096, 0, 0});
    }
    REQUIRE(rig.out.onCreditGrant(*rig.link, g).empty());
  };
  // The CreditLow messages the sender gathered for the peer so far.
  std::vector<v1::CreditLow> lows;
  auto takeLows = [&] {
    for (const auto& m : rig.link->control.messages()) {
      if (!m.has_credit_low()) continue;
      CHECK(isPerFrameMessage(m));
      lows.push_back(m.credit_low());
    }
    rig.link->control.Clear();
  };
  auto submitAndPump = [&](uint32_t first, uint32_t count) {
    for (uint32_t slot = first; slot < first + count; ++slot) rig.submit(slot, 10);
    CHECK(rig.out.pumpAll() > 0);
    takeLows();
  };

  grant(16);
  submitAndPump(0, 11);  // 5 credits left: above a quarter of 16
  CHECK(lows.empty());
  submitAndPump(11, 1);  // 4 left
  REQUIRE(lows.size() == 1);
  CHECK(lows[0].stream_id() == rig.stream_id);
  submitAndPump(12, 4);  // down to none: said once is enough
  CHECK(lows.size() == 1);

  // Credits back above a quarter: the next fall is said again.
  rig.completeSends(*rig.link, 16);
  for (uint64_t seq = 1; seq <= 16; ++seq) rig.out.onAck(rig.link->peer, rig.stream_id, seq, FL_OK, {});
  fl_completion_desc d{};
  for (int i = 0; i < 16; ++i) REQUIRE(rig.completed(&d));
  grant(8);
  submitAndPump(0, 3);  // 5 left
  CHECK(lows.size() == 1);
  submitAndPump(3, 1);  // 4 left: a quarter of the 16 held at most
  REQUIRE(lows.size() == 2);
}

TEST_CASE("outbound streams: a window below 8 credits never sends CreditLow", "[agent][outbound][coalesce]") {
  OutboundRig rig(4);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> landings;
  peer::CreditGrant g;
  g.stream_id = rig.stream_id;
  for (uint64_t id = 1; id <= 4; ++id) {
    landings.push_back(exposeLanding(*rig.pair.b, id, 4096));
    g.credits.push_back(transport::RemoteCredit{id, 4096, 0, 0});
  }
  REQUIRE(rig.out.onCreditGrant(*rig.link, g).empty());
  for (uint32_t slot = 0; slot < 4; ++slot) rig.submit(slot, 10);
  CHECK(rig.out.pumpAll() > 0);
  CHECK(rig.producer.session->slots[3].state == SlotState::kPosted);
  for (const auto& m : rig.link->control.messages()) CHECK_FALSE(m.has_credit_low());
}

namespace {

// The credit ids the sender gave back (CreditRevoke, returned) in what it
// gathered for the peer so far, in order.
std::vector<uint64_t> returnedIds(const AgentLink& link) {
  std::vector<v1::ControlBatch> batches;
  for (const std::string& record : link.controlQueued()) {
    batches.emplace_back();
    REQUIRE(batches.back().ParseFromString(record));
  }
  batches.push_back(link.control);
  std::vector<uint64_t> ids;
  for (const auto& batch : batches) {
    for (const auto& m : batch.messages()) {
      if (!m.has_credit_revoke()) continue;
      CHECK(m.credit_revoke().returned());
      ids.insert(ids.end(), m.credit_revoke().credit_ids().begin(), m.credit_revoke().credit_ids().end());
    }
  }
  return ids;
}

}  // namespace

TEST_CASE(
    "outbound streams: a revoke of 65536 ids on a stream holding 65536 credits leaves the others in order",
    "[agent][outbound]") {
  OutboundRig rig;
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  for (uint64_t id = 1; id <= peer::kMaxCreditsPerStream; ++id) {
    grant.credits.push_back(transport::RemoteCredit{id, 4096, 0, 0});
  }
  REQUIRE(rig.out.onCreditGrant(*rig.link, grant).empty());
  auto heldCredits = [&rig] {
    std::vector<StreamStats> stats;
    rig.out.collectStats(stats);
    REQUIRE(stats.size() == 1);
    return stats[0].credits;
  };

  // Every even id, and as many the stream does not hold.
  peer::CreditRevoke revoke;
  revoke.stream_id = rig.stream_id;
  std::vector<uint64_t> evens;
  for (uint64_t id = 2; id <= peer::kMaxCreditsPerStream; id += 2) {
    evens.push_back(id);
    revoke.credit_ids.push_back(id);
    revoke.credit_ids.push_back(peer::kMaxCreditsPerStream + id);
  }
  REQUIRE(revoke.credit_ids.size() == peer::kMaxCreditsPerStream);
  rig.out.onCreditRevoke(*rig.link, revoke);
  CHECK(returnedIds(*rig.link) == evens);  // only those it held, each once
  CHECK(heldCredits() == peer::kMaxCreditsPerStream / 2);

  // The oldest credit left takes the next frame.
  auto landing = exposeLanding(*rig.pair.b, 1, 4096);
  rig.submit(0, 10);
  CHECK(rig.out.pumpAll() > 0);
  CHECK(waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived).header.credit_id == 1);

  // What is left is exactly the odd ids but the one used, in grant order.
  revoke.credit_ids.clear();
  std::vector<uint64_t> odds;
  for (uint64_t id = 1; id <= peer::kMaxCreditsPerStream; ++id) {
    revoke.credit_ids.push_back(id);
    if (id % 2 == 1 && id != 1) odds.push_back(id);
  }
  rig.out.onCreditRevoke(*rig.link, revoke);
  std::vector<uint64_t> returned = evens;
  returned.insert(returned.end(), odds.begin(), odds.end());
  CHECK(returnedIds(*rig.link) == returned);
  CHECK(heldCredits() == 0);
}

TEST_CASE(
    "outbound streams: a frame that no held credit fits waits, and takes the first one granted that fits",
    "[agent][outbound]") {
  // The credits it does not fit are not scanned for it again each round
  // (review N10d: 65535 of them per stream), only once a grant came.
  OutboundRig rig;
  peer::CreditGrant small;
  small.stream_id = rig.stream_id;
  small.largest_slot = 4096;  // a consumer with larger slots exists
  for (uint64_t id = 1; id <= 1000; ++id) small.credits.push_back(transport::RemoteCredit{id, 64, 0, 0});
  REQUIRE(rig.out.onCreditGrant(*rig.link, small).empty());
  rig.submit(0, 1000);
  for (int round = 0; round < 3; ++round) CHECK(rig.out.pumpAll() == 0);
  CHECK(rig.producer.session->slots[0].state == SlotState::kPending);
  // A shorter frame behind it does not pass it: a stream leaves in order.
  rig.submit(1, 10);
  CHECK(rig.out.pumpAll() == 0);
  CHECK(rig.producer.session->slots[1].state == SlotState::kPending);

  auto landing = exposeLanding(*rig.pair.b, 2000, 4096);
  peer::CreditGrant large;
  large.stream_id = rig.stream_id;
  large.credits.push_back(transport::RemoteCredit{2000, 4096, 0, 0});
  REQUIRE(rig.out.onCreditGrant(*rig.link, large).empty());
  CHECK(rig.out.pumpAll() > 0);
  CHECK(rig.producer.session->slots[0].state == SlotState::kPosted);
  CHECK(rig.producer.session->slots[1].state == SlotState::kPosted);  // into a 64-byte credit
}
