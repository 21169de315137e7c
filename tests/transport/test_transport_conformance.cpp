// The Transport conformance suite: every test runs against every transport
// (tcp, grpc with the default 4 MiB chunk, grpc with a small chunk so that
// chunk boundaries are exercised by ordinary frame sizes, tcp wrapped in the
// `faulty` decorator with no faults on, and the in-memory loopback link).  Built a second
// time with FL_CONFORMANCE_RDMA for rdma, which needs two RDMA devices (the
// Soft-RoCE lane), so that it never runs where there are none.
//
// Memory follows the daemon's layout for every kind: a receive buffer has
// 256 bytes of slot header room before it, and payloads and receive buffers
// are registered with the pair (rdma needs that; the others ignore it).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/transport.h"
#include "transport_pair.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

#ifdef FL_CONFORMANCE_RDMA
#define FL_TRANSPORTS Rdma
#else
#define FL_TRANSPORTS Tcp, Grpc, GrpcSmallChunk, FaultyTcp, Loopback
#endif

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
    r.header.wafer_id = 0xABCDEF;
    r.header.timestamp_ns = 1'700'000'000'123'456'789ull;
    r.header.crc32c = 0xDEADBEEF;
    r.header.has_crc32c = 1;
    r.header.maybe_redelivered = 1;
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
    CHECK(ev.header.wafer_id == r.header.wafer_id);
    CHECK(ev.header.timestamp_ns == r.header.timestamp_ns);
    CHECK(ev.header.length == payload.size());
    CHECK(ev.header.crc32c == 0xDEADBEEFu);
    CHECK(ev.header.has_crc32c == 1u);
    CHECK(ev.header.maybe_redelivered == 1u);
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

  std::map<uint64_t, Buffer> buffers;        // credit id (= frame index + 1) -> buffer
  std::map<uint64_t, RemoteCredit> granted;  // what the "control link" told the sender
  std::map<uint64_t, Payload> in_flight;     // cookie -> payload, until SendComplete
  auto grant = [&](size_t frame) {
    if (frame >= kFrames) return;
    auto [it, inserted] = buffers.emplace(frame + 1, Buffer(sizes[frame]));
    granted[frame + 1] = expose(*rx.t, it->second.credit(frame + 1));
  };
  for (size_t i = 0; i < kWindow; ++i) grant(i);

  size_t next_post = 0;
  size_t verified = 0;
  size_t sends_seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 3;
  while (verified < kFrames || sends_seen < kFrames) {
    while (next_post < kFrames && granted.count(next_post + 1)) {
      auto payload = pattern(next_post, sizes[next_post]);
      SendRequest r = request(next_post, granted[next_post + 1], payload, next_post + 1);
      PostResult pr = tx.post(r);
      if (pr == PostResult::kBackpressure) break;
      REQUIRE(pr == PostResult::kOk);
      in_flight.emplace(next_post, std::move(payload));
      granted.erase(next_post + 1);
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
      long bad = firstMismatch(buffers.at(verified + 1).data(), want);
      if (bad != -1) FAIL("frame " << verified << " differs at byte " << bad);
      buffers.erase(verified + 1);
      grant(verified + kWindow);
    }
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: posted " << next_post << ", completed " << sends_seen << ", arrived " << verified);
    }
    pollfd fds[2] = {{tx.t->eventFd(), POLLIN, 0}, {rx.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 10);
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
    credits.push_back(expose(*rx.t, buffers.back().credit(1000 + i)));
  }
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
    pollfd fds[2] = {{tx.t->eventFd(), POLLIN, 0}, {rx.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 5);
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

TEMPLATE_TEST_CASE("unknown credit is reported and the link stays usable", "[transport]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  // The sender names a credit the receiver does not know (3 MiB: crosses
  // chunk boundaries and socket buffers while it is discarded).  It was
  // exposed and retracted, so that its address and rkey are valid memory:
  // an rdma write to memory never registered breaks the link by design.
  Buffer bogus_buf(4 << 20);
  RemoteCredit bogus = expose(*rx.t, bogus_buf.credit(777));
  rx.t->retractCredit(777);
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
  CHECK(rx.arrivals[0].header.sequence == 5u);
  CHECK(!rx.arrivals[0].message.empty());
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(rx.arrivals[1].header.sequence == 6u);
  CHECK(firstMismatch(buf.data(), payload) == -1);
  CHECK(rx.errors.empty());
  CHECK(tx.errors.empty());
  CHECK(rx.t->connected());
  // A credit is consumed by its frame: using it again is an unknown credit.
  REQUIRE(tx.post(request(3, good, payload, 7)) == PostResult::kOk);
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
  REQUIRE(tx.post(request(1, c, payload, 1)) == PostResult::kOk);
  Buffer buf(10);
  RemoteCredit good = expose(*rx.t, buf.credit(51));
  auto small = pattern(4, 10);
  REQUIRE(tx.post(request(2, good, small, 2)) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return rx.arrivals.size() == 2 && tx.sends.size() == 2; }, "both frames");
  CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[0].header.credit_id == 50u);
  // An rdma write cannot be stopped by the receiver: it lands in the
  // retracted buffer (kept mapped for that) and is reported as unknown.
  if (TestType::kKind != TransportKind::kRdma) {
    CHECK(std::all_of(gone.data(), gone.data() + gone.size(), [](uint8_t b) { return b == 0xEE; }));
  }
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
  std::this_thread::sleep_for(50ms);
  tx.pump();
  rx.pump();
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
  // discarded (rdma: lands in that buffer and is reported as unknown).
  constexpr size_t kSize = 1 << 20;
  auto payload = pattern(1, kSize);
  Buffer sink(kSize);
  RemoteCredit c = expose(*leaver.t, sink.credit(1));
  leaver.t->retractCredit(1);
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
  constexpr size_t kSize = 1 << 20;
  auto payload = pattern(1, kSize);
  Buffer sink(kSize);
  RemoteCredit c = expose(*rx.t, sink.credit(1));
  rx.t->retractCredit(1);
  size_t posted = 0;
  while (posted < 1000 && tx.post(request(posted, c, payload, posted + 1)) == PostResult::kOk) ++posted;
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
  for (uint64_t i = 0; i < 3; ++i) {
    RemoteCredit c = expose(*rx.t, bufs[i].credit(i + 1));
    REQUIRE(tx.post(request(i, c, payload, i + 1)) == PostResult::kOk);
  }
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
  CHECK_FALSE(readable(rx.t->eventFd(), 0));

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

// ---------------------------------------------------------------- control records
//
// Sizes around 4 KiB cross rdma's control fragment size (one fragment per
// SEND, kControlChunkBytes); tcp and grpc frame records in-band.

TEMPLATE_TEST_CASE("control records arrive in order with exact bytes, both directions",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  const std::vector<size_t> sizes = {1, 2, 7, 8, 64, 255, 4095, 4096, 4097, 8192, 12'289, 1000, 3};
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    Endpoint tx{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint rx{dir == 0 ? pair->b.get() : pair->a.get()};
    std::vector<std::string> sent;
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.push_back(controlRecord(100 * dir + i, sizes[i]));
      REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
    }
    // A record that is all zero bytes is a record too.
    sent.push_back(std::string(300, '\0'));
    REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
    waitFor(
        tx, rx, [&] { return rx.controls.size() >= sent.size(); }, "every control record");
    // Nothing more arrives, nothing arrives twice, and records are no frames.
    std::this_thread::sleep_for(50ms);
    tx.pump();
    rx.pump();
    REQUIRE(rx.controls.size() == sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      CAPTURE(i, sent[i].size());
      CHECK(rx.controls[i].size() == sent[i].size());
      CHECK(firstDifference(rx.controls[i], sent[i]) == -1);
    }
    CHECK(rx.arrivals.empty());
    CHECK(tx.sends.empty());  // records are not frames: no SendComplete
    CHECK(tx.controls.empty());
    CHECK(tx.errors.empty());
    CHECK(rx.errors.empty());
  }
}

TEMPLATE_TEST_CASE("empty and oversized control records are refused, the largest one arrives whole",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  CHECK(tx.t->postControl(std::string()) == PostResult::kInvalid);
  CHECK(tx.t->postControl(controlRecord(1, kMaxControlBytes + 1)) == PostResult::kInvalid);
  CHECK(tx.t->postControl(controlRecord(2, 4 * kMaxControlBytes)) == PostResult::kInvalid);
  // Nothing of the refused ones was queued: the first record to arrive is
  // the largest allowed one, then a small one after it.
  const std::string largest = controlRecord(3, kMaxControlBytes);
  const std::string small = controlRecord(4, 10);
  REQUIRE(tx.t->postControl(largest) == PostResult::kOk);
  REQUIRE(tx.t->postControl(small) == PostResult::kOk);
  waitFor(
      tx, rx, [&] { return rx.controls.size() >= 2 || !rx.errors.empty(); }, "the two records");
  REQUIRE(rx.errors.empty());
  std::this_thread::sleep_for(50ms);
  tx.pump();
  rx.pump();
  REQUIRE(rx.controls.size() == 2);
  CHECK(rx.controls[0].size() == kMaxControlBytes);
  CHECK(firstDifference(rx.controls[0], largest) == -1);
  CHECK(rx.controls[1] == small);
  CHECK(tx.errors.empty());
  CHECK(tx.t->connected());
  CHECK(rx.t->connected());
}

TEMPLATE_TEST_CASE("a 100 KiB control record arrives whole", "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  // Several of them back to back, so that one record's last fragment and
  // the next one's first follow each other on the wire.
  std::vector<std::string> sent;
  for (uint64_t i = 0; i < 5; ++i) {
    sent.push_back(controlRecord(50 + i, 100 * 1024 + i));
    REQUIRE(tx.t->postControl(sent.back()) == PostResult::kOk);
  }
  waitFor(
      tx, rx, [&] { return rx.controls.size() >= sent.size() || !rx.errors.empty(); },
      "five 100 KiB records");
  REQUIRE(rx.errors.empty());
  REQUIRE(rx.controls.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    CAPTURE(i);
    CHECK(rx.controls[i].size() == 100 * 1024 + i);
    CHECK(firstDifference(rx.controls[i], sent[i]) == -1);
  }
}

TEMPLATE_TEST_CASE("many control records interleaved with frames all arrive", "[transport][control]",
                   FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint tx{pair->a.get()}, rx{pair->b.get()};
  constexpr size_t kFrames = 300;
  constexpr size_t kRecordsPerFrame = 4;
  constexpr size_t kWindow = 32;  // credits outstanding
  constexpr size_t kFrameSize = 16 * 1024;
  std::mt19937_64 rng(20261124);
  // Mostly small records (like grants and ACKs), some beyond one rdma fragment.
  auto record_size = [&] { return rng() % 8 == 0 ? 1 + rng() % 20'000 : 1 + rng() % 200; };

  std::map<uint64_t, Buffer> buffers;
  std::map<uint64_t, RemoteCredit> granted;
  std::map<uint64_t, Payload> in_flight;
  auto grant = [&](size_t frame) {
    if (frame >= kFrames) return;
    auto [it, inserted] = buffers.emplace(frame + 1, Buffer(kFrameSize));
    granted[frame + 1] = expose(*rx.t, it->second.credit(frame + 1));
  };
  for (size_t i = 0; i < kWindow; ++i) grant(i);

  std::vector<std::string> sent;
  std::vector<std::string> reverse_sent;  // b -> a, at the same time
  size_t next_post = 0;
  size_t records_due = 0;  // records to post before the next frame
  size_t verified = 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 3;
  while (verified < kFrames || tx.sends.size() < kFrames || rx.controls.size() < sent.size() ||
         tx.controls.size() < reverse_sent.size() || next_post < kFrames) {
    while (next_post < kFrames) {
      bool blocked = false;
      while (records_due > 0) {
        std::string r = controlRecord(sent.size(), record_size());
        PostResult pr = tx.t->postControl(r);
        if (pr == PostResult::kBackpressure) {
          blocked = true;
          break;
        }
        REQUIRE(pr == PostResult::kOk);
        sent.push_back(std::move(r));
        --records_due;
      }
      if (blocked || !granted.count(next_post + 1)) break;
      auto payload = pattern(next_post, kFrameSize);
      PostResult pr = tx.post(request(next_post, granted[next_post + 1], payload, next_post + 1));
      if (pr == PostResult::kBackpressure) break;
      REQUIRE(pr == PostResult::kOk);
      in_flight.emplace(next_post, std::move(payload));
      granted.erase(next_post + 1);
      ++next_post;
      records_due = kRecordsPerFrame;
    }
    tx.pump();
    rx.pump();
    for (; verified < rx.arrivals.size(); ++verified) {
      const auto& ev = rx.arrivals[verified];
      REQUIRE(ev.status == FL_OK);
      REQUIRE(ev.header.sequence == verified + 1);
      long bad = firstMismatch(buffers.at(verified + 1).data(), pattern(verified, kFrameSize));
      if (bad != -1) FAIL("frame " << verified << " differs at byte " << bad);
      buffers.erase(verified + 1);
      grant(verified + kWindow);
      // The receiver answers each frame with a record, as it would ACK it.
      std::string ack = controlRecord(1'000'000 + verified, 24);
      REQUIRE(rx.t->postControl(ack) == PostResult::kOk);
      reverse_sent.push_back(std::move(ack));
    }
    for (const auto& ev : tx.sends) REQUIRE(ev.status == FL_OK);
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: posted " << next_post << " frames and " << sent.size() << " records; "
                                << tx.sends.size() << " completed, " << verified << " frames and "
                                << rx.controls.size() << " records arrived, " << tx.controls.size() << " of "
                                << reverse_sent.size() << " answers");
    }
    pollfd fds[2] = {{tx.t->eventFd(), POLLIN, 0}, {rx.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 5);
  }
  REQUIRE(rx.controls.size() == sent.size());
  CHECK(sent.size() == (kFrames - 1) * kRecordsPerFrame);
  for (size_t i = 0; i < sent.size(); ++i) {
    if (rx.controls[i] != sent[i]) {
      FAIL("record " << i << " of " << sent.size() << " (" << sent[i].size() << " bytes) arrived as "
                     << rx.controls[i].size() << " bytes differing at "
                     << firstDifference(rx.controls[i], sent[i]));
    }
  }
  REQUIRE(tx.controls.size() == reverse_sent.size());
  CHECK(tx.controls == reverse_sent);
  for (size_t i = 0; i < kFrames; ++i) REQUIRE(tx.sends[i].cookie == i);
}

TEMPLATE_TEST_CASE("control records after the link failed are refused with kNotConnected",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  Endpoint survivor{pair->a.get()}, leaver{pair->b.get()};
  // The link works first.
  REQUIRE(survivor.t->postControl("before") == PostResult::kOk);
  waitFor(
      survivor, leaver, [&] { return !leaver.controls.empty(); }, "the record before the failure");
  CHECK(leaver.controls[0] == "before");

  leaver.t->shutdown();
  CHECK(leaver.t->postControl("after shutdown") == PostResult::kNotConnected);
  waitFor(
      survivor, leaver, [&] { return !survivor.errors.empty(); }, "LinkError on the peer");
  CHECK(survivor.t->postControl("after the peer left") == PostResult::kNotConnected);
  CHECK(survivor.t->postControl(controlRecord(9, 100 * 1024)) == PostResult::kNotConnected);
  survivor.pump();
  leaver.pump();
  CHECK(survivor.errors.size() == 1);
  CHECK(leaver.errors.size() == 1);
}

TEMPLATE_TEST_CASE("control records arrive in order, exactly once, among frames of any size",
                   "[transport][control]", FL_TRANSPORTS) {
  auto pair = makePair<TestType>();
  for (int dir = 0; dir < 2; ++dir) {
    CAPTURE(dir);
    Endpoint tx{dir == 0 ? pair->a.get() : pair->b.get()};
    Endpoint rx{dir == 0 ? pair->b.get() : pair->a.get()};
    constexpr size_t kRecords = 600;
    constexpr size_t kEvery = 50;  // a frame after every 50th record
    constexpr size_t kFrames = kRecords / kEvery;
    auto recordSize = [](size_t i) {
      return i == 300 || i == 301 ? kMaxControlBytes : 1 + (i * 37) % 2000;  // the largest allowed, twice
    };
    std::vector<Buffer> buffers;
    std::vector<Payload> payloads;
    for (size_t f = 0; f < kFrames; ++f) {
      const size_t size = f % 3 == 0 ? (3u << 20) + f : 1024 * (f + 1);
      buffers.emplace_back(size);
      payloads.push_back(pattern(500 + f, size));
    }
    size_t frames = 0;
    for (size_t i = 0; i < kRecords; ++i) {
      PostResult pr;
      while ((pr = tx.t->postControl(controlRecord(i, recordSize(i)))) == PostResult::kBackpressure) {
        tx.pump();
        rx.pump();
      }
      REQUIRE(pr == PostResult::kOk);
      if (i % kEvery == kEvery - 1) {
        RemoteCredit c = expose(*rx.t, buffers[frames].credit(100 + frames));
        REQUIRE(tx.post(request(frames, c, payloads[frames], frames + 1)) == PostResult::kOk);
        ++frames;
      }
    }
    tx.t->flush();
    waitFor(
        tx, rx,
        [&] {
          return rx.controls.size() == kRecords && rx.arrivals.size() == kFrames &&
                 tx.sends.size() == kFrames;
        },
        "every record and frame");
    for (size_t i = 0; i < kRecords; ++i) {
      if (rx.controls[i] != controlRecord(i, recordSize(i))) {
        FAIL("record " << i << " differs, is out of order or was doubled");
      }
    }
    for (size_t f = 0; f < kFrames; ++f) {
      REQUIRE(tx.sends[f].status == FL_OK);
      REQUIRE(tx.sends[f].cookie == f);
      REQUIRE(rx.arrivals[f].status == FL_OK);
      REQUIRE(rx.arrivals[f].header.sequence == f + 1);
      long bad = firstMismatch(buffers[f].data(), payloads[f]);
      if (bad != -1) FAIL("frame " << f << " differs at byte " << bad);
    }
    CHECK(tx.controls.empty());  // nothing echoes back
    CHECK(tx.errors.empty());
    CHECK(rx.errors.empty());
  }
}

}  // namespace framelink::transport::testing
