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

#include "agent/inbound_streams.h"
#include "agent/peer_messages.h"
#include "agent_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

// InboundStreams on its own with one consumer of "cam" (4 slots) and links
// from one sender ("sender", instance 9) added as the test needs them.
struct InboundRig {
  Metrics metrics;
  Capture capture;  // outlives the links' session writers
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients{metrics, names};
  InboundStreams inbound{metrics, clients, links, names};
  TestClient consumer = makeClient(1, FL_ROLE_CONSUMER, "cam", 4, 4096);
  AgentClient* ac = nullptr;
  std::vector<std::unique_ptr<transport::Transport>> peer_ends;

  InboundRig() {
    ac = &clients.add(consumer.session);
    inbound.onConsumerAttached(*ac);
  }
  ~InboundRig() {
    for (auto& [id, l] : links) {
      if (l.session.writer) l.session.writer->close();
    }
  }

  // A link from the sender, up, with stream 42 ("cam") opened on it.
  AgentLink& linkUp(uint64_t id, uint64_t instance = 9) {
    TcpPair pair = makeTcpPair();
    AgentLink& l = links.add(id);
    l.peer = peers.resolve("sender");
    l.peer_name = "sender";
    l.peer_instance = instance;
    l.transport = std::move(pair.a);
    peer_ends.push_back(std::move(pair.b));
    l.session.writer = std::make_shared<SessionWriter>(
        [this](const v1::PeerMessage& m, bool) { return capture.write(m); }, 60000ms);
    inbound.onLinkUp(l);
    REQUIRE(inbound.onStreamOpen(l, peer::StreamOpen{42, "cam"}).empty());
    return l;
  }
  // The link goes, as the data agent takes it down.
  void linkDown(uint64_t id) {
    AgentLink* l = links.find(id);
    REQUIRE(l != nullptr);
    inbound.onLinkDown(*l);
    l->session.writer->close();
    links.erase(id);
    inbound.retractCreditsOfLink(id);
  }

  // Sequence `seq` of stream 42 lands in a slot credited on `l`; false when
  // none is.
  bool land(AgentLink& l, uint64_t seq) {
    for (uint32_t s = 0; s < consumer.session->slots.size(); ++s) {
      const SlotEntry& e = consumer.session->slots[s];
      if (e.state != SlotState::kCredited || e.link_id != l.id) continue;
      transport::TransportEvent ev;
      ev.kind = transport::TransportEvent::Kind::kFrameArrived;
      ev.header.stream_id = 42;
      ev.header.sequence = seq;
      ev.header.credit_id = e.credit_id;
      ev.header.length = 10;
      inbound.onFrameArrived(l, ev);
      return true;
    }
    return false;
  }
  // The consumer takes the frame delivered next and releases it.
  uint64_t takeAndRelease() {
    fl_completion_desc d{};
    if (fl_ring_pop(consumer.completion(), consumer.cap(), sizeof d, &d) != FL_RING_OK) return 0;
    inbound.onRelease(*ac, fl_submit_desc{d.slot, 0, 0});
    return d.sequence;
  }

  // The end of a round: what goes on each link's transport is decided.  The
  // ACKed sequences and NACKs of link `l` so far, taken off its batch.
  struct Said {
    std::vector<uint64_t> acked;
    std::vector<std::pair<uint64_t, int>> nacked;  // (sequence, code)
  };
  Said said(AgentLink& l) {
    inbound.flushControl();
    Said out;
    for (const auto& m : l.control.messages()) {
      const peer::Message decoded = peer::decode(m);
      if (const auto* ack = std::get_if<peer::Ack>(&decoded)) {
        out.acked.insert(out.acked.end(), ack->sequences.begin(), ack->sequences.end());
      }
      if (const auto* nack = std::get_if<peer::Nack>(&decoded))
        out.nacked.emplace_back(nack->sequence, nack->code);
    }
    l.control.Clear();
    return out;
  }
};

}  // namespace

TEST_CASE("inbound streams: a frame whose first copy never arrived is delivered when replayed",
          "[agent][inbound][replay]") {
  // Sequence 1 is lost on the way (its rdma write went into a withdrawn
  // credit, or the link broke under it); 2 and 3 arrive and are released.
  InboundRig rig;
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
  InboundRig rig;
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
  InboundRig rig;
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
  InboundRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 1));  // the consumer holds it
  AgentLink& l2 = rig.linkUp(2);
  rig.said(l1);
  rig.said(l2);
  // The stream moved to link 2: link 1's credits came back for it.
  REQUIRE(rig.land(l2, 2));
  fl_completion_desc d{};
  REQUIRE(rig.consumer.pop().sequence == 1);
  d = rig.consumer.pop();
  REQUIRE(d.sequence == 2);
  rig.inbound.onRelease(*rig.ac, fl_submit_desc{d.slot, 0, 0});
  CHECK(rig.said(l1).acked.empty());
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{2});
  // Frame 1 came on link 1, which is still up: its ACK goes there.
  for (uint32_t s = 0; s < 4; ++s) {
    if (rig.consumer.session->slots[s].state == SlotState::kDelivered) {
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
  InboundRig rig;
  AgentLink& l1 = rig.linkUp(1);
  REQUIRE(rig.land(l1, 1));
  CHECK(rig.takeAndRelease() == 1);
  rig.said(l1);
  CHECK(rig.inbound.creditsOutstanding() == 4);
  AgentLink& l2 = rig.linkUp(2);
  CHECK(l1.in_streams.count(42) == 0);
  size_t on_l2 = 0;
  for (const SlotEntry& e : rig.consumer.session->slots)
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
  InboundRig rig;
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
  InboundRig rig;
  AgentLink& l1 = rig.linkUp(1);
  AgentLink& l2 = rig.linkUp(2);
  CHECK(l1.in_streams.count(42) == 0);
  CHECK(rig.inbound.onStreamOpen(l1, peer::StreamOpen{42, "cam"}).empty());
  CHECK(l1.in_streams.count(42) == 0);
  CHECK(l2.in_streams.count(42) == 1);
  size_t on_l2 = 0;
  for (const SlotEntry& e : rig.consumer.session->slots)
    on_l2 += e.state == SlotState::kCredited && e.link_id == 2;
  CHECK(on_l2 == 4);
  rig.said(l2);
  REQUIRE(rig.land(l2, 1));
  CHECK(rig.takeAndRelease() == 1);
  CHECK(rig.said(l2).acked == std::vector<uint64_t>{1});
}
