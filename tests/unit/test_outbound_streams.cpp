// The producer side (outbound_streams.cpp) through the data agent:
// sequencing, posting into credits, ACK/NACK, resend, replay on a new link in
// sequence order, stream close, and the credit and ACK deadlines on the
// agent's manual clock; then on its own, the deadlines on simulated time and
// the order of streams on a link.  Grants, regions and CreditLow:
// test_outbound_credits.cpp.
#include <atomic>
#include <optional>

#include "agent/outbound_streams.h"
#include "agent/peer_messages.h"
#include "agent_fixture.h"
#include "forwarding_transport.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

TEST_CASE("producer side: credits, ACK, NACK and validation", "[agent][producer]") {
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 4, 64 * 1024);
  const v1::StreamOpen open = attachAndOpen(f, producer);
  CHECK(open.name() == "cam");
  uint64_t stream_id = open.stream_id();

  auto fill = [&](uint32_t slot, uint64_t frame_id, size_t n) {
    fl_slot_header* sh = producer.session->segments->slotHeader(slot);
    std::memset(sh, 0, sizeof(*sh));
    sh->frame_id = frame_id;
    sh->group_id = frame_id / 25;
    std::memset(producer.session->segments->slot(slot), int(frame_id), n);
  };
  auto grantOne = [&](uint64_t credit_id, uint64_t length) {
    f.peerSays(creditGrant(stream_id, {{credit_id, length}}));
  };
  // The peer side exposes a buffer under credit 500 so the frame can land.
  // Shared with the transport (keepalive): a frame still landing while a
  // section ends must not write into freed memory.
  auto landing_memory = std::make_shared<std::vector<uint8_t>>(64 * 1024);
  std::vector<uint8_t>& landing = *landing_memory;
  transport::LocalCredit lc;
  lc.keepalive = landing_memory;
  lc.credit_id = 500;
  lc.buffer = landing.data();
  lc.capacity = landing.size();
  REQUIRE(f.pair.b->exposeCredit(lc).ok());

  SECTION("a frame waits for a credit, is sent into it, and completes DELIVERED on ACK") {
    fill(0, 11, 3000);
    producer.push(0, 3000);
    CHECK(producer.idleFor(50ms));  // no credit yet: nothing completes
    grantOne(500, landing.size());
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 11);
    CHECK(arrived.header.sequence == 1);
    CHECK(arrived.header.length == 3000);
    CHECK(landing[0] == 11);
    CHECK(landing[2999] == 11);
    CHECK(producer.idleFor(50ms));  // sent is not delivered
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(1);
    f.peerSays(ack);
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 0);
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == 1);
    CHECK(d.frame_id == 11);
  }

  SECTION("a NACK fails the frame with the peer's code") {
    fill(1, 12, 10);
    producer.push(1, 10);
    grantOne(500, landing.size());
    waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    v1::PeerMessage nack;
    nack.mutable_nack()->set_stream_id(stream_id);
    nack.mutable_nack()->set_sequence(1);
    nack.mutable_nack()->set_code(v1::ERROR_CODE_UNKNOWN_STREAM);
    f.peerSays(nack);
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 1);
    CHECK(d.status == FL_ERR_UNKNOWN_STREAM);
  }

  SECTION("a CRC mismatch NACK sends the frame again, three times at most, then fails it") {
    fill(1, 12, 10);
    producer.push(1, 10);
    v1::PeerMessage nack;
    nack.mutable_nack()->set_stream_id(stream_id);
    nack.mutable_nack()->set_sequence(1);
    nack.mutable_nack()->set_code(v1::ERROR_CODE_CRC_MISMATCH);
    for (int attempt = 0; attempt < 4; ++attempt) {
      INFO("attempt " << attempt);
      // Each copy needs a credit of its own; the same buffer is granted again.
      if (attempt > 0) REQUIRE(f.pair.b->exposeCredit(lc).ok());
      grantOne(500, landing.size());
      auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
      CHECK(arrived.header.sequence == 1);  // the same frame, not a new one
      CHECK(arrived.header.frame_id == 12);
      if (attempt < 3) CHECK(producer.idleFor(20ms));
      f.peerSays(nack);
    }
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 1);
    CHECK(d.status == FL_ERR_CRC_MISMATCH);
    CHECK(f.metrics.counters.frames_resent_crc.load() == 3);
  }

  SECTION("a frame larger than the consumer's slot fails TOO_LARGE and the credit stays for the next") {
    fill(0, 13, 5000);
    producer.push(0, 5000);
    grantOne(500, 4096);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_ERR_TOO_LARGE);
    fill(1, 14, 100);
    producer.push(1, 100);
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 14);
    CHECK(arrived.header.credit_id == 500);
  }

  SECTION("bad descriptors get specific statuses, echo the frame id and do not disturb good frames") {
    // Each refusal's completion carries the id in the slot's header, as any completion does.
    auto refused = [&](int status, uint64_t frame_id) {
      INFO("refused with status " << status);
      fl_completion_desc d = producer.pop();
      CHECK(d.status == status);
      CHECK(d.frame_id == frame_id);
      return d;
    };
    producer.push(9, 10);
    refused(FL_ERR_BAD_SLOT, 0);  // no slot, so no header to read an id from
    fill(0, 21, 10);
    producer.push(0, 64 * 1024 + 1);
    refused(FL_ERR_TOO_LARGE, 21);
    producer.push(0, 10, 1);
    refused(FL_ERR_BAD_DESCRIPTOR, 21);
    fill(2, 15, 10);
    producer.session->segments->slotHeader(2)->attr_length = 9999;
    producer.push(2, 10);
    refused(FL_ERR_BAD_METADATA, 15);
    fill(3, 16, 10);
    producer.push(3, 10);
    producer.push(3, 10);
    fl_completion_desc twice = refused(FL_ERR_SLOT_NOT_OWNED, 16);
    CHECK(twice.slot == 3);
    grantOne(500, landing.size());
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 16);
  }

  SECTION("a link that breaks: the unacknowledged frame goes again on the next link, same sequence") {
    fill(0, 17, 10);
    producer.push(0, 10);
    grantOne(500, landing.size());
    auto first = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    auto landing2 = exposeLanding(*second.b, 501, 64 * 1024);
    auto& peer_side = *second.b;
    f.linkUp(2, std::move(second.a));
    auto reopen = f.capture.next([](auto& m) { return m.has_stream_open(); });
    CHECK(reopen.stream_open().stream_id() == stream_id);  // the stream keeps its id and sequences
    f.peerSays(creditGrant(stream_id, {{501, landing2->size()}}), 2);
    auto again = waitEvent(peer_side, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(again.header.sequence == first.header.sequence);
    CHECK(again.header.frame_id == 17);
    CHECK((*landing2)[0] == 17);
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(again.header.sequence);
    f.peerSays(ack, 2);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == first.header.sequence);
    CHECK(f.metrics.counters.frames_replayed.load() == 1);
  }

  SECTION("an ACK the receiver repeats on the next link settles a frame waiting for its replay") {
    fill(0, 18, 10);
    producer.push(0, 10);
    grantOne(500, landing.size());
    auto first = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    f.linkUp(2, std::move(second.a));
    // No credit on the new link: the receiver's repeated ACK alone completes it.
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(first.header.sequence);
    f.peerSays(ack, 2);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.frame_id == 18);
    CHECK(f.metrics.counters.acks_for_replays.load() == 1);
  }

  SECTION("frames a NACK and a broken link send back go again in sequence order") {
    // Four frames in four credits; the receiver refuses 1 and 2 (their credits
    // were withdrawn), then the link breaks with 3 and 4 unacknowledged.  The
    // next link carries 1, 2, 3, 4 -- in that order: replays go first.
    for (uint64_t id = 501; id <= 503; ++id) exposeLanding(*f.pair.b, id, 4096);
    for (uint32_t slot = 0; slot < 4; ++slot) {
      fill(slot, 30 + slot, 10);
      producer.push(slot, 10);
    }
    for (uint64_t id = 500; id <= 503; ++id) grantOne(id, 4096);
    for (int i = 0; i < 4; ++i) waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    for (uint64_t seq : {1, 2}) {
      v1::PeerMessage nack;
      nack.mutable_nack()->set_stream_id(stream_id);
      nack.mutable_nack()->set_sequence(seq);
      nack.mutable_nack()->set_code(v1::ERROR_CODE_UNKNOWN_CREDIT);
      f.peerSays(nack);
    }
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    for (uint64_t id = 600; id < 604; ++id) exposeLanding(*second.b, id, 4096);
    auto& peer_side = *second.b;
    f.linkUp(2, std::move(second.a));
    f.capture.next([](auto& m) { return m.has_stream_open(); });
    f.peerSays(creditGrant(stream_id, {{600, 4096}, {601, 4096}, {602, 4096}, {603, 4096}}), 2);
    std::vector<uint64_t> order;
    for (int i = 0; i < 4; ++i) {
      order.push_back(waitEvent(peer_side, transport::TransportEvent::Kind::kFrameArrived).header.sequence);
    }
    CHECK(order == std::vector<uint64_t>{1, 2, 3, 4});
  }

  SECTION("a frame too large for one consumer's slots takes another consumer's larger credit") {
    // Two consumers' credits: a small one first.
    f.peerSays(creditGrant(stream_id, {{501, 4096}, {500, landing.size()}}));
    fill(0, 19, 5000);
    producer.push(0, 5000);
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 19);
    CHECK(arrived.header.credit_id == 500);
    // The next large frame waits for a large credit (one exists), not TOO_LARGE;
    // a small frame behind it keeps the stream's order and waits too.
    fill(1, 20, 5000);
    producer.push(1, 5000);
    fill(2, 21, 100);
    producer.push(2, 100);
    CHECK(producer.idleFor(50ms));
    exposeLanding(*f.pair.b, 501, 4096);
    REQUIRE(f.pair.b->exposeCredit(lc).ok());
    grantOne(500, landing.size());
    auto second = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(second.header.frame_id == 20);
    CHECK(second.header.credit_id == 500);
    auto third = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(third.header.frame_id == 21);
    CHECK(third.header.credit_id == 501);
  }
}

namespace {

// Forwards to a real transport and remembers the memory key of the last post
// (kNoKey for a request without one).
class KeyRecorder final : public framelink::testing::ForwardingTransport {
 public:
  static constexpr uint64_t kNoKey = ~uint64_t{0};
  using ForwardingTransport::ForwardingTransport;
  std::shared_ptr<std::atomic<uint64_t>> last_key = std::make_shared<std::atomic<uint64_t>>(0);

  transport::PostResult post(const transport::SendRequest& r) noexcept override {
    last_key->store(r.local_key ? *r.local_key : kNoKey);
    return ForwardingTransport::post(r);
  }
};

}  // namespace

TEST_CASE("producer side: a frame is posted under its segment's key from the registration at attach",
          "[agent][producer]") {
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  const bool registered = GENERATE(true, false);
  if (registered) producer.session->segments->holdRegistration(SegmentRegistration{nullptr, 0xBEEF});
  CHECK(producer.session->segments->localKey() ==
        (registered ? std::optional<uint32_t>(0xBEEF) : std::nullopt));
  auto recorder = std::make_unique<KeyRecorder>(std::move(f.pair.a));
  auto last_key = recorder->last_key;
  const uint64_t stream_id = attachAndOpen(f, producer, 1, std::move(recorder)).stream_id();
  auto landing = exposeLanding(*f.pair.b, 700, 4096);
  producer.push(0, 100);
  f.peerSays(creditGrant(stream_id, {{700, 4096}}));
  waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
  CHECK(last_key->load() == (registered ? 0xBEEF : KeyRecorder::kNoKey));
}

TEST_CASE("producer side: a stream is closed on the link when its last producer leaves",
          "[agent][producer][streams]") {
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam-1", 2, 4096);
  const v1::StreamOpen open = attachAndOpen(f, producer);
  CHECK(open.name() == "cam-1");
  f.agent->post(CmdClientGone{1});
  auto close = f.capture.next([](auto& m) { return m.has_stream_close(); });
  CHECK(close.stream_close().stream_id() == open.stream_id());
  CHECK(f.metrics.counters.streams_forgotten.load() == 1);
  // Not announced again on the next link.
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  TcpPair second = makeTcpPair();
  TestClient other = makeClient(2, FL_ROLE_PRODUCER, "cam-2", 2, 4096);
  const v1::StreamOpen reopen = attachAndOpen(f, other, 2, std::move(second.a));
  CHECK(reopen.name() == "cam-2");
}

TEST_CASE("producer side: a frame sent on a link that breaks for good ends TIMEOUT, not FAILED",
          "[agent][timeout]") {
  // It reached the peer: its consumer may have released it, so no status may
  // say that nobody did.
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 300; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  sendOneFrame(f, producer, 10);
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  // The frame waits for the next link from the moment the link went down.
  waitUntil([&] { return f.metrics.counters.frames_replayed.load() == 1; }, "the frame is queued for replay");
  f.clock.advanceMs(299);
  CHECK(producer.idleFor(100ms));  // a millisecond short of the credit timeout: still waiting
  f.clock.advanceMs(11);           // past it, and past the agent's 10 ms deadline tick
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_TIMEOUT);
}

TEST_CASE("producer side: an ACK that comes after the peer's clean Fin still settles its frame",
          "[agent][fin]") {
  // The peer shuts down: its last ACKs are on the data channel, its Fin on
  // the Session, which may overtake them.
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  const uint64_t stream_id = sendOneFrame(f, producer, 10);
  v1::PeerMessage fin;
  fin.mutable_fin()->set_code(v1::ERROR_CODE_SHUTDOWN);
  fin.mutable_fin()->set_reason("daemon shutting down");
  f.peerSays(fin);
  waitUntil([&] { return f.sessions_cancelled.load() == 1; }, "the agent takes the Fin first");
  v1::ControlBatch batch;
  auto* ack = batch.add_messages()->mutable_ack();
  ack->set_stream_id(stream_id);
  ack->add_sequences(1);
  REQUIRE(f.pair.b->postControl(batch.SerializeAsString()) == transport::PostResult::kOk);
  f.pair.b->flush();
  const fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_OK);
  CHECK(f.metrics.counters.frames_delivered.load() == 1);
}

TEST_CASE("producer side: a frame never sent whose link does not come back fails LINK_LOST",
          "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 300; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  attachAndOpen(f, producer);
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  producer.push(0, 10);  // no credit was ever granted: it never left
  waitUntil([&] { return f.metrics.counters.frames_submitted.load() == 1; }, "the agent takes the frame");
  f.clock.advanceMs(311);
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_LINK_LOST);
}

TEST_CASE("producer side: a frame for a peer that never linked fails NO_LINK, not LINK_LOST",
          "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 300; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});  // no link to "remote" ever comes up
  producer.push(0, 10);
  waitUntil([&] { return f.metrics.counters.frames_submitted.load() == 1; }, "the agent takes the frame");
  f.clock.advanceMs(299);
  producer.push(1, 10);
  waitUntil([&] { return f.metrics.counters.frames_submitted.load() == 2; }, "the agent takes the frame");
  CHECK(producer.idleFor(20ms));  // nothing fails before its deadline
  f.clock.advanceMs(12);
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_NO_LINK);
  CHECK(d.slot == 0);
  // Once a link has been up, a frame that finds none is LINK_LOST again.
  f.linkUp();
  f.capture.next([](auto& m) { return m.has_stream_open(); });
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  // The deadline passes after the agent saw the link go down, not while it
  // was still up (the frame would wait for a consumer then).
  waitUntil([&] { return f.metrics.counters.link_failures.load() == 1; }, "the agent sees the link go down");
  f.clock.advanceMs(300);
  d = producer.pop();
  CHECK(d.status == FL_ERR_LINK_LOST);
  CHECK(d.slot == 1);
}

TEST_CASE("producer side: a replay never fails TOO_LARGE on a link with only smaller credits", "[agent]") {
  // Sent into a 4 KiB credit, then the link breaks; the next link grants only
  // 1 KiB credits.  The frame may already be at the 4 KiB consumer: it waits.
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  sendOneFrame(f, producer, 3000);
  TcpPair second = makeTcpPair();
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  f.linkUp(2, std::move(second.a));
  auto reopen = f.capture.next([](auto& m) { return m.has_stream_open(); });
  f.peerSays(creditGrant(reopen.stream_open().stream_id(), {{8, 1024}}), 2);
  CHECK(producer.idleFor(300ms));  // no TOO_LARGE (nor anything else): it waits
}

TEST_CASE("producer side: no credit within the credit timeout fails NO_CONSUMER", "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 200; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  attachAndOpen(f, producer);
  producer.push(0, 10);
  waitUntil([&] { return f.metrics.counters.frames_submitted.load() == 1; }, "the agent takes the frame");
  f.clock.advanceMs(199);
  CHECK(producer.idleFor(100ms));  // before the credit timeout: still waiting for a credit
  f.clock.advanceMs(11);           // past it, and past the agent's 10 ms deadline tick
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_NO_CONSUMER);
}

TEST_CASE("producer side: a frame sent and never acknowledged fails TIMEOUT after the ACK timeout",
          "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.ack_timeout_ms = 1000; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  sendOneFrame(f, producer, 10);
  CHECK(producer.idleFor(50ms));  // sent, not acknowledged, and no time has passed
  // The ACK deadline starts when the agent sees its send complete, which it
  // learns from the transport's own thread: move the clock a timeout at a
  // time until the frame fails.  Whatever comes first must be the timeout.
  fl_completion_desc d{};
  auto end = std::chrono::steady_clock::now() + kDeadline;
  while (fl_ring_pop(producer.completion(), producer.cap(), sizeof(d), &d) != FL_RING_OK) {
    if (std::chrono::steady_clock::now() > end) FAIL("no completion within 5 s");
    f.clock.advanceMs(1001);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(d.slot == 0);
  CHECK(d.status == FL_ERR_TIMEOUT);
  CHECK(f.metrics.counters.frames_failed.load() == 1);
}

TEST_CASE("producer side: a stream with no route fails NO_ROUTE", "[agent][route]") {
  AgentFixture f([](Config& c) { c.peers.clear(); });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  producer.session->segments->slotHeader(1)->frame_id = 77;
  producer.push(1, 10);
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_NO_ROUTE);
  CHECK(d.slot == 1);
  CHECK(d.frame_id == 77);
}

// ---------------------------------------------------------------- on its own (OutboundRig)

TEST_CASE("outbound streams: the credit deadline fires when due on the clock, not before",
          "[agent][outbound][timeout]") {
  OutboundRig rig;
  rig.submit(0, 10);
  fl_completion_desc d{};
  rig.clock.advanceMs(199);
  rig.out.checkDeadlines();
  CHECK_FALSE(rig.completed(&d));
  rig.clock.advanceMs(1);
  rig.out.checkDeadlines();
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(d.frame_id == 100);
  CHECK(rig.producer.session->in_progress == 0);
}

TEST_CASE("outbound streams: the ACK deadline runs from the send's completion",
          "[agent][outbound][timeout]") {
  OutboundRig rig;
  auto landing = exposeLanding(*rig.pair.b, 7, 4096);
  rig.submit(1, 10);
  rig.clock.advanceMs(150);  // most of the credit timeout goes by waiting for a credit
  peer::CreditGrant grant;
  grant.stream_id = rig.stream_id;
  grant.credits.push_back(transport::RemoteCredit{7, 4096, 0, 0});
  CHECK(rig.out.onCreditGrant(*rig.link, grant).empty());
  CHECK(rig.producer.session->slots[1].state == SlotState::kPending);  // posted at the end of the round
  CHECK(rig.out.pumpAll() > 0);
  CHECK(rig.producer.session->slots[1].state == SlotState::kPosted);
  rig.out.onSendComplete(waitEvent(*rig.link->transport, transport::TransportEvent::Kind::kSendComplete));
  CHECK(rig.producer.session->slots[1].state == SlotState::kSent);
  fl_completion_desc d{};
  rig.clock.advanceMs(999);  // well past the credit timeout: a sent frame waits for its ACK
  rig.out.checkDeadlines();
  CHECK_FALSE(rig.completed(&d));
  rig.clock.advanceMs(1);
  rig.out.checkDeadlines();
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 1);
  CHECK(d.status == FL_ERR_TIMEOUT);
  // A late ACK for it changes nothing.
  rig.out.onAck(rig.link->peer, rig.stream_id, 1, FL_OK, {});
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.metrics.counters.frames_delivered.load() == 0);
}

TEST_CASE("outbound streams: each round the streams of a peer take turns going first on the link",
          "[agent][outbound]") {
  // Two streams with a frame and a credit each: the one posted first is on
  // the wire first.  Whichever it was in one round, the other goes first in
  // the next, whatever order the grants came in.
  OutboundRig rig;
  TestClient other = makeClient(2, FL_ROLE_PRODUCER, "cam2", 4, 4096);
  AgentClient& other_client = rig.clients.add(other.session);
  rig.out.onProducerAttached(other_client);
  rig.out.onLinkUp(*rig.link);  // announces the new stream
  const uint64_t other_stream = other_client.out_stream;
  REQUIRE(other_stream != rig.stream_id);

  std::vector<uint64_t> first_streams;
  for (int round = 0; round < 4; ++round) {
    const uint64_t credit_a = 1000 + 2 * round;
    const uint64_t credit_b = credit_a + 1;
    auto landing_a = exposeLanding(*rig.pair.b, credit_a, 4096);
    auto landing_b = exposeLanding(*rig.pair.b, credit_b, 4096);
    const uint32_t slot = static_cast<uint32_t>(round);
    rig.submit(slot, 10);
    std::memset(other.session->segments->slotHeader(slot), 0, sizeof(fl_slot_header));
    rig.out.onSubmit(other_client, fl_submit_desc{slot, 0, 10});
    // The grants always come in the same order: the first producer's stream first.
    peer::CreditGrant ga;
    ga.stream_id = rig.stream_id;
    ga.credits.push_back(transport::RemoteCredit{credit_a, 4096, 0, 0});
    peer::CreditGrant gb;
    gb.stream_id = other_stream;
    gb.credits.push_back(transport::RemoteCredit{credit_b, 4096, 0, 0});
    REQUIRE(rig.out.onCreditGrant(*rig.link, ga).empty());
    REQUIRE(rig.out.onCreditGrant(*rig.link, gb).empty());
    REQUIRE(rig.out.pumpAll() > 0);
    const auto first = waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    const auto second = waitEvent(*rig.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(first.header.stream_id != second.header.stream_id);
    first_streams.push_back(first.header.stream_id);
    for (int i = 0; i < 2; ++i) {
      rig.out.onSendComplete(waitEvent(*rig.link->transport, transport::TransportEvent::Kind::kSendComplete));
    }
  }
  CAPTURE(first_streams);
  for (size_t i = 1; i < first_streams.size(); ++i) CHECK(first_streams[i] != first_streams[i - 1]);
}
