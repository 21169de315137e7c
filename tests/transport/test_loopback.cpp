// The loopback link's manual mode: what a simulator relies on.  Nothing moves
// until the link's owner delivers; delivery is in order and consumes the
// credit; damage changes the landed payload only; a break ends every waiting
// frame once.
#include <algorithm>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/loopback/loopback_transport.h"

namespace framelink::transport::loopback {
namespace {

using Kind = TransportEvent::Kind;

std::vector<TransportEvent> drain(Transport& t) {
  std::vector<TransportEvent> out;
  TransportEvent ev[8];
  size_t n;
  while ((n = t.poll(ev, 8)) > 0) out.insert(out.end(), ev, ev + n);
  return out;
}

SendRequest frame(uint64_t cookie, const RemoteCredit& credit, const std::vector<uint8_t>& payload,
                  uint64_t seq) {
  SendRequest r;
  r.cookie = cookie;
  r.credit = credit;
  r.header.credit_id = credit.credit_id;
  r.header.length = payload.size();
  r.header.sequence = seq;
  r.payload = payload.data();
  return r;
}

LoopbackPair manualPair(size_t depth = 256) {
  LoopbackOptions options;
  options.manual = true;
  options.send_queue_depth = depth;
  auto made = makePair(options);
  REQUIRE(made.ok());
  return std::move(made).value();
}

}  // namespace

TEST_CASE("manual loopback: nothing lands until delivered, then in order", "[loopback]") {
  auto pair = manualPair();
  std::vector<uint8_t> buf1(16, 0), buf2(16, 0);
  auto c1 = pair.b->exposeCredit(LocalCredit{1, buf1.data(), buf1.size(), nullptr});
  auto c2 = pair.b->exposeCredit(LocalCredit{2, buf2.data(), buf2.size(), nullptr});
  REQUIRE((c1.ok() && c2.ok()));
  std::vector<uint8_t> p1(16, 0x11), p2(8, 0x22);
  REQUIRE(pair.a->post(frame(10, c1.value(), p1, 1)) == PostResult::kOk);
  REQUIRE(pair.a->post(frame(20, c2.value(), p2, 2)) == PostResult::kOk);
  pair.a->flush();
  CHECK(drain(*pair.a).empty());
  CHECK(drain(*pair.b).empty());
  CHECK(pair.link->waiting(0) == 2);
  CHECK(buf1[0] == 0);

  REQUIRE(pair.link->deliverOne(0));
  auto rx = drain(*pair.b);
  REQUIRE(rx.size() == 1);
  CHECK(rx[0].kind == Kind::kFrameArrived);
  CHECK(rx[0].status == FL_OK);
  CHECK(rx[0].header.sequence == 1u);
  CHECK(buf1 == p1);
  CHECK(buf2[0] == 0);  // the second frame is still waiting
  auto tx = drain(*pair.a);
  REQUIRE(tx.size() == 1);
  CHECK(tx[0].kind == Kind::kSendComplete);
  CHECK(tx[0].cookie == 10u);

  REQUIRE(pair.link->deliverOne(0, LoopbackLink::Damage::kFlipPayloadByte));
  rx = drain(*pair.b);
  REQUIRE(rx.size() == 1);
  CHECK(rx[0].header.sequence == 2u);
  CHECK(std::memcmp(buf2.data(), p2.data(), p2.size()) != 0);  // damaged on the way
  CHECK(std::count(buf2.begin(), buf2.begin() + 8, 0x22) == 7);
  CHECK_FALSE(pair.link->deliverOne(0));  // nothing waits
  CHECK_FALSE(pair.link->deliverOne(1));
}

TEST_CASE("manual loopback: a break ends every waiting frame once, on both ends", "[loopback]") {
  auto pair = manualPair(2);
  std::vector<uint8_t> buf(4, 0), payload(4, 7);
  auto c = pair.b->exposeCredit(LocalCredit{1, buf.data(), buf.size(), nullptr});
  REQUIRE(c.ok());
  REQUIRE(pair.a->post(frame(1, c.value(), payload, 1)) == PostResult::kOk);
  REQUIRE(pair.a->post(frame(2, c.value(), payload, 2)) == PostResult::kOk);
  CHECK(pair.a->post(frame(3, c.value(), payload, 3)) == PostResult::kBackpressure);
  pair.link->breakLink(FL_ERR_LINK_LOST, "cable pulled");
  CHECK_FALSE(pair.link->up());
  CHECK_FALSE(pair.a->connected());
  auto tx = drain(*pair.a);
  REQUIRE(tx.size() == 3);
  CHECK(tx[0].cookie == 1u);
  CHECK(tx[0].status == FL_ERR_LINK_LOST);
  CHECK(tx[1].cookie == 2u);
  CHECK(tx[1].status == FL_ERR_LINK_LOST);
  CHECK(tx[2].kind == Kind::kLinkError);
  CHECK(tx[2].message == "cable pulled");
  auto rx = drain(*pair.b);
  REQUIRE(rx.size() == 1);
  CHECK(rx[0].kind == Kind::kLinkError);
  CHECK(buf[0] == 0);
  CHECK(pair.a->post(frame(4, c.value(), payload, 4)) == PostResult::kNotConnected);
  pair.link->breakLink(FL_ERR_LINK_LOST, "again");  // once only
  CHECK(drain(*pair.a).empty());
  CHECK(drain(*pair.b).empty());
}

}  // namespace framelink::transport::loopback
