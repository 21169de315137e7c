// What the transport tests share: the transport flavors the conformance
// suite is instantiated for, a pair of connected transports of one flavor,
// registered payloads and receive buffers laid out as in the daemon's
// segments, and an endpoint that collects each side's events.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "framelink/shm_layout.h"
#include "transport/faulty/faulty_transport.h"
#include "transport/transport.h"
#include "transport_pair.h"

namespace framelink::transport::testing {

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
inline TransportPair* g_pair = nullptr;

inline std::shared_ptr<void> registerWithPair(void* addr, size_t length, bool receive) {
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

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Payload bytes, registered for sending with the running test's pair.  A
// transport may read them until the post's SendComplete, as it may read a
// producer's slot; a test that lets go of a Payload before that (it waited
// for the arrival only) leaves its bytes and registration to the pair,
// which frees them after shutting its transports down.
class Payload {
 public:
  Payload() = default;
  explicit Payload(size_t n) : bytes_(std::make_shared<std::vector<uint8_t>>(n)) {
    registration_ = registerWithPair(bytes_->data(), n, false);
    if (g_pair != nullptr) kept_by_ = g_pair->kept_until_shutdown;
  }
  Payload(Payload&&) = default;
  Payload& operator=(Payload&& other) noexcept {
    release();
    bytes_ = std::move(other.bytes_);
    registration_ = std::move(other.registration_);
    kept_by_ = std::move(other.kept_by_);
    return *this;
  }
  Payload(const Payload&) = delete;  // a copy would not be registered
  Payload& operator=(const Payload&) = delete;
  ~Payload() { release(); }

  uint8_t* data() noexcept { return bytes_ ? bytes_->data() : nullptr; }
  const uint8_t* data() const noexcept { return bytes_ ? bytes_->data() : nullptr; }
  size_t size() const noexcept { return bytes_ ? bytes_->size() : 0; }
  bool empty() const noexcept { return size() == 0; }
  uint8_t operator[](size_t i) const noexcept { return (*bytes_)[i]; }

 private:
  void release() noexcept {
    if (auto kept = kept_by_.lock(); kept && bytes_) {
      // The registration first: deregistered before the bytes go.
      kept->push_back(std::move(registration_));
      kept->push_back(std::move(bytes_));
    }
    registration_.reset();
    bytes_.reset();
  }

  std::shared_ptr<std::vector<uint8_t>> bytes_;
  std::shared_ptr<void> registration_;
  std::weak_ptr<std::vector<std::shared_ptr<void>>> kept_by_;  // the pair's, while it lives
};

inline Payload pattern(uint64_t seed, size_t length) {
  Payload v(length);
  uint8_t* out = v.data();  // once: under a sanitizer every call is checked
  for (size_t i = 0; i < length; i += 8) {
    uint64_t w = splitmix64(seed * 0x9E3779B97F4A7C15ull + i / 8);
    std::memcpy(out + i, &w, std::min<size_t>(8, length - i));
  }
  return v;
}

// First differing byte, or -1.  memcmp first: a sanitizer checks it as one range, where the
// byte loop costs a check per byte (256 MiB a test under ThreadSanitizer).
inline long firstMismatch(const uint8_t* got, const Payload& want) {
  if (want.empty() || std::memcmp(got, want.data(), want.size()) == 0) return -1;  // empty: data() is null
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
  std::vector<TransportEvent> reads;  // kReadComplete, in completion order
  std::vector<std::string> controls;  // kControl records, in arrival order
  std::vector<Kind> order;

  // Posts as the daemon does: with the key of the payload's registration.
  PostResult post(SendRequest r) {
    if (g_pair != nullptr && r.payload != nullptr && r.header.length > 0) {
      r.local_key = g_pair->localKey(*t, r.payload, r.header.length);
    }
    return t->post(r);
  }
  // Reads as the daemon does: with the key of the buffer's registration.
  PostResult postRead(ReadRequest r) {
    if (g_pair != nullptr && r.buffer != nullptr && r.source.length > 0) {
      r.local_key = g_pair->localKey(*t, r.buffer, r.source.length);
    }
    return t->postRead(r);
  }

  // Polls until nothing is left, at most `max_per_poll` events a call.
  void pump(size_t max_per_poll = 32) {
    t->flush();  // as the data agent does after each round of posts
    TransportEvent ev[32];
    size_t n;
    while ((n = t->poll(ev, std::min<size_t>(max_per_poll, 32))) > 0) take(ev, n);
  }
  // One poll() call, as a reader that is slow on purpose.
  void pumpOnce() {
    t->flush();
    TransportEvent ev[32];
    take(ev, t->poll(ev, 32));
  }
  void take(TransportEvent* ev, size_t n) {
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
        case Kind::kControl:
          controls.push_back(std::move(ev[i].control));
          break;
        case Kind::kReadComplete:
          reads.push_back(std::move(ev[i]));
          break;
      }
    }
  }
};

// Sleeps until either endpoint's transport has events, at most `timeout_ms`.
inline void awaitEvents(const Endpoint& x, const Endpoint& y, int timeout_ms) {
  pollfd fds[2] = {{x.t->eventFd(), POLLIN, 0}, {y.t->eventFd(), POLLIN, 0}};
  ::poll(fds, 2, timeout_ms);
}

// Pumps both endpoints until `done` holds; fails the test after kDeadline.
template <typename Pred>
void waitFor(Endpoint& x, Endpoint& y, Pred done, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    x.pump();
    y.pump();
    if (done()) return;
    if (std::chrono::steady_clock::now() > deadline) FAIL("timed out waiting for " << what);
    awaitEvents(x, y, 10);
  }
}

// Gives whatever is still on its way 50 ms, then pumps both endpoints: what
// a test has not seen after that did not come (nothing late, nothing twice).
inline void settle(Endpoint& x, Endpoint& y) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  x.pump();
  y.pump();
}

// A control record of `length` bytes that says which it is (every byte
// depends on the seed and its position, zero bytes included).
inline std::string controlRecord(uint64_t seed, size_t length) {
  std::string r(length, '\0');
  for (size_t i = 0; i < length; i += 8) {
    uint64_t w = splitmix64(seed * 0xD1B54A32D192ED03ull + i / 8);
    std::memcpy(r.data() + i, &w, std::min<size_t>(8, length - i));
  }
  return r;
}

// Where two records first differ, for a readable failure (-1: equal).
inline long firstDifference(const std::string& got, const std::string& want) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) return static_cast<long>(i);
  }
  return got.size() == want.size() ? -1 : static_cast<long>(n);
}

inline bool readable(int fd, int timeout_ms) {
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

inline RemoteCredit expose(Transport& t, const LocalCredit& c) {
  auto r = t.exposeCredit(c);
  if (!r) FAIL("exposeCredit(" << c.credit_id << "): " << r.error().message);
  t.flush();  // where the grant would go out (rdma binds the credit's window with it)
  return r.value();
}

inline SendRequest request(uint64_t cookie, const RemoteCredit& credit, const Payload& payload,
                           uint64_t sequence) {
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

}  // namespace framelink::transport::testing
