// The tcp transport's zero-copy send (TcpTransportOptions::zerocopy_min_bytes)
// over a real loopback connection: a large frame goes from the caller's memory
// with MSG_ZEROCOPY and completes only once the kernel's notification says it
// let the pages go; small frames beside it go with copies and complete at
// once; the kernel copies on loopback, and after the first calls all said so
// the link stops asking; a link that fails with pages still the kernel's
// resets the connection and completes each frame once, none OK.
#include <sys/socket.h>

#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tcp_socket_pair.h"
#include "transport/tcp/tcp_transport.h"
#include "transport_test_util.h"

namespace framelink::transport::tcp {
namespace {

using testing::Buffer;
using testing::Endpoint;
using testing::firstMismatch;
using testing::pattern;
using testing::Payload;
using testing::request;
using testing::waitFor;

struct ZcPair {
  std::unique_ptr<TcpTransport> a;  // sends, zero-copy from zc_min bytes
  std::unique_ptr<TcpTransport> b;
};

ZcPair zcPair(int buffer_bytes, uint64_t zc_min) {
  testing::g_pair = nullptr;
  auto [x, y] = testing::socketPair(buffer_bytes);
  TcpTransportOptions zc;
  zc.zerocopy_min_bytes = zc_min;
  auto a = TcpTransport::make(std::move(x), "a", zc);
  auto b = TcpTransport::make(std::move(y), "b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  return ZcPair{std::move(a).value(), std::move(b).value()};
}

}  // namespace

TEST_CASE("tcp zero-copy: a large frame completes only after the kernel's notification; small ones at once",
          "[transport][tcp][zerocopy]") {
  ZcPair p = zcPair(4 << 20, 256 * 1024);  // room for every frame in the sockets
  REQUIRE(p.a->zerocopyOn());
  Buffer big(1 << 20);
  Payload big_payload = pattern(1, 1 << 20);
  RemoteCredit big_credit = testing::expose(*p.b, big.credit(1));
  std::vector<Buffer> small;
  std::vector<Payload> small_payloads;
  std::vector<RemoteCredit> small_credits;
  small.reserve(4);
  for (uint64_t i = 0; i < 4; ++i) {
    small.emplace_back(4096);
    small_payloads.push_back(pattern(10 + i, 4096));
    small_credits.push_back(testing::expose(*p.b, small.back().credit(10 + i)));
  }
  REQUIRE(p.a->post(request(1, big_credit, big_payload, 1)) == PostResult::kOk);
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(p.a->post(request(10 + i, small_credits[i], small_payloads[i], 10 + i)) == PostResult::kOk);
  }
  p.a->flush();
  REQUIRE(p.a->socketCounters().send_blocked == 0);  // the socket took every byte
  // The small frames, posted after it, are done; the large one's pages are
  // still the kernel's until a poll() takes its notification.
  CHECK(p.a->counters().frames_sent == 4);
  CHECK(p.a->counters().zerocopy_sends >= 1);
  CHECK(p.a->socketCounters().zerocopy_notes == 0);
  Endpoint a{p.a.get()};
  Endpoint b{p.b.get()};
  waitFor(
      a, b, [&] { return a.sends.size() == 5 && b.arrivals.size() == 5; }, "five frames");
  CHECK(p.a->socketCounters().zerocopy_notes >= 1);
  REQUIRE(a.sends.size() == 5);
  CHECK(a.sends.back().cookie == 1u);  // the large frame last, though posted first
  for (const auto& ev : a.sends) CHECK(ev.status == FL_OK);
  CHECK(firstMismatch(big.data(), big_payload) == -1);
  for (uint64_t i = 0; i < 4; ++i) CHECK(firstMismatch(small[i].data(), small_payloads[i]) == -1);
  // Loopback delivers into a local socket: the kernel copied, and says so.
  CHECK(p.a->counters().zerocopy_copied == p.a->counters().zerocopy_sends);
  CHECK(p.a->counters().frames_sent == 5);
}

TEST_CASE("tcp zero-copy: where the kernel copies all the same, the link stops asking after its first calls",
          "[transport][tcp][zerocopy]") {
  ZcPair p = zcPair(0, 64 * 1024);
  Endpoint a{p.a.get()};
  Endpoint b{p.b.get()};
  Buffer landing(64 * 1024);
  Payload payload = pattern(3, 64 * 1024);
  uint64_t sent = 0;
  // One frame at a time: each write a call or a few, each notified.
  while (p.a->zerocopyOn() && sent < 200) {
    RemoteCredit c = testing::expose(*p.b, landing.credit(sent + 1));
    REQUIRE(a.post(request(sent, c, payload, sent + 1)) == PostResult::kOk);
    ++sent;
    waitFor(
        a, b, [&] { return a.sends.size() == sent && b.arrivals.size() == sent; }, "the frame");
    CHECK(firstMismatch(landing.data(), payload) == -1);
  }
  CHECK_FALSE(p.a->zerocopyOn());
  const uint64_t calls = p.a->counters().zerocopy_sends;
  CHECK(calls >= 64);
  CHECK(p.a->counters().zerocopy_copied == calls);
  // From now on with copies: the frame completes inside flush(), no call is zero-copy.
  RemoteCredit c = testing::expose(*p.b, landing.credit(1000));
  REQUIRE(a.post(request(1000, c, payload, 1000)) == PostResult::kOk);
  p.a->flush();
  CHECK(p.a->counters().frames_sent == sent + 1);
  CHECK(p.a->counters().zerocopy_sends == calls);
  for (const auto& ev : a.sends) CHECK(ev.status == FL_OK);
}

TEST_CASE("tcp zero-copy: the link failing with pages still the kernel's resets it and completes each once",
          "[transport][tcp][zerocopy]") {
  ZcPair p = zcPair(32 * 1024, 64 * 1024);
  Endpoint tx{p.a.get()};
  Endpoint rx{p.b.get()};
  Buffer big(4 << 20);
  RemoteCredit c = testing::expose(*rx.t, big.credit(1));
  auto big_payload = std::make_unique<Payload>(pattern(1, 4 << 20));
  REQUIRE(tx.post(request(0, c, *big_payload, 1)) == PostResult::kOk);
  std::vector<Buffer> small;
  std::vector<Payload> small_payloads;
  small.reserve(3);
  for (uint64_t i = 1; i <= 3; ++i) {
    small.emplace_back(100);
    small_payloads.push_back(pattern(i, 100));
    RemoteCredit sc = testing::expose(*rx.t, small.back().credit(i + 1));
    REQUIRE(tx.post(request(i, sc, small_payloads.back(), i + 1)) == PostResult::kOk);
  }
  tx.t->flush();
  // Part of the large payload is in the kernel's queues, sent from its pages;
  // the reader reads nothing, so nothing of it is notified.
  REQUIRE(p.a->socketCounters().send_blocked >= 1);
  REQUIRE(p.a->counters().zerocopy_sends >= 1);
  CHECK(tx.sends.empty());
  tx.t->shutdown();
  // Every frame completes when shutdown() returns, none OK: the connection
  // was reset, so the kernel sends nothing more from the large frame's pages.
  tx.pump();
  REQUIRE(tx.sends.size() == 4);
  std::vector<int> seen(4, 0);
  for (const auto& ev : tx.sends) {
    REQUIRE(ev.cookie < 4);
    ++seen[ev.cookie];
    CHECK(ev.status == FL_ERR_LINK_LOST);
  }
  CHECK(seen == std::vector<int>{1, 1, 1, 1});
  big_payload.reset();
  waitFor(
      tx, rx, [&] { return !rx.errors.empty(); }, "the peer's LinkError");
  CHECK(rx.errors[0].status == FL_ERR_LINK_LOST);
  INFO(rx.errors[0].message);
  CHECK(rx.errors[0].message.find("reset") != std::string::npos);  // not a clean close
  CHECK(rx.arrivals.empty());
}

}  // namespace framelink::transport::tcp
