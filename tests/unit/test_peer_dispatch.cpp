// DataAgent's dispatch of what peers send (peer_dispatch.cpp): each kind of
// peer message, on the Session or in a control record, reaches the part that
// owns it -- the producer's streams take grants, recalls, ACKs; the
// consumer's take StreamOpen, returned credits, CreditLow, StreamClose and
// offers -- and a message that is malformed, of no known kind or out of
// place fails that link alone, with a Fin that says what was wrong.  The
// agent runs on the test's thread (AgentLinkRig) over loopback links: link
// 1 to peer "b", which is sent stream "cam", link 2 to peer "c".
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent_fixture.h"
#include "agent_link_rig.h"
#include "outbound_fixture.h"
#include "transport/frame_header_proto.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

struct DispatchRig : TwoPeerRig {
  using TwoPeerRig::TwoPeerRig;
  // What link `id`'s peer end took off its transport since the last call.
  struct Received {
    std::vector<v1::PeerMessage> messages;  // of control records
    std::vector<transport::FrameHeader> frames;
  };
  Received take(uint64_t id) {
    Received out;
    transport::TransportEvent ev[16];
    for (size_t n; (n = peerEnd(id).poll(ev, 16)) > 0;) {
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind == transport::TransportEvent::Kind::kFrameArrived) out.frames.push_back(ev[i].header);
        if (ev[i].kind != transport::TransportEvent::Kind::kControl) continue;
        v1::ControlBatch batch;
        REQUIRE(batch.ParseFromString(ev[i].control));
        for (const auto& m : batch.messages()) out.messages.push_back(m);
      }
    }
    return out;
  }
  // The Fin the agent sent on link `id` (code 0 and no reason: none).
  v1::Fin fin(uint64_t id) const {
    for (const auto& m : *sessions[id - 1]) {
      if (m.has_fin()) return m.fin();
    }
    return {};
  }
};

// The credits of the grants among `messages` for stream `sid` (whole and slot credits).
std::vector<uint64_t> granted(const std::vector<v1::PeerMessage>& messages, uint64_t sid) {
  std::vector<uint64_t> ids;
  for (const auto& m : messages) {
    if (!m.has_credit_grant() || m.credit_grant().stream_id() != sid) continue;
    for (const auto& c : m.credit_grant().credits()) ids.push_back(c.credit_id());
    for (uint64_t id : m.credit_grant().slot_credits()) ids.push_back(id);
  }
  return ids;
}

std::vector<uint64_t> acked(const std::vector<v1::PeerMessage>& messages) {
  std::vector<uint64_t> sequences;
  for (const auto& m : messages) {
    const peer::Message decoded = peer::decode(m);
    if (const auto* a = std::get_if<peer::Ack>(&decoded)) {
      sequences.insert(sequences.end(), a->sequences.begin(), a->sequences.end());
    }
  }
  return sequences;
}

v1::PeerMessage revoke(uint64_t sid, std::initializer_list<uint64_t> ids, bool returned) {
  v1::PeerMessage m;
  m.mutable_credit_revoke()->set_stream_id(sid);
  for (uint64_t id : ids) m.mutable_credit_revoke()->add_credit_ids(id);
  m.mutable_credit_revoke()->set_returned(returned);
  return m;
}

v1::PeerMessage creditLow(uint64_t sid) {
  v1::PeerMessage m;
  m.mutable_credit_low()->set_stream_id(sid);
  return m;
}

// An ACK run without its count: peer::decode makes it a violation.
v1::PeerMessage malformedAck(uint64_t sid) {
  v1::PeerMessage m;
  m.mutable_ack()->set_stream_id(sid);
  m.mutable_ack()->add_runs(1);
  return m;
}

// Stream 42 of "cam" opened on link `id`: the grant of the slots of the
// rig's consumer of "cam" (4) reaches that link.  How a test shows a link
// still serves its peer.
void linkServes(DispatchRig& rig, uint64_t id) {
  rig.take(id);
  rig.session(id, streamOpenMessage(42, "cam"));
  CHECK(granted(rig.take(id).messages, 42).size() == 4);
  CHECK(rig.fin(id).reason().empty());
}

}  // namespace

TEST_CASE("peer dispatch: a producer's stream takes the grant, the recall and the ACK of control records",
          "[peer_dispatch]") {
  DispatchRig rig;
  TestClient producer = rig.attach(1, FL_ROLE_PRODUCER, "cam");
  const uint64_t sid = rig.opened(1, "cam");
  auto first = exposeLanding(rig.peerEnd(1), 500, 4096);
  auto second = exposeLanding(rig.peerEnd(1), 501, 4096);
  rig.record(1, {creditGrant(sid, {{500, 4096}, {501, 4096}})});
  producer.push(0, 100);
  rig.settle();
  DispatchRig::Received got = rig.take(1);
  REQUIRE(got.frames.size() == 1);
  CHECK(got.frames[0].sequence == 1);
  const uint64_t unused = got.frames[0].credit_id == 500 ? 501 : 500;

  // The receiver recalls both: the producer's side gives back the one it
  // did not use, as returned credits.
  rig.record(1, {revoke(sid, {500, 501}, false)});
  got = rig.take(1);
  REQUIRE(got.messages.size() == 1);
  REQUIRE(got.messages[0].has_credit_revoke());
  CHECK(got.messages[0].credit_revoke().returned());
  CHECK(got.messages[0].credit_revoke().stream_id() == sid);
  REQUIRE(got.messages[0].credit_revoke().credit_ids_size() == 1);
  CHECK(got.messages[0].credit_revoke().credit_ids(0) == unused);

  CHECK(producer.idleFor(0ms));  // sent is not delivered
  rig.record(1, {ackMessage(sid, 1)});
  const fl_completion_desc done = producer.pop();
  CHECK(done.slot == 0);
  CHECK(done.status == FL_OK);
  CHECK(done.sequence == 1);

  // No credit is left: the next frame waits.
  producer.push(1, 100);
  rig.settle();
  CHECK(rig.take(1).frames.empty());
  CHECK(producer.idleFor(0ms));
}

TEST_CASE(
    "peer dispatch: a consumer's stream takes the StreamOpen, returned credits, CreditLow and StreamClose",
    "[peer_dispatch]") {
  // ACKs are held back for a second: what sends one earlier is the
  // message the test is about.
  DispatchRig rig([](Config& c) { c.ack_delay_us = 1'000'000; });
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam", 16);
  rig.session(1, streamOpenMessage(42, "cam"));
  const std::vector<uint64_t> credits = granted(rig.take(1).messages, 42);
  REQUIRE(credits.size() == 16);
  CHECK(granted(rig.take(2).messages, 42).empty());  // on the link it was opened on only

  // Two credits given back unused: their slots are granted again, under new ids.
  rig.record(1, {revoke(42, {credits[0], credits[1]}, true)});
  DispatchRig::Received got = rig.take(1);
  const std::vector<uint64_t> again = granted(got.messages, 42);
  CHECK(again.size() == 2);
  for (uint64_t id : again) CHECK(std::find(credits.begin(), credits.end(), id) == credits.end());
  CHECK(std::none_of(got.messages.begin(), got.messages.end(),
                     [](const v1::PeerMessage& m) { return m.has_credit_revoke(); }));

  // A frame lands, is delivered and released: its ACK is held back ...
  auto land = [&](uint64_t sequence, uint64_t credit_id) {
    std::vector<uint8_t> payload(64, uint8_t(sequence));
    transport::SendRequest req;
    req.cookie = sequence;
    req.header.stream_id = 42;
    req.header.sequence = sequence;
    req.header.credit_id = credit_id;
    req.header.length = payload.size();
    req.payload = payload.data();
    req.credit.credit_id = credit_id;
    req.credit.length = 4096;
    REQUIRE(rig.peerEnd(1).post(req) == transport::PostResult::kOk);
    for (int i = 0; i < 4; ++i) rig.peerEnd(1).flush();
    rig.settle();
    const fl_completion_desc d = consumer.pop();
    REQUIRE(d.status == FL_OK);
    REQUIRE(d.sequence == sequence);
    consumer.push(d.slot, 0);
    rig.settle();
  };
  land(1, credits[2]);
  CHECK(acked(rig.take(1).messages).empty());
  // ... until the sender says it runs low on credits.
  rig.record(1, {creditLow(42)});
  CHECK(acked(rig.take(1).messages) == std::vector<uint64_t>{1});

  // Or until it closes the stream.
  land(2, credits[3]);
  CHECK(acked(rig.take(1).messages).empty());
  v1::PeerMessage close;
  close.mutable_stream_close()->set_stream_id(42);
  rig.session(1, close);
  CHECK(acked(rig.take(1).messages) == std::vector<uint64_t>{2});
  CHECK(rig.fin(1).reason().empty());
}

TEST_CASE("peer dispatch: an Offer is read into the credit it names; a second offer into it fails the link",
          "[peer_dispatch][pull]") {
  DispatchRig rig([](Config& c) { c.pull_streams = {"cam"}; });
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam");
  rig.session(1, streamOpenMessage(42, "cam"));
  const std::vector<uint64_t> credits = granted(rig.take(1).messages, 42);
  REQUIRE(credits.size() == 4);
  std::vector<uint8_t> payload(300);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 3 + 1);
  auto offer = [&](uint64_t sequence, uint64_t credit_id) {
    transport::LocalSource source;
    source.source_id = sequence;
    source.payload = payload.data();
    source.length = payload.size();
    auto remote = rig.peerEnd(1).exposeSource(source);
    REQUIRE(remote.ok());
    transport::FrameHeader h;
    h.stream_id = 42;
    h.sequence = sequence;
    h.credit_id = credit_id;
    h.length = payload.size();
    v1::PeerMessage m;
    transport::toProto(h, m.mutable_offer()->mutable_header());
    m.mutable_offer()->set_source_id(remote.value().source_id);
    return m;
  };
  rig.record(1, {offer(1, credits[0])});
  const fl_completion_desc d = consumer.pop();
  CHECK(d.status == FL_OK);
  CHECK(d.sequence == 1);
  CHECK(d.length == payload.size());
  CHECK(std::memcmp(consumer.session->segments->slot(d.slot), payload.data(), payload.size()) == 0);
  CHECK(rig.fin(1).reason().empty());

  rig.record(1, {offer(2, credits[1]), offer(3, credits[1])});
  const v1::Fin fin = rig.fin(1);
  CHECK(fin.code() == v1::ERROR_CODE_PROTOCOL);
  CHECK_THAT(fin.reason(), Catch::Contains("into credit " + std::to_string(credits[1])) &&
                               Catch::Contains("an earlier offer has taken"));
  CHECK(rig.fin(2).reason().empty());
}

TEST_CASE(
    "peer dispatch: a malformed message fails its own link with what was wrong, the other link serves on",
    "[peer_dispatch][security]") {
  // peer::decode turns each into a violation; the agent closes the link that
  // sent it with a PROTOCOL Fin carrying the reason.
  const int which = GENERATE(0, 1, 2, 3);
  v1::PeerMessage bad;
  std::string expect;
  switch (which) {
    case 0:
      bad = malformedAck(1);
      expect = "ACK with a run that has no count";
      break;
    case 1:
      bad.mutable_offer()->set_source_id(1);  // no frame header
      expect = "an offer without a frame header";
      break;
    case 2:
      for (uint64_t i = 0; i <= peer::kMaxCreditsPerStream; ++i)
        bad.mutable_credit_revoke()->add_credit_ids(i);
      expect = "revoke of more than 65536 credits";
      break;
    case 3: {
      auto* g = bad.mutable_credit_grant();
      g->set_stream_id(1);
      g->add_slot_credits(7);  // names region 0: none
      expect = "slot credit 7 names no region";
      break;
    }
  }
  INFO("case " << which);
  DispatchRig rig;
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam");
  const uint64_t before = rig.messagesHandled();
  rig.record(2, {bad, creditLow(5)});
  const v1::Fin fin = rig.fin(2);
  CHECK(fin.code() == v1::ERROR_CODE_PROTOCOL);
  CHECK_THAT(fin.reason(), Catch::Contains(expect));
  CHECK(rig.messagesHandled() == before + 1);  // what came after it in the record was not taken
  linkServes(rig, 1);
}

TEST_CASE("peer dispatch: a message of no known kind fails its link, on the Session and in a control record",
          "[peer_dispatch][security]") {
  DispatchRig rig;
  TestClient consumer = rig.attach(1, FL_ROLE_CONSUMER, "cam");
  // Field 14 (length 0): a kind a newer peer might send; this end sees no body.
  v1::PeerMessage newer;
  REQUIRE(newer.ParseFromString(std::string("\x72\x00", 2)));
  REQUIRE(newer.body_case() == v1::PeerMessage::BODY_NOT_SET);
  std::string expect;
  SECTION("an empty message on the Session") {
    rig.session(2, v1::PeerMessage{});
    expect = "unexpected message (field 0) after the handshake";
  }
  SECTION("a message of a newer kind on the Session") {
    rig.session(2, newer);
    expect = "unexpected message (field 0) after the handshake";
  }
  SECTION("a Hello after the handshake") {
    v1::PeerMessage hello;
    hello.mutable_hello();
    rig.session(2, hello);
    expect = "unexpected message (field 1) after the handshake";
  }
  SECTION("a message of a newer kind in a control record") {
    rig.record(2, {newer});
    expect = "a control record carries a message of kind 0; only credit grants";
  }
  SECTION("a Session message (a Fin) in a control record") {
    v1::PeerMessage fin;
    fin.mutable_fin()->set_reason("bye");
    rig.record(2, {creditLow(5), fin});
    expect = "a control record carries a message of kind " + std::to_string(v1::PeerMessage::kFin);
  }
  SECTION("a control record that is not a ControlBatch") {
    REQUIRE(rig.peerEnd(2).postControl(std::string("\xff\xff\xff", 3)) == transport::PostResult::kOk);
    for (int i = 0; i < 4; ++i) rig.peerEnd(2).flush();
    rig.settle();
    expect = "a control record of 3 bytes is not a ControlBatch";
  }
  const v1::Fin fin = rig.fin(2);
  CHECK(fin.code() == v1::ERROR_CODE_PROTOCOL);
  CHECK_THAT(fin.reason(), Catch::Contains(expect));
  linkServes(rig, 1);
}

TEST_CASE("peer dispatch: an ACK behind a violation in the same record does not settle its frame",
          "[peer_dispatch][security]") {
  DispatchRig rig;
  TestClient producer = rig.attach(1, FL_ROLE_PRODUCER, "cam");
  const uint64_t sid = rig.opened(1, "cam");
  auto memory = exposeLanding(rig.peerEnd(1), 500, 4096);
  rig.record(1, {creditGrant(sid, {{500, 4096}})});
  producer.push(0, 100);
  rig.settle();
  REQUIRE(rig.take(1).frames.size() == 1);
  rig.record(1, {malformedAck(sid), ackMessage(sid, 1)});
  CHECK_THAT(rig.fin(1).reason(), Catch::Contains("ACK with a run that has no count"));
  // Nothing a violating link says counts: the frame waits for the next link.
  CHECK(producer.idleFor(0ms));
}

TEST_CASE("peer dispatch: after the peer's Fin, its records still settle frames but grant nothing",
          "[peer_dispatch][fin]") {
  DispatchRig rig;
  TestClient producer = rig.attach(1, FL_ROLE_PRODUCER, "cam");
  const uint64_t sid = rig.opened(1, "cam");
  auto first = exposeLanding(rig.peerEnd(1), 500, 4096);
  auto second = exposeLanding(rig.peerEnd(1), 501, 4096);
  rig.record(1, {creditGrant(sid, {{500, 4096}})});
  producer.push(0, 100);
  rig.settle();
  REQUIRE(rig.take(1).frames.size() == 1);

  v1::PeerMessage fin;
  fin.mutable_fin()->set_code(v1::ERROR_CODE_SHUTDOWN);
  fin.mutable_fin()->set_reason("daemon shutting down");
  rig.session(1, fin);
  const uint64_t before = rig.messagesHandled();
  rig.record(1, {creditGrant(sid, {{501, 4096}}), ackMessage(sid, 1)});
  CHECK(rig.messagesHandled() == before + 1);  // the ACK; the grant was not taken
  const fl_completion_desc done = producer.pop();
  CHECK(done.status == FL_OK);
  CHECK(done.sequence == 1);
  producer.push(1, 100);
  rig.settle();
  CHECK(rig.take(1).frames.empty());
  CHECK(producer.idleFor(0ms));
  CHECK(rig.fin(1).reason().empty());  // the peer closed it: no Fin goes back
}
