// The Transport conformance suite (transport_conformance.h), frames: every
// header field and payload byte arrives, frames of any size and in any
// number arrive in order, backpressure loses none, and eventFd says when
// there is something to poll.
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/transport.h"
#include "transport_conformance.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

TEMPLATE_TEST_CASE("single frame round trip carries every header field", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  // Both directions: a -> b and b -> a.
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    Endpoint tx{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint rx{dir == 0 ? pair->b.get() : pair->a.get()};
    Buffer buf(100'000);
    RemoteCredit credit = expose(*rx.t, buf.credit(41 + dir));
    CHECK(credit.credit_id == 41u + dir);
    CHECK(credit.length == 100'000u);

    auto payload = pattern(1234 + dir, 77'777);
    SendRequest r = request(0xC00C1E + dir, credit, payload, 99);
    r.header.stream_id = 0x1122334455667788ull;
    r.header.frame_id = 0xF00DF00DF00Dull;
    r.header.group_id = 0xABCDEF;
    r.header.timestamp_ns = 1'700'000'000'123'456'789ull;
    r.header.crc32c = 0xDEADBEEF;
    r.header.has_crc32c = 1;
    r.header.maybe_redelivered = 1;
    r.header.subscribers_only = 1;
    r.header.attr_length = FL_MAX_ATTR_BYTES;
    for (uint32_t i = 0; i < FL_MAX_ATTR_BYTES; ++i) r.header.attrs[i] = static_cast<uint8_t>(i * 7 + 1);
    REQUIRE(tx.post(r) == PostResult::kOk);

    waitFor(
        tx, rx, [&] { return !tx.sends.empty() && !rx.arrivals.empty(); }, "send completion and arrival");
    REQUIRE(tx.sends.size() == 1);
    CHECK(tx.sends[0].cookie == 0xC00C1Eu + dir);
    CHECK(tx.sends[0].status == FL_OK);
    REQUIRE(rx.arrivals.size() == 1);
    const TransportEvent& ev = rx.arrivals[0];
    CHECK(ev.status == FL_OK);
    CHECK(ev.header.stream_id == r.header.stream_id);
    CHECK(ev.header.sequence == 99u);
    CHECK(ev.header.credit_id == credit.credit_id);
    CHECK(ev.header.frame_id == r.header.frame_id);
    CHECK(ev.header.group_id == r.header.group_id);
    CHECK(ev.header.timestamp_ns == r.header.timestamp_ns);
    CHECK(ev.header.length == payload.size());
    CHECK(ev.header.crc32c == 0xDEADBEEFu);
    CHECK(ev.header.has_crc32c == 1u);
    CHECK(ev.header.maybe_redelivered == 1u);
    CHECK(ev.header.subscribers_only == 1u);
    CHECK(ev.header.attr_length == FL_MAX_ATTR_BYTES);
    CHECK(std::memcmp(ev.header.attrs, r.header.attrs, FL_MAX_ATTR_BYTES) == 0);
    CHECK(firstMismatch(buf.data(), payload) == -1);
    // Bytes past the frame are untouched.
    CHECK(buf.data()[payload.size()] == 0xEE);
    CHECK(tx.errors.empty());
    CHECK(rx.errors.empty());
  }
}

TEMPLATE_TEST_CASE("short attributes and no crc round trip", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  Buffer buf(64);
  RemoteCredit credit = expose(*rx.t, buf.credit(1));
  auto payload = pattern(5, 64);
  SendRequest r = request(1, credit, payload, 1);
  const char attrs[] = "frame=0;wafer=0";
  r.header.attr_length = sizeof attrs - 1;
  std::memcpy(r.header.attrs, attrs, r.header.attr_length);
  REQUIRE(tx.post(r) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return !rx.arrivals.empty(); }, "arrival");
  CHECK(rx.arrivals[0].header.has_crc32c == 0u);
  CHECK(rx.arrivals[0].header.maybe_redelivered == 0u);
  CHECK(rx.arrivals[0].header.subscribers_only == 0u);
  CHECK(rx.arrivals[0].header.attr_length == sizeof attrs - 1);
  CHECK(std::string(reinterpret_cast<const char*>(rx.arrivals[0].header.attrs),
                    rx.arrivals[0].header.attr_length) == "frame=0;wafer=0");
  CHECK(firstMismatch(buf.data(), payload) == -1);
}

TEMPLATE_TEST_CASE("zero-length frame", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  Buffer buf(16);
  RemoteCredit credit = expose(*rx.t, buf.credit(3));
  Payload empty;
  REQUIRE(tx.post(request(10, credit, empty, 1)) == PostResult::kOk);
  // And a normal frame after it, to show the stream stayed in sync.
  Buffer buf2(16);
  RemoteCredit credit2 = expose(*rx.t, buf2.credit(4));
  auto payload = pattern(9, 16);
  REQUIRE(tx.post(request(11, credit2, payload, 2)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return tx.sends.size() == 2 && rx.arrivals.size() == 2; }, "two frames");
  CHECK(tx.sends[0].cookie == 10u);
  CHECK(tx.sends[0].status == FL_OK);
  CHECK(rx.arrivals[0].status == FL_OK);
  CHECK(rx.arrivals[0].header.length == 0u);
  CHECK(rx.arrivals[0].header.credit_id == 3u);
  CHECK(buf.data()[0] == 0xEE);
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(rx.arrivals[1].header.sequence == 2u);
  CHECK(firstMismatch(buf2.data(), payload) == -1);
}

TEMPLATE_TEST_CASE("8 MiB frame", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  const size_t size = size_t{8} << 20;
  Buffer buf(size);
  RemoteCredit credit = expose(*rx.t, buf.credit(8));
  auto payload = pattern(88, size);
  REQUIRE(tx.post(request(8, credit, payload, 1)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return !tx.sends.empty() && !rx.arrivals.empty(); }, "8 MiB frame");
  CHECK(tx.sends[0].status == FL_OK);
  CHECK(rx.arrivals[0].status == FL_OK);
  CHECK(rx.arrivals[0].header.length == size);
  CHECK(firstMismatch(buf.data(), payload) == -1);
}

TEMPLATE_TEST_CASE("500 frames of random sizes arrive in order, byte for byte", "[transport]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  constexpr size_t kFrames = 500;
  constexpr size_t kWindow = 24;  // credits outstanding, like the daemon's grants
  std::mt19937_64 rng(20240611);
  std::uniform_int_distribution<uint64_t> size_dist(1, 1 << 20);
  std::vector<size_t> sizes(kFrames);
  for (auto& s : sizes) s = size_dist(rng);

  CreditWindow window(*rx.t, kFrames, kWindow, [&](size_t frame) { return sizes[frame]; });
  std::map<uint64_t, Payload> in_flight;  // cookie -> payload, until SendComplete

  size_t next_post = 0;
  size_t verified = 0;
  size_t sends_seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 3;
  while (verified < kFrames || sends_seen < kFrames) {
    while (next_post < kFrames && window.granted(next_post) != nullptr) {
      auto payload = pattern(next_post, sizes[next_post]);
      SendRequest r = request(next_post, *window.granted(next_post), payload, next_post + 1);
      PostResult pr = tx.post(r);
      if (pr == PostResult::kBackpressure) break;
      REQUIRE(pr == PostResult::kOk);
      in_flight.emplace(next_post, std::move(payload));
      window.posted(next_post);
      ++next_post;
    }
    tx.pump();
    rx.pump();
    for (; sends_seen < tx.sends.size(); ++sends_seen) {
      const auto& ev = tx.sends[sends_seen];
      REQUIRE(ev.status == FL_OK);
      REQUIRE(ev.cookie == sends_seen);  // completions in posting order
      in_flight.erase(ev.cookie);
    }
    for (; verified < rx.arrivals.size(); ++verified) {
      const auto& ev = rx.arrivals[verified];
      REQUIRE(ev.status == FL_OK);
      REQUIRE(ev.header.sequence == verified + 1);
      REQUIRE(ev.header.credit_id == verified + 1);
      REQUIRE(ev.header.length == sizes[verified]);
      auto want = pattern(verified, sizes[verified]);
      long bad = firstMismatch(window.landed(verified).data(), want);
      if (bad != -1) FAIL("frame " << verified << " differs at byte " << bad);
      window.release(verified);
    }
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: posted " << next_post << ", completed " << sends_seen << ", arrived " << verified);
    }
    awaitEvents(tx, rx, 10);
  }
  CHECK(in_flight.empty());
}

TEMPLATE_TEST_CASE("backpressure: post until full, then continue without losing a frame", "[transport]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  constexpr size_t kFrames = 600;
  // Every credit points at one shared buffer: this test is about counting,
  // the content of the last frame is still checked.  Not so for rdma, where
  // each frame's header lands in its credit's slot header and is read from
  // there: one (smaller) buffer per credit.  Its send queue fills at its
  // depth whatever the frame size.
  constexpr bool kRdma = TestType::kKind == TransportKind::kRdma;
  constexpr size_t kSize = kRdma ? 64 * 1024 : 256 * 1024;
  std::vector<Buffer> buffers;
  std::vector<RemoteCredit> credits;
  for (size_t i = 0; i < kFrames; ++i) {
    if (kRdma || buffers.empty()) buffers.emplace_back(kSize);
    auto r = rx.t->exposeCredit(buffers.back().credit(1000 + i));
    // rdma binds a memory window per credit, a bounded number at a time
    // until the receiver polls their completions.
    for (int tries = 0; !r && r.error().code == FL_ERR_RESOURCES && tries < 1000; ++tries) {
      rx.pump();
      readable(rx.t->eventFd(), 10);
      r = rx.t->exposeCredit(buffers.back().credit(1000 + i));
    }
    if (!r) FAIL("exposeCredit(" << 1000 + i << "): " << r.error().message);
    credits.push_back(r.value());
  }
  rx.t->flush();
  std::vector<Payload> payloads;
  for (size_t i = 0; i < kFrames; ++i) payloads.push_back(pattern(i, kSize));

  size_t posted = 0;
  bool saw_backpressure = false;
  // Without polling, the queue must fill long before 600 x 256 KiB are on
  // the wire.
  while (posted < kFrames) {
    PostResult pr = tx.post(request(posted, credits[posted], payloads[posted], posted + 1));
    if (pr == PostResult::kBackpressure) {
      saw_backpressure = true;
      break;
    }
    REQUIRE(pr == PostResult::kOk);
    ++posted;
  }
  REQUIRE(saw_backpressure);
  INFO("backpressure after " << posted << " posts");
  CHECK(posted >= 1);

  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 3;
  size_t backpressured = 1;
  while (tx.sends.size() < kFrames || rx.arrivals.size() < kFrames) {
    while (posted < kFrames) {
      PostResult pr = tx.post(request(posted, credits[posted], payloads[posted], posted + 1));
      if (pr == PostResult::kBackpressure) {
        ++backpressured;
        break;
      }
      REQUIRE(pr == PostResult::kOk);
      ++posted;
    }
    tx.pump();
    rx.pump();
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: posted " << posted << ", completed " << tx.sends.size() << ", arrived "
                                << rx.arrivals.size());
    }
    awaitEvents(tx, rx, 5);
  }
  REQUIRE(tx.sends.size() == kFrames);
  REQUIRE(rx.arrivals.size() == kFrames);
  for (size_t i = 0; i < kFrames; ++i) {
    REQUIRE(tx.sends[i].cookie == i);
    REQUIRE(tx.sends[i].status == FL_OK);
    REQUIRE(rx.arrivals[i].status == FL_OK);
    REQUIRE(rx.arrivals[i].header.sequence == i + 1);
    REQUIRE(rx.arrivals[i].header.credit_id == 1000 + i);
  }
  CHECK(firstMismatch(buffers.back().data(), payloads[kFrames - 1]) == -1);
}

TEMPLATE_TEST_CASE("eventFd is readable exactly while events are pending", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  CHECK(tx.t->eventFd() >= 0);
  CHECK(tx.t->eventFd() != rx.t->eventFd());
  tx.pump();
  rx.pump();
  CHECK_FALSE(readable(tx.t->eventFd(), 0));
  CHECK_FALSE(readable(rx.t->eventFd(), 0));

  Buffer bufs[3] = {Buffer(100), Buffer(100), Buffer(100)};
  auto payload = pattern(7, 100);
  RemoteCredit credits[3];
  for (uint64_t i = 0; i < 3; ++i) credits[i] = expose(*rx.t, bufs[i].credit(i + 1));
  rx.pump();  // rdma: the completions of the memory-window binds
  CHECK_FALSE(readable(rx.t->eventFd(), 0));
  for (uint64_t i = 0; i < 3; ++i)
    REQUIRE(tx.post(request(i, credits[i], payload, i + 1)) == PostResult::kOk);
  tx.t->flush();
  const int wait_ms = static_cast<int>(std::chrono::milliseconds(kDeadline).count());
  REQUIRE(readable(tx.t->eventFd(), wait_ms));
  REQUIRE(readable(rx.t->eventFd(), wait_ms));

  // Drain one event at a time: while any is left, the fd stays readable.
  size_t arrived = 0;
  TransportEvent ev;
  while (arrived < 3) {
    if (!readable(rx.t->eventFd(), wait_ms))
      FAIL("eventFd not readable with " << (3 - arrived) << " frames to come");
    size_t n = rx.t->poll(&ev, 1);
    if (n == 1) {
      CHECK(ev.kind == Kind::kFrameArrived);
      ++arrived;
    }
  }
  CHECK(rx.t->poll(&ev, 1) == 0);
  // rdma: the completions of the windows' invalidations may come later;
  // they wake the fd once and report nothing.
  while (readable(rx.t->eventFd(), 100)) CHECK(rx.t->poll(&ev, 1) == 0);

  size_t completed = 0;
  while (completed < 3) {
    if (!readable(tx.t->eventFd(), wait_ms)) FAIL("eventFd not readable with completions to come");
    completed += tx.t->poll(&ev, 1);
  }
  CHECK(tx.t->poll(&ev, 1) == 0);
  CHECK_FALSE(readable(tx.t->eventFd(), 0));

  // A LinkError makes it readable too.
  rx.t->shutdown();
  REQUIRE(readable(tx.t->eventFd(), wait_ms));
  CHECK(std::string(tx.t->name()) == kindName(TestType::kKind));
}

}  // namespace framelink::transport::testing
