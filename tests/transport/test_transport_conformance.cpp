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
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/faulty/faulty_transport.h"
#include "transport/transport.h"
#include "transport_pair.h"

namespace framelink::transport::testing {
namespace {

using namespace std::chrono_literals;
using Kind = TransportEvent::Kind;

constexpr auto kDeadline = 20s;  // generous for sanitizer builds on 2 cores

struct Tcp {
  static constexpr TransportKind kKind = TransportKind::kTcp;
  static constexpr size_t kChunk = 0;
};
struct Grpc {
  static constexpr TransportKind kKind = TransportKind::kGrpc;
  static constexpr size_t kChunk = 0;
};
struct GrpcSmallChunk {
  static constexpr TransportKind kKind = TransportKind::kGrpc;
  static constexpr size_t kChunk = 64 * 1024;
};
struct Loopback {
  static constexpr TransportKind kKind = TransportKind::kLoopback;
  static constexpr size_t kChunk = 0;
};
struct Rdma {
  static constexpr TransportKind kKind = TransportKind::kRdma;
  static constexpr size_t kChunk = 0;
};
// tcp under the `faulty` decorator with every fault off: the decorator must
// pass the whole contract through unchanged.
struct FaultyTcp {
  static constexpr TransportKind kKind = TransportKind::kTcp;
  static constexpr size_t kChunk = 0;
  static constexpr bool kFaulty = true;
};

// The pair of the running test: what payloads and buffers register with.
TransportPair* g_pair = nullptr;

std::shared_ptr<void> registerWithPair(void* addr, size_t length, bool receive) {
  if (g_pair == nullptr || length == 0) return nullptr;
  auto r = g_pair->registerMemory(addr, length, receive);
  if (!r) FAIL("cannot register " << length << " bytes: " << r.error().message);
  return std::move(r).value();
}

template <typename Flavor>
std::unique_ptr<TransportPair> makePair() {
  TransportPairOptions options;
  options.grpc_chunk_bytes = Flavor::kChunk;
  auto pair = TransportPair::make(Flavor::kKind, options);
  if (!pair) FAIL("cannot build a " << kindName(Flavor::kKind) << " pair: " << pair.error().message);
  if constexpr (requires { Flavor::kFaulty; }) {
    for (auto* side : {&pair.value()->a, &pair.value()->b}) {
      auto wrapped = FaultyTransport::wrap(*side, FaultSpec{}, side == &pair.value()->a ? 1 : 2);
      REQUIRE(wrapped.ok());
      *side = std::move(wrapped).value();
    }
  }
  REQUIRE(pair.value()->a->connected());
  REQUIRE(pair.value()->b->connected());
  g_pair = pair.value().get();
  return std::move(pair).value();
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Payload bytes, registered for sending with the running test's pair.
class Payload {
 public:
  Payload() = default;
  explicit Payload(size_t n) : bytes_(n) { registration_ = registerWithPair(bytes_.data(), n, false); }
  Payload(Payload&&) = default;
  Payload& operator=(Payload&&) = default;
  Payload(const Payload&) = delete;  // a copy would not be registered
  Payload& operator=(const Payload&) = delete;

  uint8_t* data() noexcept { return bytes_.data(); }
  const uint8_t* data() const noexcept { return bytes_.data(); }
  size_t size() const noexcept { return bytes_.size(); }
  bool empty() const noexcept { return bytes_.empty(); }
  uint8_t operator[](size_t i) const noexcept { return bytes_[i]; }

 private:
  std::vector<uint8_t> bytes_;
  std::shared_ptr<void> registration_;  // declared last: deregistered before the bytes go
};

Payload pattern(uint64_t seed, size_t length) {
  Payload v(length);
  for (size_t i = 0; i < length; i += 8) {
    uint64_t w = splitmix64(seed * 0x9E3779B97F4A7C15ull + i / 8);
    std::memcpy(v.data() + i, &w, std::min<size_t>(8, length - i));
  }
  return v;
}

// First differing byte, or -1.
long firstMismatch(const uint8_t* got, const Payload& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return static_cast<long>(i);
  }
  return -1;
}

// Events seen on one transport, split by kind, in arrival order.
struct Endpoint {
  Transport* t = nullptr;
  std::vector<TransportEvent> sends;
  std::vector<TransportEvent> arrivals;
  std::vector<TransportEvent> errors;
  std::vector<Kind> order;

  // Posts as the daemon does: with the key of the payload's registration.
  PostResult post(SendRequest r) {
    if (g_pair != nullptr && r.payload != nullptr && r.header.length > 0) {
      r.local_key = g_pair->localKey(*t, r.payload, r.header.length);
    }
    return t->post(r);
  }

  void pump() {
    t->flush();  // as the data agent does after each round of posts
    TransportEvent ev[32];
    size_t n;
    while ((n = t->poll(ev, 32)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        order.push_back(ev[i].kind);
        switch (ev[i].kind) {
          case Kind::kSendComplete:
            sends.push_back(std::move(ev[i]));
            break;
          case Kind::kFrameArrived:
            arrivals.push_back(std::move(ev[i]));
            break;
          case Kind::kLinkError:
            errors.push_back(std::move(ev[i]));
            break;
        }
      }
    }
  }
};

// Pumps both endpoints until `done` holds; fails the test after kDeadline.
template <typename Pred>
void waitFor(Endpoint& x, Endpoint& y, Pred done, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    x.pump();
    y.pump();
    if (done()) return;
    if (std::chrono::steady_clock::now() > deadline) FAIL("timed out waiting for " << what);
    pollfd fds[2] = {{x.t->eventFd(), POLLIN, 0}, {y.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 10);
  }
}

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

// A receive buffer that can be exposed as a credit: as in the daemon's
// segments, the 256-byte slot header lies right before it, and both are
// registered for peers to write into.
struct Buffer {
  static constexpr size_t kHeaderRoom = sizeof(fl_slot_header);
  struct Memory {
    uint8_t* base = nullptr;
    size_t size = 0;
    std::shared_ptr<void> registration;
    ~Memory() {
      registration.reset();
      std::free(base);
    }
  };
  std::shared_ptr<Memory> mem;
  explicit Buffer(size_t n, uint8_t fill = 0xEE) : mem(std::make_shared<Memory>()) {
    const size_t total = (kHeaderRoom + n + 4095) / 4096 * 4096;
    mem->base = static_cast<uint8_t*>(std::aligned_alloc(4096, total));
    REQUIRE(mem->base != nullptr);
    std::memset(mem->base, fill, total);
    mem->size = n;
    mem->registration = registerWithPair(mem->base, kHeaderRoom + n, true);
  }
  LocalCredit credit(uint64_t id) const { return LocalCredit{id, data(), mem->size, mem}; }
  uint8_t* data() const { return mem->base + kHeaderRoom; }
  size_t size() const { return mem->size; }
};

RemoteCredit expose(Transport& t, const LocalCredit& c) {
  auto r = t.exposeCredit(c);
  if (!r) FAIL("exposeCredit(" << c.credit_id << "): " << r.error().message);
  return r.value();
}

SendRequest request(uint64_t cookie, const RemoteCredit& credit, const Payload& payload, uint64_t sequence) {
  SendRequest r;
  r.cookie = cookie;
  r.credit = credit;
  r.header.credit_id = credit.credit_id;
  r.header.length = payload.size();
  r.header.sequence = sequence;
  r.header.stream_id = 7;
  r.header.frame_id = sequence;
  r.payload = payload.empty() ? nullptr : payload.data();
  return r;
}

}  // namespace

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
  waitFor(
      tx, rx, [&] { return rx.arrivals.size() == 3; }, "reused credit");
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

// ---------------------------------------------------------------- faulty
// The decorator's own faults, over a tcp pair: each one does what the data
// agent's recovery expects of a real link with that fault.
#ifndef FL_CONFORMANCE_RDMA

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
}

}  // namespace

TEST_CASE("fault spec: every key parses, mistakes name the key", "[transport][faulty]") {
  auto s =
      parseFaultSpec("seed=7,drop=0.5,fail=0.25,disconnect=0.125,dup=1,delay=0,delay_ms=20,corrupt=0.75");
  REQUIRE(s.ok());
  CHECK(s.value().seed == 7);
  CHECK(s.value().drop == 0.5);
  CHECK(s.value().fail == 0.25);
  CHECK(s.value().disconnect == 0.125);
  CHECK(s.value().dup == 1);
  CHECK(s.value().delay_ms == 20);
  CHECK(s.value().corrupt == 0.75);
  CHECK(s.value().any());
  CHECK_FALSE(parseFaultSpec("").value().any());
  for (const char* bad :
       {"drop=2", "drop=-0.1", "drop=x", "seed=1.5", "loss=0.1", "drop", "delay_ms=99999"}) {
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

#endif  // FL_CONFORMANCE_RDMA

}  // namespace framelink::transport::testing
