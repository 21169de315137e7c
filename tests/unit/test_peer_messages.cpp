// The peer-message decoder: every message a peer sends after the handshake
// comes out as a plain struct within the protocol's bounds, or as the
// violation that closes its link.
#include <catch2/catch.hpp>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <variant>

#include "agent/peer_messages.h"
#include "framelink/framelink.h"

using namespace framelink;

namespace {

std::string violation(const v1::PeerMessage& m) {
  auto decoded = peer::decode(m);
  const auto* v = std::get_if<peer::Violation>(&decoded);
  return v == nullptr ? std::string() : v->why;
}

}  // namespace

TEST_CASE("peer messages: stream names are checked", "[peer_messages]") {
  v1::PeerMessage m;
  m.mutable_stream_open()->set_stream_id(7);
  m.mutable_stream_open()->set_name("cam-1.left_2");
  auto decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::StreamOpen>(decoded));
  CHECK(std::get<peer::StreamOpen>(decoded).stream_id == 7);
  CHECK(std::get<peer::StreamOpen>(decoded).name == "cam-1.left_2");

  const std::string longest(FL_STREAM_NAME_MAX - 1, 'a');
  CHECK(peer::validStreamName(longest));
  for (const std::string& bad : {std::string(), std::string(FL_STREAM_NAME_MAX, 'a'), std::string("cam/1"),
                                 std::string("cam 1"), std::string("ca\0m", 4), std::string("caméra")}) {
    INFO("name '" << bad << "'");
    m.mutable_stream_open()->set_name(bad);
    CHECK_THAT(violation(m), Catch::Contains("invalid stream name"));
  }
}

TEST_CASE("peer messages: credit grants are bounded and never of zero length", "[peer_messages]") {
  v1::PeerMessage m;
  auto* g = m.mutable_credit_grant();
  g->set_stream_id(3);
  for (uint64_t i = 1; i <= 3; ++i) {
    auto* c = g->add_credits();
    c->set_credit_id(i);
    c->set_length(4096 * i);
    c->set_remote_addr(0x1000 * i);
    c->set_rkey(uint32_t(i + 10));
  }
  auto decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::CreditGrant>(decoded));
  const auto& grant = std::get<peer::CreditGrant>(decoded);
  CHECK(grant.stream_id == 3);
  REQUIRE(grant.credits.size() == 3);
  CHECK(grant.credits[2].credit_id == 3);
  CHECK(grant.credits[2].length == 3 * 4096);
  CHECK(grant.credits[2].remote_addr == 0x3000);
  CHECK(grant.credits[2].rkey == 13);

  SECTION("a zero-length credit anywhere in the grant") {
    g->mutable_credits(1)->set_length(0);
    CHECK_THAT(violation(m), Catch::Contains("zero length"));
  }
  SECTION("more credits than one stream may hold, in one message") {
    while (static_cast<size_t>(g->credits_size()) <= peer::kMaxCreditsPerStream) {
      auto* c = g->add_credits();
      c->set_credit_id(uint64_t(g->credits_size()));
      c->set_length(4096);
    }
    CHECK_THAT(violation(m), Catch::Contains("more than 65536 credits"));
  }
}

TEST_CASE("peer messages: slot regions and slot credits are bounded, and resolve to their slot's address",
          "[peer_messages]") {
  v1::PeerMessage m;
  auto* g = m.mutable_credit_grant();
  g->set_stream_id(3);
  auto* r = g->add_regions();
  r->set_region_id(5);
  r->set_base_addr(0x10000);
  r->set_rkey(77);
  r->set_slot_stride(0x2100);
  r->set_slot_bytes(0x2000);
  r->set_slot_count(8);
  g->add_slot_credits(peer::slotCreditId(5, 7, 1234));
  g->add_slot_credits(peer::slotCreditId(5, 0, 1235));
  auto decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::CreditGrant>(decoded));
  const auto grant = std::get<peer::CreditGrant>(decoded);
  REQUIRE(grant.regions.size() == 1);
  REQUIRE(grant.slot_credits.size() == 2);
  peer::SlotRegions regions;
  CHECK(regions.add(grant.regions[0]).empty());
  transport::RemoteCredit rc;
  CHECK(regions.resolve(grant.slot_credits[0], &rc).empty());
  CHECK(rc.credit_id == grant.slot_credits[0]);
  CHECK(static_cast<uint32_t>(rc.credit_id) == 1234);  // the generation: the rdma immediate data
  CHECK(rc.remote_addr == 0x10000 + 7 * 0x2100);
  CHECK(rc.length == 0x2000);
  CHECK(rc.rkey == 77);
  CHECK(regions.resolve(grant.slot_credits[1], &rc).empty());
  CHECK(rc.remote_addr == 0x10000);

  SECTION("a region announced twice on one link") {
    CHECK_THAT(regions.add(grant.regions[0]), Catch::Contains("region 5 announced while it was announced"));
  }
  SECTION("a slot past the region, a region never announced or retired") {
    CHECK_THAT(regions.resolve(peer::slotCreditId(5, 8, 1), &rc),
               Catch::Contains("slot 8 of region 5, which has 8"));
    CHECK_THAT(regions.resolve(peer::slotCreditId(6, 0, 1), &rc),
               Catch::Contains("region 6, which was not announced"));
    regions.retire(5);
    CHECK_THAT(regions.resolve(grant.slot_credits[0], &rc), Catch::Contains("not announced"));
    CHECK(regions.add(grant.regions[0]).empty());  // its id may come back for other slots
  }
  SECTION("a region id outside 1..4095") {
    r->set_region_id(0);
    CHECK_THAT(violation(m), Catch::Contains("region id 0 is outside 1..4095"));
    r->set_region_id(4096);
    CHECK_THAT(violation(m), Catch::Contains("region id 4096 is outside"));
  }
  SECTION("a region of no slots, too many, or slots of no bytes") {
    r->set_slot_count(0);
    CHECK_THAT(violation(m), Catch::Contains("of 0 slots"));
    r->set_slot_count((1u << 20) + 1);
    CHECK_THAT(violation(m), Catch::Contains("of 1048577 slots"));
    r->set_slot_count(8);
    r->set_slot_bytes(0);
    CHECK_THAT(violation(m), Catch::Contains("slots of 0 bytes"));
  }
  SECTION("a slot credit that names no region, or has generation 0") {
    g->add_slot_credits(1234);
    CHECK_THAT(violation(m), Catch::Contains("slot credit 1234 names no region"));
    g->set_slot_credits(2, peer::slotCreditId(5, 1, 0));
    CHECK_THAT(violation(m), Catch::Contains("has generation 0"));
  }
  SECTION("more credits than one stream may hold, whole and slot credits together") {
    for (size_t i = 0; i < peer::kMaxCreditsPerStream; ++i) g->add_slot_credits(peer::slotCreditId(5, 1, 9));
    CHECK_THAT(violation(m), Catch::Contains("more than 65536 credits"));
  }
  SECTION("a revoke that retires regions") {
    v1::PeerMessage revoke;
    revoke.mutable_credit_revoke()->add_retired_regions(5);
    auto d = peer::decode(revoke);
    REQUIRE(std::holds_alternative<peer::CreditRevoke>(d));
    CHECK(std::get<peer::CreditRevoke>(d).retired_regions == std::vector<uint32_t>{5});
  }
}

TEST_CASE("peer messages: 64 slot credits take under 40 % of the bytes of 64 whole credits",
          "[peer_messages]") {
  // An rdma consumer's 64 slots of 64 KiB in a hugepage segment, granted
  // again after its region was announced.
  const uint64_t base = 0x7f3a'4000'0000;
  const uint64_t stride = 64 * 1024 + 256;
  v1::PeerMessage whole, slots;
  whole.mutable_credit_grant()->set_stream_id(7);
  slots.mutable_credit_grant()->set_stream_id(7);
  for (uint32_t s = 0; s < 64; ++s) {
    const uint64_t id = peer::slotCreditId(1, s, 100000 + s);
    auto* c = whole.mutable_credit_grant()->add_credits();
    c->set_credit_id(100000 + s);
    c->set_length(64 * 1024);
    c->set_remote_addr(base + s * stride);
    c->set_rkey(0x1a2b3c);
    slots.mutable_credit_grant()->add_slot_credits(id);
  }
  INFO("whole credits: " << whole.ByteSizeLong() << " bytes, slot credits: " << slots.ByteSizeLong());
  CHECK(slots.ByteSizeLong() * 5 < whole.ByteSizeLong() * 2);  // 520 and 1413 bytes
  CHECK(slots.ByteSizeLong() <= 64 * 8 + 8);
}

TEST_CASE("peer messages: an ACK carries runs of consecutive frames as pairs and decodes to the same order",
          "[peer_messages]") {
  const std::vector<uint64_t> released = {5, 6, 7, 8, 2, 10, 11, 3, 100, 99, 12, 13, 14};
  v1::PeerMessage msg;
  msg.mutable_ack()->set_stream_id(9);
  peer::encodeAck(released.data(), released.size(), msg.mutable_ack());
  // Three runs (5..8, 10..11, 12..14) as pairs, the rest one by one.
  CHECK(std::vector<uint64_t>(msg.ack().runs().begin(), msg.ack().runs().end()) ==
        std::vector<uint64_t>{5, 4, 10, 2, 12, 3});
  CHECK(std::vector<uint64_t>(msg.ack().sequences().begin(), msg.ack().sequences().end()) ==
        std::vector<uint64_t>{2, 3, 100, 99});
  auto decoded = peer::decode(msg);
  REQUIRE(std::holds_alternative<peer::Ack>(decoded));
  auto got = std::get<peer::Ack>(decoded).sequences;
  std::sort(got.begin(), got.end());
  auto want = released;
  std::sort(want.begin(), want.end());
  CHECK(got == want);

  // A streaming consumer's 4096 releases are one pair, 2 numbers.
  std::vector<uint64_t> in_order(peer::kMaxAcksPerMessage);
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = 1000 + i;
  v1::PeerMessage full;
  peer::encodeAck(in_order.data(), in_order.size(), full.mutable_ack());
  CHECK(full.ack().runs_size() == 2);
  CHECK(full.ack().sequences_size() == 0);
  decoded = peer::decode(full);
  REQUIRE(std::holds_alternative<peer::Ack>(decoded));
  CHECK(std::get<peer::Ack>(decoded).sequences == in_order);
  // One frame more, as a single or as a longer run, is too many.
  full.mutable_ack()->add_sequences(1);
  CHECK_THAT(violation(full), Catch::Contains("ACK of more than 4096"));
  full.mutable_ack()->clear_sequences();
  full.mutable_ack()->set_runs(1, peer::kMaxAcksPerMessage + 1);
  CHECK_THAT(violation(full), Catch::Contains("ACK of more than 4096"));
}

TEST_CASE("peer messages: a malformed ACK run is a violation", "[peer_messages]") {
  auto withRuns = [](std::vector<uint64_t> runs) {
    v1::PeerMessage m;
    m.mutable_ack()->set_stream_id(1);
    for (uint64_t r : runs) m.mutable_ack()->add_runs(r);
    return m;
  };
  CHECK_THAT(violation(withRuns({7})), Catch::Contains("run that has no count"));
  CHECK_THAT(violation(withRuns({7, 1})), Catch::Contains("ACK run of 1 frames from 7"));
  CHECK_THAT(violation(withRuns({7, 0})), Catch::Contains("ACK run of 0 frames"));
  CHECK_THAT(violation(withRuns({0, 5})), Catch::Contains("from 0"));
  CHECK_THAT(violation(withRuns({UINT64_MAX - 1, 3})), Catch::Contains("ACK run of 3 frames"));
  CHECK_THAT(violation(withRuns({1, UINT64_MAX})), Catch::Contains("ACK of more than 4096"));
  CHECK(std::holds_alternative<peer::Ack>(
      peer::decode(withRuns({UINT64_MAX - 1, 2}))));  // ends at the last one
}

TEST_CASE("peer messages: an ACK's skipped readers are fewer than its readers", "[peer_messages]") {
  v1::PeerMessage m;
  m.mutable_ack()->set_stream_id(3);
  m.mutable_ack()->add_sequences(7);
  m.mutable_ack()->set_readers(3);
  m.mutable_ack()->set_skipped(2);
  auto decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::Ack>(decoded));
  CHECK(std::get<peer::Ack>(decoded).readers == 3);
  CHECK(std::get<peer::Ack>(decoded).skipped == 2);
  // An older receiver says neither: one reader, none skipped.
  m.mutable_ack()->clear_readers();
  m.mutable_ack()->clear_skipped();
  decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::Ack>(decoded));
  CHECK(std::get<peer::Ack>(decoded).readers == 1);
  CHECK(std::get<peer::Ack>(decoded).skipped == 0);
  // The reader the frame landed in released it: every reader skipped is a lie.
  m.mutable_ack()->set_readers(2);
  m.mutable_ack()->set_skipped(2);
  CHECK_THAT(violation(m), Catch::Contains("ACK saying 2 of its 2 readers were skipped"));
  m.mutable_ack()->clear_readers();
  m.mutable_ack()->set_skipped(1);
  CHECK_THAT(violation(m), Catch::Contains("1 of its 1 readers"));
}

TEST_CASE("peer messages: ACKs are bounded, NACKs always carry a failure", "[peer_messages]") {
  v1::PeerMessage ack;
  ack.mutable_ack()->set_stream_id(5);
  for (uint64_t s = 1; s <= peer::kMaxAcksPerMessage; ++s) ack.mutable_ack()->add_sequences(s);
  auto decoded = peer::decode(ack);
  REQUIRE(std::holds_alternative<peer::Ack>(decoded));
  CHECK(std::get<peer::Ack>(decoded).sequences.size() == peer::kMaxAcksPerMessage);
  CHECK(std::get<peer::Ack>(decoded).sequences.back() == peer::kMaxAcksPerMessage);
  ack.mutable_ack()->add_sequences(peer::kMaxAcksPerMessage + 1);
  CHECK_THAT(violation(ack), Catch::Contains("ACK of more than 4096"));

  v1::PeerMessage nack;
  nack.mutable_nack()->set_stream_id(5);
  nack.mutable_nack()->set_sequence(9);
  nack.mutable_nack()->set_message(std::string(1000, 'x'));
  decoded = peer::decode(nack);  // code 0: a refusal all the same
  REQUIRE(std::holds_alternative<peer::Nack>(decoded));
  CHECK(std::get<peer::Nack>(decoded).code == FL_ERR_PEER_REJECTED);
  CHECK(std::get<peer::Nack>(decoded).sequence == 9);
  CHECK(std::get<peer::Nack>(decoded).message.size() == peer::kMaxTextBytes);
  nack.mutable_nack()->set_code(v1::ERROR_CODE_CRC_MISMATCH);
  CHECK(std::get<peer::Nack>(peer::decode(nack)).code == FL_ERR_CRC_MISMATCH);
}

TEST_CASE("peer messages: a NACK's code is one a frame may fail with, or PEER_REJECTED", "[peer_messages]") {
  v1::PeerMessage nack;
  nack.mutable_nack()->set_stream_id(5);
  nack.mutable_nack()->set_sequence(9);
  const auto codeOf = [&](int code) {
    nack.mutable_nack()->set_code(static_cast<v1::ErrorCode>(code));
    return std::get<peer::Nack>(peer::decode(nack)).code;
  };
  // What a receiving daemon refuses a frame with reaches the producer as it is.
  for (int code :
       {FL_ERR_TOO_LARGE, FL_ERR_NO_CONSUMER, FL_ERR_TIMEOUT, FL_ERR_CRC_MISMATCH, FL_ERR_LINK_LOST,
        FL_ERR_SHUTDOWN, FL_ERR_PROTOCOL, FL_ERR_UNKNOWN_STREAM, FL_ERR_UNKNOWN_CREDIT, FL_ERR_TRANSPORT}) {
    CHECK(codeOf(code) == code);
  }
  // A call's outcome, this client's attachment, the local device, or no
  // status at all would tell the producer something about its own host
  // that a peer cannot know.
  for (int code :
       std::initializer_list<int>{FL_EAGAIN, FL_ETIMEDOUT, FL_ERR_DAEMON_GONE, FL_ERR_RING_CORRUPT,
                                  FL_ERR_QUOTA, FL_ERR_AUTH, FL_ERR_DEVICE, 114, 199, 305, 999, -1}) {
    INFO("code " << code);
    CHECK(codeOf(code) == FL_ERR_PEER_REJECTED);
  }
}

TEST_CASE("peer messages: the ACKs of one control record name at most the per-record budget of frames",
          "[peer_messages]") {
  // Each ACK on its own is within kMaxAcksPerMessage; together they are
  // bounded too, runs counted frame by frame.
  v1::ControlBatch record;
  record.add_messages()->mutable_credit_low()->set_stream_id(1);  // other messages do not count
  for (uint64_t first = 1; first <= peer::kMaxAckFramesPerRecord; first += peer::kMaxAcksPerMessage) {
    v1::Ack* ack = record.add_messages()->mutable_ack();
    ack->set_stream_id(1);
    ack->add_runs(first);
    ack->add_runs(peer::kMaxAcksPerMessage);
  }
  CHECK(peer::checkRecord(record).empty());
  v1::Ack* one_more = record.add_messages()->mutable_ack();
  one_more->set_stream_id(2);
  one_more->add_sequences(7);
  CHECK(peer::ackFrames(*one_more) == 1);
  CHECK_THAT(peer::checkRecord(record), Catch::Contains("ACKs more than 65536 frames"));

  // A run's count as sent, however large, is counted without wrapping
  // (decode refuses such a run; the record is refused before that).
  v1::ControlBatch huge;
  v1::Ack* ack = huge.add_messages()->mutable_ack();
  ack->add_sequences(1);
  ack->add_runs(1);
  ack->add_runs(UINT64_MAX);
  CHECK(peer::ackFrames(*ack) == UINT64_MAX);
  CHECK_THAT(peer::checkRecord(huge), Catch::Contains("ACKs more than"));
}

TEST_CASE("peer messages: a revoke names at most as many credits as a stream may hold", "[peer_messages]") {
  v1::PeerMessage m;
  auto* r = m.mutable_credit_revoke();
  r->set_stream_id(4);
  for (uint64_t id = 1; id <= peer::kMaxCreditsPerStream; ++id) r->add_credit_ids(id);
  auto decoded = peer::decode(m);
  REQUIRE(std::holds_alternative<peer::CreditRevoke>(decoded));
  CHECK(std::get<peer::CreditRevoke>(decoded).credit_ids.size() == peer::kMaxCreditsPerStream);
  // One more, even a repeat of an id already named, is more than any stream holds.
  r->add_credit_ids(2);
  CHECK_THAT(violation(m), Catch::Contains("revoke of more than 65536 credits"));
  r->set_returned(true);  // a sender giving credits back is held to the same bound
  CHECK_THAT(violation(m), Catch::Contains("revoke of more than 65536 credits"));
}

TEST_CASE("peer messages: the rest, and what may not come after the handshake", "[peer_messages]") {
  v1::PeerMessage m;
  m.mutable_fin()->set_reason(std::string(300, 'r'));
  CHECK(std::get<peer::Fin>(peer::decode(m)).reason.size() == peer::kMaxTextBytes);
  m.mutable_keepalive();
  CHECK(std::holds_alternative<peer::Keepalive>(peer::decode(m)));
  m.mutable_stream_close()->set_stream_id(4);
  CHECK(std::get<peer::StreamClose>(peer::decode(m)).stream_id == 4);
  m.mutable_credit_revoke()->set_stream_id(4);
  m.mutable_credit_revoke()->add_credit_ids(11);
  m.mutable_credit_revoke()->add_credit_ids(12);
  CHECK(std::get<peer::CreditRevoke>(peer::decode(m)).credit_ids == std::vector<uint64_t>{11, 12});

  CHECK_THAT(violation(v1::PeerMessage{}), Catch::Contains("unexpected message"));
  v1::PeerMessage hello;
  hello.mutable_hello();
  CHECK_THAT(violation(hello), Catch::Contains("after the handshake"));
}
