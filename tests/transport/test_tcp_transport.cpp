// The tcp transport's I/O on the calling thread: writes the socket does not
// take whole (small socket buffers, a reader that is slow on purpose), a big
// frame with many control records around it, the link failing while a frame
// is half written, and poll()'s bound per call.  The contract itself is the
// conformance suite's; these tests look at what only this implementation
// has (its counters, its read budget, its eventFd over the socket).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
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
using testing::kDeadline;
using testing::Kind;
using testing::pattern;
using testing::Payload;
using testing::readable;
using testing::request;
using testing::waitFor;

using testing::socketPair;

struct Pair {
  std::unique_ptr<TcpTransport> a;
  std::unique_ptr<TcpTransport> b;
  int b_fd = -1;  // b's socket (owned by b): to see what waits in it
};

Pair makePair(int buffer_bytes, TcpTransportOptions a_options = {}, TcpTransportOptions b_options = {}) {
  testing::g_pair = nullptr;  // no registered memory here (a conformance test's pair is gone)
  auto [x, y] = socketPair(buffer_bytes);
  const int b_fd = y.get();
  auto a = TcpTransport::make(std::move(x), "a", a_options);
  auto b = TcpTransport::make(std::move(y), "b", b_options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  return Pair{std::move(a).value(), std::move(b).value(), b_fd};
}

// Bytes received and not yet read on a socket.
int queued(int fd) {
  int n = 0;
  REQUIRE(::ioctl(fd, FIONREAD, &n) == 0);
  return n;
}

std::string record(size_t index, size_t size) {
  std::string r(size, '\0');
  for (size_t i = 0; i < size; ++i) r[i] = static_cast<char>((index * 131 + i * 7) & 0xFF);
  std::memcpy(r.data(), &index, std::min(size, sizeof index));
  return r;
}

}  // namespace

TEST_CASE("tcp: a frame the socket takes whole completes inside flush(), before any poll",
          "[transport][tcp]") {
  Pair p = makePair(0);
  Buffer buf(4096);
  RemoteCredit c = testing::expose(*p.b, buf.credit(1));
  auto payload = pattern(1, 4096);
  CHECK_FALSE(readable(p.a->eventFd(), 0));
  REQUIRE(p.a->post(request(7, c, payload, 1)) == PostResult::kOk);
  CHECK(p.a->counters().frames_sent == 0);  // queued: the round's frames go together
  p.a->flush();
  // Nothing else ran: the write happened on this thread, in flush().
  CHECK(p.a->counters().frames_sent == 1);
  CHECK(p.a->socketCounters().writes == 1);
  CHECK(p.a->socketCounters().send_blocked == 0);
  REQUIRE(readable(p.a->eventFd(), 0));
  TransportEvent ev;
  REQUIRE(p.a->poll(&ev, 1) == 1);
  CHECK(ev.kind == Kind::kSendComplete);
  CHECK(ev.cookie == 7u);
  CHECK(ev.status == FL_OK);
  CHECK_FALSE(readable(p.a->eventFd(), 0));
  // A control record goes out the same way; the receiver reads both in poll().
  REQUIRE(p.a->postControl("grant") == PostResult::kOk);
  CHECK(p.a->counters().control_sent == 1);
  CHECK_FALSE(readable(p.a->eventFd(), 0));  // a record has no completion
  Endpoint b{p.b.get()};
  Endpoint a{p.a.get()};
  waitFor(
      a, b, [&] { return b.arrivals.size() == 1 && b.controls.size() == 1; }, "frame and record");
  CHECK(b.arrivals[0].status == FL_OK);
  CHECK(firstMismatch(buf.data(), payload) == -1);
  CHECK(b.controls[0] == "grant");
}

TEST_CASE("tcp: a round of small frames goes out in one sendmsg, a large frame in a write of its own",
          "[transport][tcp]") {
  Pair p = makePair(1 << 20);  // room for the whole round in the socket
  constexpr uint64_t kSmall = 32;
  std::vector<Buffer> bufs;
  std::vector<Payload> payloads;
  std::vector<RemoteCredit> credits;
  bufs.reserve(kSmall + 1);
  for (uint64_t i = 0; i < kSmall; ++i) {
    bufs.emplace_back(4096);
    payloads.push_back(pattern(i + 1, 4096));
    credits.push_back(testing::expose(*p.b, bufs.back().credit(i + 1)));
  }
  for (uint64_t i = 0; i < kSmall; ++i)
    REQUIRE(p.a->post(request(i, credits[i], payloads[i], i + 1)) == PostResult::kOk);
  CHECK(p.a->socketCounters().writes == 0);
  p.a->flush();
  CHECK(p.a->socketCounters().writes == 1);
  CHECK(p.a->socketCounters().frames_written == kSmall);
  CHECK(p.a->socketCounters().send_blocked == 0);
  Endpoint a{p.a.get()};
  Endpoint b{p.b.get()};
  waitFor(
      a, b, [&] { return a.sends.size() == kSmall && b.arrivals.size() == kSmall; },
      "the round of 4 KiB frames");
  for (uint64_t i = 0; i < kSmall; ++i) {
    CHECK(a.sends[i].cookie == i);  // completed in the order posted
    CHECK(a.sends[i].status == FL_OK);
    CHECK(firstMismatch(bufs[i].data(), payloads[i]) == -1);
  }

  // 512 KiB is over a write unit's 256 KiB: it goes alone, the small frames behind it together.
  bufs.emplace_back(512 * 1024);
  Payload big = pattern(99, 512 * 1024);
  RemoteCredit big_credit = testing::expose(*p.b, bufs.back().credit(100));
  for (uint64_t i = 0; i < 4; ++i) credits[i] = testing::expose(*p.b, bufs[i].credit(200 + i));
  REQUIRE(p.a->post(request(100, big_credit, big, 100)) == PostResult::kOk);
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(p.a->post(request(200 + i, credits[i], payloads[i], 200 + i)) == PostResult::kOk);
  }
  const uint64_t writes = p.a->socketCounters().writes;
  p.a->flush();
  if (p.a->socketCounters().send_blocked == 0) {
    // The socket took everything: two write units, two calls.
    CHECK(p.a->socketCounters().writes - writes == 2);
    CHECK(p.a->socketCounters().frames_written == kSmall + 5);
  }
  a.sends.clear();
  b.arrivals.clear();
  waitFor(
      a, b, [&] { return a.sends.size() == 5 && b.arrivals.size() == 5; },
      "the large frame and four small ones");
  CHECK(p.a->socketCounters().frames_written == kSmall + 5);
  CHECK(p.a->socketCounters().writes - writes >= 2);
  CHECK(a.sends[0].cookie == 100u);
  CHECK(firstMismatch(bufs.back().data(), big) == -1);
}

TEST_CASE("tcp: partial writes under a full socket buffer and a slow reader keep every frame whole",
          "[transport][tcp]") {
  // 16 KiB socket buffers (the kernel doubles them) against frames up to
  // 300 KiB: nearly every frame is written in many pieces.  The reader takes
  // 8 KiB per poll() and sleeps between polls.
  TcpTransportOptions slow;
  slow.read_budget_bytes = 8 * 1024;
  Pair p = makePair(16 * 1024, {}, slow);
  Endpoint tx{p.a.get()};
  Endpoint rx{p.b.get()};
  constexpr size_t kFrames = 40;
  std::vector<size_t> sizes(kFrames);
  for (size_t i = 0; i < kFrames; ++i) sizes[i] = 1 + (i * 7919 * 37) % (300 * 1024);
  std::vector<Buffer> buffers;
  std::vector<Payload> payloads;
  for (size_t i = 0; i < kFrames; ++i) {
    buffers.emplace_back(sizes[i]);
    payloads.push_back(pattern(100 + i, sizes[i]));
  }
  size_t posted = 0;
  for (; posted < kFrames; ++posted) {
    RemoteCredit c = testing::expose(*rx.t, buffers[posted].credit(posted + 1));
    REQUIRE(tx.post(request(posted, c, payloads[posted], posted + 1)) == PostResult::kOk);
  }
  const auto deadline = std::chrono::steady_clock::now() + kDeadline * 2;
  size_t scribbled = 0;
  while (rx.arrivals.size() < kFrames || tx.sends.size() < kFrames) {
    tx.pump();
    // A completed frame's payload is not read any more: overwrite it, so a
    // transport that still sent from it would deliver these bytes.
    for (; scribbled < tx.sends.size(); ++scribbled) {
      const TransportEvent& ev = tx.sends[scribbled];
      REQUIRE(ev.status == FL_OK);
      REQUIRE(ev.cookie == scribbled);  // in posting order, once each
      std::memset(payloads[ev.cookie].data(), 0xA5, payloads[ev.cookie].size());
    }
    rx.pumpOnce();
    REQUIRE(tx.errors.empty());
    REQUIRE(rx.errors.empty());
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: completed " << tx.sends.size() << ", arrived " << rx.arrivals.size());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(tx.sends.size() == kFrames);
  REQUIRE(rx.arrivals.size() == kFrames);
  for (size_t i = 0; i < kFrames; ++i) {
    const TransportEvent& ev = rx.arrivals[i];
    REQUIRE(ev.status == FL_OK);
    REQUIRE(ev.header.sequence == i + 1);
    REQUIRE(ev.header.length == sizes[i]);
    long bad = firstMismatch(buffers[i].data(), pattern(100 + i, sizes[i]));
    if (bad != -1) FAIL("frame " << i << " differs at byte " << bad);
  }
  // The paths this test is about were taken.
  CHECK(p.a->socketCounters().send_blocked > 0);
  CHECK(p.b->socketCounters().read_budget_hits > 0);
  CHECK(p.a->counters().frames_sent == kFrames);
  CHECK(p.b->counters().frames_received == kFrames);
}

TEST_CASE("tcp: eventFd wakes a sender whose write waits once the socket has room", "[transport][tcp]") {
  TcpTransportOptions slow;
  slow.read_budget_bytes = 64 * 1024;
  Pair p = makePair(32 * 1024, {}, slow);
  Buffer buf(4 << 20);
  RemoteCredit c = testing::expose(*p.b, buf.credit(1));
  auto payload = pattern(3, 4 << 20);
  REQUIRE(p.a->post(request(1, c, payload, 1)) == PostResult::kOk);
  p.a->flush();
  REQUIRE(p.a->socketCounters().send_blocked == 1);
  // Until the reader reads, the socket fills up and stays full: nothing is
  // pending and eventFd() is quiet, so a caller may sleep.
  TransportEvent ev;
  bool quiet = false;
  for (int i = 0; i < 100 && !quiet; ++i) {
    CHECK(p.a->poll(&ev, 1) == 0);
    quiet = !readable(p.a->eventFd(), 50);
  }
  REQUIRE(quiet);
  // The reader drains a little: the sender's eventFd turns readable with no
  // event pending (the write can go on), and poll() goes on with it.
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  bool woke = false;
  while (!woke) {
    p.b->poll(&ev, 1);
    woke = readable(p.a->eventFd(), 5);
    if (std::chrono::steady_clock::now() > deadline) FAIL("the sender's eventFd never became readable");
  }
  const uint64_t blocked = p.a->socketCounters().send_blocked;
  CHECK(p.a->poll(&ev, 1) == 0);                             // wrote more, the frame is not finished
  CHECK(p.a->socketCounters().send_blocked == blocked + 1);  // and blocked again
  Endpoint a{p.a.get()};
  Endpoint b{p.b.get()};
  waitFor(
      a, b, [&] { return a.sends.size() == 1 && b.arrivals.size() == 1; }, "the 4 MiB frame");
  CHECK(a.sends[0].status == FL_OK);
  CHECK(firstMismatch(buf.data(), payload) == -1);
  a.pump();
  b.pump();
  CHECK_FALSE(readable(p.a->eventFd(), 0));  // nothing waits: no EPOLLOUT interest left behind
  CHECK_FALSE(readable(p.b->eventFd(), 0));
}

TEST_CASE("tcp: control records posted behind a half-written frame go ahead of queued frames, in order",
          "[transport][tcp]") {
  // Both directions at once from one thread, as two agents would: each side
  // writes a 16 MiB frame (it cannot fit the 64 KiB socket buffers), then
  // 2000 records of 1..300 bytes with a small frame after every 500th.
  Pair p = makePair(64 * 1024);
  Endpoint sides[2] = {Endpoint{p.a.get()}, Endpoint{p.b.get()}};
  constexpr size_t kBig = size_t{16} << 20;
  constexpr size_t kRecords = 2000;
  struct Out {
    Buffer big{kBig};
    std::vector<Buffer> small;
    Payload big_payload;
    std::vector<Payload> small_payloads;
  };
  Out out[2];
  for (int s = 0; s < 2; ++s) {
    Endpoint& tx = sides[s];
    Endpoint& rx = sides[1 - s];
    out[s].big_payload = pattern(50 + s, kBig);
    RemoteCredit c = testing::expose(*rx.t, out[s].big.credit(1));
    REQUIRE(tx.post(request(1, c, out[s].big_payload, 1)) == PostResult::kOk);
    tx.t->flush();  // the big frame is being written when the rest is posted
    uint64_t sequence = 1;
    for (size_t i = 0; i < kRecords; ++i) {
      if (i % 500 == 499) {
        out[s].small.emplace_back(1024);
        out[s].small_payloads.push_back(pattern(sequence + 1, 1024));
        ++sequence;
        RemoteCredit sc = testing::expose(*rx.t, out[s].small.back().credit(sequence));
        REQUIRE(tx.post(request(sequence, sc, out[s].small_payloads.back(), sequence)) == PostResult::kOk);
      }
      REQUIRE(tx.t->postControl(record(i, 1 + (i * 37) % 300)) == PostResult::kOk);
    }
  }
  REQUIRE(p.a->socketCounters().send_blocked > 0);
  REQUIRE(p.b->socketCounters().send_blocked > 0);
  waitFor(
      sides[0], sides[1],
      [&] {
        return sides[0].controls.size() == kRecords && sides[1].controls.size() == kRecords &&
               sides[0].arrivals.size() == 5 && sides[1].arrivals.size() == 5 && sides[0].sends.size() == 5 &&
               sides[1].sends.size() == 5;
      },
      "every record and frame in both directions");
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    Endpoint& tx = sides[s];
    Endpoint& rx = sides[1 - s];
    for (size_t i = 0; i < kRecords; ++i) {
      if (rx.controls[i] != record(i, 1 + (i * 37) % 300))
        FAIL("record " << i << " differs or is out of order");
    }
    for (size_t i = 0; i < 5; ++i) {
      REQUIRE(rx.arrivals[i].status == FL_OK);
      REQUIRE(rx.arrivals[i].header.sequence == i + 1);
      REQUIRE(tx.sends[i].status == FL_OK);
      REQUIRE(tx.sends[i].cookie == i + 1);
    }
    CHECK(firstMismatch(out[s].big.data(), out[s].big_payload) == -1);
    for (size_t i = 0; i < 4; ++i)
      CHECK(firstMismatch(out[s].small[i].data(), out[s].small_payloads[i]) == -1);
    // Wire order: the big frame (being written when everything else was
    // posted), then every record (queued control goes first), then the
    // four small frames.
    std::vector<Kind> want{Kind::kFrameArrived};
    want.insert(want.end(), kRecords, Kind::kControl);
    want.insert(want.end(), 4, Kind::kFrameArrived);
    std::vector<Kind> got;
    for (Kind k : rx.order) {
      if (k == Kind::kFrameArrived || k == Kind::kControl) got.push_back(k);
    }
    CHECK(got == want);
    CHECK(tx.errors.empty());
  }
}

TEST_CASE("tcp: the link failing while a frame is half written completes every send once, none OK",
          "[transport][tcp]") {
  Pair p = makePair(32 * 1024);
  Endpoint tx{p.a.get()};
  Endpoint rx{p.b.get()};
  Buffer big(4 << 20);
  RemoteCredit c = testing::expose(*rx.t, big.credit(1));
  auto big_payload = std::make_unique<Payload>(pattern(1, 4 << 20));
  REQUIRE(tx.post(request(0, c, *big_payload, 1)) == PostResult::kOk);
  tx.t->flush();
  std::vector<Buffer> small;
  std::vector<Payload> small_payloads;
  for (uint64_t i = 1; i <= 3; ++i) {
    small.emplace_back(100);
    small_payloads.push_back(pattern(i, 100));
    RemoteCredit sc = testing::expose(*rx.t, small.back().credit(i + 1));
    REQUIRE(tx.post(request(i, sc, small_payloads.back(), i + 1)) == PostResult::kOk);
  }
  REQUIRE(tx.t->postControl("after the frames") == PostResult::kOk);
  REQUIRE(p.a->socketCounters().send_blocked == 1);
  CHECK(tx.sends.empty());

  SECTION("the peer goes away") {
    rx.pumpOnce();  // part of the big frame lands
    rx.t->shutdown();
    waitFor(
        tx, rx, [&] { return !tx.errors.empty() && tx.sends.size() == 4; }, "LinkError and 4 completions");
    CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
    CHECK(!tx.errors[0].message.empty());
  }
  SECTION("local shutdown") {
    tx.t->shutdown();
    // Everything is reported when shutdown() returns; the payload may go at once.
    tx.pump();
    REQUIRE(tx.sends.size() == 4);
    big_payload.reset();
    CHECK(tx.errors[0].status == FL_ERR_SHUTDOWN);
    waitFor(
        tx, rx, [&] { return !rx.errors.empty(); }, "the peer's LinkError");
    CHECK(rx.errors[0].status == FL_ERR_LINK_LOST);
    INFO(rx.errors[0].message);
    CHECK(rx.errors[0].message.find("in the middle of a frame") != std::string::npos);
    CHECK(rx.arrivals.empty());
  }
  REQUIRE(tx.errors.size() == 1);
  std::vector<int> seen(4, 0);
  for (const auto& ev : tx.sends) {
    REQUIRE(ev.cookie < 4);
    ++seen[ev.cookie];
    CHECK(ev.status == FL_ERR_LINK_LOST);  // the big one never left whole, the others never started
  }
  CHECK(seen == std::vector<int>{1, 1, 1, 1});
  // The LinkError comes before the completions it caused.
  CHECK(tx.order.front() == Kind::kLinkError);
  CHECK(tx.t->post(request(9, c, small_payloads[0], 9)) == PostResult::kNotConnected);
  CHECK(tx.t->postControl("late") == PostResult::kNotConnected);
  CHECK_FALSE(tx.t->connected());
  // A broken link leaves nothing readable behind: the caller can sleep.
  tx.pump();
  CHECK_FALSE(readable(tx.t->eventFd(), 0));
  tx.t->shutdown();
  tx.pump();
  CHECK(tx.errors.size() == 1);
}

TEST_CASE("tcp: the link failing while a round of small frames is half written completes each once",
          "[transport][tcp]") {
  Pair p = makePair(16 * 1024);
  Endpoint tx{p.a.get()};
  Endpoint rx{p.b.get()};
  constexpr uint64_t kFrames = 48;  // 48 x 4 KiB: one write unit, far more than the socket takes
  std::vector<Buffer> bufs;
  std::vector<Payload> payloads;
  bufs.reserve(kFrames);
  for (uint64_t i = 0; i < kFrames; ++i) {
    bufs.emplace_back(4096);
    payloads.push_back(pattern(i + 7, 4096));
    RemoteCredit c = testing::expose(*rx.t, bufs.back().credit(i + 1));
    REQUIRE(tx.post(request(i, c, payloads.back(), i + 1)) == PostResult::kOk);
  }
  tx.t->flush();
  REQUIRE(p.a->socketCounters().send_blocked == 1);
  REQUIRE(p.a->socketCounters().writes == 1);
  tx.t->shutdown();
  tx.pump();
  // Every frame of the unit, written in part or not at all, completes once, none OK: the unit
  // was not finished, and what of it the peer got it may never read.
  std::vector<int> seen(kFrames, 0);
  for (const auto& ev : tx.sends) {
    REQUIRE(ev.cookie < kFrames);
    ++seen[ev.cookie];
    CHECK(ev.status == FL_ERR_LINK_LOST);
  }
  CHECK(seen == std::vector<int>(kFrames, 1));
  CHECK(p.a->socketCounters().frames_written == 0);
}

TEST_CASE("tcp: a peer cut in the middle of a control record fails the link", "[transport][tcp]") {
  auto [x, raw] = socketPair(0);
  auto made = TcpTransport::make(std::move(x), "raw");
  REQUIRE(made.ok());
  std::unique_ptr<TcpTransport> t = std::move(made).value();
  TcpFrameHeader h{};
  h.magic = kTcpControlMagic;
  h.length = 100;
  REQUIRE(::send(raw.get(), &h, sizeof h, MSG_NOSIGNAL) == sizeof h);
  REQUIRE(::send(raw.get(), "only forty bytes of the hundred announced", 40, MSG_NOSIGNAL) == 40);
  raw.reset();
  Endpoint s{t.get()};
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (s.errors.empty()) {
    s.pump();
    if (std::chrono::steady_clock::now() > deadline) FAIL("no LinkError");
    readable(t->eventFd(), 10);
  }
  CHECK(s.controls.empty());
  CHECK(s.errors[0].status == FL_ERR_LINK_LOST);
  CHECK(s.errors[0].message.find("in the middle of a control record") != std::string::npos);
}

TEST_CASE("tcp: one poll() reads at most its budget and its max events", "[transport][tcp]") {
  TcpTransportOptions budget;
  budget.read_budget_bytes = 16 * 1024;
  Pair p = makePair(0, {}, budget);
  Endpoint a{p.a.get()};
  Endpoint b{p.b.get()};
  Buffer big(1 << 20);
  RemoteCredit c = testing::expose(*p.b, big.credit(1));
  auto payload = pattern(9, 1 << 20);
  REQUIRE(p.a->post(request(1, c, payload, 1)) == PostResult::kOk);
  // Far more than one budget waits in the receiver's socket...
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (queued(p.b_fd) < 48 * 1024) {
    a.pump();
    if (std::chrono::steady_clock::now() > deadline) FAIL("the sender never filled the receiver's socket");
    readable(p.b->eventFd(), 10);
  }
  // ...and one poll() takes a budget of it and leaves the rest, readable.
  TransportEvent ev[64];
  CHECK(p.b->poll(ev, 64) == 0);
  CHECK(p.b->socketCounters().read_budget_hits == 1);
  CHECK(queued(p.b_fd) > 0);
  CHECK(readable(p.b->eventFd(), 0));
  waitFor(
      a, b, [&] { return a.sends.size() == 1 && b.arrivals.size() == 1; }, "the 1 MiB frame");
  CHECK(firstMismatch(big.data(), payload) == -1);
  // 1 MiB in budgets of 16 KiB: at least 64 polls hit the budget.
  CHECK(p.b->socketCounters().read_budget_hits >= 64);

  // Ten small frames wait in the socket: never more events than asked for,
  // and eventFd() stays readable while some are left.
  std::vector<Buffer> small;
  std::vector<Payload> small_payloads;
  for (uint64_t i = 0; i < 10; ++i) {
    small.emplace_back(16);
    small_payloads.push_back(pattern(20 + i, 16));
    RemoteCredit sc = testing::expose(*p.b, small.back().credit(10 + i));
    REQUIRE(p.a->post(request(10 + i, sc, small_payloads.back(), 2 + i)) == PostResult::kOk);
  }
  p.a->flush();
  while (queued(p.b_fd) < static_cast<int>(10 * (sizeof(TcpFrameHeader) + 16))) {
    if (std::chrono::steady_clock::now() > deadline) FAIL("the small frames never arrived in the socket");
    readable(p.b->eventFd(), 10);
  }
  size_t arrived = 0;
  while (arrived < 10) {
    REQUIRE(readable(p.b->eventFd(), 0));
    const size_t n = p.b->poll(ev, 2);
    REQUIRE(n == 2);
    for (size_t i = 0; i < n; ++i) CHECK(ev[i].header.sequence == arrived + i + 2);
    arrived += n;
  }
  CHECK(p.b->poll(ev, 64) == 0);
  CHECK_FALSE(readable(p.b->eventFd(), 0));
}

TEST_CASE("tcp: a discarded frame a little larger than the scratch buffer keeps the next header whole",
          "[transport][tcp]") {
  // The receiver reads a frame for an unknown credit into a 256 KiB scratch
  // buffer, a piece at a time.  When the rest of it is a few bytes more
  // than the scratch buffer and the next header already waits in the
  // socket, one read must not run on from the scratch buffer into the
  // header: those bytes are still the discarded frame's.
  for (size_t extra : {size_t{1}, size_t{100}, sizeof(TcpFrameHeader) - 1, sizeof(TcpFrameHeader)}) {
    CAPTURE(extra);
    Pair p = makePair(8 << 20);
    Endpoint tx{p.a.get()};
    Endpoint rx{p.b.get()};
    Buffer gone(512 * 1024);
    RemoteCredit unknown = testing::expose(*rx.t, gone.credit(1));
    rx.t->retractCredit(1);
    Buffer buf(4096);
    RemoteCredit good = testing::expose(*rx.t, buf.credit(2));
    auto discarded = pattern(1, 256 * 1024 + extra);
    auto payload = pattern(2, 4096);
    REQUIRE(tx.post(request(1, unknown, discarded, 1)) == PostResult::kOk);
    REQUIRE(tx.post(request(2, good, payload, 2)) == PostResult::kOk);
    // Both frames wait in the receiver's socket before it reads anything.
    const size_t total = 2 * sizeof(TcpFrameHeader) + discarded.size() + payload.size();
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (static_cast<size_t>(queued(p.b_fd)) < total) {
      tx.pump();
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    waitFor(
        tx, rx, [&] { return rx.arrivals.size() == 2 || !rx.errors.empty(); }, "both frames");
    REQUIRE(rx.errors.empty());
    CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
    CHECK(rx.arrivals[1].status == FL_OK);
    CHECK(rx.arrivals[1].header.sequence == 2u);
    CHECK(firstMismatch(buf.data(), payload) == -1);
  }
}

}  // namespace framelink::transport::tcp
