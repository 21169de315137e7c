// The consumer side's answers to replays and where its ACKs go: a frame
// whose first copy never arrived is new when it comes again, however many
// later frames arrived; an answer that is no longer remembered is never
// guessed as DELIVERED; ACKs go on the link their frame came on, else on the
// sender's newest link, also when an older link goes while a newer one is up.
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "inbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

// The rig with one consumer of "cam" (4 slots) and links from one sender
// ("sender", instance 9) on which stream 42 ("cam") is open.
struct ReplayRig : InboundRig {
  AgentClient* ac = &consumer(1, "cam");

  AgentLink& linkUp(uint64_t id, uint64_t instance = 9) {
    AgentLink& l = InboundRig::linkUp(id, "sender", instance);
    REQUIRE(open(l, 42, "cam").empty());
    return l;
  }
  bool land(AgentLink& l, uint64_t seq) { return InboundRig::land(l, 42, seq); }
};

}  // namespace

TEST_CASE("inbound streams: a frame whose first copy never arrived is delivered when replayed",
          "[agent][inbound][replay]") {
  // Sequence 1 is lost on the way (its rdma write went into a withdrawn
  // credit, or the link broke under it); 2 and 3 arrive and are released.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 2));
  CHECK(rig.takeAndRelease() == 2);
  REQUIRE(rig.land(l1, 3));
  CHECK(rig.takeAndRelease() == 3);
  CHECK(rig.said(l1).acked == std::vector<uint64_t>{2, 3});

  // The sender replays 1 on its next link: it is new to the consumer.
  rig.linkDown(1);
  AgentLink& l2 = rig.linkUp(2);
  rig.said(l2);  // the ACKs of 2 and 3 again
  REQUIRE(rig.land(l2, 1));
  CHECK(rig.takeAndRelease() == 1);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{1});
  CHECK(rig.metrics.counters.duplicates_dropped.load() == 0);
  // 2 and 3 again are duplicates, ACKed from memory.
  REQUIRE(rig.land(l2, 3));
  CHECK(rig.takeAndRelease() == 0);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{3});
}

TEST_CASE("inbound streams: a replay answered longer ago than is remembered is not ACKed",
          "[agent][inbound][replay]") {
  // Frames 1..N are delivered and released; the receiver remembers the last
  // kMaxRemembered releases.  A replay of frame 1 was answered -- released,
  // or refused and forgotten -- and which is no longer known: the sender
  // hears "unknown" (TIMEOUT), never a DELIVERED on a guess.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  constexpr uint64_t kFrames = InboundStreams::kMaxRemembered + 8;
  for (uint64_t seq = 1; seq <= kFrames; ++seq) {
    REQUIRE(rig.land(l1, seq));
    REQUIRE(rig.takeAndRelease() == seq);
    rig.said(l1);
  }
  REQUIRE(rig.land(l1, 1));
  CHECK(rig.takeAndRelease() == 0);
  const auto answer = rig.said(l1);
  CHECK(answer.acked.empty());
  REQUIRE(answer.nacked.size() == 1);
  CHECK(answer.nacked[0] == std::make_pair(uint64_t{1}, int{FL_ERR_TIMEOUT}));
  // A recent one is still ACKed.
  REQUIRE(rig.land(l1, kFrames - 1));
  CHECK(rig.said(l1).acked == std::vector<uint64_t>{kFrames - 1});
}

TEST_CASE("inbound streams: a gap that never fills stops being waited for after kMaxRemembered answers",
          "[agent][inbound][replay]") {
  // Sequence 1 never comes; the memory of what was answered above it stays
  // bounded, and the gap is counted when the watermark passes it.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  constexpr uint64_t kFrames = InboundStreams::kMaxRemembered + 2;
  for (uint64_t seq = 2; seq <= kFrames + 1; ++seq) {
    REQUIRE(rig.land(l1, seq));
    REQUIRE(rig.takeAndRelease() == seq);
    rig.said(l1);
  }
  CHECK(rig.metrics.counters.answer_gaps_forgotten.load() == 1);
  REQUIRE(rig.land(l1, 1));
  CHECK(rig.takeAndRelease() == 0);
  const auto answer = rig.said(l1);
  CHECK(answer.acked.empty());
  REQUIRE(answer.nacked.size() == 1);
  CHECK(answer.nacked[0].second == FL_ERR_TIMEOUT);
}

TEST_CASE("inbound streams: an ACK goes on the link its frame came on, else on the sender's newest link",
          "[agent][inbound][links]") {
  // The sender dialed again (link 2) while this end still has link 1 up,
  // as after a partition that only the sender noticed.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 1));  // the consumer holds it
  AgentLink& l2 = rig.linkUp(2);
  rig.said(l1);
  rig.said(l2);
  // The stream moved to link 2: link 1's credits came back for it.
  REQUIRE(rig.land(l2, 2));
  fl_completion_desc d{};
  REQUIRE(rig.consumers[0].pop().sequence == 1);
  d = rig.consumers[0].pop();
  REQUIRE(d.sequence == 2);
  rig.inbound.onRelease(*rig.ac, fl_submit_desc{d.slot, 0, 0});
  CHECK(rig.said(l1).acked.empty());
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{2});
  // Frame 1 came on link 1, which is still up: its ACK goes there.
  for (uint32_t s = 0; s < 4; ++s) {
    if (rig.consumers[0].session->slots[s].state == SlotState::kDelivered) {
      rig.inbound.onRelease(*rig.ac, fl_submit_desc{s, 0, 0});
    }
  }
  CHECK(rig.said(l1).acked == std::vector<uint64_t>{1});
  CHECK(rig.said(l2).acked.empty());
}

TEST_CASE("inbound streams: a stream opened on a newer link from the same sender leaves the older link",
          "[agent][inbound][links]") {
  // The older link's credits are of no use to the sender (it sends on its
  // newest link): they come back and are granted on the newer one, and
  // what is remembered of the stream stays (a replay is still a duplicate).
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 1));
  CHECK(rig.takeAndRelease() == 1);
  rig.said(l1);
  CHECK(rig.inbound.creditsOutstanding() == 4);
  AgentLink& l2 = rig.linkUp(2);
  CHECK(l1.in_streams.count(42) == 0);
  size_t on_l2 = 0;
  for (const SlotEntry& e : rig.consumers[0].session->slots)
    on_l2 += e.state == SlotState::kCredited && e.link_id == 2;
  CHECK(on_l2 == 4);
  rig.said(l2);
  REQUIRE(rig.land(l2, 1));
  CHECK(rig.takeAndRelease() == 0);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{1});
}

TEST_CASE("inbound streams: when an old link goes while a newer one is up, its held ACKs go on the newer one",
          "[agent][inbound][links]") {
  // An ACK held back for link 1 (coalescing, or written into its dead
  // socket) must reach the sender: no link-up follows to carry it.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 1));
  AgentLink& l2 = rig.linkUp(2);
  rig.said(l2);
  // Released after link 2 came up: its ACK goes on link 1, which it came
  // on, and is lost with it.
  CHECK(rig.takeAndRelease() == 1);
  CHECK(rig.said(l1).acked == std::vector<uint64_t>{1});
  CHECK(rig.said(l2).acked.empty());
  rig.linkDown(1);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{1});
}

TEST_CASE(
    "inbound streams: a StreamOpen that arrives late on an older link leaves the stream on the newer one",
    "[agent][inbound][links]") {
  // Written on link 1 before the sender gave it up, read after link 2's:
  // the sender sends on link 2, so the stream and its credits stay there.
  ReplayRig rig;
  AgentLink& l1 = rig.linkUp(1);
  AgentLink& l2 = rig.linkUp(2);
  CHECK(l1.in_streams.count(42) == 0);
  CHECK(rig.inbound.onStreamOpen(l1, peer::StreamOpen{42, "cam"}).empty());
  CHECK(l1.in_streams.count(42) == 0);
  CHECK(l2.in_streams.count(42) == 1);
  size_t on_l2 = 0;
  for (const SlotEntry& e : rig.consumers[0].session->slots)
    on_l2 += e.state == SlotState::kCredited && e.link_id == 2;
  CHECK(on_l2 == 4);
  rig.said(l2);
  REQUIRE(rig.land(l2, 1));
  CHECK(rig.takeAndRelease() == 1);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{1});
}
