// SenderMemory on its own: what the consumer's daemon keeps per sender
// stream to answer replays, and the bounds a peer cannot push it past -- the
// watermark and the gaps it gives up on, the streams a peer may leave behind,
// the answers each keeps, and what is forgotten when (closed, a new instance
// of the peer, long unused).
#include <catch2/catch.hpp>

#include "agent/inbound_streams.h"
#include "agent/sender_memory.h"

using namespace framelink;

namespace {

constexpr PeerId kPeer = 3;
constexpr PeerId kOtherPeer = 4;

struct MemoryRig {
  Metrics metrics;
  ManualClock clock;
  InboundLimits limits;
  SenderMemory memory{metrics, clock, limits};

  SenderMemory::Stream& stream(uint64_t sid, uint64_t instance = 1, PeerId peer = kPeer) {
    return memory.at(memory.idOf(peer, instance, sid));
  }
  uint64_t forgotten() const { return metrics.counters.sender_streams_forgotten.load(); }
};

}  // namespace

TEST_CASE("sender memory: one id per (peer, instance, stream), found again, never made by a lookup",
          "[sender_memory]") {
  MemoryRig rig;
  CHECK(rig.memory.find(kPeer, 1, 42) == nullptr);
  CHECK_FALSE(rig.memory.remembers(kPeer));
  const uint64_t id = rig.memory.idOf(kPeer, 1, 42);
  CHECK(rig.memory.idOf(kPeer, 1, 42) == id);
  CHECK(rig.memory.idOf(kPeer, 2, 42) != id);  // a restarted sender's stream 42 is another
  CHECK(rig.memory.idOf(kOtherPeer, 1, 42) != id);
  CHECK(rig.memory.find(kPeer, 1, 42) == rig.memory.find(id));
  CHECK(rig.memory.find(kPeer, 1, 43) == nullptr);
  CHECK(rig.memory.size() == 3);
  CHECK(rig.memory.remembers(kPeer));
}

TEST_CASE("sender memory: the watermark moves over answered sequences and waits at a gap",
          "[sender_memory]") {
  MemoryRig rig;
  auto& in = rig.stream(42);
  rig.memory.markAnswered(in, 1);
  rig.memory.markAnswered(in, 2);
  rig.memory.markAnswered(in, 4);
  CHECK(in.answered_to == 2);
  CHECK(in.answered_above.size() == 1);
  CHECK(SenderMemory::answered(in, 4));
  CHECK_FALSE(SenderMemory::answered(in, 3));  // its first copy never arrived: a replay is new
  CHECK_FALSE(rig.memory.answeredBefore(kPeer, 1, 42, 3));
  CHECK(rig.memory.answeredBefore(kPeer, 1, 42, 2));
  rig.memory.markAnswered(in, 3);
  CHECK(in.answered_to == 4);
  CHECK(in.answered_above.empty());
  // Asked for again after a CRC mismatch: its next copy is not a replay.
  rig.memory.askedAgain(in, 4);
  CHECK_FALSE(rig.memory.answeredBefore(kPeer, 1, 42, 4));
}

TEST_CASE("sender memory: a gap open for as many answers as the stream keeps is passed, and counted",
          "[sender_memory]") {
  MemoryRig rig;
  rig.limits.remembered_per_peer = 64;  // one stream: it keeps 64
  auto& in = rig.stream(42);
  REQUIRE(rig.memory.rememberCap(kPeer) == 64);
  for (uint64_t seq = 3; seq <= 3 + 64; ++seq) rig.memory.markAnswered(in, seq);  // 1 and 2 never came
  CHECK(in.answered_to == 3 + 64);
  CHECK(in.answered_above.empty());
  CHECK(rig.metrics.counters.answer_gaps_forgotten.load() == 2);
  CHECK(SenderMemory::answered(in, 1));  // a late replay is answered "unknown", never delivered
}

TEST_CASE("sender memory: what each stream keeps shares the peer's bound, within kMin and kMaxRemembered",
          "[sender_memory]") {
  MemoryRig rig;
  rig.limits.remembered_per_peer = 1024;
  rig.stream(1);
  CHECK(rig.memory.rememberCap(kPeer) == 1024);
  rig.stream(2);
  CHECK(rig.memory.rememberCap(kPeer) == 512);
  for (uint64_t sid = 3; sid <= 100; ++sid) rig.stream(sid);
  CHECK(rig.memory.rememberCap(kPeer) == SenderMemory::kMinRemembered);
  CHECK(rig.memory.rememberCap(kOtherPeer) == 1024);
  rig.limits.remembered_per_peer = size_t{1} << 30;
  CHECK(rig.memory.rememberCap(kOtherPeer) == SenderMemory::kMaxRemembered);
  rig.limits.remembered_per_peer = 1024;

  // Releases, refusals and copies asked for again keep the newest, each up to the cap.
  auto& in = rig.stream(1);
  for (uint64_t seq = 1; seq <= 200; ++seq) {
    rig.memory.released(in, {seq, 1, 0});
    rig.memory.refused(in, seq, FL_ERR_NO_CONSUMER);
    rig.memory.askedAgain(in, seq);
  }
  CHECK(in.released.size() == SenderMemory::kMinRemembered);
  CHECK(in.released.front().sequence == 200 - SenderMemory::kMinRemembered + 1);
  CHECK(in.refused.size() == SenderMemory::kMinRemembered);
  CHECK(in.refused.begin()->first == 200 - SenderMemory::kMinRemembered + 1);
  CHECK(in.resend.size() == SenderMemory::kMinRemembered);
  CHECK(rig.memory.answersKept(kPeer) == 3 * SenderMemory::kMinRemembered);
}

TEST_CASE("sender memory: a peer at its stream bound loses its oldest unused stream, never one in use",
          "[sender_memory]") {
  MemoryRig rig;
  rig.limits.max_in_states_per_peer = 3;
  rig.memory.countOpen(kPeer, 1, 1, +1);  // open on a link
  rig.stream(2).held.insert(7);           // a consumer holds a frame of it
  rig.stream(3);
  rig.clock.advanceMs(1);
  rig.stream(4, 2);  // another instance's: same peer, the bound counts it
  REQUIRE(rig.memory.size() == 4);
  // 4 >= 3: the oldest with nothing open or held goes (3, not the newer 4).
  CHECK(rig.memory.makeRoom(kPeer, 1, 5));
  CHECK(rig.forgotten() == 1);
  CHECK(rig.memory.find(kPeer, 1, 3) == nullptr);
  CHECK(rig.memory.find(kPeer, 2, 4) != nullptr);
  CHECK(rig.memory.makeRoom(kPeer, 1, 1));  // remembered already: no room needed
  rig.memory.countOpen(kPeer, 2, 4, +1);
  CHECK_FALSE(rig.memory.makeRoom(kPeer, 1, 5));  // every one in use
  CHECK(rig.forgotten() == 1);
  CHECK(rig.memory.makeRoom(kOtherPeer, 1, 5));  // another peer has its own bound
}

TEST_CASE("sender memory: closed, superseded and idle streams go unless a frame of theirs is held",
          "[sender_memory]") {
  MemoryRig rig;
  rig.limits.forget_idle_ns = 1'000'000'000;
  rig.stream(1);
  rig.stream(2).held.insert(9);
  rig.memory.closed(kPeer, 1, 1);
  rig.memory.closed(kPeer, 1, 2);
  CHECK(rig.memory.find(kPeer, 1, 1) == nullptr);
  CHECK(rig.memory.find(kPeer, 1, 2) != nullptr);
  CHECK(rig.memory.framesHeld() == 1);

  // A new instance of the peer links: its earlier instance's streams go, but the held one.
  rig.stream(3);
  rig.stream(4, 7);
  rig.memory.forgetOtherInstances(kPeer, 7);
  CHECK(rig.memory.find(kPeer, 1, 3) == nullptr);
  CHECK(rig.memory.find(kPeer, 1, 2) != nullptr);
  CHECK(rig.memory.find(kPeer, 7, 4) != nullptr);

  // Unused for forget_idle_ns and open on no link: forgotten, counted.
  rig.memory.countOpen(kPeer, 7, 5, +1);
  rig.clock.advanceMs(999);
  rig.memory.forgetIdle(rig.clock.nowNs());
  CHECK(rig.memory.size() == 3);
  rig.clock.advanceMs(1);
  rig.memory.forgetIdle(rig.clock.nowNs());
  CHECK(rig.memory.find(kPeer, 7, 4) == nullptr);
  CHECK(rig.memory.find(kPeer, 7, 5) != nullptr);  // open on a link
  CHECK(rig.memory.find(kPeer, 1, 2) != nullptr);  // a frame held
  CHECK(rig.forgotten() == 1);
  rig.memory.countOpen(kPeer, 7, 5, -1);
  rig.memory.countOpen(kPeer, 7, 5, -1);  // never below zero
  CHECK(rig.memory.find(kPeer, 7, 5)->open_links == 0);
}
