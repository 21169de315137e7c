// The consumer side (inbound_streams.cpp) through the data agent: credits,
// arrival, CRC32C, duplicate suppression, release and the ACKs repeated on a
// new link.
#include <set>

#include "inbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

TEST_CASE("consumer side: StreamOpen is answered with one credit per free slot", "[agent][credits]") {
  AgentFixture f;
  TestClient consumer = makeClient(1, FL_ROLE_CONSUMER, "cam", 4, 64 * 1024);
  f.agent->post(CmdClientAttached{consumer.session});
  f.linkUp();
  v1::PeerMessage open;
  open.mutable_stream_open()->set_stream_id(42);
  open.mutable_stream_open()->set_name("cam");
  f.peerSays(open);
  auto grant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
  CHECK(grant.credit_grant().stream_id() == 42);
  // The consumer's slots are announced once, as a region; each credit is a
  // slot credit (8 bytes) naming it.
  CHECK(grant.credit_grant().credits_size() == 0);
  REQUIRE(grant.credit_grant().regions_size() == 1);
  const v1::SlotRegion region = grant.credit_grant().regions(0);
  CHECK(region.slot_bytes() == 64 * 1024);
  CHECK(region.slot_count() == 4);
  REQUIRE(grant.credit_grant().slot_credits_size() == 4);
  std::set<uint32_t> slots;
  for (uint64_t id : grant.credit_grant().slot_credits()) {
    CHECK(peer::slotCreditRegion(id) == region.region_id());
    slots.insert(peer::slotCreditSlot(id));
  }
  CHECK(slots == std::set<uint32_t>{0, 1, 2, 3});

  SECTION("a frame into a credit is delivered, its release ACKs it and re-grants the slot") {
    std::vector<uint8_t> payload(1000);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7);
    transport::SendRequest req;
    req.cookie = 1;
    req.header.stream_id = 42;
    req.header.sequence = 1;
    req.header.credit_id = grant.credit_grant().slot_credits(0);
    req.header.frame_id = 99;
    req.header.group_id = 5;
    req.header.length = payload.size();
    req.header.attr_length = 3;
    std::memcpy(req.header.attrs, "abc", 3);
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    fl_completion_desc d = consumer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == 1);
    CHECK(d.frame_id == 99);
    CHECK(d.length == 1000);
    const fl_slot_header* sh = consumer.session->segments->slotHeader(d.slot);
    CHECK(sh->group_id == 5);
    CHECK(sh->attr_length == 3);
    CHECK(std::memcmp(sh->attrs, "abc", 3) == 0);
    CHECK(std::memcmp(consumer.session->segments->slot(d.slot), payload.data(), payload.size()) == 0);

    consumer.push(d.slot, 0);
    auto ack = f.capture.next([](auto& m) { return m.has_ack(); });
    CHECK(ack.ack().stream_id() == 42);
    REQUIRE(ack.ack().sequences_size() == 1);
    CHECK(ack.ack().sequences(0) == 1);
    auto regrant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(regrant.credit_grant().regions_size() == 0);  // announced already on this link
    CHECK(regrant.credit_grant().credits_size() == 0);
    REQUIRE(regrant.credit_grant().slot_credits_size() == 1);
    const uint64_t again = regrant.credit_grant().slot_credits(0);
    CHECK(peer::slotCreditSlot(again) == d.slot);
    // A new generation: not the credit the frame came in.
    CHECK(again != req.header.credit_id);

    SECTION("the same frame replayed on a new link is dropped and ACKed again, not delivered twice") {
      f.agent->post(CmdLinkDown{1, "test cut the link"});
      TcpPair second = makeTcpPair();
      auto& sender = *second.a;  // the test plays the sender on the new link
      f.capture.watch(&sender);
      f.linkUp(2, std::move(second.b));
      f.peerSays(open, 2);
      auto grant2 = f.capture.next([](auto& m) { return m.has_credit_grant(); });
      CHECK(grant2.credit_grant().regions_size() == 1);  // a new link hears of the region anew
      REQUIRE(grant2.credit_grant().slot_credits_size() >= 1);
      req.header.credit_id = grant2.credit_grant().slot_credits(0);
      req.credit.credit_id = req.header.credit_id;
      REQUIRE(sender.post(req) == transport::PostResult::kOk);
      sendDone(sender);
      auto ack2 = f.capture.next([](auto& m) { return m.has_ack(); });
      REQUIRE(ack2.ack().sequences_size() == 1);
      CHECK(ack2.ack().sequences(0) == 1);
      CHECK(consumer.idleFor(100ms));  // nothing delivered a second time
      CHECK(f.metrics.counters.duplicates_dropped.load() == 1);

      req.header.sequence = 2;  // a new frame after the replay is delivered
      req.header.credit_id =
          grant2.credit_grant().slot_credits(1 % grant2.credit_grant().slot_credits_size());
      req.credit.credit_id = req.header.credit_id;
      REQUIRE(sender.post(req) == transport::PostResult::kOk);
      sendDone(sender);
      fl_completion_desc d2 = consumer.pop();
      CHECK(d2.status == FL_OK);
      CHECK(d2.sequence == 2);
    }

    SECTION("releasing it again is a double release, reported to the consumer only") {
      consumer.push(d.slot, 0);
      fl_completion_desc err = consumer.pop();
      CHECK(err.status == FL_ERR_DOUBLE_RELEASE);
      CHECK(err.slot == d.slot);
    }

    SECTION("its ACK is sent again on the next link, before any replay (the first may be lost)") {
      f.agent->post(CmdLinkDown{1, "test cut the link"});
      TcpPair second = makeTcpPair();
      f.capture.watch(second.a.get());
      f.linkUp(2, std::move(second.b));
      auto again = f.capture.next([](auto& m) { return m.has_ack(); });
      CHECK(again.ack().stream_id() == 42);
      REQUIRE(again.ack().sequences_size() == 1);
      CHECK(again.ack().sequences(0) == 1);
    }
  }

  SECTION("a stream the sender closes gives its credits back to the consumer for the next stream") {
    v1::PeerMessage close;
    close.mutable_stream_close()->set_stream_id(42);
    f.peerSays(close);
    v1::PeerMessage open2;
    open2.mutable_stream_open()->set_stream_id(43);
    open2.mutable_stream_open()->set_name("cam");
    f.peerSays(open2);
    auto grant2 = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(grant2.credit_grant().stream_id() == 43);
    CHECK(grant2.credit_grant().slot_credits_size() == 4);  // every slot again, none left on stream 42
    CHECK(grant2.credit_grant().regions_size() == 0);       // the region is the link's, not the stream's
  }

  SECTION("a frame for a credit never granted is NACKed and the link stays usable") {
    std::vector<uint8_t> payload(10, 1);
    transport::SendRequest req;
    req.cookie = 2;
    req.header.stream_id = 42;
    req.header.sequence = 7;
    req.header.credit_id = 123456789;
    req.header.length = payload.size();
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    auto nack = f.capture.next([](auto& m) { return m.has_nack(); });
    CHECK(nack.nack().sequence() == 7);
    CHECK(int(nack.nack().code()) == FL_ERR_UNKNOWN_CREDIT);
    CHECK(consumer.idleFor(50ms));
  }

  SECTION("a frame with a wrong CRC32C is NACKed, not delivered, and the slot is granted again") {
    std::vector<uint8_t> payload(100, 9);
    transport::SendRequest req;
    req.cookie = 3;
    req.header.stream_id = 42;
    req.header.sequence = 1;
    req.header.credit_id = grant.credit_grant().slot_credits(1);
    req.header.length = payload.size();
    req.header.has_crc32c = 1;
    req.header.crc32c = fl_crc32c(0, payload.data(), payload.size()) ^ 1;
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    auto nack = f.capture.next([](auto& m) { return m.has_nack(); });
    CHECK(int(nack.nack().code()) == FL_ERR_CRC_MISMATCH);
    auto regrant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(regrant.credit_grant().slot_credits_size() == 1);
    CHECK(consumer.idleFor(50ms));
  }

  SECTION("a consumer that goes away revokes its credits") {
    f.agent->post(CmdClientGone{1});
    auto revoke = f.capture.next([](auto& m) { return m.has_credit_revoke(); });
    CHECK(revoke.credit_revoke().credit_ids_size() == 4);
    // and retires its region, whose id the next consumer may get
    REQUIRE(revoke.credit_revoke().retired_regions_size() == 1);
    CHECK(revoke.credit_revoke().retired_regions(0) == region.region_id());
    TestClient next = makeClient(2, FL_ROLE_CONSUMER, "cam", 2, 4096);
    f.agent->post(CmdClientAttached{next.session});
    auto fresh = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    REQUIRE(fresh.credit_grant().regions_size() == 1);
    CHECK(fresh.credit_grant().regions(0).region_id() == region.region_id());
    CHECK(fresh.credit_grant().regions(0).slot_count() == 2);
    CHECK(fresh.credit_grant().slot_credits_size() == 2);
  }
}

// The consumer side on its own, without the agent's thread: frames arrive as
// transport events, the consumer releases them, and each round's ACKs and
// grants go out through flushControl, in control records on the link's transport.
TEST_CASE("inbound streams: a new link from the same sender gets the last 4096 released frames' ACKs again",
          "[agent][inbound][replay]") {
  Metrics metrics;
  Capture on_first, on_second;  // outlive the links' session writers
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients(metrics, names);
  InboundStreams inbound(metrics, clients, links, names);
  TestClient consumer = makeClient(1, FL_ROLE_CONSUMER, "cam", 4, 4096);
  AgentClient& ac = clients.add(consumer.session);
  inbound.onConsumerAttached(ac);
  CHECK(names.size() == 1);

  TcpPair first = makeTcpPair();
  TcpPair second = makeTcpPair();
  auto addLink = [&](uint64_t id, Capture& capture, std::unique_ptr<transport::Transport> t) -> AgentLink& {
    AgentLink& l = links.add(id);
    l.peer = peers.resolve("sender");
    l.peer_name = "sender";
    l.peer_instance = 9;
    l.transport = std::move(t);
    l.session.writer = std::make_shared<SessionWriter>(
        [&capture](const v1::PeerMessage& m, bool) { return capture.write(m); }, 60000ms);
    return l;
  };
  auto arrive = [&](AgentLink& l, uint64_t seq) { return landFrame(inbound, consumer, l, 42, seq); };

  // The round's end as the agent does it: the ACKs and grants the streams
  // decided go to each link's transport in a control record.
  auto flushControl = [&] {
    inbound.flushControl();
    for (auto& [id, l] : links) {
      std::string refused;
      l.flushControl(&refused);
      REQUIRE(refused.empty());
    }
  };
  on_first.watch(first.b.get());
  on_second.watch(second.b.get());

  AgentLink& l1 = addLink(1, on_first, std::move(first.a));
  REQUIRE(inbound.onStreamOpen(l1, peer::StreamOpen{42, "cam"}).empty());
  CHECK(inbound.creditsOutstanding() == 4);
  constexpr uint64_t kFrames = InboundStreams::kMaxRemembered + 904;
  for (uint64_t seq = 1; seq <= kFrames; ++seq) {
    const int slot = arrive(l1, seq);
    REQUIRE(slot >= 0);
    fl_completion_desc d = consumer.pop();
    REQUIRE(d.sequence == seq);
    inbound.onRelease(ac, fl_submit_desc{d.slot, 0, 0});
    flushControl();  // the ACK, and the slot granted again
  }
  CHECK(metrics.counters.frames_released.load() == kFrames);

  // The first link goes (its last ACKs may be lost with it); the sender's
  // next link gets the ACKs of the last kMaxRemembered releases first.
  inbound.onLinkDown(l1);
  links.erase(1);
  inbound.retractCreditsOfLink(1);
  CHECK(inbound.creditsOutstanding() == 0);
  AgentLink& l2 = addLink(2, on_second, std::move(second.a));
  inbound.onLinkUp(l2);
  flushControl();
  auto again = on_second.next([](auto& m) { return m.has_ack(); });
  CHECK(again.ack().stream_id() == 42);
  // The remembered releases are consecutive: one run.
  REQUIRE(again.ack().runs_size() == 2);
  CHECK(again.ack().sequences_size() == 0);
  CHECK(again.ack().runs(0) == kFrames - InboundStreams::kMaxRemembered + 1);
  CHECK(again.ack().runs(1) == InboundStreams::kMaxRemembered);

  // A frame replayed on it that was released already is ACKed again, not
  // delivered a second time.
  REQUIRE(inbound.onStreamOpen(l2, peer::StreamOpen{42, "cam"}).empty());
  REQUIRE(arrive(l2, kFrames - 1) >= 0);
  flushControl();
  auto replayed = on_second.next([](auto& m) { return m.has_ack(); });
  REQUIRE(replayed.ack().sequences_size() == 1);
  CHECK(replayed.ack().sequences(0) == kFrames - 1);
  CHECK(metrics.counters.duplicates_dropped.load() == 1);
  CHECK(consumer.idleFor(10ms));
  // Frames after the replay are delivered.
  REQUIRE(arrive(l2, kFrames + 1) >= 0);
  CHECK(consumer.pop().sequence == kFrames + 1);
  for (auto& [id, l] : links) l.session.writer->close();
}

// Coalescing on the agent's manual clock: a release's ACK and its slot's
// credit wait until a quarter of the sender's window waits, until the
// oldest has waited ack_delay, or until the sender says it is low on
// credits; answers to a replay never wait.
TEST_CASE(
    "inbound streams: ACKs and credits go back per quarter window, after the delay, or when the sender is "
    "low",
    "[agent][inbound][coalesce]") {
  constexpr uint64_t kDelayNs = 1'000'000;  // 1 ms of the manual clock
  constexpr uint32_t kWindow = 16;          // a quarter: 4 releases
  Metrics metrics;
  Capture capture;  // outlives the link's session writer
  ManualClock clock;
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients(metrics, names);
  InboundStreams inbound(metrics, clients, links, names, clock, kDelayNs);
  TestClient consumer = makeClient(1, FL_ROLE_CONSUMER, "cam", kWindow, 4096);
  AgentClient& ac = clients.add(consumer.session);
  inbound.onConsumerAttached(ac);

  TcpPair pair = makeTcpPair();
  capture.watch(pair.b.get());
  AgentLink& l = links.add(1);
  l.peer = peers.resolve("sender");
  l.peer_name = "sender";
  l.peer_instance = 9;
  l.transport = std::move(pair.a);
  l.session.writer = std::make_shared<SessionWriter>(
      [&capture](const v1::PeerMessage& m, bool) { return capture.write(m); }, 60000ms);
  REQUIRE(inbound.onStreamOpen(l, peer::StreamOpen{42, "cam"}).empty());

  // What one round decided for the sender: the sequences ACKed and the
  // credits granted, read off the link's batch before it goes out.
  struct Round {
    std::vector<uint64_t> acked;
    size_t granted = 0;
  };
  auto round = [&] {
    inbound.flushControl();
    Round r;
    for (const auto& m : l.control.messages()) {
      const peer::Message decoded = peer::decode(m);
      if (const auto* ack = std::get_if<peer::Ack>(&decoded)) {
        r.acked.insert(r.acked.end(), ack->sequences.begin(), ack->sequences.end());
      }
      if (m.has_credit_grant()) {
        r.granted +=
            static_cast<size_t>(m.credit_grant().credits_size() + m.credit_grant().slot_credits_size());
      }
    }
    std::string refused;
    l.flushControl(&refused);
    REQUIRE(refused.empty());
    capture.pump();
    return r;
  };
  REQUIRE(round().granted == kWindow);
  uint64_t next_seq = 1;
  auto arrive = [&](uint64_t sequence) {
    if (landFrame(inbound, consumer, l, 42, sequence) < 0) FAIL("no credited slot left");
  };
  // A new frame lands and the consumer releases it.
  auto arriveAndRelease = [&] {
    const uint64_t sequence = next_seq++;
    arrive(sequence);
    fl_completion_desc d = consumer.pop();
    REQUIRE(d.sequence == sequence);
    inbound.onRelease(ac, fl_submit_desc{d.slot, 0, 0});
  };

  SECTION("a quarter of the window goes in one record, not before") {
    for (int i = 0; i < 3; ++i) {
      arriveAndRelease();
      const Round r = round();
      CHECK(r.acked.empty());
      CHECK(r.granted == 0);
    }
    CHECK(inbound.nextControlDeadlineNs() == clock.nowNs() + kDelayNs);
    arriveAndRelease();
    const Round r = round();
    CHECK(r.acked == std::vector<uint64_t>{1, 2, 3, 4});
    CHECK(r.granted == 4);
    CHECK(inbound.nextControlDeadlineNs() == 0);
  }

  SECTION("a single release goes when the oldest has waited the delay") {
    arriveAndRelease();
    CHECK(round().acked.empty());
    clock.advanceNs(kDelayNs / 2);
    arriveAndRelease();  // does not move the deadline
    CHECK(round().acked.empty());
    clock.advanceNs(kDelayNs / 2 - 1);
    CHECK(round().acked.empty());
    clock.advanceNs(1);
    const Round r = round();
    CHECK(r.acked == std::vector<uint64_t>{1, 2});
    CHECK(r.granted == 2);
  }

  SECTION("the sender low on credits gets what waits at once, and its next release") {
    arriveAndRelease();
    CHECK(round().acked.empty());
    inbound.onCreditLow(l, peer::CreditLow{42});
    CHECK(round().acked == std::vector<uint64_t>{1});
    // Nothing waits when it says so again: its next release goes at once,
    // the one after waits again.
    inbound.onCreditLow(l, peer::CreditLow{42});
    CHECK(round().acked.empty());
    arriveAndRelease();
    CHECK(round().acked == std::vector<uint64_t>{2});
    arriveAndRelease();
    CHECK(round().acked.empty());
    // A stream the link does not have open is no one's to hurry.
    inbound.onCreditLow(l, peer::CreditLow{77});
    CHECK(round().acked.empty());
  }

  SECTION("a replay of a released frame is answered at once") {
    for (int i = 0; i < 4; ++i) arriveAndRelease();
    CHECK(round().acked.size() == 4);
    arriveAndRelease();  // 5 waits
    CHECK(round().acked.empty());
    // Sequence 2 again, in a credited slot: the ACK goes now, and takes 5 with it.
    arrive(2);
    CHECK(round().acked == std::vector<uint64_t>{5, 2});
    CHECK(metrics.counters.duplicates_dropped.load() == 1);
  }

  SECTION("the link going down grants the released slots again at once; their ACKs follow on the next link") {
    arriveAndRelease();
    CHECK(round().acked.empty());
    inbound.onLinkDown(l);
    const uint64_t outstanding = inbound.creditsOutstanding();
    links.erase(1);
    inbound.retractCreditsOfLink(1);
    CHECK(outstanding == kWindow - 1);
    CHECK(inbound.nextControlDeadlineNs() == 0);
    inbound.flushControl();  // no link left to grant to; nothing is sent and nothing waits
    CHECK(inbound.creditsOutstanding() == 0);
    CHECK(consumer.session->slots[0].state == SlotState::kFree);
  }
  if (links.find(1) != nullptr) l.session.writer->close();
}
