// The Transport conformance suite (transport_conformance.h), refusals and
// failures: unknown and retracted credits are reported and the link stays
// up, malformed requests and duplicate credit ids are refused, and a link
// shut down on either side completes every pending send and fails once.
#include <algorithm>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/transport.h"
#include "transport_conformance.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

TEMPLATE_TEST_CASE("unknown credit is reported and the link stays usable", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  // The sender names a credit the receiver does not know (3 MiB: crosses
  // chunk boundaries and socket buffers while it is discarded), aimed at a
  // live credit's memory: rdma accepts a write only inside the memory
  // window of a live credit, and breaks the link on any other.
  Buffer bogus_buf(4 << 20);
  RemoteCredit bogus = expose(*rx.t, bogus_buf.credit(776));
  bogus.credit_id = 777;
  auto big = pattern(1, 3 << 20);
  REQUIRE(tx.post(request(1, bogus, big, 5)) == PostResult::kOk);
  Buffer buf(1000);
  RemoteCredit good = expose(*rx.t, buf.credit(778));
  auto payload = pattern(2, 1000);
  REQUIRE(tx.post(request(2, good, payload, 6)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return tx.sends.size() == 2 && rx.arrivals.size() == 2; }, "both frames");
  CHECK(tx.sends[0].status == FL_OK);  // the sender cannot know; the daemon NACKs
  CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[0].header.credit_id == 777u);
  // rdma reads a frame's header from its credit's slot: none for an id never exposed.
  if (TestType::kKind != TransportKind::kRdma) CHECK(rx.arrivals[0].header.sequence == 5u);
  CHECK(!rx.arrivals[0].message.empty());
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(rx.arrivals[1].header.sequence == 6u);
  CHECK(firstMismatch(buf.data(), payload) == -1);
  CHECK(rx.errors.empty());
  CHECK(tx.errors.empty());
  CHECK(rx.t->connected());
  // A credit is consumed by its frame.  Using it again is an unknown
  // credit; on rdma its window is gone and the adapter refuses the write.
  REQUIRE(tx.post(request(3, good, payload, 7)) == PostResult::kOk);
  if (TestType::kKind == TransportKind::kRdma) {
    waitFor(
        tx, rx, [&] { return tx.sends.size() == 3 && !tx.errors.empty(); }, "the refused write");
    CHECK(tx.sends[2].status == FL_ERR_TRANSPORT);
    CHECK(firstMismatch(buf.data(), payload) == -1);
    return;
  }
  // The payload stays valid until its send completes: a receiver may report
  // a frame for an unknown credit before the sender has written all of it.
  waitFor(
      tx, rx, [&] { return rx.arrivals.size() == 3 && tx.sends.size() == 3; }, "reused credit and its send");
  CHECK(rx.arrivals[2].status == FL_ERR_UNKNOWN_CREDIT);
}

TEMPLATE_TEST_CASE("retracted credit is reported and its buffer is not written", "[transport]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  Buffer gone(200'000);
  RemoteCredit c = expose(*rx.t, gone.credit(50));
  rx.t->retractCredit(50);
  rx.t->retractCredit(12345);  // never exposed: harmless
  auto payload = pattern(3, 200'000);
  auto untouched = [&] {
    return std::all_of(gone.data(), gone.data() + gone.size(), [](uint8_t b) { return b == 0xEE; });
  };
  if (TestType::kKind == TransportKind::kRdma) {
    // The credit's memory window ended with it: the adapter refuses the
    // write (REM_ACCESS_ERR), which fails the frame and the link.
    REQUIRE(tx.post(request(1, c, payload, 1)) == PostResult::kOk);
    waitFor(
        tx, rx, [&] { return tx.sends.size() == 1 && !tx.errors.empty(); }, "the refused write");
    CHECK(tx.sends[0].status == FL_ERR_TRANSPORT);
    CHECK(untouched());
    return;
  }
  REQUIRE(tx.post(request(1, c, payload, 1)) == PostResult::kOk);
  Buffer buf(10);
  RemoteCredit good = expose(*rx.t, buf.credit(51));
  auto small = pattern(4, 10);
  REQUIRE(tx.post(request(2, good, small, 2)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return rx.arrivals.size() == 2 && tx.sends.size() == 2; }, "both frames");
  CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[0].header.credit_id == 50u);
  CHECK(untouched());
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(firstMismatch(buf.data(), small) == -1);
  CHECK(rx.errors.empty());
  // The id can be exposed again after the retraction.
  Buffer again(10);
  CHECK(rx.t->exposeCredit(again.credit(50)).ok());
}

TEMPLATE_TEST_CASE("malformed requests are refused by post", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  Buffer buf(100);
  RemoteCredit c = expose(*rx.t, buf.credit(9));
  auto payload = pattern(1, 101);
  CHECK(tx.post(request(1, c, payload, 1)) == PostResult::kInvalid);  // length > credit
  auto fits = pattern(1, 100);
  SendRequest r = request(2, c, fits, 1);
  r.header.attr_length = FL_MAX_ATTR_BYTES + 1;
  CHECK(tx.post(r) == PostResult::kInvalid);
  r = request(3, c, fits, 1);
  r.payload = nullptr;
  CHECK(tx.post(r) == PostResult::kInvalid);
  r = request(4, c, fits, 1);
  r.header.credit_id = 10;  // does not match request.credit
  CHECK(tx.post(r) == PostResult::kInvalid);
  // Nothing was queued: the one valid frame is the first to arrive.
  REQUIRE(tx.post(request(5, c, fits, 2)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return !rx.arrivals.empty() && !tx.sends.empty(); }, "the valid frame");
  settle(tx, rx);
  REQUIRE(tx.sends.size() == 1);
  CHECK(tx.sends[0].cookie == 5u);
  REQUIRE(rx.arrivals.size() == 1);
  CHECK(rx.arrivals[0].header.sequence == 2u);
  CHECK(rx.arrivals[0].status == FL_OK);
}

TEMPLATE_TEST_CASE("credit ids are unique per link", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Buffer x(10), y(10);
  REQUIRE(pair->b->exposeCredit(x.credit(1)).ok());
  auto dup = pair->b->exposeCredit(y.credit(1));
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.error().code == FL_EINVAL);
  LocalCredit null_buffer{2, nullptr, 10, nullptr};
  CHECK_FALSE(pair->b->exposeCredit(null_buffer).ok());
}

TEMPLATE_TEST_CASE("peer shutdown fails the link on the other side", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  const bool dialer_goes_away = GENERATE(true, false);
  CAPTURE(dialer_goes_away);
  Endpoint survivor{dialer_goes_away ? pair->b.get() : pair->a.get()};
  Endpoint leaver{dialer_goes_away ? pair->a.get() : pair->b.get()};

  // Queue far more than can be in flight, then the peer goes away.  The
  // leaver's only credit is retracted, so everything that does arrive is
  // discarded.
  DiscardedCredit discarded(*leaver.t);
  const RemoteCredit& c = discarded.credit;
  const Payload& payload = discarded.payload;
  size_t posted = 0;
  while (posted < 1000) {
    SendRequest r = request(posted, c, payload, posted + 1);
    PostResult pr = survivor.post(r);
    if (pr == PostResult::kBackpressure) break;
    REQUIRE(pr == PostResult::kOk);
    ++posted;
  }
  REQUIRE(posted > 0);
  survivor.t->flush();
  leaver.t->shutdown();
  CHECK_FALSE(leaver.t->connected());

  waitFor(
      survivor, leaver, [&] { return !survivor.errors.empty() && survivor.sends.size() == posted; },
      "LinkError and a completion for every posted frame");
  CHECK(survivor.errors.size() == 1);
  CHECK(survivor.errors[0].status != FL_OK);
  CHECK(!survivor.errors[0].message.empty());
  CHECK_FALSE(survivor.t->connected());
  // Exactly one completion per cookie; nothing reported OK after the LinkError.
  std::vector<int> seen(posted, 0);
  size_t lost = 0;
  for (const auto& ev : survivor.sends) {
    REQUIRE(ev.cookie < posted);
    ++seen[ev.cookie];
    CHECK((ev.status == FL_OK || ev.status == FL_ERR_LINK_LOST));
    if (ev.status == FL_ERR_LINK_LOST) ++lost;
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  CHECK(lost > 0);
  bool after_error = false;
  size_t send_index = 0;
  for (Kind k : survivor.order) {
    if (k == Kind::kLinkError) after_error = true;
    if (k == Kind::kSendComplete) {
      if (after_error) CHECK(survivor.sends[send_index].status == FL_ERR_LINK_LOST);
      ++send_index;
    }
  }
  CHECK(survivor.post(request(9999, c, payload, 9999)) == PostResult::kNotConnected);
  Buffer b(10);
  CHECK_FALSE(survivor.t->exposeCredit(b.credit(5)).ok());

  // The side that shut down reports it once too, and refuses posts.
  leaver.pump();
  REQUIRE(leaver.errors.size() == 1);
  CHECK(leaver.errors[0].status == FL_ERR_SHUTDOWN);
  CHECK(leaver.post(request(1, c, payload, 1)) == PostResult::kNotConnected);

  // shutdown() is idempotent and the survivor can be shut down after the loss.
  leaver.t->shutdown();
  survivor.t->shutdown();
  survivor.pump();
  CHECK(survivor.errors.size() == 1);
}

TEMPLATE_TEST_CASE("local shutdown completes pending sends with FL_ERR_LINK_LOST", "[transport]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  DiscardedCredit discarded(*rx.t);
  size_t posted = 0;
  while (posted < 1000 &&
         tx.post(request(posted, discarded.credit, discarded.payload, posted + 1)) == PostResult::kOk) {
    ++posted;
  }
  tx.t->flush();
  tx.t->shutdown();
  // Everything is reported by the time shutdown() returns.
  tx.pump();
  REQUIRE(tx.sends.size() == posted);
  CHECK(std::any_of(tx.sends.begin(), tx.sends.end(),
                    [](const auto& e) { return e.status == FL_ERR_LINK_LOST; }));
  REQUIRE(tx.errors.size() == 1);
  CHECK(tx.errors[0].status == FL_ERR_SHUTDOWN);
  waitFor(
      tx, rx, [&] { return !rx.errors.empty(); }, "LinkError on the peer");
  CHECK_FALSE(rx.t->connected());
}

}  // namespace framelink::transport::testing
