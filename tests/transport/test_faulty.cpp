// The `faulty` decorator's own faults, over a tcp pair: each one does what the
// data agent's recovery expects of a real link with that fault.  (The
// decorator with every fault off runs the whole conformance suite as FaultyTcp.)
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/faulty/faulty_transport.h"
#include "transport/transport.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

namespace {

struct FaultyPair {
  std::unique_ptr<TransportPair> pair;
  std::shared_ptr<FaultyTransport> a, b;  // the pair's transports, each under its own spec
};

FaultyPair faultyPair(const std::string& spec_a, const std::string& spec_b) {
  FaultyPair f;
  f.pair = makePair<Tcp>();
  auto sa = parseFaultSpec(spec_a);
  auto sb = parseFaultSpec(spec_b);
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  auto a = FaultyTransport::wrap(f.pair->a, sa.value(), 1);
  auto b = FaultyTransport::wrap(f.pair->b, sb.value(), 2);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  f.a = a.value();
  f.b = b.value();
  f.pair->a = f.a;
  f.pair->b = f.b;
  return f;
}

// Posts frames 0..n-1 (cookie i, sequence i + 1) from tx, each into its own
// 4 KiB piece of `buf` exposed on rx as credit i + 1.
void postEach(Endpoint& tx, Endpoint& rx, const Buffer& buf, uint64_t n, const Payload& payload) {
  for (uint64_t i = 0; i < n; ++i) {
    LocalCredit c = buf.credit(i + 1);
    c.buffer += i * 4096;
    c.capacity = 4096;
    REQUIRE(tx.post(request(i, expose(*rx.t, c), payload, i + 1)) == PostResult::kOk);
  }
  tx.t->flush();  // as the data agent does after a round of posts
}

}  // namespace

TEST_CASE("fault spec: every key parses, mistakes name the key", "[transport][faulty]") {
  auto s = parseFaultSpec(
      "seed=7,drop=0.5,fail=0.25,disconnect=0.125,dup=1,delay=0,delay_ms=20,corrupt=0.75,stall=0.5,mute=0."
      "25");
  REQUIRE(s.ok());
  CHECK(s.value().seed == 7);
  CHECK(s.value().drop == 0.5);
  CHECK(s.value().fail == 0.25);
  CHECK(s.value().disconnect == 0.125);
  CHECK(s.value().dup == 1);
  CHECK(s.value().delay_ms == 20);
  CHECK(s.value().corrupt == 0.75);
  CHECK(s.value().stall == 0.5);
  CHECK(s.value().mute == 0.25);
  CHECK(s.value().any());
  CHECK(parseFaultSpec("stall=0.1").value().any());
  CHECK_FALSE(parseFaultSpec("").value().any());
  for (const char* bad :
       {"drop=2", "drop=-0.1", "drop=x", "seed=1.5", "loss=0.1", "drop", "delay_ms=99999", "stall=1.5"}) {
    CAPTURE(bad);
    auto r = parseFaultSpec(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == FL_EINVAL);
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    CHECK(r.error().message.find(key) != std::string::npos);
  }
}

TEST_CASE("faulty drop: the frame never arrives, its send fails and the link breaks", "[transport][faulty]") {
  auto f = faultyPair("drop=1", "");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  Buffer buf(4096);
  auto payload = pattern(1, 1000);
  REQUIRE(tx.post(request(5, expose(*rx.t, buf.credit(1)), payload, 1)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return !tx.sends.empty() && !tx.errors.empty() && !rx.errors.empty(); },
      "the failed send and both link errors");
  CHECK(tx.sends[0].cookie == 5);
  CHECK(tx.sends[0].status == FL_ERR_LINK_LOST);
  CHECK(tx.errors.size() == 1);
  CHECK(rx.arrivals.empty());
  CHECK(buf.data()[0] == 0xEE);
  CHECK_FALSE(tx.t->connected());
  CHECK(tx.post(request(6, RemoteCredit{2, 4096, 0, 0}, payload, 2)) == PostResult::kNotConnected);
  CHECK(f.a->counts().drops == 1);
}

TEST_CASE("faulty fail: the send is reported failed and the link breaks, no OK after",
          "[transport][faulty]") {
  auto f = faultyPair("fail=1", "");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  Buffer buf(4096);
  auto payload = pattern(2, 500);
  REQUIRE(tx.post(request(9, expose(*rx.t, buf.credit(1)), payload, 1)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return !tx.sends.empty() && !tx.errors.empty(); }, "the failed send");
  REQUIRE(tx.sends.size() == 1);
  CHECK(tx.sends[0].status == FL_ERR_LINK_LOST);
  CHECK(tx.order.front() == Kind::kLinkError);  // the error comes first: nothing is OK after it
  CHECK(f.a->counts().fails == 1);
}

TEST_CASE("faulty dup: every send completion is reported twice", "[transport][faulty]") {
  auto f = faultyPair("dup=1", "");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  Buffer buf(4096 * 4);
  auto payload = pattern(3, 100);
  postEach(tx, rx, buf, 4, payload);
  waitFor(
      tx, rx, [&] { return tx.sends.size() == 8 && rx.arrivals.size() == 4; }, "8 completions");
  std::map<uint64_t, int> per_cookie;
  for (auto& s : tx.sends) {
    CHECK(s.status == FL_OK);
    ++per_cookie[s.cookie];
  }
  CHECK(per_cookie == std::map<uint64_t, int>{{0, 2}, {1, 2}, {2, 2}, {3, 2}});
  CHECK(f.a->counts().dups == 4);
}

TEST_CASE("faulty delay: events come late, arrivals still in order, eventFd wakes when due",
          "[transport][faulty]") {
  auto f = faultyPair("", "delay=0.5,delay_ms=150,seed=3");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  constexpr uint64_t kFrames = 20;
  Buffer buf(4096 * kFrames);
  auto payload = pattern(4, 64);
  const auto t0 = std::chrono::steady_clock::now();
  postEach(tx, rx, buf, kFrames, payload);
  // Only the wake-up of the eventFd brings the held arrivals out.
  while (rx.arrivals.size() < kFrames) {
    REQUIRE(readable(rx.t->eventFd(), 5000));
    rx.pump();
    tx.pump();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 150ms);
  for (uint64_t i = 0; i < kFrames; ++i) CHECK(rx.arrivals[i].header.sequence == i + 1);
  CHECK(f.b->counts().delays > 0);
  CHECK(f.b->counts().delays < kFrames);
}

TEST_CASE("faulty corrupt: a frame with a CRC32C lands with one byte changed", "[transport][faulty]") {
  auto f = faultyPair("", "corrupt=1");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  Buffer with_crc(4096), without_crc(4096);
  auto payload = pattern(5, 3000);
  SendRequest r1 = request(1, expose(*rx.t, with_crc.credit(1)), payload, 1);
  r1.header.has_crc32c = 1;
  SendRequest r2 = request(2, expose(*rx.t, without_crc.credit(2)), payload, 2);
  REQUIRE(tx.post(r1) == PostResult::kOk);
  REQUIRE(tx.post(r2) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return rx.arrivals.size() == 2; }, "both arrivals");
  size_t changed = 0;
  for (size_t i = 0; i < payload.size(); ++i) changed += with_crc.data()[i] != payload[i] ? 1 : 0;
  CHECK(changed == 1);
  CHECK(firstMismatch(without_crc.data(), payload) == -1);  // no CRC: nobody could notice, so no damage
  CHECK(f.b->counts().corruptions == 1);
}

TEST_CASE("faulty stall: a read's completion never comes while the link lives, then it fails LINK_LOST",
          "[transport][faulty]") {
  auto f = faultyPair("", "stall=1");
  Endpoint owner{f.a.get()}, reader{f.b.get()};
  auto payload = pattern(4, 3000);
  LocalSource source;
  source.source_id = 7;
  source.payload = payload.data();
  source.length = payload.size();
  auto exposed = f.a->exposeSource(source);
  REQUIRE(exposed.ok());
  owner.t->flush();
  Buffer buf(4096);
  ReadRequest r;
  r.cookie = 31;
  r.source = exposed.value();
  r.buffer = buf.data();
  r.capacity = buf.size();
  REQUIRE(reader.postRead(r) == PostResult::kOk);
  // The bytes land (the wrapped transport read them); the completion does not come.
  waitFor(
      owner, reader, [&] { return buf.data()[0] == payload[0] && f.b->counts().stalls == 1; },
      "the read to land and its completion to be withheld");
  settle(owner, reader);
  CHECK(reader.reads.empty());
  // The link ends: the read is reported, failed, with it.
  f.pair->a->shutdown();
  waitFor(
      owner, reader, [&] { return !reader.reads.empty() && !reader.errors.empty(); },
      "the stalled read to end with the link");
  REQUIRE(reader.reads.size() == 1);
  CHECK(reader.reads[0].cookie == 31);
  CHECK(reader.reads[0].status == FL_ERR_LINK_LOST);
}

TEST_CASE("faulty mute: a record, and whatever is posted after it, is taken and never delivered",
          "[transport][faulty]") {
  auto f = faultyPair("mute=1", "");
  Endpoint tx{f.a.get()}, rx{f.b.get()};
  Buffer buf(4096);
  auto payload = pattern(8, 700);
  REQUIRE(tx.t->postControl("first") == PostResult::kOk);
  REQUIRE(tx.post(request(12, expose(*rx.t, buf.credit(1)), payload, 1)) == PostResult::kOk);
  settle(tx, rx);
  settle(tx, rx);
  CHECK(rx.controls.empty());
  CHECK(rx.arrivals.empty());
  CHECK(tx.sends.empty());  // neither delivered nor failed while the link lives
  CHECK(tx.t->connected());
  CHECK(f.a->counts().mutes == 1);
  f.pair->b->shutdown();
  waitFor(
      tx, rx, [&] { return !tx.sends.empty() && !tx.errors.empty(); }, "the link's end");
  REQUIRE(tx.sends.size() == 1);
  CHECK(tx.sends[0].cookie == 12);
  CHECK(tx.sends[0].status == FL_ERR_LINK_LOST);
}

TEST_CASE("faulty: the same seed injects the same faults", "[transport][faulty]") {
  auto run = [] {
    auto f = faultyPair("seed=11,dup=0.3", "");
    Endpoint tx{f.a.get()}, rx{f.b.get()};
    Buffer buf(4096 * 30);
    auto payload = pattern(6, 10);
    postEach(tx, rx, buf, 30, payload);
    std::map<uint64_t, int> per_cookie;
    waitFor(
        tx, rx,
        [&] {
          per_cookie.clear();
          for (auto& s : tx.sends) ++per_cookie[s.cookie];
          return rx.arrivals.size() == 30 && per_cookie.size() == 30;
        },
        "30 frames");
    return per_cookie;
  };
  auto first = run();
  auto second = run();
  CHECK(first == second);
  size_t doubled = 0;
  for (auto& [cookie, n] : first) doubled += n == 2 ? 1 : 0;
  CHECK(doubled > 0);
  CHECK(doubled < 30);
}

}  // namespace framelink::transport::testing
